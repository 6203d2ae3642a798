/// \file
/// `from_tensor_slices`: the rows of in-memory arrays as the elements of a dataset.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/stack.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The rows of an array-like (or of a tuple of array-likes) as elements: row `i` of a tensor of
/// shape `(n, S...)` is a view of shape `(S...)` sharing the tensor's storage, so producing an
/// element copies nothing. The state is the row index: restoring costs O(1).
/// \code
/// auto ds = from_tensor_slices(images, labels);   // elements (image row, label row)
/// auto [image, label] = *ds.next();
/// \endcode
template <class A>
requires detail::Unstackable<A>
class TensorSlices : public DatasetBase<TensorSlices<A>> {
 public:
  using element_type = typename detail::Unstacker<A>::row_type;

  /// Throws `ShapeError` when the members have different numbers of rows.
  explicit TensorSlices(A arrays)
      : arrays_(std::move(arrays)), rows_(detail::Unstacker<A>::rows(arrays_)) {}

  std::optional<element_type> next() {
    if (index_ >= rows_) return std::nullopt;
    return detail::Unstacker<A>::row(arrays_, index_++);
  }
  void reset() noexcept { index_ = 0; }
  nlohmann::json state() const { return {{"op", "tensor_slices"}, {"index", index_}}; }
  void restore(const nlohmann::json& state) {
    const std::size_t index = detail::expect_state(state, "tensor_slices")["index"];
    if (index > rows_) {
      throw CheckpointError("tensor_slices: state is at row " + std::to_string(index) +
                            " but the arrays have " + std::to_string(rows_) + " rows");
    }
    index_ = index;
  }

  /// The number of elements of an epoch.
  std::size_t size() const noexcept { return rows_; }

 private:
  A arrays_;
  std::size_t rows_;
  std::size_t index_ = 0;
};

/// The rows of `x`: each a tensor, a list, a map or a tuple of tensors.
template <ArrayLike X>
TensorSlices<X> from_tensor_slices(X x) {
  return TensorSlices<X>(std::move(x));
}

/// The rows of `(x, y)` as `(x_row, y_row)` elements; throws `ShapeError` when `x` and `y` have
/// different numbers of rows.
template <ArrayLike X, ArrayLike Y>
TensorSlices<std::tuple<X, Y>> from_tensor_slices(X x, Y y) {
  return TensorSlices<std::tuple<X, Y>>(std::tuple<X, Y>(std::move(x), std::move(y)));
}

/// The rows of `(x, y, sample_weight)` as `(x_row, y_row, w_row)` elements.
template <ArrayLike X, ArrayLike Y>
TensorSlices<std::tuple<X, Y, Tensor<float>>> from_tensor_slices(X x, Y y,
                                                                 Tensor<float> sample_weight) {
  return TensorSlices<std::tuple<X, Y, Tensor<float>>>(
      std::tuple<X, Y, Tensor<float>>(std::move(x), std::move(y), std::move(sample_weight)));
}

}  // namespace loadstar
