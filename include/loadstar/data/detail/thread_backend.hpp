/// \file
/// The thread backend of `SequenceAdapter`: a pool of worker threads filling a fixed ring of
/// slots indexed by position, consumed strictly in order.
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loadstar/data/concepts.hpp"
#include "loadstar/data/detail/adapter_common.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// A hint to the core that this thread spins (`pause` on x86: it frees the pipeline for the
/// sibling hyper-thread and saves power).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// Spins until `done()`: for about `spin` on the core, then for about `yielding` giving the core
/// to any other thread that is ready to run (on a machine busier than it has cores, the thread
/// being waited for may be waiting for this very core); returns `done()`.
template <class F>
bool spin_until(F done, std::chrono::nanoseconds spin, std::chrono::nanoseconds yielding) {
  const auto started = std::chrono::steady_clock::now();
  for (unsigned i = 1; spin.count() > 0; ++i) {
    if (done()) return true;
    cpu_relax();
    // The clock costs tens of nanoseconds: read it now and then.
    if (i % 32 == 0 && std::chrono::steady_clock::now() - started > spin) break;
  }
  while (std::chrono::steady_clock::now() - started < spin + yielding) {
    if (done()) return true;
    std::this_thread::yield();
  }
  return done();
}

/// The CPU this thread runs on, or -1 where that is unknown (glibc reads it from the kernel's
/// restartable-sequence area: a few nanoseconds).
inline int current_cpu() noexcept {
  return ::sched_getcpu();
}

/// The CPUs this process may run on (its affinity mask: `taskset`, cgroups' cpusets), at least 1.
inline std::size_t available_cpus() noexcept {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) {
    return std::max(1U, std::thread::hardware_concurrency());
  }
  return static_cast<std::size_t>(std::max(1, CPU_COUNT(&set)));
}

/// Sleeps while `word` holds `expected`, at most `timeout` when one is given (a private futex:
/// `std::atomic::wait` has no timeout, and the consumer's wait must end at the per-batch timeout).
inline void futex_wait_private(std::atomic<std::uint32_t>& word, std::uint32_t expected,
                               std::optional<std::chrono::nanoseconds> timeout) noexcept {
  timespec relative{};
  if (timeout) {
    relative.tv_sec = static_cast<std::time_t>(timeout->count() / 1000000000);
    relative.tv_nsec = static_cast<long>(timeout->count() % 1000000000);
  }
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected,
            timeout ? &relative : nullptr, nullptr, 0);
}

/// Wakes up to `count` threads sleeping in `futex_wait_private` on `word`.
inline void futex_wake_private(std::atomic<std::uint32_t>& word, int count) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, count, nullptr,
            nullptr, 0);
}

