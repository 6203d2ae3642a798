/// \file
/// `SequenceAdapter<S, Workers, Multiprocess>`: a `Sequence` served in sampler order with
/// bounded, ordered prefetch on threads or forked processes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <type_traits>
#include <utility>

#include "loadstar/data/concepts.hpp"
#include "loadstar/data/detail/adapter_common.hpp"
#include "loadstar/data/detail/process_backend.hpp"
#include "loadstar/data/detail/thread_backend.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {

/// No workers: batches are built on the consumer's thread when asked for.
template <class S, class Batch>
class InlineBackend {
 public:
  InlineBackend(const std::shared_ptr<S>& sequence, Sampler& sampler, const AdapterOptions&,
                std::size_t, std::uint64_t, std::uint64_t)
      : sequence_(*sequence), sampler_(sampler) {}

  BackendResult<Batch> take(std::uint64_t position) {
    BackendResult<Batch> result;
    result.ticket = *sampler_.ticket(position);
    try {
      result.batch.emplace(build_batch(sequence_, result.ticket.index, std::stop_token{}));
    } catch (...) {
      result.error = "sequence adapter: " + describe_batch(result.ticket) +
                     " failed: " + current_exception_message();
    }
    ++produced_;
    return result;
  }
  void resume(std::uint64_t) noexcept {}
  void settle() noexcept {}
  std::uint64_t produced() const noexcept { return produced_; }
  std::chrono::nanoseconds waited() const noexcept { return {}; }
  std::size_t occupancy() const noexcept { return 0; }

 private:
  const S& sequence_;
  Sampler& sampler_;
  std::uint64_t produced_ = 0;
};

/// A worker count chosen at run time: `Pool` with one or more workers, else the consumer builds.
template <class S, class Batch, class Pool>
class DynamicBackend {
 public:
  DynamicBackend(const std::shared_ptr<S>& sequence, Sampler& sampler,
                 const AdapterOptions& options, std::size_t workers, std::uint64_t start,
                 std::uint64_t barrier) {
    if (workers == 0) {
      inline_.emplace(sequence, sampler, options, workers, start, barrier);
    } else {
      pool_.emplace(sequence, sampler, options, workers, start, barrier);
    }
  }

  BackendResult<Batch> take(std::uint64_t position) {
    return pool_ ? pool_->take(position) : inline_->take(position);
  }
  void resume(std::uint64_t barrier) {
    if (pool_) pool_->resume(barrier);
  }
  void settle() {
    if (pool_) pool_->settle();
  }
  std::uint64_t produced() const noexcept {
    return pool_ ? pool_->produced() : inline_->produced();
  }
  std::chrono::nanoseconds waited() const noexcept {
    return pool_ ? pool_->waited() : std::chrono::nanoseconds{};
  }
  std::size_t occupancy() const noexcept { return pool_ ? pool_->occupancy() : 0; }

 private:
  std::optional<InlineBackend<S, Batch>> inline_;
  std::optional<Pool> pool_;
};

template <class S, bool Multiprocess>
using pool_t =
    std::conditional_t<Multiprocess, ProcessBackend<S, batch_t<S>>, ThreadBackend<S, batch_t<S>>>;

template <class S, std::size_t Workers, bool Multiprocess>
using backend_t = std::conditional_t<
    Workers == dynamic_workers, DynamicBackend<S, batch_t<S>, pool_t<S, Multiprocess>>,
    std::conditional_t<Workers == 0, InlineBackend<S, batch_t<S>>, pool_t<S, Multiprocess>>>;

}  // namespace detail

