/// \file
/// `ValidationData`: the validation data of `fit`, of any loader kind.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/batch.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The validation data of `fit`: arrays `(x, y[, sample_weight])`, a `Sequence` or a `Dataset`
/// (held by a shared pointer: pass `std::move(dataset)` or a copy). Empty by default.
/// \code
/// model.fit(x, y, {.epochs = 5, .validation_data = {x_test, y_test}});
/// \endcode
class ValidationData {
 public:
  ValidationData() = default;
  template <ArrayLike X, ArrayLike Y>
  ValidationData(X x, Y y)  // NOLINT: implicit, for `.validation_data = {x, y}`
      : make_([x = std::move(x), y = std::move(y)](std::size_t batch_size,
                                                   std::optional<std::size_t> steps) {
          return arrays(x, y, std::nullopt, batch_size, steps);
        }) {}
  template <ArrayLike X, ArrayLike Y>
  ValidationData(X x, Y y, Tensor<float> sample_weight)
      : make_([x = std::move(x), y = std::move(y), w = std::move(sample_weight)](
                  std::size_t batch_size, std::optional<std::size_t> steps) {
          return arrays(x, y, w, batch_size, steps);
        }) {}
  template <KerasSequence S>
  requires(!ArrayLike<S>) ValidationData(S sequence)  // NOLINT: implicit on purpose
      : make_([sequence = std::move(sequence)](std::size_t, std::optional<std::size_t> steps) {
          return std::shared_ptr<detail::BatchSource>(
              std::make_shared<detail::SequenceSource<S>>(sequence, steps));
        }) {}
  template <Dataset D>
  requires KerasBatch<element_t<D>> ValidationData(D dataset)  // NOLINT: implicit on purpose
      : make_([dataset = std::make_shared<D>(std::move(dataset))](std::size_t,
                                                                  std::optional<std::size_t>) {
          return std::shared_ptr<detail::BatchSource>(
              std::make_shared<detail::DatasetSource<D&>>(*dataset, std::nullopt));
        }) {}

  bool empty() const noexcept { return !make_; }

  /// The source of validation batches (for the model).
  std::shared_ptr<detail::BatchSource> source(std::size_t batch_size,
                                              std::optional<std::size_t> steps) const {
    return make_(batch_size, steps);
  }

 private:
  template <ArrayLike X, ArrayLike Y>
  static std::shared_ptr<detail::BatchSource> arrays(const X& x, const Y& y,
                                                     std::optional<Tensor<float>> w,
                                                     std::size_t batch_size,
                                                     std::optional<std::size_t> steps) {
    const std::size_t rows = rows_of(x, "x", "validation_data");
    const std::size_t y_rows = rows_of(y, "y", "validation_data");
    if (y_rows != rows) {
      throw ShapeError("validation_data: y has " + std::to_string(y_rows) + " rows but x has " +
                       std::to_string(rows));
    }
    return std::make_shared<detail::ArraySource<X, Y>>(x, y, std::move(w), rows,
                                                       std::min(batch_size, rows), false, 0, steps);
  }

  std::function<std::shared_ptr<detail::BatchSource>(std::size_t, std::optional<std::size_t>)>
      make_;
};

}  // namespace loadstar::keras
