/// \file
/// `batch`: consecutive elements stacked into batches along a new axis 0.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/stack.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// Batches of `batch_size` consecutive elements of `D`, stacked member by member along a new
/// axis 0: rows of shape `(S...)` become a batch of shape `(batch_size, S...)`, scalars a rank-1
/// tensor, and tuples, lists and maps stack each member. The last batch of an epoch holds the
/// remaining elements unless `drop_remainder` (tf.data's default). The state is the upstream's
/// (a batch is built within one `next()`), so restoring costs what the upstream's costs.
/// \code
/// auto batches = from_tensor_slices(x, y).batch(32);   // (x of (32, ...), y of (32, ...))
/// \endcode
template <Dataset D>
class BatchDataset : public DatasetBase<BatchDataset<D>> {
  static_assert(detail::Stackable<element_t<D>>,
                "batch: elements must be tensors, scalars, or tuples, lists or maps of them");

 public:
  using element_type = typename detail::Stacker<element_t<D>>::batch_type;

  /// Throws `ConfigError` for a batch size of 0.
  BatchDataset(D upstream, std::size_t batch_size, bool drop_remainder)
      : upstream_(std::move(upstream)), batch_size_(batch_size), drop_remainder_(drop_remainder) {
    if (batch_size == 0) throw ConfigError("batch: batch_size must be positive but is 0");
    pending_.reserve(batch_size);
  }

  std::optional<element_type> next() {
    pending_.clear();
    while (pending_.size() < batch_size_) {
      auto element = upstream_.next();
      if (!element) break;
      pending_.push_back(std::move(*element));
    }
    if (pending_.empty() || (drop_remainder_ && pending_.size() < batch_size_)) {
      pending_.clear();
      return std::nullopt;
    }
    auto batch = detail::Stacker<element_t<D>>::stack(pending_);
    pending_.clear();
    return batch;
  }
  void reset() { upstream_.reset(); }
  nlohmann::json state() const { return {{"op", "batch"}, {"upstream", upstream_.state()}}; }
  void restore(const nlohmann::json& state) {
    upstream_.restore(detail::expect_state(state, "batch")["upstream"]);
  }

 private:
  D upstream_;
  std::size_t batch_size_;
  bool drop_remainder_;
  std::vector<element_t<D>> pending_;
};

}  // namespace loadstar