/// A Keras `Sequence` served in the order a `Sampler` decides (Determined's `_Sampler` +
/// `_Enqueuer`), built ahead by `Workers` threads or, with `Multiprocess`, forked processes, and
/// delivered strictly in order.
///
/// - `Workers == 0` builds each batch on the calling thread. Otherwise at most
///   `max_queue_size` batches are requested and not yet consumed. `Workers == dynamic_workers`
///   takes the count at run time from `AdapterOptions::workers` (what `fit` does).
/// - Training (`repeat`) is an infinite stream; validation is one finite pass.
/// - `on_epoch_end()` of the sequence runs on the consumer after the last batch of each epoch:
///   at `finish_epoch()` (what `fit` calls at the end of each epoch, so that after two epochs it
///   has run twice, as in Keras) or else before the next batch is returned; never concurrently
///   with `sequence[i]`; then
///   `set_epoch(e)` (`SequenceWithSetEpoch`), which also runs before the first batch. Forked
///   workers see what they changed: the adapter forks them again at each epoch boundary when the
///   sequence has either hook.
/// - A failed batch throws `WorkerError` (batch index and original message, whole) when its turn
///   comes; calling `next()` again continues with the following batch. So does a batch that is not
///   ready within `AdapterOptions::timeout`: a worker process stuck in it is killed and replaced, a
///   worker thread is abandoned (see below) and replaced. A worker process that dies throws
///   `WorkerError` naming its pid, the signal and the batch as soon as the consumer waits, whatever
///   the other workers are doing, after which the adapter can only be destroyed.
/// - Destruction, an early `break` included, keeps RAII's promise: when the destructor returns, no
///   call of the adapter's to the sequence runs any more. Worker processes are killed; a worker
///   thread inside `sequence[i]` is asked to stop (a `SequenceWithStopToken` receives a
///   `std::stop_token` and may end the call early; `sequence[i]` runs to its end) and waited for.
///   Only with a per-batch `timeout` does the destructor wait at most that long and then abandon
///   a call still running (see `AdapterOptions::timeout`).
/// - `state()` is taken at the consumption boundary and restores, with any `Workers` or
///   `Multiprocess`, exactly the stream an uninterrupted run would produce, at O(1) cost; and with
///   any number of ranks, the global stream from the step it was taken at (`SamplerState`).
/// - Up to the CPUs there are, more workers are never slower than fewer on the same work; beyond
///   them, worker threads on slow batches take turns with the consumer on its CPU (on 2 CPUs, 3
///   threads built 1 ms batches 13% slower than 2; 3 processes as fast as 2). With threads, on
///   batches that build in under about 2 us (cheaper than handing them over), workers beyond the
///   CPUs left beside the consumer park, and wake once the consumer waits 100 us for a batch; a
///   side whose counterpart runs on its CPU yields instead of spinning. Worker processes asleep
///   on a full ring are woken when half of it is free or the consumer is about to wait.
///
/// Processes are forked in the constructor (the adapter itself never creates a thread in that
/// mode) and return batches through a preallocated shared-memory ring of `max_queue_size` slots
/// (see `AdapterOptions::slot_bytes`); the batch type must be `Serializable`. A worker process
/// builds the large tensors of a batch (256 KiB and up) in place in its slot, so they are not
/// copied into it; a tensor the sequence keeps after the call (a cache) is given memory of its
/// own, once. The tensors of a batch read from the ring are views of its slot, not copies: the
/// slot goes back to the workers when the last of them is destroyed, and they stay valid after
/// the adapter is gone. While the consumer keeps so many batches that the next slot is still in
/// use, the adapter builds that batch itself instead of waiting.
/// \code
/// const AdapterOptions options{.sampler = {.shuffle = true, .seed = 777}};
/// SequenceAdapter<MySequence, 4> train(MySequence{...}, options);
/// for (auto& [x, y] : train) { ... }              // infinite: break out
/// nlohmann::json saved = train.state();
/// SequenceAdapter<MySequence, 2, true> resumed(MySequence{...}, options,
///                                              saved.get<SamplerState>());
/// \endcode
template <Sequence S, std::size_t Workers = 0, bool Multiprocess = false>
class SequenceAdapter {
  static_assert(!Multiprocess || Serializable<batch_t<S>>,
                "SequenceAdapter with Multiprocess = true sends batches between processes: the "
                "batch type must be Serializable (tensors, arithmetic types, std::string, and "
                "vectors, maps, pairs, tuples or optionals of them), or specialise "
                "loadstar::Serializer for it");

