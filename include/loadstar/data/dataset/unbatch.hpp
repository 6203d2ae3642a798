/// \file
/// `unbatch`: every element split into its rows.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/stack.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The rows of every element of `D`, the reverse of `batch`: a batch of shape `(n, S...)`
/// becomes `n` elements of shape `(S...)` (views of the batch). The state is the upstream's
/// state before the current batch and the row within it; a restore rebuilds that one batch.
/// \code
/// auto rows = from_sequence(ArraySequence(x, y, 32)).unbatch();
/// \endcode
template <Dataset D>
class UnbatchDataset : public DatasetBase<UnbatchDataset<D>> {
  static_assert(detail::Unstackable<element_t<D>>,
                "unbatch: elements must be tensors, or tuples, lists or maps of tensors");

 public:
  using element_type = typename detail::Unstacker<element_t<D>>::row_type;

  explicit UnbatchDataset(D upstream)
      : upstream_(std::move(upstream)), before_batch_(upstream_.state()) {}

  std::optional<element_type> next() {
    while (!current_ || row_ >= rows_) {
      before_batch_ = upstream_.state();
      current_ = upstream_.next();
      row_ = 0;
      if (!current_) {
        rows_ = 0;
        return std::nullopt;
      }
      rows_ = detail::Unstacker<element_t<D>>::rows(*current_);
    }
    return detail::Unstacker<element_t<D>>::row(*current_, row_++);
  }
  void reset() {
    upstream_.reset();
    current_.reset();
    row_ = rows_ = 0;
    before_batch_ = upstream_.state();
  }
  nlohmann::json state() const {
    if (!current_ || row_ >= rows_) {
      return {{"op", "unbatch"}, {"row", 0}, {"upstream", upstream_.state()}};
    }
    return {{"op", "unbatch"}, {"row", row_}, {"upstream", before_batch_}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "unbatch");
    upstream_.restore(s["upstream"]);
    before_batch_ = s["upstream"];
    current_.reset();
    row_ = rows_ = 0;
    const std::size_t row = s["row"];
    if (row == 0) return;
    current_ = upstream_.next();
    rows_ = current_ ? detail::Unstacker<element_t<D>>::rows(*current_) : 0;
    if (row > rows_) {
      throw CheckpointError("unbatch: state is at row " + std::to_string(row) +
                            " but the batch has " + std::to_string(rows_) + " rows");
    }
    row_ = row;
  }

 private:
  D upstream_;
  nlohmann::json before_batch_;
  std::optional<element_t<D>> current_;
  std::size_t row_ = 0;
  std::size_t rows_ = 0;
};

}  // namespace loadstar
