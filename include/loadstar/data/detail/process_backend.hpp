/// \file
/// The process backend of `SequenceAdapter`: forked workers write serialized batches into a
/// preallocated shared-memory ring; the consumer reads them back strictly in order.
///
/// Over 800 lines as one class template with its shared-memory ring and worker protocol: both
/// ends of the protocol stay in one place, and a template has to be defined in its header.
#pragma once

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loadstar/data/detail/adapter_common.hpp"
#include "loadstar/data/detail/sandbox.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/detail/fork_guard.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/detail/storage_cache.hpp"

namespace loadstar::detail {

/// `"SIGKILL"`: the name of a signal for error messages.
inline std::string signal_name(int signal) {
  const char* abbreviation = sigabbrev_np(signal);
  return abbreviation ? std::string("SIG") + abbreviation : "signal " + std::to_string(signal);
}

/// The bytes of memory the kernel can still hand out (`MemAvailable` of `/proc/meminfo`), or
/// nothing when it cannot be read.
inline std::optional<std::uint64_t> available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

/// Sends all of `bytes` on a socket without raising `SIGPIPE` when the peer is gone; false on
/// failure.
inline bool send_all(int fd, const void* data, std::size_t bytes) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free &&
                  std::atomic<std::uint64_t>::is_always_lock_free,
              "the shared-memory protocol needs address-free lock-free atomics");

/// Sleeps while `word` holds `expected` (a process-shared futex: the word lives in a `MAP_SHARED`
/// mapping, so no `FUTEX_PRIVATE_FLAG`).
inline void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, expected, nullptr,
            nullptr, 0);
}

/// Wakes every process sleeping in `futex_wait` on `word`.
inline void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
}

/// `a * b + c`, or nothing when it overflows `std::size_t`.
inline std::optional<std::size_t> checked_size(std::size_t a, std::size_t b, std::size_t c) {
  std::size_t product = 0;
  std::size_t sum = 0;
  if (__builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, &sum)) {
    return std::nullopt;
  }
  return sum;
}

/// A shared anonymous file (`memfd_create`) mapped `MAP_SHARED`: a control block of
/// `control_bytes`, then `slots` slots of `slot_bytes`. It has no name in `/dev/shm`, so nothing
/// is left behind even when every process is killed, and it is not bound by the size of
/// `/dev/shm` (Docker's 64 MB, the cause of PyTorch's bus errors). Its pages are reserved up front
/// with `fallocate`, so a shortfall is an error here rather than a `SIGBUS` later.
class SharedRing {
 public:
  SharedRing(std::size_t slots, std::size_t slot_bytes, std::size_t control_bytes)
      : slots_(slots), slot_bytes_(slot_bytes), control_bytes_(control_bytes) {
    const std::optional<std::size_t> total = checked_size(slots, slot_bytes, control_bytes);
    if (!total || *total > static_cast<std::size_t>(std::numeric_limits<off_t>::max())) {
      throw WorkerError("sequence adapter: " + std::to_string(slots) + " slots of " +
                        std::to_string(slot_bytes) + " bytes overflow the address space");
    }
    total_ = *total;
    const auto needed = [&] {
      return std::to_string(total_) + " bytes of shared memory (" + std::to_string(slots) +
             " slots of " + std::to_string(slot_bytes) + " bytes)";
    };
    if (const auto available = available_memory(); available && total_ > *available) {
      throw WorkerError("sequence adapter: the batch ring needs " + needed() + " but only " +
                        std::to_string(*available) +
                        " bytes are available; lower max_queue_size or slot_bytes");
    }
    fd_ = ::memfd_create("loadstar-batch-ring", MFD_CLOEXEC);
    if (fd_ < 0) fail("create", needed());
    if (::ftruncate(fd_, static_cast<off_t>(total_)) != 0) fail("size", needed());
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(total_)) != 0) fail("reserve", needed());
    void* base = ::mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) fail("map", needed());
    base_ = static_cast<std::byte*>(base);
  }

  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  ~SharedRing() {
    if (base_) ::munmap(base_, total_);
    if (fd_ >= 0) ::close(fd_);
  }

  std::byte* control() const noexcept { return base_; }
  /// Maps the slots a second time, at another address (the same memory): a worker process builds
  /// tensors in place there, and can give one it keeps pages of its own without touching the
  /// mapping it writes slots through. Null when it cannot be mapped.
  std::byte* map_mirror() const noexcept {
    void* mirror = ::mmap(nullptr, total_ - control_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                          static_cast<off_t>(control_bytes_));
    return mirror == MAP_FAILED ? nullptr : static_cast<std::byte*>(mirror);
  }
  /// The bytes of all slots.
  std::size_t slots_bytes() const noexcept { return total_ - control_bytes_; }
  std::byte* slot(std::uint64_t position) const noexcept {
    return base_ + control_bytes_ + (position % slots_) * slot_bytes_;
  }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }

 private:
  [[noreturn]] void fail(const char* what, const std::string& needed) {
    const int error = errno;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    throw WorkerError(std::string("sequence adapter: cannot ") + what + " " + needed + ": " +
                      std::strerror(error));
  }

  std::size_t slots_;
  std::size_t slot_bytes_;
  std::size_t control_bytes_;
  std::size_t total_ = 0;
  int fd_ = -1;
  std::byte* base_ = nullptr;
};

