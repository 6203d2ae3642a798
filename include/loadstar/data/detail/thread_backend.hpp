/// \file
/// The thread backend of `SequenceAdapter`: a pool of worker threads filling a fixed ring of
/// slots indexed by position, consumed strictly in order.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loadstar/data/detail/adapter_common.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// `Workers` threads claim positions in order, build them without holding the lock and publish
/// them into slot `position % max_queue_size`. A position is claimable while it is below
/// `consumed + max_queue_size` (backpressure: at most that many batches requested and not
/// consumed), below the end of the stream and below the epoch barrier (so that `on_epoch_end`
/// never runs concurrently with `sequence[i]`). One mutex guards it all: batch rates are far below
/// what a mutex handles, and it keeps the protocol simple to reason about.
template <class S, class Batch>
class ThreadBackend {
 public:
  ThreadBackend(const S& sequence, Sampler& sampler, const AdapterOptions& options,
                std::size_t workers, std::uint64_t start, std::uint64_t barrier)
      : sequence_(sequence),
        sampler_(sampler),
        timeout_(options.timeout),
        slots_(options.max_queue_size),
        end_(sampler.end()),
        dispatch_(start),
        consume_(start),
        barrier_(barrier) {
    workers_.reserve(workers);
    for (std::size_t i = 0; i < workers; ++i) {
      workers_.emplace_back([this](std::stop_token stop) { work(stop); });
    }
  }

  ThreadBackend(const ThreadBackend&) = delete;
  ThreadBackend& operator=(const ThreadBackend&) = delete;

  /// Stops every worker: each returns once its current `sequence[i]` does (user code cannot be
  /// interrupted); waiting workers wake at once.
  ~ThreadBackend() {
    for (auto& w : workers_)
      w.request_stop();
    work_cv_.notify_all();
    for (auto& w : workers_)
      w.join();
  }

  /// Waits for the batch at `position` (the next one in order) and takes it; throws
  /// `WorkerError` when the timeout passes first (the batch stays requested).
  BackendResult<Batch> take(std::uint64_t position) {
    std::unique_lock lock(mutex_);
    Slot& slot = slots_[position % slots_.size()];
    if (!slot.ready || slot.ticket.position != position) {
      const auto started = std::chrono::steady_clock::now();
      waiting_for_ = position;
      const auto ready = [&] { return slot.ready && slot.ticket.position == position; };
      bool arrived = true;
      if (timeout_.count() > 0) {
        arrived = ready_cv_.wait_for(lock, timeout_, ready);
      } else {
        ready_cv_.wait(lock, ready);
      }
      waiting_for_ = no_position;
      wait_ns_.fetch_add(
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - started)
                                         .count()),
          std::memory_order_relaxed);
      if (!arrived) {
        throw WorkerError("sequence adapter: the batch at position " + std::to_string(position) +
                          " was not ready after " + std::to_string(timeout_.count()) +
                          " ms (per-batch timeout)");
      }
    }
    BackendResult<Batch> result{std::move(slot.batch), std::move(slot.error), slot.ticket};
    slot.batch.reset();
    slot.error.clear();
    slot.ready = false;
    consume_ = position + 1;
    ready_count_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    // One slot freed: exactly one more position became claimable.
    work_cv_.notify_one();
    return result;
  }

  /// Moves the epoch barrier after `on_epoch_end` ran on the consumer.
  void resume(std::uint64_t barrier) {
    {
      std::lock_guard lock(mutex_);
      barrier_ = barrier;
    }
    work_cv_.notify_all();
  }

  std::uint64_t produced() const noexcept { return produced_.load(std::memory_order_relaxed); }
  std::chrono::nanoseconds waited() const noexcept {
    return std::chrono::nanoseconds(wait_ns_.load(std::memory_order_relaxed));
  }
  std::size_t occupancy() const noexcept { return ready_count_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint64_t no_position = std::numeric_limits<std::uint64_t>::max();

  struct Slot {
    std::optional<Batch> batch;
    std::string error;
    SamplerTicket ticket;
    bool ready = false;
  };

  bool claimable() const noexcept {
    return dispatch_ < consume_ + slots_.size() && dispatch_ < end_ && dispatch_ < barrier_;
  }

  void work(std::stop_token stop) {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (!work_cv_.wait(lock, stop, [&] { return claimable(); })) return;
      // The sampler caches permutations and is used only under the lock.
      const SamplerTicket ticket = *sampler_.ticket(dispatch_++);
      lock.unlock();
      std::optional<Batch> batch;
      std::string error;
      try {
        batch.emplace(sequence_[ticket.index]);
      } catch (...) {
        error = "sequence adapter: " + describe_batch(ticket) +
                " failed in a worker thread: " + current_exception_message();
      }
      lock.lock();
      Slot& slot = slots_[ticket.position % slots_.size()];
      slot.batch = std::move(batch);
      slot.error = std::move(error);
      slot.ticket = ticket;
      slot.ready = true;
      produced_.fetch_add(1, std::memory_order_relaxed);
      ready_count_.fetch_add(1, std::memory_order_relaxed);
      if (waiting_for_ == ticket.position) ready_cv_.notify_one();
    }
  }

  const S& sequence_;
  Sampler& sampler_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable_any work_cv_;
  std::condition_variable ready_cv_;
  std::vector<Slot> slots_;
  std::uint64_t end_;
  std::uint64_t dispatch_;
  std::uint64_t consume_;
  std::uint64_t barrier_;
  std::uint64_t waiting_for_ = no_position;
  std::atomic<std::uint64_t> produced_{0};
  std::atomic<std::uint64_t> wait_ns_{0};
  std::atomic<std::size_t> ready_count_{0};
  // Last, so that the threads are gone before anything they use is destroyed.
  std::vector<std::jthread> workers_;
};

}  // namespace loadstar::detail