 public:
  using batch_type = batch_t<S>;
  using sequence_type = S;
  /// The `Workers` argument (`dynamic_workers` for a count chosen at run time: `worker_count()`).
  static constexpr std::size_t workers = Workers;
  static constexpr bool multiprocess = Multiprocess;

  /// Starts serving `sequence` from the beginning (after `options.sampler.skip` batches); throws
  /// `ConfigError` for a `max_queue_size` of 0 or above `max_queue_size_limit`, a `slot_bytes`
  /// above `max_slot_bytes`, a `workers` above `max_workers` or other than a fixed `Workers`,
  /// fewer batches than ranks or a bad rank.
  explicit SequenceAdapter(S sequence, const AdapterOptions& options = {})
      : sequence_(std::make_shared<S>(std::move(sequence))),
        options_(checked(options)),
        sampler_(sequence_->size(), options_.sampler),
        position_(starting_position()),
        backend_(sequence_, sampler_, options_, worker_count(), position_, first_barrier()) {}

  /// Continues from a state saved by `state()`, possibly with other `Workers` or `Multiprocess`,
  /// or on another number of ranks (`SamplerState`); throws `CheckpointError` when the state
  /// belongs to another seed or sequence length.
  SequenceAdapter(S sequence, const AdapterOptions& options, const SamplerState& state)
      : sequence_(std::make_shared<S>(std::move(sequence))),
        options_(checked(options)),
        sampler_(sequence_->size(), options_.sampler, state),
        position_(starting_position()),
        backend_(sequence_, sampler_, options_, worker_count(), position_, first_barrier()) {}

  SequenceAdapter(const SequenceAdapter&) = delete;
  SequenceAdapter& operator=(const SequenceAdapter&) = delete;

  /// The next batch, or nothing at the end of a validation pass. Throws `WorkerError` for a batch
  /// that failed or passed the timeout (the adapter moves past it), and for a dead worker process.
  std::optional<batch_type> next() {
    finish_epoch();
    if (position_ >= sampler_.end()) return std::nullopt;
    detail::BackendResult<batch_type> result = backend_.take(position_);
    ++position_;
    if (result.ticket.last_in_epoch && (SequenceWithEpochEnd<S> || SequenceWithSetEpoch<S>)) {
      epoch_end_pending_ = true;
    }
    if (!result.batch) throw WorkerError(result.error);
    return std::move(result.batch);
  }

  /// Runs the epoch-end hooks (`on_epoch_end`, then `set_epoch` of the next epoch) now, when the
  /// last batch of an epoch has been taken and they have not run yet; otherwise does nothing.
  /// `next()` runs them itself before the next epoch's first batch; a training loop calls this
  /// once it is done with the epoch's last batch, so that `on_epoch_end` runs at the end of every
  /// epoch, the last one included, as in Keras's `fit` (which the executor's `fit` does).
  void finish_epoch() {
    if (!epoch_end_pending_) return;
    if constexpr (SequenceWithEpochEnd<S> || SequenceWithSetEpoch<S>) {
      backend_.settle();  // no abandoned sequence[i] may run beside the hooks
    }
    if constexpr (SequenceWithEpochEnd<S>) sequence_->on_epoch_end();
    if constexpr (SequenceWithSetEpoch<S>) sequence_->set_epoch(sampler_.epoch_of(position_));
    epoch_end_pending_ = false;
    backend_.resume(first_barrier());
  }

  /// An input iterator over the remaining batches; `++` calls `next()`.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = batch_type;
    using difference_type = std::ptrdiff_t;
    using reference = batch_type&;

    iterator() = default;
    explicit iterator(SequenceAdapter* adapter) noexcept : adapter_(adapter) {}
    batch_type& operator*() const noexcept { return *adapter_->current_; }
    batch_type* operator->() const noexcept { return &*adapter_->current_; }
    iterator& operator++() {
      adapter_->current_.reset();
      adapter_->current_ = adapter_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    friend bool operator==(const iterator& it, std::default_sentinel_t) noexcept {
      return it.at_end();
    }

   private:
    bool at_end() const noexcept { return adapter_ == nullptr || !adapter_->current_; }

    SequenceAdapter* adapter_ = nullptr;
  };

