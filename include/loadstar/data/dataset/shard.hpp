/// \file
/// `shard`: every `num_shards`-th element, as `tf.data.Dataset.shard`.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// Elements `index, index + num_shards, index + 2 * num_shards, ...` of every epoch of `D`: the
/// shards `0..num_shards-1` partition the epoch. With one shard the dataset is passed through.
///
/// The upstream is read in rounds of `num_shards` elements, each shard taking its own and
/// skipping the rest of the round at once, so that at every consumption boundary every shard's
/// upstream stands at the same place: the end of the last round. The state is that upstream
/// state (and the sharding, for the check below), which does not depend on the number of shards:
/// restored into `shard(M, i)` it goes on
/// with the rounds of `M` from there, so a job checkpointed on `N` ranks (which consume in step)
/// resumes on `M` reading the upstream stream from the same element on, each element once. That
/// holds when nothing between this `shard` and the consumer holds elements across its
/// consumption boundary: a `shuffle`, a parallel `map`'s window, an `interleave` or a `cache`
/// downstream of the shard holds this rank's elements, and restoring it with another sharding
/// throws `CheckpointError`. tf.data advises sharding before randomising operators (so each
/// shard shuffles only its own share); to resume on another number of ranks, shard after them
/// (the elements a rank skips are still read upstream).
/// \code
/// auto mine = from_tensor_slices(files).shuffle(10000, seed).shard(size, rank);
/// auto batches = std::move(mine).map(decode).batch(32);
/// \endcode
template <Dataset D>
class ShardDataset : public DatasetBase<ShardDataset<D>> {
 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for zero shards or an index outside `[0, num_shards)`.
  ShardDataset(D upstream, std::size_t num_shards, std::size_t index)
      : upstream_(std::move(upstream)), num_shards_(num_shards), index_(index) {
    if (num_shards == 0) throw ConfigError("shard: num_shards must be positive but is 0");
    if (index >= num_shards) {
      throw ConfigError("shard: index must be less than num_shards " + std::to_string(num_shards) +
                        " but is " + std::to_string(index));
    }
  }

  std::optional<element_type> next() {
    if (!skip(index_)) return std::nullopt;
    auto element = upstream_.next();
    if (element) skip(num_shards_ - 1 - index_);
    return element;
  }
  void reset() { upstream_.reset(); }
  nlohmann::json state() const {
    return {{"op", "shard"},
            {"num_shards", num_shards_},
            {"index", index_},
            {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "shard");
    upstream_.restore(s["upstream"]);
    // A state written when shards skipped lazily stands just after this shard's last element.
    if (!s.contains("num_shards") && s.contains("started") && s["started"] == true) {
      skip(num_shards_ - 1 - index_);
    }
  }

  std::size_t num_shards() const noexcept { return num_shards_; }
  std::size_t index() const noexcept { return index_; }

 private:
  D upstream_;
  /// Reads and drops `count` upstream elements; false when the epoch ended first.
  bool skip(std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) {
      if (!upstream_.next()) return false;
    }
    return true;
  }

  std::size_t num_shards_;
  std::size_t index_;
};

}  // namespace loadstar
