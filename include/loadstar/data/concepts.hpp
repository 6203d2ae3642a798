/// \file
/// The concepts of the data area: sequences and the batch shapes Keras trains on.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <stop_token>
#include <tuple>
#include <type_traits>
#include <utility>

#include "loadstar/data/array_like.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

namespace detail {
template <class B, std::size_t N>
concept TupleOfSize = requires {
  typename std::tuple_size<std::remove_cvref_t<B>>::type;
}
&&std::tuple_size_v<std::remove_cvref_t<B>> == N;

template <class B, std::size_t I>
using tuple_element_t = std::remove_cvref_t<std::tuple_element_t<I, std::remove_cvref_t<B>>>;
}  // namespace detail

/// A batch `(x, y)`: a pair or 2-tuple of array-likes with the same number of rows.
template <class B>
concept XYBatch = detail::TupleOfSize<B, 2> && ArrayLike<detail::tuple_element_t<B, 0>> &&
    ArrayLike<detail::tuple_element_t<B, 1>>;

/// A batch `(x, y, w)`: inputs, targets and one `float` sample weight per row (a rank-1 tensor).
template <class B>
concept XYWBatch = detail::TupleOfSize<B, 3> && ArrayLike<detail::tuple_element_t<B, 0>> &&
    ArrayLike<detail::tuple_element_t<B, 1>> &&
    std::same_as<detail::tuple_element_t<B, 2>, Tensor<float>>;

/// A batch Keras can train on: `(x, y)` or `(x, y, w)`.
template <class B>
concept KerasBatch = XYBatch<B> || XYWBatch<B>;

/// Keras's `Sequence`: a fixed number of batches, each built on demand by index.
///
/// Semantic requirements:
/// - `s.size()` is O(1) and stable during an epoch;
/// - `s[i]` for `i < s.size()` builds batch `i`; it is `const` and may be called concurrently
///   from several threads (or forked processes), so it must not depend on call order;
/// - the batch type is movable.
template <class S>
concept Sequence = requires(const S& s, std::size_t i) {
  { s.size() } -> std::convertible_to<std::size_t>;
  s[i];
}
&&!std::is_void_v<decltype(std::declval<const S&>()[std::size_t{}])> &&
    std::movable<std::remove_cvref_t<decltype(std::declval<const S&>()[std::size_t{}])>>;

/// The batch type of a sequence.
template <Sequence S>
using batch_t = std::remove_cvref_t<decltype(std::declval<const S&>()[std::size_t{}])>;

/// A `Sequence` with Keras's `on_epoch_end()` hook, called by the consumer after every epoch
/// (to reshuffle or change augmentation). It runs on the consuming thread, never concurrently
/// with `s[i]`.
template <class S>
concept SequenceWithEpochEnd = Sequence<S> && requires(S& s) {
  s.on_epoch_end();
};

/// A `Sequence` whose batches depend on the epoch (augmentation changed every epoch), as
/// PyTorch's `sampler.set_epoch`: `SequenceAdapter` calls `s.set_epoch(e)` on the consumer before
/// any batch of epoch `e` is built (also after a restore, with the epoch restored into), never
/// concurrently with `s[i]`; forked workers are forked again after it, as for `on_epoch_end`.
/// Derive what changes from `e` alone (not from the calls before), so that a sequence restored
/// into epoch `e` builds the same batches as one that ran epochs `0..e-1`.
template <class S>
concept SequenceWithSetEpoch = Sequence<S> && requires(S& s, std::uint64_t epoch) {
  s.set_epoch(epoch);
};

/// A `Sequence` whose long batches can end early: `s.get(i, stop)` builds batch `i` as `s[i]`
/// does, and may end by throwing (any exception) once `stop.stop_requested()`, or register a
/// `std::stop_callback` that interrupts what it waits on. A `SequenceAdapter` on threads calls it
/// instead of `s[i]` and asks the worker's call to stop when the adapter is destroyed, or when the
/// per-batch timeout gives the batch up; what such a call returns or throws is dropped. On the
/// calling thread (no workers) the token never stops; a worker process ends with its process.
/// \code
/// Batch get(std::size_t i, std::stop_token stop) const {
///   for (auto& file : files_of(i)) {
///     if (stop.stop_requested()) throw std::runtime_error("stopped");
///     decode(file);
///   }
/// }
/// \endcode
template <class S>
concept SequenceWithStopToken = Sequence<S> &&
    requires(const S& s, std::size_t i, std::stop_token stop) {
  { s.get(i, stop) } -> std::same_as<batch_t<S>>;
};

namespace detail {
/// Batch `i` of `sequence`, through `get(i, stop)` where the sequence has it.
template <Sequence S>
batch_t<S> build_batch(const S& sequence, std::size_t i, const std::stop_token& stop) {
  if constexpr (SequenceWithStopToken<S>) {
    return sequence.get(i, stop);
  } else {
    return sequence[i];
  }
}
}  // namespace detail

/// A `Sequence` whose batches Keras can train on.
template <class S>
concept KerasSequence = Sequence<S> && KerasBatch<batch_t<S>>;

}  // namespace loadstar
