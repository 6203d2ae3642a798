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
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>

#include "loadstar/config.hpp"

namespace loadstar::detail {

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

  /// A block of `bytes` bytes aligned to `LOADSTAR_TENSOR_ALIGNMENT`, reused when one is cached.
  void* allocate(std::size_t bytes) {
    if (bytes >= min_bytes) {
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
    void* block = ::operator new(bytes, alignment);
    if (bytes >= min_bytes) populate(block, bytes);
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

  std::mutex mutex_;
  std::array<Block, max_blocks> blocks_{};
  std::size_t count_ = 0;
  std::size_t held_ = 0;
};

}  // namespace loadstar::detail