/// The ring and which of its slots the consumer's batches still view. Batches read from a slot are
/// views of it (no copy out of shared memory); the slot is not given to a worker again until the
/// last view is gone. Shared by those views, so they may outlive the adapter.
struct RingLeases {
  RingLeases(std::size_t slots, std::size_t slot_bytes, std::size_t control_bytes)
      : ring(slots, slot_bytes, control_bytes), leased(new std::atomic<bool>[slots]) {
    for (std::size_t i = 0; i < slots; ++i)
      leased[i].store(false, std::memory_order_relaxed);
  }
  SharedRing ring;
  std::unique_ptr<std::atomic<bool>[]> leased;
};

/// What the consumer and the children share at the start of the ring. Children claim positions
/// themselves (`next` below `limit`), so a slow batch holds up only the child building it; the
/// consumer moves `limit` as it consumes and never blocks on a child. Every access is sequentially
/// consistent: `generation` and `sleepers` form a Dekker pair (a child announces that it sleeps,
/// then sleeps only while `generation` is unchanged; the consumer bumps `generation`, then wakes
/// if anyone announced), so no wake-up is lost.
struct RingControl {
  /// The next position a child may claim (by compare-and-swap).
  alignas(64) std::atomic<std::uint64_t> next{0};
  /// Positions below it may be claimed.
  alignas(64) std::atomic<std::uint64_t> limit{0};
  /// The futex word children sleep on; bumped whenever `limit` moves.
  std::atomic<std::uint32_t> generation{0};
  std::atomic<std::uint32_t> sleepers{0};
  /// Batches built by the children.
  alignas(64) std::atomic<std::uint64_t> produced{0};
  /// The position the consumer sleeps for (`none`: it does not sleep): the child that publishes
  /// it signals the `eventfd`, and no other does. With `SlotHeader::ready` a Dekker pair.
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  alignas(64) std::atomic<std::uint64_t> waiting_for{none};
};

/// What child `i` is building (`none` when idle), each on its own cache line.
struct alignas(64) ChildWord {
  static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();
  std::atomic<std::uint64_t> building{none};
};

/// The header at the start of every slot; the serialized batch (or an error message) follows at
/// `payload_offset`. A child fills it and then publishes it with `ready` (release).
struct SlotHeader {
  /// The position whose result the slot holds, plus one (0: none yet).
  std::atomic<std::uint64_t> ready{0};
  std::uint64_t bytes = 0;
  std::uint32_t status = 0;
  /// The child that wrote it (for a message sent on that child's socket).
  std::uint32_t writer = 0;
};
inline constexpr std::size_t payload_offset = 64;
static_assert(sizeof(SlotHeader) <= payload_offset);
enum SlotStatus : std::uint32_t {
  slot_ok = 0,
  slot_error = 1,
  slot_overflow = 2,
  /// An error message longer than the slot: it follows on the writer's socket.
  slot_long_error = 3
};

