/// \file
/// `ArraySequence`: in-memory arrays `(x, y[, w])` served as a Keras `Sequence` of batches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/class_weight.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// Options of an `ArraySequence`.
struct ArrayOptions {
  /// Drop the last partial batch: `size()` is `floor(n / batch_size)` instead of the ceiling.
  bool drop_leftovers = false;
};

/// Arrays `(x, y[, w])` as a `Sequence` of batches, with the semantics of Determined's
/// `_ArrayLikeAdapter`: `size()` is `ceil(n / batch_size)` (`floor` with `drop_leftovers`) and
/// batch `i` holds rows `[i * batch_size, min((i + 1) * batch_size, n))`, so the last batch may be
/// partial. Batches are views of the arrays' storage: building one copies nothing.
///
/// `x` and `y` are each a tensor, a list, a map or a tuple of tensors (`ArrayLike`). With sample
/// weights (given directly or made from a `ClassWeight`), batches are `(x, y, w)`; otherwise
/// `(x, y)`.
/// \code
/// ArraySequence train(images, labels, 32);                      // (x, y) batches
/// ArraySequence weighted(images, labels, ClassWeight{{0, 1.f}, {1, 4.f}}, 32); // (x, y, w)
/// for (std::size_t i = 0; i < train.size(); ++i) {
///   auto [x, y] = train[i];
/// }
/// \endcode
template <ArrayLike X, ArrayLike Y, bool Weighted = false>
class ArraySequence {
 public:
  using batch_type =
      std::conditional_t<Weighted, std::tuple<X, Y, Tensor<float>>, std::tuple<X, Y>>;

  /// Unweighted arrays; throws `ShapeError` for empty or mismatched arrays and `ConfigError` for a
  /// batch size of 0 or larger than the data.
  ArraySequence(X x, Y y, std::size_t batch_size, ArrayOptions options = {}) requires(!Weighted)
      : x_(std::move(x)), y_(std::move(y)), batch_size_(batch_size), options_(options) {
    validate();
  }

  /// Arrays with one sample weight per row (a rank-1 `float` tensor).
  ArraySequence(X x, Y y, Tensor<float> sample_weight, std::size_t batch_size,
                ArrayOptions options = {}) requires Weighted : x_(std::move(x)),
                                                               y_(std::move(y)),
                                                               w_(std::move(sample_weight)),
                                                               batch_size_(batch_size),
                                                               options_(options) {
    validate();
  }

  /// Arrays whose sample weights come from a weight per class of `y`, as Keras's `class_weight`;
  /// throws `ConfigError` for a class of `y` missing from `class_weight`.
  ArraySequence(X x, Y y, const ClassWeight& class_weight, std::size_t batch_size,
                ArrayOptions options = {}) requires Weighted : x_(std::move(x)),
                                                               y_(std::move(y)),
                                                               batch_size_(batch_size),
                                                               options_(options) {
    w_ = class_weight_to_sample_weight(y_, class_weight);
    validate();
  }

  /// The number of batches.
  std::size_t size() const noexcept { return batches_; }
  /// The number of rows of the arrays.
  std::size_t rows() const noexcept { return rows_; }
  std::size_t batch_size() const noexcept { return batch_size_; }

  /// Batch `index`: rows `[index * batch_size, min((index + 1) * batch_size, rows()))` of every
  /// array, as views. Throws `ConfigError` for an index `>= size()`.
  batch_type operator[](std::size_t index) const {
    if (index >= batches_) {
      throw ConfigError("array sequence: batch " + std::to_string(index) +
                        " is out of range for a sequence of " + std::to_string(batches_) +
                        " batches");
    }
    const std::size_t begin = index * batch_size_;
    const std::size_t end = std::min(begin + batch_size_, rows_);
    if constexpr (Weighted) {
      return {slice_rows(x_, begin, end), slice_rows(y_, begin, end), w_.slice_rows(begin, end)};
    } else {
      return {slice_rows(x_, begin, end), slice_rows(y_, begin, end)};
    }
  }

  const X& x() const noexcept { return x_; }
  const Y& y() const noexcept { return y_; }
  /// The sample weights (only with `Weighted`).
  const Tensor<float>& sample_weight() const noexcept requires Weighted { return w_; }

 private:
  void validate() {
    constexpr const char* owner = "array sequence";
    rows_ = rows_of(x_, "x", owner);
    const std::size_t y_rows = rows_of(y_, "y", owner);
    if (y_rows != rows_) {
      throw ShapeError(std::string(owner) + ": y has " + std::to_string(y_rows) +
                       " rows but x has " + std::to_string(rows_));
    }
    if constexpr (Weighted) {
      if (w_.rank() != 1) {
        throw ShapeError(std::string(owner) + ": sample_weight must have rank 1 (one weight per " +
                         "row) but is a " + w_.description());
      }
      if (w_.rows() != rows_) {
        throw ShapeError(std::string(owner) + ": sample_weight has " + std::to_string(w_.rows()) +
                         " rows but x has " + std::to_string(rows_));
      }
    }
    if (rows_ == 0) throw ShapeError(std::string(owner) + ": x and y have no rows");
    if (batch_size_ == 0) {
      throw ConfigError(std::string(owner) + ": batch_size must be positive but is 0");
    }
    // Determined's _ArrayLikeAdapter: "Batch size is too large for the input data."
    if (batch_size_ > rows_) {
      throw ConfigError(std::string(owner) + ": batch_size " + std::to_string(batch_size_) +
                        " is larger than the " + std::to_string(rows_) + " rows of the data");
    }
    batches_ =
        options_.drop_leftovers ? rows_ / batch_size_ : (rows_ + batch_size_ - 1) / batch_size_;
  }

  X x_;
  Y y_;
  [[no_unique_address]] std::conditional_t<Weighted, Tensor<float>, std::tuple<>> w_{};
  std::size_t batch_size_;
  ArrayOptions options_;
  std::size_t rows_ = 0;
  std::size_t batches_ = 0;
};

template <ArrayLike X, ArrayLike Y>
ArraySequence(X, Y, std::size_t, ArrayOptions = {}) -> ArraySequence<X, Y, false>;
template <ArrayLike X, ArrayLike Y>
ArraySequence(X, Y, Tensor<float>, std::size_t, ArrayOptions = {}) -> ArraySequence<X, Y, true>;
template <ArrayLike X, ArrayLike Y>
ArraySequence(X, Y, ClassWeight, std::size_t, ArrayOptions = {}) -> ArraySequence<X, Y, true>;

}  // namespace loadstar
