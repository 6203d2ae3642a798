/// \file
/// The thread backend of `SequenceAdapter`: a pool of worker threads filling a fixed ring of
/// slots indexed by position, consumed strictly in order.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
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
/// never runs concurrently with `sequence[i]`). One mutex guards it all; what makes the hand-off
/// cheap is waking threads rarely: the consumer wakes workers that sleep on a full ring only once
/// half of it is free (or when it is about to wait itself), and a worker wakes the consumer only
/// when it waits for that very batch.
///
/// Workers share the state they use (the sequence included) with the backend, so a worker stuck in
/// `sequence[i]` can be abandoned: when its batch passes the timeout, or when the backend is
/// destroyed, its thread is detached, finishes the call on its own, drops the batch and exits; the
/// sequence is freed after the last such call returns.
template <class S, class Batch>
class ThreadBackend {
 public:
  ThreadBackend(const std::shared_ptr<S>& sequence, Sampler& sampler, const AdapterOptions& options,
                std::size_t workers, std::uint64_t start, std::uint64_t barrier)
      : shared_(std::make_shared<Shared>(sequence, sampler, options, start, barrier)) {
    workers_.reserve(workers);
    for (std::size_t i = 0; i < workers; ++i)
      add_worker();
  }

  ThreadBackend(const ThreadBackend&) = delete;
  ThreadBackend& operator=(const ThreadBackend&) = delete;

  /// Stops every worker: idle ones exit at once and are joined; one inside `sequence[i]` (user code
  /// cannot be interrupted) is abandoned and detached, so destruction returns promptly.
  ~ThreadBackend() {
    {
      std::lock_guard lock(shared_->mutex);
      shared_->stopping = true;
      for (auto& w : workers_)
        w.state->abandoned = w.state->building != no_position;
    }
    shared_->work_cv.notify_all();
    for (auto& w : workers_) {
      if (w.state->abandoned) {
        w.thread.detach();
      } else {
        w.thread.join();
      }
    }
  }