/// `Workers` forked children share the ring's control block and claim positions in order; each
/// publishes a finished slot with a release store and signals an `eventfd` (a counter: writing it
/// never blocks, so no channel can fill up against the consumer). The consumer waits in `poll` on
/// that `eventfd`, on a pidfd per child (a death is seen at once, whatever the others are doing)
/// and on each child's socket, which carries only error messages too long for a slot. It creates
/// no thread, so forking again (at an epoch boundary, to let children see what `on_epoch_end`
/// changed, or to replace a child killed for a timeout) is as safe as the first fork.
template <class S, class Batch>
class ProcessBackend {
 public:
  ProcessBackend(const std::shared_ptr<S>& sequence, Sampler& sampler,
                 const AdapterOptions& options, std::size_t workers, std::uint64_t start,
                 std::uint64_t barrier)
      : sequence_(*sequence),
        sampler_(sampler),
        timeout_(options.timeout),
        queue_(options.max_queue_size),
        end_(sampler.end()),
        consume_(start),
        barrier_(barrier),
        children_(workers),
        consumer_mapped_(options.max_queue_size, false) {
    std::uint64_t first_claim = start;
    std::size_t slot_bytes = options.slot_bytes;
    if (slot_bytes == 0) {
      // Measure the first batch, built here before forking, and keep it as that batch's result.
      slot_bytes = std::size_t{1} << 20U;
      if (auto ticket = sampler_.ticket(start); ticket && start < barrier_) {
        first_.emplace();
        first_->ticket = *ticket;
        try {
          first_->batch.emplace(sequence_[ticket->index]);
          const std::size_t bytes = serialized_size(*first_->batch);
          slot_bytes = checked_size(bytes / 4, 1, bytes + 4096).value_or(bytes);
        } catch (...) {
          first_->error = "sequence adapter: " + describe_batch(*ticket) +
                          " failed in the consumer process: " + current_exception_message();
        }
        ++built_here_;
        first_claim = start + 1;
      }
    }
    // Round up to whole pages (AdapterOptions bounds slot_bytes, so this cannot overflow for a
    // given bound; a measured batch near SIZE_MAX is refused by the ring).
    slot_bytes =
        checked_size(1, slot_bytes, payload_offset + 4095).value_or(slot_bytes) / 4096 * 4096;
    const std::size_t control_bytes =
        (sizeof(RingControl) + workers * sizeof(ChildWord) + 4095) / 4096 * 4096;
    leases_ = std::make_shared<RingLeases>(queue_, slot_bytes, control_bytes);
    ring_ = &leases_->ring;
    control_ = new (ring_->control()) RingControl;
    words_ = reinterpret_cast<ChildWord*>(ring_->control() + sizeof(RingControl));
    for (std::size_t c = 0; c < workers; ++c)
      new (words_ + c) ChildWord;
    for (std::size_t i = 0; i < queue_; ++i)
      new (ring_->slot(i)) SlotHeader;
    control_->next.store(first_claim);
    control_->limit.store(first_claim);
    event_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (event_fd_ < 0) {
      throw WorkerError(std::string("sequence adapter: cannot create an eventfd: ") +
                        std::strerror(errno));
    }
    try {
      for (std::size_t c = 0; c < children_.size(); ++c)
        spawn(c);
    } catch (...) {
      // A fork that failed part-way: leave no child behind.
      reap_all();
      ::close(event_fd_);
      throw;
    }
    pump();
  }

  ProcessBackend(const ProcessBackend&) = delete;
  ProcessBackend& operator=(const ProcessBackend&) = delete;

