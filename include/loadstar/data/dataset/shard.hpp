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
/// shards `0..num_shards-1` partition the epoch. As tf.data advises, shard before any
/// randomising operator, so that every shard sees the same upstream order. With one shard the
/// dataset is passed through. The state is the upstream's.
/// \code
/// auto mine = from_tensor_slices(x).shard(size, rank);
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
    // Skip to this shard's next element: on the first call `index`, then `num_shards - 1`.
    const std::size_t gap = started_ ? num_shards_ - 1 : index_;
    for (std::size_t i = 0; i < gap; ++i) {
      if (!upstream_.next()) return std::nullopt;
    }
    started_ = true;
    return upstream_.next();
  }
  void reset() {
    upstream_.reset();
    started_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "shard"}, {"started", started_}, {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "shard");
    upstream_.restore(s["upstream"]);
    started_ = s["started"];
  }

  std::size_t num_shards() const noexcept { return num_shards_; }
  std::size_t index() const noexcept { return index_; }

 private:
  D upstream_;
  std::size_t num_shards_;
  std::size_t index_;
  bool started_ = false;
};

}  // namespace loadstar