/// `Workers` threads claim positions in order from an atomic counter, build them and publish
/// them into slot `position % max_queue_size` with a per-slot flag; the consumer takes them
/// strictly in order. No lock is taken on the way of a batch: the only system calls are wake-ups,
/// made only when the other side announced that it sleeps (each is a context switch, and on a
/// small machine a thread more than there are cores takes the consumer's core), and both sides
/// spin briefly before they sleep.
///
/// Only the consumer moves `limit`, the end of the claimable positions: below `consumed +
/// max_queue_size` (backpressure: at most that many batches requested and not consumed), below
/// the end of the stream and below the epoch barrier (so that `on_epoch_end` never runs
/// concurrently with `sequence[i]`). It writes each position's sampler ticket into its slot before
/// it makes the position claimable, so the sampler (which caches permutations) is used on the
/// consumer's thread alone.
///
/// Spinning pays only while the thread waited for runs on another CPU: both sides note the CPU
/// they run on, and a side whose counterpart shares its CPU yields at once instead (the scheduler
/// puts a woken thread beside its waker, and spinning there only delays the thread it waits for:
/// hand-offs on one CPU were 2.5 times slower that way). And on batches that build faster than a
/// hand-off costs, workers beyond the CPUs left beside the consumer park: one worker keeps up with
/// the consumer then, and more only take turns with it on its CPU. A parked worker sleeps until
/// a wait of the consumer's lasts 100 us, then builds a few batches before it looks at their cost
/// again.
///
/// Each worker announces the position it builds in its own word, which also settles its fate
/// without a lock: the worker swaps it back to idle when it is done (then it publishes), while the
/// consumer swaps it to `abandoned` (per-batch timeout) or the destructor to `stopped`; whoever
/// swaps first wins. The destructor asks every call in flight to stop (the worker's
/// `std::stop_token`, which a `SequenceWithStopToken` receives) and waits for it to return, as
/// `std::jthread` does: after it, no user code of this backend runs. Only under a per-batch
/// timeout may a call be abandoned: the one the consumer gave up, and one still running when the
/// destructor has waited the timeout. An abandoned worker finishes the call on its own, drops its
/// batch and exits; it shares the state it uses (the sequence included) with the backend, so it
/// never touches freed memory, and the sequence is freed after the last such call returns.
template <class S, class Batch>
class ThreadBackend {
 public:
  ThreadBackend(const std::shared_ptr<S>& sequence, Sampler& sampler, const AdapterOptions& options,
                std::size_t workers, std::uint64_t start, std::uint64_t barrier)
      : shared_(std::make_shared<Shared>(sequence, options, start)),
        sampler_(&sampler),
        end_(sampler.end()),
        consume_(start),
        limit_(start),
        barrier_(barrier) {
    pump(Wake::lazily);
    const std::size_t spare = std::max<std::size_t>(available_cpus(), 2) - 1;
    shared_->park_above = workers > spare ? spare : 0;
    workers_.reserve(workers);
    for (std::size_t i = 0; i < workers; ++i)
      add_worker();
  }

  ThreadBackend(const ThreadBackend&) = delete;
  ThreadBackend& operator=(const ThreadBackend&) = delete;