  /// Kills and reaps every child at once (they hold nothing that needs an orderly exit: the ring
  /// is released by the kernel with the last mapping), so destruction is prompt even when a
  /// child is stuck in `sequence[i]`.
  ~ProcessBackend() {
    reap_all();
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  /// The batch at `position`, or the error that took its place (a failure, or the per-batch
  /// timeout, after which the child stuck in it is killed and replaced); throws `WorkerError`
  /// once a child has died.
  BackendResult<Batch> take(std::uint64_t position) {
    if (!broken_.empty()) throw WorkerError(broken_);
    if (first_ && first_->ticket.position == position) {
      BackendResult<Batch> result = std::move(*first_);
      first_.reset();
      consume_ = position + 1;
      pump();
      return result;
    }
    pump();
    if (position >= control_->next.load() &&
        (control_->limit.load() <= position || live_children() == 0)) {
      // No child can take it (the consumer still views its slot): build it here. Claiming it
      // keeps every child off it.
      std::uint64_t expected = position;
      if (control_->next.compare_exchange_strong(expected, position + 1)) {
        return build_here(position);
      }
    }
    if (std::optional<std::string> timed_out = wait_for(position)) {
      BackendResult<Batch> result;
      result.ticket = *sampler_.ticket(position);
      result.error = std::move(*timed_out);
      consume_ = position + 1;
      pump();
      return result;
    }
    BackendResult<Batch> result = read_slot(position);
    consume_ = position + 1;
    pump();
    return result;
  }

  /// After `on_epoch_end` ran in the consumer: replaces the children by fresh forks that see the
  /// sequence as it is now, and moves the barrier.
  void resume(std::uint64_t barrier) {
    barrier_ = barrier;
    if (consume_ >= end_) return;
    reap_all();
    control_->next.store(consume_);
    control_->limit.store(consume_);
    for (std::size_t c = 0; c < children_.size(); ++c)
      spawn(c);
    pump();
  }

  /// Nothing to wait for: a child stuck in a batch is killed, never left running.
  void settle() noexcept {}

  std::uint64_t produced() const noexcept { return control_->produced.load() + built_here_; }
  std::chrono::nanoseconds waited() const noexcept { return waited_; }
  std::size_t occupancy() const noexcept {
    std::size_t ready = 0;
    const std::uint64_t next = control_->next.load();
    for (std::uint64_t p = consume_; p < next && p < consume_ + queue_; ++p)
      ready += header(p).ready.load(std::memory_order_acquire) == p + 1;
    return ready;
  }

 private:
  struct Child {
    pid_t pid = -1;
    int pidfd = -1;
    int message_fd = -1;
    std::string inbox;  // bytes of long messages received but not yet framed
  };

  std::size_t capacity() const noexcept { return ring_->slot_bytes() - payload_offset; }

  SlotHeader& header(std::uint64_t position) const noexcept {
    return *std::launder(reinterpret_cast<SlotHeader*>(ring_->slot(position)));
  }

  bool leased(std::uint64_t position) const noexcept {
    return leases_->leased[position % queue_].load(std::memory_order_acquire);
  }

  std::size_t live_children() const noexcept {
    return static_cast<std::size_t>(std::count_if(children_.begin(), children_.end(),
                                                  [](const Child& c) { return c.pid > 0; }));
  }

  /// The consumer still holds a batch viewing the slot of `position`, so no worker can write it:
  /// build the batch here rather than wait for a release that may never come.
  BackendResult<Batch> build_here(std::uint64_t position) {
    BackendResult<Batch> result;
    result.ticket = *sampler_.ticket(position);
    try {
      result.batch.emplace(sequence_[result.ticket.index]);
    } catch (...) {
      result.error = "sequence adapter: " + describe_batch(result.ticket) +
                     " failed in the consumer process: " + current_exception_message();
    }
    ++built_here_;
    consume_ = position + 1;
    pump();
    return result;
  }

  /// Maps the pages of a slot into this process in one system call: a fork does not carry the
  /// page tables of a shared mapping, and faulting them in one at a time costs about 20 us a page
  /// in a virtual machine (a second for a ring of 190 MB, against 20 ms populated).
  /// A child with a mirror writes the batch through it and only the header through the slot
  /// itself, so it maps the slot's first page and the mirror's whole slot.
  void populate_slot(std::uint64_t position) const noexcept {
#ifdef MADV_POPULATE_WRITE
    const std::size_t page = 4096;
    (void)::madvise(ring_->slot(position), mirror_ ? page : ring_->slot_bytes(),
                    MADV_POPULATE_WRITE);
    if (mirror_) (void)::madvise(mirror_slot(position), ring_->slot_bytes(), MADV_POPULATE_WRITE);
#else
    (void)position;
#endif
  }

  BackendResult<Batch> read_slot(std::uint64_t position) {
    if (!consumer_mapped_[position % queue_]) {
      consumer_mapped_[position % queue_] = true;
      populate_slot(position);
    }
    const SlotHeader& h = header(position);
    const std::byte* payload_begin = ring_->slot(position) + payload_offset;
    const std::size_t slot_index = position % queue_;
    BackendResult<Batch> result;
    result.ticket = *sampler_.ticket(position);
    if (h.status == slot_ok) {
      // The whole payload: tensors built in place lie past the `h.bytes` serialized in front.
      const std::span<const std::byte> payload(payload_begin, capacity());
      try {
        // The batch's tensors view the slot; releasing the last of them frees the slot.
        leases_->leased[slot_index].store(true, std::memory_order_relaxed);
        std::shared_ptr<void> lease(
            static_cast<void*>(leases_.get()), [leases = leases_, slot_index](void*) {
              leases->leased[slot_index].store(false, std::memory_order_release);
            });
        result.batch.emplace(deserialize<Batch>(payload, std::move(lease)));
      } catch (...) {
        result.error = "sequence adapter: " + describe_batch(result.ticket) +
                       " could not be read back: " + current_exception_message();
      }
    } else if (h.status == slot_overflow) {
      result.error = "sequence adapter: " + describe_batch(result.ticket) + " needs " +
                     std::to_string(h.bytes) + " bytes but a shared-memory slot holds " +
                     std::to_string(capacity()) + "; raise AdapterOptions::slot_bytes";
    } else if (h.status == slot_long_error) {
      // The child sent the whole message before publishing the slot: it is in its socket.
      for (auto& child : children_)
        drain(child);
      if (auto found = long_messages_.find(position); found != long_messages_.end()) {
        result.error = std::move(found->second);
        long_messages_.erase(found);
      } else {
        result.error = "sequence adapter: " + describe_batch(result.ticket) +
                       " failed in a worker process with a message of " + std::to_string(h.bytes) +
                       " bytes that was lost";
      }
    } else {
      result.error.assign(reinterpret_cast<const char*>(payload_begin),
                          std::min<std::size_t>(h.bytes, capacity()));
    }
    return result;
  }

  void spawn(std::size_t index) {
    loadstar::detail::require_fork_allowed("sequence adapter");
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
      throw WorkerError(std::string("sequence adapter: cannot create a socket pair: ") +
                        std::strerror(errno));
    }
    words_[index].building.store(ChildWord::none);
    std::fflush(nullptr);  // nothing buffered is written twice (children never flush anyway)
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int error = errno;
      ::close(fds[0]);
      ::close(fds[1]);
      throw WorkerError("sequence adapter: cannot fork worker " + std::to_string(index) + ": " +
                        std::strerror(error));
    }
    if (pid == 0) {
      ::close(fds[1]);
      for (const auto& c : children_) {
        if (c.pidfd >= 0) ::close(c.pidfd);
        if (c.message_fd >= 0) ::close(c.message_fd);
      }
      child_main(parent, index, fds[0]);  // never returns
    }
    ::close(fds[0]);
    Child& child = children_[index];
    child = Child{};
    child.pid = pid;
    child.pidfd = open_pidfd(pid);
    child.message_fd = fds[1];
  }

  [[noreturn]] void child_main(pid_t parent, std::size_t index, int message_fd) noexcept {
    // Die with the consumer, whatever kills it (the check closes the race with an early death).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    // Blocks inherited from the parent's tensor cache would be copied page by page on first
    // write; fresh ones are populated in one call.
    StorageCache::instance().drop_all();
    // Large tensors of a batch are built in place in its slot, through the mirror, so the batch is
    // not copied into the slot afterwards (the copy that kept processes below half of memcpy's
    // bandwidth on large batches).
    mirror_ = ring_->map_mirror();
    if (mirror_) StorageCache::instance().set_arena_range(mirror_, mirror_ + ring_->slots_bytes());
    child_mapped_.assign(queue_, false);
    RingControl& control = *control_;
    std::atomic<std::uint64_t>& building = words_[index].building;
    for (;;) {
      const std::uint32_t generation = control.generation.load();
      std::uint64_t position = control.next.load();
      if (position >= control.limit.load()) {
        control.sleepers.fetch_add(1);
        futex_wait(control.generation, generation);
        control.sleepers.fetch_sub(1);
        continue;
      }
      if (!control.next.compare_exchange_weak(position, position + 1)) continue;
      building.store(position);
      if (!child_mapped_[position % queue_]) {
        child_mapped_[position % queue_] = true;
        populate_slot(position);
      }
      build(position, static_cast<std::uint32_t>(index), message_fd);
      building.store(ChildWord::none);
      control.produced.fetch_add(1);
      // A system call only when the consumer sleeps for this very batch.
      if (control.waiting_for.load() == position) {
        const std::uint64_t one = 1;
        // Never blocks (a counter); a failure only costs the consumer a later look at the slot.
        (void)!::write(event_fd_, &one, sizeof one);
      }
    }
  }

  /// Builds `position` into its slot (in a child) and publishes it. Large tensors are built in
  /// place at the top of the slot (through the mirror, see `BlockArena`) and serialized as
  /// references; the rest is serialized below them.
  void build(std::uint64_t position, std::uint32_t index, int message_fd) noexcept {
    SlotHeader& h = header(position);
    std::byte* payload = ring_->slot(position) + payload_offset;
    std::byte* mirror = mirror_ ? mirror_slot(position) + payload_offset : nullptr;
    std::uint32_t status = slot_ok;
    std::uint64_t bytes = 0;
    std::optional<BlockArena> arena;
    if (mirror) arena.emplace(mirror, mirror + capacity());
    try {
      const SamplerTicket ticket = *sampler_.ticket(position);
      try {
        std::optional<BlockArena::Scope> scope;
        if (arena) scope.emplace(*arena);
        std::optional<Batch> batch;
        batch.emplace(sequence_[ticket.index]);
        if (arena) arena->seal();
        const std::size_t room =
            arena ? static_cast<std::size_t>(arena->low() - mirror) : capacity();
        ByteWriter writer(mirror ? mirror : payload, room, mirror, capacity());
        Serializer<Batch>::write(*batch, writer);
        bytes = writer.written();
        if (writer.overflowed()) {
          // What was built in place took the room the rest needs: copy it all out of place.
          bytes = serialized_size(*batch);
          if (bytes > capacity()) {
            status = slot_overflow;
          } else {
            std::vector<std::byte> copy(bytes);
            bytes = serialize(*batch, copy);
            std::memcpy(mirror ? mirror : payload, copy.data(), bytes);
          }
        }
        batch.reset();  // with the arena installed, so that it sees its blocks freed
      } catch (...) {
        const std::string message = "sequence adapter: " + describe_batch(ticket) +
                                    " failed in worker process " + std::to_string(::getpid()) +
                                    ": " + current_exception_message();
        bytes = message.size();
        if (bytes <= capacity()) {
          status = slot_error;
          std::memcpy(payload, message.data(), bytes);
        } else {
          // Whole, as threads deliver it: sent before the slot is published. The consumer drains
          // the socket while it waits, so a message larger than the socket buffer cannot block
          // this child for good.
          status = slot_long_error;
          const std::uint64_t frame[2] = {position, bytes};
          if (!send_all(message_fd, frame, sizeof frame) ||
              !send_all(message_fd, message.data(), message.size())) {
            ::_exit(1);
          }
        }
      }
    } catch (...) {
      const char message[] = "sequence adapter: a batch failed in a worker process";
      status = slot_error;
      bytes = sizeof message - 1;
      std::memcpy(payload, message, bytes);
    }
    if (arena && arena->live() > 0) keep_private(*arena);
    h.bytes = bytes;
    h.status = status;
    h.writer = index;
    h.ready.store(position + 1);
  }

  /// The sequence kept tensors built in the slot (a cache of batches, say): the next batch in this
  /// slot would change them under it, and it would change what the consumer reads. Gives their
  /// pages of the mirror private copies, so the sequence keeps its values and the slot is the
  /// consumer's alone, and builds no more batches in place in this process (the mirror now has
  /// private pages). One copy of those tensors, once.
  void keep_private(const BlockArena& arena) noexcept {
    for (std::size_t i = 0; i < arena.count(); ++i) {
      const BlockArena::Block& block = arena.blocks()[i];
      if (!block.live) continue;
      // Out of memory here ends this process, which the consumer reports.
      const std::unique_ptr<std::byte[]> copy(new (std::nothrow) std::byte[block.bytes]);
      if (!copy) ::_exit(1);
      std::memcpy(copy.get(), block.memory, block.bytes);
      if (::mmap(block.memory, block.bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        ::_exit(1);
      }
      std::memcpy(block.memory, copy.get(), block.bytes);
    }
    mirror_ = nullptr;
    // Batches are now written through the slots themselves, whose pages were mapped one at most.
    child_mapped_.assign(queue_, false);
  }

  std::byte* mirror_slot(std::uint64_t position) const noexcept {
    return mirror_ + (position % queue_) * ring_->slot_bytes();
  }

  /// Lets the children claim every position that may be requested: below `consume_ +
  /// max_queue_size`, the end and the barrier, and short of a slot the consumer still views.
  /// Children asleep on a full ring are woken when every live child sleeps and half of the ring
  /// is free, or at once with `wake_now` (the consumer is about to wait): waking them after every
  /// batch cost a system call per batch, and woke every child to race for one slot.
  void pump(bool wake_now = false) {
    std::uint64_t limit = control_->limit.load();
    const std::uint64_t from = limit;
    while (limit < consume_ + queue_ && limit < end_ && limit < barrier_ && !leased(limit))
      ++limit;
    if (limit != from) {
      control_->limit.store(limit);
      control_->generation.fetch_add(1);
    }
    const std::uint32_t sleepers = control_->sleepers.load();
    if (sleepers == 0) return;
    if (!wake_now && sleepers < live_children()) return;
    const std::uint64_t next = control_->next.load();
    if (next >= limit) return;
    if (wake_now || limit - next >= (queue_ + 1) / 2) futex_wake_all(control_->generation);
  }

  /// Waits until the slot of `position` is published; returns the timeout's message when it
  /// passes first (the child building the batch is then killed and replaced), and throws
  /// `WorkerError` when a child dies.
  std::optional<std::string> wait_for(std::uint64_t position) {
    const auto started = std::chrono::steady_clock::now();
    const SlotHeader& h = header(position);
    if (h.ready.load(std::memory_order_acquire) == position + 1) return std::nullopt;
    pump(true);
    control_->waiting_for.store(position);
    struct Announced {
      RingControl& control;
      ~Announced() { control.waiting_for.store(RingControl::none); }
    } announced{*control_};
    std::vector<pollfd> fds;
    while (h.ready.load() != position + 1) {
      int wait_ms = -1;
      if (timeout_.count() > 0) {
        const auto left = timeout_ - (std::chrono::steady_clock::now() - started);
        if (left.count() <= 0) {
          if (std::optional<std::string> message = on_timeout(position)) {
            waited_ += std::chrono::steady_clock::now() - started;
            return message;
          }
          continue;  // it arrived after all
        }
        wait_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
      }
      fds.clear();
      fds.push_back({event_fd_, POLLIN, 0});
      bool without_pidfd = false;
      for (const auto& c : children_) {
        if (c.pid <= 0) continue;
        fds.push_back({c.pidfd, POLLIN, 0});  // -1 is ignored by poll
        fds.push_back({c.message_fd, POLLIN, 0});
        without_pidfd = without_pidfd || c.pidfd < 0;
      }
      // Without pidfds (Linux before 5.3), deaths are found by polling waitpid every 10 ms.
      if (without_pidfd && (wait_ms < 0 || wait_ms > 10)) wait_ms = 10;
      if (::poll(fds.data(), fds.size(), wait_ms) < 0 && errno != EINTR) {
        throw WorkerError(std::string("sequence adapter: cannot wait for the workers: ") +
                          std::strerror(errno));
      }
      std::uint64_t count = 0;
      if (fds[0].revents != 0) (void)!::read(event_fd_, &count, sizeof count);
      for (auto& child : children_)
        drain(child);
      // A batch that is here is delivered before a death is reported.
      if (h.ready.load(std::memory_order_acquire) == position + 1) break;
      for (std::size_t c = 0; c < children_.size(); ++c) {
        if (children_[c].pid <= 0) continue;
        int status = 0;
        if (::waitpid(children_[c].pid, &status, WNOHANG) == children_[c].pid) died(c, status);
      }
    }
    waited_ += std::chrono::steady_clock::now() - started;
    return std::nullopt;
  }

  /// The timeout passed for `position`: gives it up. A child that is building it is killed and
  /// replaced; to know which one without racing it, every child is stopped while the consumer
  /// looks. Returns nothing when the batch turned out to be ready.
  std::optional<std::string> on_timeout(std::uint64_t position) {
    const std::string lead = "sequence adapter: " + describe_batch(*sampler_.ticket(position)) +
                             " was not ready after " + std::to_string(timeout_.count()) +
                             " ms (per-batch timeout); ";
    std::uint64_t expected = position;
    if (control_->next.compare_exchange_strong(expected, position + 1)) {
      return lead + "no worker process had started it";
    }
    for (;;) {
      for_each_child([](pid_t pid) { ::kill(pid, SIGSTOP); });
      for (std::size_t c = 0; c < children_.size(); ++c) {
        if (children_[c].pid <= 0) continue;
        int status = 0;
        while (::waitpid(children_[c].pid, &status, WUNTRACED) < 0 && errno == EINTR) {
        }
        if (!WIFSTOPPED(status)) {
          for_each_child([](pid_t pid) { ::kill(pid, SIGCONT); });
          died(c, status);
        }
      }
      const bool arrived = header(position).ready.load(std::memory_order_acquire) == position + 1;
      std::size_t stuck = children_.size();
      for (std::size_t c = 0; c < children_.size() && !arrived; ++c) {
        if (children_[c].pid > 0 && words_[c].building.load() == position) stuck = c;
      }
      if (stuck != children_.size()) {
        const pid_t pid = children_[stuck].pid;
        ::kill(pid, SIGKILL);
        for_each_child([](pid_t other) { ::kill(other, SIGCONT); });
        bury(children_[stuck]);
        spawn(stuck);
        return lead + "worker process " + std::to_string(pid) + " building it was killed";
      }
      for_each_child([](pid_t pid) { ::kill(pid, SIGCONT); });
      if (arrived) return std::nullopt;
      // A child claimed it but was stopped before recording it: let it record it.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  template <class F>
  void for_each_child(F f) {
    for (const auto& c : children_) {
      if (c.pid > 0) f(c.pid);
    }
  }

  /// Child `c` has exited with `status`: marks the adapter broken and throws `WorkerError` naming
  /// its pid, how it died and the batch it was building.
  [[noreturn]] void died(std::size_t c, int status) {
    const pid_t pid = children_[c].pid;
    drain(children_[c]);
    children_[c].pid = -1;
    std::string how = WIFSIGNALED(status)
                          ? "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                signal_name(WTERMSIG(status)) + ")"
                          : "exited with status " + std::to_string(WEXITSTATUS(status));
    std::string batch = "while idle";
    const std::uint64_t building = words_[c].building.load();
    if (building != ChildWord::none) {
      batch = "while building " + describe_batch(*sampler_.ticket(building));
    }
    broken_ = "sequence adapter: worker process " + std::to_string(pid) + " " + how + " " + batch;
    throw WorkerError(broken_);
  }

  /// Reads what a child has sent of its long messages, without blocking, and files each whole
  /// one under its position.
  void drain(Child& child) {
    if (child.message_fd < 0) return;
    char buffer[65536];
    for (;;) {
      const ssize_t n = ::recv(child.message_fd, buffer, sizeof buffer, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      child.inbox.append(buffer, static_cast<std::size_t>(n));
    }
    std::uint64_t frame[2];
    while (child.inbox.size() >= sizeof frame) {
      std::memcpy(frame, child.inbox.data(), sizeof frame);
      if (child.inbox.size() - sizeof frame < frame[1]) break;
      long_messages_[frame[0]] = child.inbox.substr(sizeof frame, frame[1]);
      child.inbox.erase(0, sizeof frame + frame[1]);
    }
  }

  /// Reaps a child that was sent `SIGKILL` and closes its descriptors.
  void bury(Child& child) noexcept {
    while (::waitpid(child.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    try {
      drain(child);
    } catch (...) {
      // Only its long messages are lost.
    }
    if (child.pidfd >= 0) ::close(child.pidfd);
    if (child.message_fd >= 0) ::close(child.message_fd);
    child = Child{};
  }

  void reap_all() noexcept {
    for_each_child([](pid_t pid) { ::kill(pid, SIGKILL); });
    for (auto& c : children_) {
      if (c.pid > 0) {
        bury(c);
      } else {
        if (c.pidfd >= 0) ::close(c.pidfd);
        if (c.message_fd >= 0) ::close(c.message_fd);
        c = Child{};
      }
    }
  }

  const S& sequence_;
  Sampler& sampler_;
  std::chrono::milliseconds timeout_;
  std::size_t queue_;
  std::uint64_t end_;
  std::uint64_t consume_;
  std::uint64_t barrier_;
  std::shared_ptr<RingLeases> leases_;
  SharedRing* ring_ = nullptr;
  RingControl* control_ = nullptr;
  ChildWord* words_ = nullptr;
  /// In a child: the slots' second mapping that tensors are built in (null: none, or given up).
  std::byte* mirror_ = nullptr;
  std::optional<BackendResult<Batch>> first_;
  std::vector<Child> children_;
  std::vector<bool> consumer_mapped_;
  /// In a child: the slots whose pages it has mapped.
  std::vector<bool> child_mapped_;
  std::map<std::uint64_t, std::string> long_messages_;
  int event_fd_ = -1;
  std::string broken_;
  std::uint64_t built_here_ = 0;
  std::chrono::nanoseconds waited_{0};
};

}  // namespace loadstar::detail