  /// Fetches the next batch and returns an iterator at it.
  iterator begin() {
    current_.reset();
    current_ = next();
    return iterator(this);
  }
  std::default_sentinel_t end() const noexcept { return {}; }

  /// The state before the next batch `next()` returns: `{epoch, cursor, seed, length}`.
  SamplerState state() const noexcept { return sampler_.state_at(position_); }

  /// Counters: batches produced, the consumer's waiting time, batches ready now.
  AdapterStats stats() const noexcept {
    return {backend_.produced(), backend_.waited(), backend_.occupancy()};
  }

  /// The number of batches of the sequence.
  std::size_t size() const noexcept { return sampler_.length(); }
  /// The number of batches this rank gets in one validation pass.
  std::uint64_t pass_length() const noexcept { return sampler_.pass_length(); }
  /// The batches of one epoch: in training the same on every rank (`Sampler::steps_per_epoch`),
  /// in validation this rank's pass.
  std::uint64_t steps_per_epoch() const noexcept {
    return options_.sampler.repeat ? sampler_.steps_per_epoch() : sampler_.pass_length();
  }
  /// The workers building batches (threads or processes; 0: the consumer's thread).
  std::size_t worker_count() const noexcept {
    if constexpr (Workers == dynamic_workers) {
      return options_.workers.value_or(0);
    } else {
      return Workers;
    }
  }
  const S& sequence() const noexcept { return *sequence_; }
  const AdapterOptions& options() const noexcept { return options_; }

 private:
  static AdapterOptions checked(const AdapterOptions& options) {
    if (options.max_queue_size == 0) {
      throw ConfigError("sequence adapter: max_queue_size must be positive but is 0");
    }
    if (options.max_queue_size > AdapterOptions::max_queue_size_limit) {
      throw ConfigError("sequence adapter: max_queue_size must be at most " +
                        std::to_string(AdapterOptions::max_queue_size_limit) + " but is " +
                        std::to_string(options.max_queue_size));
    }
    if constexpr (Workers == dynamic_workers) {
      if (options.workers.value_or(0) > AdapterOptions::max_workers) {
        throw ConfigError("sequence adapter: workers must be at most " +
                          std::to_string(AdapterOptions::max_workers) + " but is " +
                          std::to_string(*options.workers));
      }
    } else if (options.workers && *options.workers != Workers) {
      throw ConfigError("sequence adapter: workers is " + std::to_string(*options.workers) +
                        " but the adapter's Workers argument is " + std::to_string(Workers) +
                        " (SequenceAdapter<S, dynamic_workers> takes the count at run time)");
    }
    if (options.slot_bytes > AdapterOptions::max_slot_bytes) {
      throw ConfigError("sequence adapter: slot_bytes must be at most " +
                        std::to_string(AdapterOptions::max_slot_bytes) + " but is " +
                        std::to_string(options.slot_bytes));
    }
    return options;
  }

  /// The first position, after telling a sequence with `set_epoch` the epoch it starts in
  /// (before any worker exists).
  std::uint64_t starting_position() {
    const std::uint64_t start = sampler_.start();
    if constexpr (SequenceWithSetEpoch<S>) sequence_->set_epoch(sampler_.epoch_of(start));
    return start;
  }

  /// Without a hook, prefetch runs across epochs; with one, it stops at the next epoch.
  std::uint64_t first_barrier() const noexcept {
    if constexpr (SequenceWithEpochEnd<S> || SequenceWithSetEpoch<S>) {
      return sampler_.first_position_of_epoch(sampler_.epoch_of(position_) + 1);
    } else {
      return std::numeric_limits<std::uint64_t>::max();
    }
  }

  // Shared with worker threads, so that an abandoned one never outlives what it reads.
  std::shared_ptr<S> sequence_;
  AdapterOptions options_;
  Sampler sampler_;
  std::uint64_t position_;
  bool epoch_end_pending_ = false;
  std::optional<batch_type> current_;
  // Last: its workers stop before the members they read are destroyed.
  detail::backend_t<S, Workers, Multiprocess> backend_;
};

}  // namespace loadstar
