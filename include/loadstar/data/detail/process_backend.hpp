/// \file
/// The process backend of `SequenceAdapter`: forked workers write serialized batches into a
/// preallocated shared-memory ring; the consumer reads them back strictly in order.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/detail/adapter_common.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"

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

/// Writes all of `bytes`, retrying on `EINTR`; false on any other failure.
inline bool write_all(int fd, const void* data, std::size_t bytes) noexcept {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

/// Sends all of `bytes` on a socket without raising `SIGPIPE` when the peer is gone (a dead
/// child is reported by `waitpid`, not by killing the consumer); false on failure.
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

/// Reads all of `bytes`, retrying on `EINTR`; false at end of file or on failure.
inline bool read_all(int fd, void* data, std::size_t bytes) noexcept {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::read(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
  return true;
}

/// A shared anonymous file (`memfd_create`) mapped `MAP_SHARED`: it has no name in `/dev/shm`,
/// so nothing is left behind even when every process is killed, and it is not bound by the size
/// of `/dev/shm` (Docker's 64 MB, the cause of PyTorch's bus errors). Its pages are reserved up
/// front with `fallocate`, so a shortfall is an error here rather than a `SIGBUS` later.
class SharedRing {
 public:
  SharedRing(std::size_t slots, std::size_t slot_bytes) : slots_(slots), slot_bytes_(slot_bytes) {
    const std::size_t total = slots * slot_bytes;
    const auto needed = [&] {
      return std::to_string(total) + " bytes of shared memory (" + std::to_string(slots) +
             " slots of " + std::to_string(slot_bytes) + " bytes)";
    };
    if (slot_bytes != 0 && total / slot_bytes != slots) {
      throw WorkerError("sequence adapter: " + std::to_string(slots) + " slots of " +
                        std::to_string(slot_bytes) + " bytes overflow the address space");
    }
    if (const auto available = available_memory(); available && total > *available) {
      throw WorkerError("sequence adapter: the batch ring needs " + needed() + " but only " +
                        std::to_string(*available) +
                        " bytes are available; lower max_queue_size or slot_bytes");
    }
    fd_ = ::memfd_create("loadstar-batch-ring", MFD_CLOEXEC);
    if (fd_ < 0) fail("create", needed());
    if (::ftruncate(fd_, static_cast<off_t>(total)) != 0) fail("size", needed());
    if (::fallocate(fd_, 0, 0, static_cast<off_t>(total)) != 0) fail("reserve", needed());
    void* base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) fail("map", needed());
    base_ = static_cast<std::byte*>(base);
  }

  SharedRing(const SharedRing&) = delete;
  SharedRing& operator=(const SharedRing&) = delete;

  ~SharedRing() {
    if (base_) ::munmap(base_, slots_ * slot_bytes_);
    if (fd_ >= 0) ::close(fd_);
  }

  std::byte* slot(std::uint64_t position) const noexcept {
    return base_ + (position % slots_) * slot_bytes_;
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
  int fd_ = -1;
  std::byte* base_ = nullptr;
};

/// The ring and which of its slots the consumer's batches still view. Batches read from a slot are
/// views of it (no copy out of shared memory); the slot is not given to a worker again until the
/// last view is gone. Shared by those views, so they may outlive the adapter.
struct RingLeases {
  RingLeases(std::size_t slots, std::size_t slot_bytes)
      : ring(slots, slot_bytes), leased(new std::atomic<bool>[slots]) {
    for (std::size_t i = 0; i < slots; ++i)
      leased[i].store(false, std::memory_order_relaxed);
  }
  SharedRing ring;
  std::unique_ptr<std::atomic<bool>[]> leased;
};

/// The header at the start of every slot; the serialized batch (or an error message) follows at
/// `payload_offset`.
struct SlotHeader {
  std::uint64_t position;
  std::uint64_t bytes;
  std::uint32_t status;
};
inline constexpr std::size_t payload_offset = 64;
enum SlotStatus : std::uint32_t { slot_ok = 0, slot_error = 1, slot_overflow = 2 };

/// A task sent to a child through its pipe.
struct Task {
  std::uint64_t position;
  std::uint64_t epoch;
  std::uint64_t index;
};

/// `Workers` forked children, each with a task socket; one shared pipe carries "position done"
/// messages back (8 bytes, below `PIPE_BUF`, so writes from several children never interleave).
/// The consumer assigns positions round-robin, waits with `poll` in steps of at most 100 ms and
/// checks its children with `waitpid(WNOHANG)` at each step, so a child killed by a signal is
/// reported well within a second. The backend creates no thread, so forking again at an epoch
/// boundary (to let children see what `on_epoch_end` changed) is as safe as the first fork.
template <class S, class Batch>
class ProcessBackend {
 public:
  ProcessBackend(const S& sequence, Sampler& sampler, const AdapterOptions& options,
                 std::size_t workers, std::uint64_t start, std::uint64_t barrier)
      : sequence_(sequence),
        sampler_(sampler),
        timeout_(options.timeout),
        queue_(options.max_queue_size),
        end_(sampler.end()),
        dispatch_(start),
        consume_(start),
        barrier_(barrier),
        workers_(workers),
        arrived_(options.max_queue_size, false),
        owner_(options.max_queue_size, 0) {
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
          slot_bytes = bytes + bytes / 4 + 4096;
        } catch (...) {
          first_->error = "sequence adapter: " + describe_batch(*ticket) +
                          " failed in the consumer process: " + current_exception_message();
        }
        ++produced_;
        ++dispatch_;
      }
    }
    slot_bytes = (payload_offset + slot_bytes + 4095) / 4096 * 4096;
    leases_ = std::make_shared<RingLeases>(queue_, slot_bytes);
    ring_ = &leases_->ring;
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      throw WorkerError(std::string("sequence adapter: cannot create a pipe: ") +
                        std::strerror(errno));
    }
    done_read_ = fds[0];
    done_write_ = fds[1];
    try {
      spawn();
    } catch (...) {
      // A fork that failed part-way: leave no child behind.
      reap_all();
      ::close(done_read_);
      ::close(done_write_);
      throw;
    }
  }

  ProcessBackend(const ProcessBackend&) = delete;
  ProcessBackend& operator=(const ProcessBackend&) = delete;

  /// Kills and reaps every child at once (they hold nothing that needs an orderly exit: the ring
  /// is released by the kernel with the last mapping), so destruction is prompt even when a
  /// child is stuck in `sequence[i]`.
  ~ProcessBackend() {
    reap_all();
    if (done_read_ >= 0) ::close(done_read_);
    if (done_write_ >= 0) ::close(done_write_);
  }

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
    if (position >= dispatch_) return build_here(position);
    const std::size_t slot_index = position % queue_;
    if (!arrived_[slot_index]) wait_for(position);
    arrived_[slot_index] = false;
    --ready_;
    const std::byte* slot = ring_->slot(position);
    SlotHeader header;
    std::memcpy(&header, slot, sizeof header);
    BackendResult<Batch> result;
    result.ticket = *sampler_.ticket(position);
    const std::span<const std::byte> payload(slot + payload_offset,
                                             std::min<std::size_t>(header.bytes, capacity()));
    if (header.status == slot_ok) {
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
    } else if (header.status == slot_overflow) {
      result.error = "sequence adapter: " + describe_batch(result.ticket) + " needs " +
                     std::to_string(header.bytes) + " bytes but a shared-memory slot holds " +
                     std::to_string(capacity()) + "; raise AdapterOptions::slot_bytes";
    } else {
      result.error.assign(reinterpret_cast<const char*>(payload.data()), payload.size());
    }
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
    spawn();
    pump();
  }

  std::uint64_t produced() const noexcept { return produced_; }
  std::chrono::nanoseconds waited() const noexcept { return waited_; }
  std::size_t occupancy() const noexcept { return ready_; }

 private:
  std::size_t capacity() const noexcept { return ring_->slot_bytes() - payload_offset; }

  bool leased(std::uint64_t position) const noexcept {
    return leases_->leased[position % queue_].load(std::memory_order_acquire);
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
    ++produced_;
    dispatch_ = position + 1;
    consume_ = position + 1;
    pump();
    return result;
  }

  void spawn() {
    children_.clear();
    std::fflush(nullptr);  // nothing buffered is written twice (children never flush anyway)
    const pid_t parent = ::getpid();
    for (std::size_t w = 0; w < workers_; ++w) {
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) {
        throw WorkerError(std::string("sequence adapter: cannot create a socket pair: ") +
                          std::strerror(errno));
      }
      const pid_t pid = ::fork();
      if (pid < 0) {
        const int error = errno;
        ::close(fds[0]);
        ::close(fds[1]);
        throw WorkerError("sequence adapter: cannot fork worker " + std::to_string(w) + ": " +
                          std::strerror(error));
      }
      if (pid == 0) {
        ::close(fds[1]);
        for (const auto& c : children_)
          ::close(c.task_fd);
        ::close(done_read_);
        child_main(parent, fds[0]);  // never returns
      }
      ::close(fds[0]);
      children_.push_back({pid, fds[1]});
    }
  }

  [[noreturn]] void child_main(pid_t parent, int task_fd) noexcept {
    // Die with the consumer, whatever kills it (the check closes the race with an early death).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(0);
    Task task;
    while (read_all(task_fd, &task, sizeof task)) {
      std::byte* slot = ring_->slot(task.position);
      SlotHeader header{task.position, 0, slot_ok};
      std::byte* payload = slot + payload_offset;
      const SamplerTicket ticket{task.position, task.epoch, static_cast<std::size_t>(task.index),
                                 false};
      try {
        Batch batch = sequence_[ticket.index];
        const std::size_t bytes = serialized_size(batch);
        if (bytes > capacity()) {
          header.status = slot_overflow;
          header.bytes = bytes;
        } else {
          header.bytes = serialize(batch, std::span<std::byte>(payload, capacity()));
        }
      } catch (...) {
        std::string message;
        try {
          message = "sequence adapter: " + describe_batch(ticket) + " failed in worker process " +
                    std::to_string(::getpid()) + ": " + current_exception_message();
        } catch (...) {
          message = "sequence adapter: a batch failed in a worker process";
        }
        header.status = slot_error;
        header.bytes = std::min(message.size(), capacity());
        std::memcpy(payload, message.data(), header.bytes);
      }
      std::memcpy(slot, &header, sizeof header);
      // The pipe write, a system call, orders the slot's bytes before the consumer's read of
      // them (the kernel's pipe buffer is the synchronisation point): no fence is needed.
      if (!write_all(done_write_, &task.position, sizeof task.position)) break;
    }
    // Never run the parent's atexit handlers or flush its stdio buffers.
    ::_exit(0);
  }

  /// Sends every claimable position to its child.
  void pump() {
    while (dispatch_ < consume_ + queue_ && dispatch_ < end_ && dispatch_ < barrier_ &&
           !children_.empty() && !leased(dispatch_)) {
      const SamplerTicket ticket = *sampler_.ticket(dispatch_);
      const std::size_t child = static_cast<std::size_t>(dispatch_ % children_.size());
      const Task task{ticket.position, ticket.epoch, ticket.index};
      // A child that died cannot take its task; waiting reports it.
      (void)send_all(children_[child].task_fd, &task, sizeof task);
      owner_[dispatch_ % queue_] = child;
      ++dispatch_;
    }
  }

  void wait_for(std::uint64_t position) {
    const auto started = std::chrono::steady_clock::now();
    const std::size_t slot_index = position % queue_;
    auto last_check = started;
    while (!arrived_[slot_index]) {
      const auto now = std::chrono::steady_clock::now();
      auto step = std::chrono::milliseconds(100);
      if (timeout_.count() > 0) {
        const auto left =
            timeout_ - std::chrono::duration_cast<std::chrono::milliseconds>(now - started);
        if (left.count() <= 0) {
          waited_ += now - started;
          throw WorkerError("sequence adapter: the batch at position " + std::to_string(position) +
                            " was not ready after " + std::to_string(timeout_.count()) +
                            " ms (per-batch timeout)");
        }
        step = std::min(step, left);
      }
      pollfd p{done_read_, POLLIN, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(step.count()));
      if (ready > 0) {
        std::uint64_t done = 0;
        if (read_all(done_read_, &done, sizeof done)) {
          arrived_[done % queue_] = true;
          ++produced_;
          ++ready_;
        }
      }
      const auto after = std::chrono::steady_clock::now();
      if (ready == 0 || after - last_check >= std::chrono::milliseconds(100)) {
        last_check = after;
        check_children(position);
      }
    }
    waited_ += std::chrono::steady_clock::now() - started;
  }

  /// Throws `WorkerError` when a child has exited, naming its pid, how it died and the batch it
  /// was building (the earliest requested one it owned).
  void check_children(std::uint64_t waiting) {
    for (std::size_t c = 0; c < children_.size(); ++c) {
      int status = 0;
      if (::waitpid(children_[c].pid, &status, WNOHANG) != children_[c].pid) continue;
      const pid_t pid = children_[c].pid;
      children_[c].pid = -1;
      std::string how = WIFSIGNALED(status)
                            ? "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                  signal_name(WTERMSIG(status)) + ")"
                            : "exited with status " + std::to_string(WEXITSTATUS(status));
      std::string batch = "while idle";
      for (std::uint64_t p = waiting; p < dispatch_; ++p) {
        if (owner_[p % queue_] == c && !arrived_[p % queue_]) {
          batch = "while building " + describe_batch(*sampler_.ticket(p));
          break;
        }
      }
      broken_ = "sequence adapter: worker process " + std::to_string(pid) + " " + how + " " + batch;
      throw WorkerError(broken_);
    }
  }

  void reap_all() noexcept {
    for (auto& c : children_) {
      if (c.pid > 0) ::kill(c.pid, SIGKILL);
    }
    for (auto& c : children_) {
      if (c.pid > 0) {
        while (::waitpid(c.pid, nullptr, 0) < 0 && errno == EINTR) {
        }
      }
      if (c.task_fd >= 0) ::close(c.task_fd);
    }
    children_.clear();
    // Tasks sent to the killed children are lost: send them again to the next ones.
    for (std::uint64_t p = consume_; p < dispatch_; ++p)
      arrived_[p % queue_] = false;
    ready_ = 0;
    dispatch_ = std::max(consume_, first_ ? first_->ticket.position + 1 : consume_);
    // Drain "done" messages of the killed children.
    pollfd p{done_read_, POLLIN, 0};
    std::uint64_t stale = 0;
    while (done_read_ >= 0 && ::poll(&p, 1, 0) > 0 && read_all(done_read_, &stale, sizeof stale)) {
    }
  }

  struct Child {
    pid_t pid;
    int task_fd;
  };

  const S& sequence_;
  Sampler& sampler_;
  std::chrono::milliseconds timeout_;
  std::size_t queue_;
  std::uint64_t end_;
  std::uint64_t dispatch_;
  std::uint64_t consume_;
  std::uint64_t barrier_;
  std::size_t workers_;
  std::vector<bool> arrived_;
  std::vector<std::size_t> owner_;
  std::shared_ptr<RingLeases> leases_;
  SharedRing* ring_ = nullptr;
  std::optional<BackendResult<Batch>> first_;
  std::vector<Child> children_;
  int done_read_ = -1;
  int done_write_ = -1;
  std::string broken_;
  std::uint64_t produced_ = 0;
  std::chrono::nanoseconds waited_{0};
  std::size_t ready_ = 0;
};

}  // namespace loadstar::detail