  /// Waits for the batch at `position` (the next one in order) and takes it, or the error that
  /// took its place: a failure, or the timeout (the batch is given up and the worker building it
  /// abandoned and replaced).
  BackendResult<Batch> take(std::uint64_t position) {
    Shared& s = *shared_;
    std::unique_lock lock(s.mutex);
    Slot& slot = s.slots[position % s.slots.size()];
    const auto ready = [&] { return slot.ready && slot.ticket.position == position; };
    BackendResult<Batch> result;
    if (!ready()) {
      // Workers asleep on a full ring are woken lazily; never wait while they could work.
      if (s.sleeping > 0 && s.claimable()) s.work_cv.notify_all();
      const auto started = std::chrono::steady_clock::now();
      s.waiting_for = position;
      bool arrived = true;
      if (s.timeout.count() > 0) {
        arrived = s.ready_cv.wait_for(lock, s.timeout, ready);
      } else {
        s.ready_cv.wait(lock, ready);
      }
      s.waiting_for = no_position;
      s.wait_ns.fetch_add(
          static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now() - started)
                                         .count()),
          std::memory_order_relaxed);
      if (!arrived) {
        result.ticket = *s.sampler->ticket(position);
        result.error = "sequence adapter: " + describe_batch(result.ticket) +
                       " was not ready after " + std::to_string(s.timeout.count()) +
                       " ms (per-batch timeout); ";
        bool replace = false;
        if (position >= s.dispatch) {
          s.dispatch = position + 1;
          result.error += "no worker thread had started it";
        } else {
          for (auto& w : workers_) {
            if (w.state->building == position) {
              w.state->abandoned = true;
              ++s.abandoned_running;
              replace = true;
            }
          }
          result.error +=
              "its worker thread was abandoned (it finishes the call on its own and its batch is "
              "dropped)";
        }
        s.consume = position + 1;
        lock.unlock();
        if (replace) replace_abandoned();
        s.work_cv.notify_all();
        return result;
      }
    }
    result.batch = std::move(slot.batch);
    result.error = std::move(slot.error);
    result.ticket = slot.ticket;
    slot.batch.reset();
    slot.error.clear();
    slot.ready = false;
    s.consume = position + 1;
    s.ready_count.fetch_sub(1, std::memory_order_relaxed);
    // Wake one sleeping worker once half the ring is free, not one per slot and not all: each
    // wake-up is a system call and a context switch, and a thread more than there are cores takes
    // the consumer's core. Workers sleep on a full ring only when they outpace the consumer, so
    // one of them is enough until the consumer would wait, which wakes them all (above).
    const std::uint64_t free = s.consume + s.slots.size() - s.dispatch;
    const bool wake = s.sleeping > 0 && s.claimable() && free >= (s.slots.size() + 1) / 2;
    lock.unlock();
    if (wake) s.work_cv.notify_one();
    return result;
  }

  /// Moves the epoch barrier after `on_epoch_end` ran on the consumer.
  void resume(std::uint64_t barrier) {
    {
      std::lock_guard lock(shared_->mutex);
      shared_->barrier = barrier;
    }
    shared_->work_cv.notify_all();
  }

  /// Before `on_epoch_end`: waits (up to the timeout) until no abandoned call to `sequence[i]` is
  /// still running, so that the hook never runs concurrently with one; throws `WorkerError` when
  /// one is still running, and `on_epoch_end` is then tried again at the next `next()`.
  void settle() {
    Shared& s = *shared_;
    std::unique_lock lock(s.mutex);
    if (s.abandoned_running == 0) return;
    if (!s.ready_cv.wait_for(lock, s.timeout, [&] { return s.abandoned_running == 0; })) {
      throw WorkerError(
          "sequence adapter: on_epoch_end cannot run yet: " + std::to_string(s.abandoned_running) +
          " abandoned call(s) to sequence[i] still running after " +
          std::to_string(s.timeout.count()) + " ms");
    }
  }

  std::uint64_t produced() const noexcept {
    return shared_->produced.load(std::memory_order_relaxed);
  }
  std::chrono::nanoseconds waited() const noexcept {
    return std::chrono::nanoseconds(shared_->wait_ns.load(std::memory_order_relaxed));
  }
  std::size_t occupancy() const noexcept {
    return shared_->ready_count.load(std::memory_order_relaxed);
  }

 private:
  static constexpr std::uint64_t no_position = std::numeric_limits<std::uint64_t>::max();

  // Each slot on its own cache lines: the consumer empties one while a worker fills the next.
  struct alignas(64) Slot {
    std::optional<Batch> batch;
    std::string error;
    SamplerTicket ticket;
    bool ready = false;
  };

  /// What a worker thread owns a share of, so that an abandoned one never touches freed memory.
  /// Everything but the atomics is guarded by `mutex`; `sampler` is used only while `stopping` is
  /// false (the adapter owns it and outlives that).
  struct Shared {
    Shared(const std::shared_ptr<S>& sequence_, Sampler& sampler_, const AdapterOptions& options,
           std::uint64_t start, std::uint64_t barrier_)
        : sequence(sequence_),
          sampler(&sampler_),
          timeout(options.timeout),
          slots(options.max_queue_size),
          end(sampler_.end()),
          dispatch(start),
          consume(start),
          barrier(barrier_) {}

    bool claimable() const noexcept {
      return dispatch < consume + slots.size() && dispatch < end && dispatch < barrier;
    }

    std::shared_ptr<S> sequence;
    Sampler* sampler;
    std::chrono::milliseconds timeout;
    std::mutex mutex;
    std::condition_variable work_cv;
    std::condition_variable ready_cv;
    std::vector<Slot> slots;
    std::uint64_t end;
    std::uint64_t dispatch;
    std::uint64_t consume;
    std::uint64_t barrier;
    std::uint64_t waiting_for = no_position;
    std::size_t sleeping = 0;
    std::size_t abandoned_running = 0;
    bool stopping = false;
    alignas(64) std::atomic<std::uint64_t> produced{0};
    alignas(64) std::atomic<std::uint64_t> wait_ns{0};
    alignas(64) std::atomic<std::size_t> ready_count{0};
  };

  /// One worker's position and fate, guarded by `Shared::mutex`.
  struct WorkerState {
    std::uint64_t building = no_position;
    bool abandoned = false;
  };

  struct Worker {
    std::shared_ptr<WorkerState> state;
    std::thread thread;
  };

  void add_worker() {
    auto state = std::make_shared<WorkerState>();
    workers_.push_back({state, std::thread(work, shared_, state)});
  }

  /// Detaches the abandoned workers and starts one fresh worker for each.
  void replace_abandoned() {
    std::size_t replaced = 0;
    for (auto it = workers_.begin(); it != workers_.end();) {
      bool abandoned = false;
      {
        std::lock_guard lock(shared_->mutex);
        abandoned = it->state->abandoned;
      }
      if (abandoned) {
        it->thread.detach();
        it = workers_.erase(it);
        ++replaced;
      } else {
        ++it;
      }
    }
    for (std::size_t i = 0; i < replaced; ++i)
      add_worker();
  }

  static void work(std::shared_ptr<Shared> shared, std::shared_ptr<WorkerState> me) {
    Shared& s = *shared;
    std::unique_lock lock(s.mutex);
    for (;;) {
      while (!s.stopping && !s.claimable()) {
        ++s.sleeping;
        s.work_cv.wait(lock);
        --s.sleeping;
      }
      if (s.stopping) return;
      // The sampler caches permutations and is used only under the lock.
      const SamplerTicket ticket = *s.sampler->ticket(s.dispatch++);
      me->building = ticket.position;
      lock.unlock();
      std::optional<Batch> batch;
      std::string error;
      try {
        batch.emplace((*s.sequence)[ticket.index]);
      } catch (...) {
        error = "sequence adapter: " + describe_batch(ticket) +
                " failed in a worker thread: " + current_exception_message();
      }
      lock.lock();
      me->building = no_position;
      if (me->abandoned) {
        // Given up by the consumer: drop the batch (outside the lock) and leave.
        if (s.abandoned_running > 0 && !s.stopping) --s.abandoned_running;
        const bool settled = s.abandoned_running == 0;
        lock.unlock();
        if (settled) s.ready_cv.notify_all();
        return;
      }
      if (s.stopping) return;
      Slot& slot = s.slots[ticket.position % s.slots.size()];
      slot.batch = std::move(batch);
      slot.error = std::move(error);
      slot.ticket = ticket;
      slot.ready = true;
      s.produced.fetch_add(1, std::memory_order_relaxed);
      s.ready_count.fetch_add(1, std::memory_order_relaxed);
      if (s.waiting_for == ticket.position) {
        lock.unlock();
        s.ready_cv.notify_one();
        lock.lock();
      }
    }
  }

  std::shared_ptr<Shared> shared_;
  std::vector<Worker> workers_;
};

}  // namespace loadstar::detail
