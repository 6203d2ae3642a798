/// \file
/// `shuffle`: a seeded buffer shuffle, as `tf.data.Dataset.shuffle`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/element_seed.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The elements of `D` shuffled through a buffer of `buffer_size` elements, as tf.data does: the
/// buffer is filled, then each output is a uniformly chosen buffer element, replaced by the next
/// upstream element. A buffer at least as large as the epoch gives a uniform permutation. The
/// order of epoch `e` is a function of `(seed, e)` (of `seed` alone without
/// `reshuffle_each_iteration`).
///
/// State and restore: the buffer holds elements that may be arbitrarily old, so instead of
/// serialising them (tf.data's checkpoints grow with the buffer), the state is the upstream's
/// state at the start of the epoch plus the number of elements produced; a restore replays the
/// upstream from there and redraws the same choices. This costs O(elements produced this epoch)
/// upstream elements; put `shuffle` before expensive `map`s (shuffling file names or indices,
/// not decoded images) to keep it cheap.
/// \code
/// auto ds = from_tensor_slices(x, y).shuffle(10000, 42).batch(32);
/// \endcode
template <Dataset D>
class ShuffleDataset : public DatasetBase<ShuffleDataset<D>> {
 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for a buffer size of 0.
  ShuffleDataset(D upstream, std::size_t buffer_size, std::uint64_t seed, bool reshuffle)
      : upstream_(std::move(upstream)),
        buffer_size_(buffer_size),
        seed_(seed),
        reshuffle_(reshuffle),
        rng_(0) {
    if (buffer_size == 0) throw ConfigError("shuffle: buffer_size must be positive but is 0");
    start_epoch();
  }

  std::optional<element_type> next() {
    if (!filled_) {
      filled_ = true;
      buffer_.reserve(buffer_size_);
      while (buffer_.size() < buffer_size_) {
        auto element = upstream_.next();
        if (!element) break;
        buffer_.push_back(std::move(*element));
      }
    }
    if (buffer_.empty()) return std::nullopt;
    const std::size_t pick = static_cast<std::size_t>(rng_.below(buffer_.size()));
    element_type out = std::move(buffer_[pick]);
    if (auto element = upstream_.next()) {
      buffer_[pick] = std::move(*element);
    } else {
      buffer_[pick] = std::move(buffer_.back());
      buffer_.pop_back();
    }
    ++produced_;
    return out;
  }
  void reset() {
    upstream_.reset();
    ++epoch_;
    start_epoch();
  }
  nlohmann::json state() const {
    return {{"op", "shuffle"}, {"epoch", epoch_}, {"produced", produced_}, {"start", start_}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "shuffle");
    if (s["produced"] != 0) detail::require_same_shards(s["start"], upstream_.state(), "shuffle");
    upstream_.restore(s["start"]);
    epoch_ = s["epoch"];
    start_epoch();
    const std::size_t produced = s["produced"];
    while (produced_ < produced) {
      if (!next()) {
        throw CheckpointError("shuffle: state is at element " + std::to_string(produced) +
                              " but the epoch ended after " + std::to_string(produced_));
      }
    }
  }

 private:
  void start_epoch() {
    start_ = upstream_.state();
    buffer_.clear();
    filled_ = false;
    produced_ = 0;
    rng_ = SplitMix64(epoch_seed(seed_, reshuffle_ ? epoch_ : 0));
  }

  D upstream_;
  std::size_t buffer_size_;
  std::uint64_t seed_;
  bool reshuffle_;
  SplitMix64 rng_;
  std::uint64_t epoch_ = 0;
  std::size_t produced_ = 0;
  bool filled_ = false;
  nlohmann::json start_;
  std::vector<element_type> buffer_;
};

}  // namespace loadstar
