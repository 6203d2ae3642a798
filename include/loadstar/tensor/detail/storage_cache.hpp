/// \file
/// Reuse of large tensor blocks: a data loader builds one large batch after another, and taking
/// fresh memory from the system for each costs a page fault per page (and, once the allocator
/// returns the block with `munmap`, a TLB shootdown on every core), which made two worker threads
/// twenty times slower than one on 19 MB batches.
#pragma once

#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

#include "loadstar/config.hpp"

namespace loadstar::detail {

/// A region that large tensor blocks are carved from, top down, while it is installed on a
/// thread (`BlockArena::Scope`): a worker process installs its shared-memory slot while the user's
/// sequence builds a batch, so the batch's tensors are built where the consumer reads them and
/// serialization references them instead of copying (see `Serializer<Tensor<T>>`). Blocks are
/// whole pages, so that one the sequence keeps after the batch (a cache) can be given pages of its
/// own (`ProcessBackend`); freeing a block gives its space back only while no block below it
/// lives. At most `max_blocks` blocks; past them, or past its room, allocation falls back to the
/// heap.
class BlockArena {
 public:
  static constexpr std::size_t page = 4096;
  static constexpr std::size_t max_blocks = 64;

  struct Block {
    std::byte* memory = nullptr;
    std::size_t bytes = 0;
    bool live = false;
  };

  /// `[begin, end)`, page aligned.
  BlockArena(std::byte* begin, std::byte* end) noexcept : begin_(begin), end_(end), low_(end) {}
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;

  /// Installs an arena on this thread for its lifetime (arenas do not nest).
  class Scope {
   public:
    explicit Scope(BlockArena& arena) noexcept { current() = &arena; }
    ~Scope() { current() = nullptr; }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
  };

  /// The arena installed on this thread, if any.
  static BlockArena*& current() noexcept {
    static thread_local BlockArena* arena = nullptr;
    return arena;
  }

  /// A block of `bytes` (whole pages), or null when there is no room or the arena is sealed.
  void* take(std::size_t bytes) noexcept {
    const std::size_t rounded = (bytes + page - 1) / page * page;
    if (sealed_ || count_ == max_blocks || rounded < bytes ||
        rounded > static_cast<std::size_t>(low_ - begin_)) {
      return nullptr;
    }
    low_ -= rounded;
    blocks_[count_++] = {low_, rounded, true};
    ++live_;
    return low_;
  }

  /// Whether `block` came from this arena.
  bool owns(const void* block) const noexcept {
    const auto* p = static_cast<const std::byte*>(block);
    return p >= low_ && p < end_;
  }

  /// Gives back a block from `take`; the space of the lowest blocks, once dead, is reused.
  void give_back(const void* block) noexcept {
    for (std::size_t i = 0; i < count_; ++i) {
      if (blocks_[i].memory == block && blocks_[i].live) {
        blocks_[i].live = false;
        --live_;
        break;
      }
    }
    while (count_ > 0 && !blocks_[count_ - 1].live) {
      low_ += blocks_[count_ - 1].bytes;
      --count_;
    }
  }

  /// No more blocks are taken (the batch is built; its bytes below `low()` are being written).
  void seal() noexcept { sealed_ = true; }
  /// The lowest byte handed out: the room below it is free.
  std::byte* low() const noexcept { return low_; }
  /// The blocks handed out and not given back.
  std::size_t live() const noexcept { return live_; }
  /// The blocks handed out, live or not (the first `count`).
  const Block* blocks() const noexcept { return blocks_.data(); }
  std::size_t count() const noexcept { return count_; }

 private:
  std::byte* begin_;
  std::byte* end_;
  std::byte* low_;
  std::array<Block, max_blocks> blocks_{};
  std::size_t count_ = 0;
  std::size_t live_ = 0;
  bool sealed_ = false;
};

/// A process-wide cache of recently freed blocks of at least `min_bytes`, matched by exact size
/// (the sizes of a loader's batches repeat). It holds at most `max_blocks` blocks and
/// `LOADSTAR_TENSOR_CACHE_BYTES` bytes; smaller blocks go straight to the allocator, which
/// already recycles them well.
class StorageCache {
 public:
  static constexpr std::size_t min_bytes = std::size_t{256} << 10U;
  static constexpr std::size_t max_blocks = 16;
  static constexpr std::align_val_t alignment{LOADSTAR_TENSOR_ALIGNMENT};

  static StorageCache& instance() {
    // Never destroyed: tensors may be freed during static destruction.
    static StorageCache* cache = new StorageCache;
    return *cache;
  }

