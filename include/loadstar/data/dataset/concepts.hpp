/// \file
/// The concept of the pipeline area: a `Dataset` is a resumable, single-pass stream of elements.
#pragma once

#include <concepts>
#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

namespace loadstar {

/// A tf.data-style dataset: a single-pass stream of elements that can be reset for a new epoch
/// and whose position is a serialisable state that a restore continues from exactly.
///
/// Semantic requirements:
/// - `d.next()` returns the next element of the current epoch, or `std::nullopt` once the epoch is
///   exhausted (and keeps returning `std::nullopt` until `reset()`);
/// - `d.reset()` starts the next epoch; operators that depend on the epoch (a reshuffling
///   `shuffle`, `map_with_seed`) count resets, so epoch `e` is the same stream in every run;
/// - `d.state()` is a JSON tree taken at the consumption boundary: the position after the last
///   element `next()` returned, never ahead of it (a prefetched element is not yet consumed);
/// - `d2.restore(d.state())` on a dataset built the same way makes `d2` yield exactly the elements
///   `d` yields from then on, element by element, across epochs; a state of another kind of
///   dataset throws `CheckpointError`;
/// - a dataset has one consumer: `next`, `reset`, `state` and `restore` are not called
///   concurrently.
template <class D>
concept Dataset = requires(D& d, const D& cd, const nlohmann::json& state) {
  typename D::element_type;
  { d.next() } -> std::same_as<std::optional<typename D::element_type>>;
  d.reset();
  { cd.state() } -> std::same_as<nlohmann::json>;
  d.restore(state);
}
&&std::movable<typename D::element_type>;

/// The element type of a dataset.
template <Dataset D>
using element_t = typename D::element_type;

}  // namespace loadstar