  /// Stops every worker and waits for it: idle ones exit at once; one inside `sequence[i]` is asked
  /// to stop (its `std::stop_token`) and its call waited for, so that no call runs once the
  /// destructor returns. With a per-batch timeout, the wait for calls in flight (and for calls
  /// abandoned before) lasts at most the timeout; a call still running then is abandoned.
  ~ThreadBackend() {
    Shared& s = *shared_;
    s.stopping.store(true);
    for (Worker& worker : workers_) {
      std::atomic<std::uint64_t>& building = worker.state->building;
      std::uint64_t seen = building.load();
      // An idle worker marked `stopped` never starts another call; one inside a call drops it.
      while (!building.compare_exchange_weak(seen, stopped)) {
      }
      if (seen != idle) worker.state->stop.request_stop();
    }
    s.work_event.fetch_add(1);
    futex_wake_private(s.work_event, INT_MAX);
    unpark();
    if (s.timeout.count() == 0) {
      for (Worker& worker : workers_)
        worker.thread.join();
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + s.timeout;
    for (Worker& worker : workers_) {
      if (worker.state->exited_by(deadline)) {
        worker.thread.join();
      } else {
        worker.thread.detach();
      }
    }
    std::unique_lock lock(s.settle_mutex);
    s.settle_cv.wait_until(lock, deadline, [&] { return s.abandoned_running.load() == 0; });
  }

  /// Waits for the batch at `position` (the next one in order) and takes it, or the error that
  /// took its place: a failure, or the timeout (the batch is given up and the worker building it
  /// abandoned and replaced).
  BackendResult<Batch> take(std::uint64_t position) {
    Shared& s = *shared_;
    Slot& slot = s.slots[position % s.slots.size()];
    BackendResult<Batch> result;
    note_consumer_cpu();
    if (slot.ready.load(std::memory_order_acquire) != position + 1 && !wait(position)) {
      if (std::optional<std::string> message = give_up(position)) {
        result.ticket = *sampler_->ticket(position);
        result.error = std::move(*message);
        consume_ = position + 1;
        pump(Wake::all);
        return result;
      }
    }
    result.batch = std::move(slot.batch);
    result.error = std::move(slot.error);
    result.ticket = slot.ticket;
    slot.batch.reset();
    slot.error.clear();
    consume_ = position + 1;
    pump(Wake::lazily);
    return result;
  }

  /// Moves the epoch barrier after `on_epoch_end` ran on the consumer.
  void resume(std::uint64_t barrier) {
    barrier_ = barrier;
    pump(Wake::all);
  }

  /// Before `on_epoch_end`: waits (up to the timeout) until no abandoned call to `sequence[i]` is
  /// still running, so that the hook never runs concurrently with one; throws `WorkerError` when
  /// one is still running, and `on_epoch_end` is then tried again at the next `next()`.
  void settle() {
    Shared& s = *shared_;
    std::unique_lock lock(s.settle_mutex);
    const auto settled = [&] { return s.abandoned_running.load() == 0; };
    if (settled()) return;
    if (!s.settle_cv.wait_for(lock, s.timeout, settled)) {
      throw WorkerError("sequence adapter: on_epoch_end cannot run yet: " +
                        std::to_string(s.abandoned_running.load()) +
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
  /// Counted over the ring rather than kept in a counter that workers and consumer would both
  /// write for every batch (a cache line moving between cores twice per batch).
  std::size_t occupancy() const noexcept {
    const Shared& s = *shared_;
    std::size_t ready = 0;
    for (std::uint64_t p = consume_; p < limit_; ++p)
      ready += s.slots[p % s.slots.size()].ready.load(std::memory_order_acquire) == p + 1;
    return ready;
  }

 private:
  /// The values of a worker's word besides the position it builds.
  static constexpr std::uint64_t idle = std::numeric_limits<std::uint64_t>::max();
  static constexpr std::uint64_t stopped = idle - 1;
  static constexpr std::uint64_t abandoned = idle - 2;
  static constexpr std::uint64_t no_position = idle;
  /// How long each side spins and then yields before it sleeps: a few times what a cheap batch
  /// takes to build and hand over, short enough that a spinning worker on a full ring leaves the
  /// consumer's core soon.
  static constexpr std::chrono::microseconds consumer_spin{5};
  static constexpr std::chrono::microseconds consumer_yield{20};
  /// The consumer's spin adapts: halved after each wait it spun through in vain (batches that
  /// take long to build, where spinning only takes a core from the workers), doubled back after
  /// each that it won, from 1/64 of the above up to it. At its shortest it does not yield: a
  /// thread that yields on a busy machine may wait a whole time slice to run again, while one
  /// woken from sleep runs at once, so yielding pays only where batches come fast.
  static constexpr unsigned max_spin_shift = 6;
  static constexpr std::chrono::microseconds worker_spin{2};
  static constexpr std::chrono::microseconds worker_yield{5};
  /// A batch that builds faster than this is cheaper than handing it over between two CPUs a few
  /// times (about 0.6 us here): one worker then keeps up with the consumer, and a second one
  /// where no CPU is free only takes turns on a CPU with the consumer.
  static constexpr std::chrono::microseconds cheap_batch{2};
  static constexpr unsigned grace_batches = 8;
  static constexpr std::chrono::microseconds unpark_after{100};

  // Each slot on its own cache lines: the consumer empties one while a worker fills the next.
  struct alignas(cache_line_bytes) Slot {
    /// The position whose result the slot holds, plus one (0: none yet); published last.
    std::atomic<std::uint64_t> ready{0};
    /// Written by the consumer before the position becomes claimable.
    SamplerTicket ticket;
    std::optional<Batch> batch;
    std::string error;
  };

  /// What a worker thread owns a share of, so that an abandoned one never touches freed memory.
  /// The words that different threads write are on cache lines of their own.
  struct Shared {
    Shared(const std::shared_ptr<S>& sequence_, const AdapterOptions& options, std::uint64_t start)
        : sequence(sequence_), timeout(options.timeout), slots(options.max_queue_size) {
      next.store(start, std::memory_order_relaxed);
      limit.store(start, std::memory_order_relaxed);
    }

    std::shared_ptr<S> sequence;
    std::chrono::milliseconds timeout;
    std::vector<Slot> slots;
    /// The next position a worker may claim (by compare-and-swap), and the end of the claimable
    /// ones (moved by the consumer only).
    alignas(cache_line_bytes) std::atomic<std::uint64_t> next{0};
    alignas(cache_line_bytes) std::atomic<std::uint64_t> limit{0};
    /// Workers sleep on `work_event` after counting themselves in `sleepers`; the consumer bumps
    /// it and wakes them only when it counted someone. Every access is sequentially consistent:
    /// (`sleepers`, `limit`) and (`waiting_for`, `Slot::ready`) are Dekker pairs, so no wake-up
    /// is lost.
    alignas(cache_line_bytes) std::atomic<std::uint32_t> work_event{0};
    std::atomic<std::uint32_t> sleepers{0};
    std::atomic<std::uint32_t> spinners{0};
    std::atomic<bool> stopping{false};
    /// The consumer sleeps on `ready_event` after announcing the position it waits for.
    alignas(cache_line_bytes) std::atomic<std::uint32_t> ready_event{0};
    std::atomic<std::uint64_t> waiting_for{no_position};
    alignas(cache_line_bytes) std::atomic<std::uint64_t> produced{0};
    /// Workers not parked, and how many may stay awake on cheap batches (0: never park); parked
    /// workers count themselves in `parked` and sleep on `park_event` (a Dekker pair as above).
    alignas(cache_line_bytes) std::atomic<std::size_t> awake{0};
    std::size_t park_above = 0;
    std::atomic<std::uint32_t> park_event{0};
    std::atomic<std::uint32_t> parked{0};
    /// The CPU the consumer last ran on (-1: unknown); written only when it changes.
    alignas(cache_line_bytes) std::atomic<int> consumer_cpu{-1};
    alignas(cache_line_bytes) std::atomic<std::uint64_t> wait_ns{0};
    /// Abandoned calls still running, and how `settle` waits for them (rare: no hot path).
    alignas(cache_line_bytes) std::atomic<std::size_t> abandoned_running{0};
    std::mutex settle_mutex;
    std::condition_variable settle_cv;
  };

  /// The position a worker builds, `idle`, or the fate the consumer chose for it.
  struct alignas(cache_line_bytes) WorkerState {
    std::atomic<std::uint64_t> building{idle};
    /// The CPU the worker last ran on (-1: unknown); written only when it changes.
    std::atomic<int> cpu{-1};
    /// Asks the worker's call in flight to end early (destruction, or the timeout gave it up).
    std::stop_source stop;
    /// 1 once the worker function has returned (the destructor's timed wait).
    std::atomic<std::uint32_t> exited{0};

    /// Whether the worker has returned, waiting for it until `deadline`.
    bool exited_by(std::chrono::steady_clock::time_point deadline) {
      while (exited.load() == 0) {
        const auto left = deadline - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero()) return false;
        futex_wait_private(exited, 0, std::chrono::duration_cast<std::chrono::nanoseconds>(left));
      }
      return true;
    }
  };

  struct Worker {
    std::shared_ptr<WorkerState> state;
    std::thread thread;
  };

  void add_worker() {
    auto state = std::make_shared<WorkerState>();
    workers_.push_back({state, std::thread(work, shared_, state)});
  }

  /// Whom `pump` wakes among the sleeping workers, if there is work for them.
  enum class Wake {
    /// One, and only once half the ring is free and every worker sleeps.
    lazily,
    /// One (the consumer is about to wait).
    one,
    /// All (the barrier moved, or a worker was replaced).
    all
  };

  /// Makes every position that may be requested claimable (writing their tickets first) and
  /// wakes sleeping workers as `wake` says. Workers sleep on a full ring only when they outpace
  /// the consumer: one awake worker keeps up then, and waking more costs a system call per
  /// wake-up and, on a machine with few cores, takes the consumer's core (two workers were
  /// slower than one that way). Each wait of the consumer wakes one more, so slow batches soon
  /// have every worker on them.
  void pump(Wake wake) {
    Shared& s = *shared_;
    const std::uint64_t target =
        std::min({consume_ + static_cast<std::uint64_t>(s.slots.size()), end_, barrier_});
    if (target > limit_) {
      for (std::uint64_t p = limit_; p < target; ++p)
        s.slots[p % s.slots.size()].ticket = *sampler_->ticket(p);
      limit_ = target;
      s.limit.store(target);
    }
    if (wake == Wake::all) unpark();
    const std::uint32_t sleepers = s.sleepers.load();
    if (sleepers == 0) return;
    // Decided before reading `next`, which the workers write for every batch: reading it after
    // every batch cost the consumer a cache line from another CPU whenever a worker slept.
    if (wake == Wake::lazily && sleepers + s.parked.load() < workers_.size()) return;
    const std::uint64_t next = s.next.load();
    if (next >= limit_) return;
    if (wake != Wake::lazily || limit_ - next >= (s.slots.size() + 1) / 2) {
      s.work_event.fetch_add(1);
      futex_wake_private(s.work_event, wake == Wake::all ? INT_MAX : 1);
    }
  }

  /// Wakes every parked worker.
  void unpark() noexcept {
    Shared& s = *shared_;
    s.park_event.fetch_add(1);
    if (s.parked.load() > 0) futex_wake_private(s.park_event, INT_MAX);
  }

  /// Notes the CPU the consumer runs on, for the workers' choice between spinning and yielding.
  void note_consumer_cpu() noexcept {
    const int cpu = current_cpu();
    if (cpu != consumer_cpu_) {
      consumer_cpu_ = cpu;
      shared_->consumer_cpu.store(cpu, std::memory_order_relaxed);
    }
  }

  /// Whether the worker building `position` (or, when none has claimed it yet, every awake worker)
  /// last ran on the consumer's CPU: then spinning would only keep it from running.
  bool builder_shares_cpu(std::uint64_t position) const noexcept {
    if (consumer_cpu_ < 0) return false;
    bool any_elsewhere = false;
    for (const Worker& worker : workers_) {
      const int cpu = worker.state->cpu.load(std::memory_order_relaxed);
      if (worker.state->building.load(std::memory_order_relaxed) == position) {
        return cpu == consumer_cpu_;
      }
      any_elsewhere = any_elsewhere || cpu != consumer_cpu_;
    }
    return !any_elsewhere;
  }

  /// Waits until the slot of `position` is published: spins a little, then sleeps; false when
  /// the per-batch timeout passed first.
  bool wait(std::uint64_t position) {
    Shared& s = *shared_;
    const std::atomic<std::uint64_t>& ready = s.slots[position % s.slots.size()].ready;
    const auto started = std::chrono::steady_clock::now();
    const auto is_ready = [&] { return ready.load(std::memory_order_acquire) == position + 1; };
    bool arrived = false;
    if (builder_shares_cpu(position)) {
      // Only yielding lets the batch be finished.
      arrived = spin_until(is_ready, std::chrono::nanoseconds(0), consumer_yield);
    } else {
      arrived = spin_until(is_ready, consumer_spin / (1U << spin_shift_),
                           spin_shift_ < max_spin_shift ? consumer_yield / (1U << spin_shift_)
                                                        : std::chrono::microseconds(0));
      if (arrived) {
        spin_shift_ = spin_shift_ > 0 ? spin_shift_ - 1 : 0;
      } else {
        spin_shift_ = std::min(spin_shift_ + 1, max_spin_shift);
      }
    }
    if (!arrived) {
      // Workers asleep on a full ring are woken lazily; never sleep while none works.
      pump(Wake::one);
      s.waiting_for.store(position);
      // Parked workers are woken once a wait lasts: the batches are no longer cheap, or the
      // worker that builds them is held up.
      bool unparked = s.park_above == 0;
      for (;;) {
        const std::uint32_t event = s.ready_event.load();
        if (ready.load() == position + 1) {
          arrived = true;
          break;
        }
        const auto waited = std::chrono::steady_clock::now() - started;
        if (!unparked && waited >= unpark_after) {
          unpark();
          unparked = true;
        }
        std::optional<std::chrono::nanoseconds> left;
        if (s.timeout.count() > 0) {
          left = s.timeout - waited;
          if (left->count() <= 0) break;
        }
        if (!unparked) {
          const std::chrono::nanoseconds until_unpark = unpark_after - waited;
          left = left ? std::min(*left, until_unpark) : until_unpark;
        }
        futex_wait_private(s.ready_event, event, left);
      }
      s.waiting_for.store(no_position);
    }
    s.wait_ns.fetch_add(
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                       std::chrono::steady_clock::now() - started)
                                       .count()),
        std::memory_order_relaxed);
    return arrived;
  }

  /// The timeout passed for `position`: gives it up and returns the message, or nothing when the
  /// batch turned out to be ready. A worker building it is abandoned and replaced; one that has
  /// claimed it but not yet announced it is waited for (it does so in a few instructions).
  std::optional<std::string> give_up(std::uint64_t position) {
    Shared& s = *shared_;
    const Slot& slot = s.slots[position % s.slots.size()];
    std::string message = "sequence adapter: " + describe_batch(*sampler_->ticket(position)) +
                          " was not ready after " + std::to_string(s.timeout.count()) +
                          " ms (per-batch timeout); ";
    std::uint64_t expected = position;
    if (s.next.compare_exchange_strong(expected, position + 1)) {
      return message + "no worker thread had started it";
    }
    // Counted before the swap, so that the worker never counts down below zero.
    s.abandoned_running.fetch_add(1);
    for (;;) {
      if (slot.ready.load(std::memory_order_acquire) == position + 1) {
        s.abandoned_running.fetch_sub(1);
        return std::nullopt;
      }
      for (auto it = workers_.begin(); it != workers_.end(); ++it) {
        std::uint64_t building = position;
        if (it->state->building.compare_exchange_strong(building, abandoned)) {
          it->state->stop.request_stop();
          it->thread.detach();
          workers_.erase(it);
          add_worker();
          return message +
                 "its worker thread was abandoned (it finishes the call on its own and its batch "
                 "is dropped)";
        }
      }
      std::this_thread::yield();
    }
  }

  /// Parks this worker while batches are cheap and more workers are awake than the machine has
  /// CPUs to spare beside the consumer: sleeps until the consumer has waited `unpark_after` for a
  /// batch, the barrier moved or the backend stops. Returns false without sleeping when this
  /// worker is needed.
  static bool park(Shared& s) {
    std::size_t awake = s.awake.load();
    do {
      if (awake <= s.park_above) return false;
    } while (!s.awake.compare_exchange_weak(awake, awake - 1));
    const std::uint32_t event = s.park_event.load();
    s.parked.fetch_add(1);
    if (!s.stopping.load()) futex_wait_private(s.park_event, event, std::nullopt);
    s.parked.fetch_sub(1);
    s.awake.fetch_add(1);
    return true;
  }

  static void work(std::shared_ptr<Shared> shared, std::shared_ptr<WorkerState> me) {
    Shared& s = *shared;
    s.awake.fetch_add(1);
    struct Leave {
      Shared& s;
      WorkerState& me;
      ~Leave() {
        s.awake.fetch_sub(1);
        me.exited.store(1);
        futex_wake_private(me.exited, INT_MAX);
      }
    } leave{s, *me};
    const std::stop_token stop = me->stop.get_token();
    const auto claimable = [&] {
      return s.next.load(std::memory_order_relaxed) < s.limit.load(std::memory_order_relaxed) ||
             s.stopping.load(std::memory_order_relaxed);
    };
    // This worker's view of what a batch costs to build (every fourth batch timed, a moving
    // average), and the batches it builds after a wake-up before it may park again.
    std::chrono::nanoseconds build_cost = cheap_batch;
    unsigned built = 0;
    unsigned grace = 0;
    for (;;) {
      if (s.stopping.load(std::memory_order_relaxed)) return;
      std::uint64_t position = s.next.load();
      if (position >= s.limit.load()) {
        // One worker at a time spins on a full ring; the others sleep at once, so that spinning
        // workers never outnumber the cores the consumer and the busy workers need.
        const bool spinner = s.spinners.fetch_add(1) == 0;
        // Spinning beside the consumer on its CPU only delays it: yield at once there.
        const int consumer = s.consumer_cpu.load(std::memory_order_relaxed);
        const bool beside = consumer >= 0 && consumer == current_cpu();
        const bool found =
            spinner &&
            spin_until(claimable, beside ? std::chrono::nanoseconds(0) : worker_spin, worker_yield);
        s.spinners.fetch_sub(1);
        if (found) continue;
        const std::uint32_t event = s.work_event.load();
        s.sleepers.fetch_add(1);
        if (!s.stopping.load() && s.next.load() >= s.limit.load()) {
          futex_wait_private(s.work_event, event, std::nullopt);
        }
        s.sleepers.fetch_sub(1);
        continue;
      }
      if (!s.next.compare_exchange_weak(position, position + 1)) continue;
      if (const int cpu = current_cpu(); cpu != me->cpu.load(std::memory_order_relaxed)) {
        me->cpu.store(cpu, std::memory_order_relaxed);
      }
      Slot& slot = s.slots[position % s.slots.size()];
      // Read before announcing the position: the consumer rewrites the ticket only after it took
      // or gave up this position, and it gives one up only through this worker's word.
      const SamplerTicket ticket = slot.ticket;
      std::uint64_t expected = idle;
      if (!me->building.compare_exchange_strong(expected, position)) return;  // stopped
      std::optional<Batch> batch;
      std::string error;
      const bool timed = s.park_above > 0 && built++ % 4 == 0;
      const auto started =
          timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      try {
        batch.emplace(build_batch(*s.sequence, ticket.index, stop));
        if (timed) {
          const std::chrono::nanoseconds took = std::chrono::steady_clock::now() - started;
          build_cost = built == 1 ? took : build_cost + (took - build_cost) / 4;
        }
      } catch (...) {
        error = "sequence adapter: " + describe_batch(ticket) +
                " failed in a worker thread: " + current_exception_message();
      }
      expected = position;
      if (!me->building.compare_exchange_strong(expected, idle)) {
        // Given up by the consumer, or the backend is gone: drop the batch and leave.
        batch.reset();
        if (expected == abandoned && s.abandoned_running.fetch_sub(1) == 1) {
          { std::lock_guard lock(s.settle_mutex); }
          s.settle_cv.notify_all();
        }
        return;
      }
      slot.batch = std::move(batch);
      slot.error = std::move(error);
      s.produced.fetch_add(1, std::memory_order_relaxed);
      slot.ready.store(position + 1);
      if (s.waiting_for.load() == position) {
        s.ready_event.fetch_add(1);
        futex_wake_private(s.ready_event, 1);
      }
      // Only after a batch: a worker woken to build one must not park instead (the wake-up it
      // took was meant for the batch the consumer waits for).
      if (grace > 0) {
        --grace;
      } else if (build_cost < cheap_batch && s.park_above > 0 && park(s)) {
        grace = grace_batches;
      }
    }
  }

  std::shared_ptr<Shared> shared_;
  std::vector<Worker> workers_;
  // The consumer's own state.
  Sampler* sampler_;
  std::uint64_t end_;
  std::uint64_t consume_;
  std::uint64_t limit_;
  std::uint64_t barrier_;
  unsigned spin_shift_ = 0;
  int consumer_cpu_ = -1;
};

}  // namespace loadstar::detail
