/// \file
/// Pieces shared by the backends of `SequenceAdapter`: options, counters, results.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <optional>
#include <string>

#include "loadstar/data/sampler.hpp"

namespace loadstar {

/// The `Workers` argument of a `SequenceAdapter` whose number of workers is chosen at run time,
/// by `AdapterOptions::workers` (as `std::dynamic_extent` is for `std::span`): what `fit`,
/// `configure_fit` and a trial's loaders use, so that they run exactly the workers asked for.
inline constexpr std::size_t dynamic_workers = std::numeric_limits<std::size_t>::max();

/// Options of a `SequenceAdapter`: Determined's `_build_enqueuer` arguments (the order and shard
/// of the batches in `sampler`, the `Sampler`'s own options) plus the process transport and a
/// per-batch timeout.
struct AdapterOptions {
  /// The most batches requested but not yet consumed (Keras's `max_queue_size`); from 1 to
  /// `max_queue_size_limit`.
  std::size_t max_queue_size = 10;
  /// The number of workers (Keras's `workers`) of a `SequenceAdapter<S, dynamic_workers>`: 0 (or
  /// unset) builds batches on the consumer's thread; at most `max_workers`. An adapter with a
  /// fixed `Workers` takes its count from the type, and refuses another one here.
  std::optional<std::size_t> workers = {};
  /// Which batch comes next: the shuffling and its seed (the trial seed), this process's rank
  /// and the number of ranks (rank `r` takes `stream[r::size]`), an infinite stream of epochs
  /// (training, `repeat`) or one pass (validation), and the batches already consumed (`skip`,
  /// Determined's `prior_batches_trained`). Shuffling is off by default, as in Determined.
  SamplerOptions sampler = {};
  /// The longest the consumer waits for one batch before `next()` throws `WorkerError` naming it;
  /// zero waits forever. The batch is given up, as a failed one is, and the next `next()` goes on
  /// with the following batch. The worker stuck in it is replaced: a worker process is killed; a
  /// worker thread cannot be, so it is asked to stop (the `std::stop_token` of a
  /// `SequenceWithStopToken`) and abandoned: it finishes the call on its own, keeping the
  /// sequence alive until then, and its batch is dropped. The timeout also bounds how long the
  /// destructor waits for worker threads' calls in flight; one still running then is abandoned
  /// likewise. Abandoning happens only here: without a timeout, the destructor waits for every
  /// call, and nothing of the adapter runs after it returns.
  std::chrono::milliseconds timeout{0};
  /// Processes only: the bytes of one shared-memory slot (a serialized batch, whose tensors are
  /// padded to 64 bytes). Zero measures the first batch, built in the consumer before forking,
  /// and adds a quarter plus 4 KiB of headroom: give a bound when batches grow. A batch that does
  /// not fit is a `WorkerError` naming the bytes it needs; the ring is reserved up front, and a
  /// shortfall of memory is a `WorkerError` naming the bytes needed. At most `max_slot_bytes`.
  std::size_t slot_bytes = 0;

  /// The largest `max_queue_size`: a ring of 2^20 batches is far beyond any prefetch need, and
  /// the bound keeps the slot count times `max_slot_bytes` within 64 bits.
  static constexpr std::size_t max_queue_size_limit = std::size_t{1} << 20U;
  /// The largest `slot_bytes` (1 TiB).
  static constexpr std::size_t max_slot_bytes = std::size_t{1} << 40U;
  /// The most `workers` (threads or processes) one adapter runs.
  static constexpr std::size_t max_workers = 1024;
};

/// Counters of a `SequenceAdapter`, readable at any time.
struct AdapterStats {
  /// Batches built by the workers (or by the consumer with no workers), failed ones included.
  std::uint64_t batches_produced = 0;
  /// Total time the consumer spent waiting for a batch that was not ready.
  std::chrono::nanoseconds consumer_wait{0};
  /// Batches built and waiting to be consumed right now.
  std::size_t queue_occupancy = 0;
};

namespace detail {

/// The alignment that keeps state written by different threads off each other's cache lines.
/// Not `std::hardware_destructive_interference_size`: GCC warns that its value may change between
/// compiler versions, and here it sets the layout of types in headers.
inline constexpr std::size_t cache_line_bytes = 64;

/// One batch as a backend hands it over: the batch, or the message of the failure that took its
/// place, and the ticket it was built for.
template <class Batch>
struct BackendResult {
  std::optional<Batch> batch;
  std::string error;
  SamplerTicket ticket;
};

/// `"batch 17 (epoch 2, position 350)"`: how errors name a batch.
inline std::string describe_batch(const SamplerTicket& t) {
  return "batch " + std::to_string(t.index) + " (epoch " + std::to_string(t.epoch) + ", position " +
         std::to_string(t.position) + ")";
}

/// The message of the exception being handled.
inline std::string current_exception_message() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace detail
}  // namespace loadstar