  /// A block of `bytes` bytes aligned to `LOADSTAR_TENSOR_ALIGNMENT`, reused when one is cached;
  /// null when the system has no such block (the caller names what it was for).
  void* allocate(std::size_t bytes) {
    if (bytes >= min_bytes) {
      if (BlockArena* arena = BlockArena::current()) {
        if (void* block = arena->take(bytes)) return block;
      }
      std::lock_guard lock(mutex_);
      for (std::size_t i = 0; i < count_; ++i) {
        if (blocks_[i].bytes == bytes) {
          void* block = blocks_[i].memory;
          held_ -= bytes;
          blocks_[i] = blocks_[--count_];
          return block;
        }
      }
    }
    // The non-throwing form: a sanitizer's allocator reports a failed throwing `new` as a crash
    // instead of throwing, and a size read from a file or a configuration may be any size.
    void* block = ::operator new(bytes, alignment, std::nothrow);
    if (block != nullptr && bytes >= min_bytes) populate(block, bytes);
    return block;
  }

  /// Frees every cached block. A forked child calls it: the blocks it inherited are shared with
  /// its parent copy-on-write, so writing one would fault and copy every page.
  void drop_all() noexcept {
    std::array<Block, max_blocks> dropped{};
    std::size_t drop_count = 0;
    {
      std::lock_guard lock(mutex_);
      std::copy_n(blocks_.begin(), count_, dropped.begin());
      drop_count = count_;
      count_ = 0;
      held_ = 0;
    }
    for (std::size_t i = 0; i < drop_count; ++i)
      ::operator delete(dropped[i].memory, alignment);
  }

  /// Gives back a block from `allocate(bytes)`: kept, after dropping the oldest blocks to make
  /// room, when it fits in the cache; freed otherwise.
  void release(void* block, std::size_t bytes) noexcept {
    if (bytes >= min_bytes && in_arenas(block)) {
      // Arena memory is not the heap's: the arena that holds it takes it back, if it is still
      // installed (a block freed later, after its batch, stays where it is).
      if (BlockArena* arena = BlockArena::current(); arena && arena->owns(block)) {
        arena->give_back(block);
      }
      return;
    }
    std::array<Block, max_blocks> dropped{};
    std::size_t drop_count = 0;
    if (bytes >= min_bytes && bytes <= LOADSTAR_TENSOR_CACHE_BYTES) {
      std::lock_guard lock(mutex_);
      while (count_ == max_blocks || held_ + bytes > LOADSTAR_TENSOR_CACHE_BYTES) {
        dropped[drop_count++] = blocks_[0];
        held_ -= blocks_[0].bytes;
        std::move(blocks_.begin() + 1, blocks_.begin() + static_cast<std::ptrdiff_t>(count_),
                  blocks_.begin());
        --count_;
      }
      blocks_[count_++] = {block, bytes};
      held_ += bytes;
    } else {
      dropped[drop_count++] = {block, bytes};
    }
    // Freed outside the lock: giving pages back to the system takes a while.
    for (std::size_t i = 0; i < drop_count; ++i)
      ::operator delete(dropped[i].memory, alignment);
  }

  /// Declares `[begin, end)` as the memory arenas are made of in this process, so that `release`
  /// tells their blocks from the heap's whatever thread frees them.
  void set_arena_range(const void* begin, const void* end) noexcept {
    arena_begin_.store(reinterpret_cast<std::uintptr_t>(begin), std::memory_order_relaxed);
    arena_end_.store(reinterpret_cast<std::uintptr_t>(end), std::memory_order_relaxed);
  }

  StorageCache(const StorageCache&) = delete;
  StorageCache& operator=(const StorageCache&) = delete;

 private:
  StorageCache() {
    // A process forked while another thread holds the lock must not inherit it locked (the
    // sequence adapter forks its workers, and user threads may be allocating tensors).
    ::pthread_atfork([] { instance().mutex_.lock(); }, [] { instance().mutex_.unlock(); },
                     [] { instance().mutex_.unlock(); });
  }

  /// Maps the whole pages of a fresh block in one system call (`MADV_POPULATE_WRITE`, Linux
  /// 5.14; ignored before): faulting them in one by one costs about 20 us a page in a virtual
  /// machine, 100 ms for a 19 MB batch, against 1 ms populated.
  static void populate(void* block, std::size_t bytes) noexcept {
#ifdef MADV_POPULATE_WRITE
    const std::size_t page = 4096;
    const auto begin = (reinterpret_cast<std::uintptr_t>(block) + page - 1) / page * page;
    const auto end = (reinterpret_cast<std::uintptr_t>(block) + bytes) / page * page;
    if (end > begin) {
      (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
    }
#else
    (void)block;
    (void)bytes;
#endif
  }

  struct Block {
    void* memory = nullptr;
    std::size_t bytes = 0;
  };

  bool in_arenas(const void* block) const noexcept {
    const auto p = reinterpret_cast<std::uintptr_t>(block);
    return p >= arena_begin_.load(std::memory_order_relaxed) &&
           p < arena_end_.load(std::memory_order_relaxed);
  }

  std::mutex mutex_;
  std::atomic<std::uintptr_t> arena_begin_{0};
  std::atomic<std::uintptr_t> arena_end_{0};
  std::array<Block, max_blocks> blocks_{};
  std::size_t count_ = 0;
  std::size_t held_ = 0;
};

}  // namespace loadstar::detail
