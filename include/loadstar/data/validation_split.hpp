/// \file
/// Keras's `validation_split`: the last fraction of the rows, taken before any shuffle.
#pragma once

#include <cmath>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

#include "loadstar/data/array_like.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// Inputs, targets and optional sample weights of an array loader, as Keras's `fit` takes them.
template <ArrayLike X, ArrayLike Y>
struct Arrays {
  X x;
  Y y;
  std::optional<Tensor<float>> sample_weight;
};

/// Splits arrays into training and validation parts as Keras's `fit(validation_split=f)`: the
/// validation part is the last `f` of the rows, before any shuffling; the first
/// `floor(n * (1 - f))` rows train. Both parts view the original storage.
///
/// Throws `ConfigError` when `f` is outside (0, 1) or leaves either part empty, and `ShapeError`
/// when the arrays' row counts differ.
template <ArrayLike X, ArrayLike Y>
std::pair<Arrays<X, Y>, Arrays<X, Y>> validation_split(const Arrays<X, Y>& data, double fraction) {
  if (!(fraction > 0.0 && fraction < 1.0)) {
    throw ConfigError("validation_split: must be in (0, 1) but is " + std::to_string(fraction));
  }
  const std::size_t n = rows_of(data.x, "x", "validation_split");
  const std::size_t y_rows = rows_of(data.y, "y", "validation_split");
  if (y_rows != n) {
    throw ShapeError("validation_split: y has " + std::to_string(y_rows) + " rows but x has " +
                     std::to_string(n));
  }
  if (data.sample_weight && data.sample_weight->rows() != n) {
    throw ShapeError("validation_split: sample_weight has " +
                     std::to_string(data.sample_weight->rows()) + " rows but x has " +
                     std::to_string(n));
  }
  // tf.keras's data_adapter.train_validation_split: split_at = floor(n * (1 - f)).
  const auto split_at =
      static_cast<std::size_t>(std::floor(static_cast<double>(n) * (1.0 - fraction)));
  if (split_at == 0 || split_at == n) {
    throw ConfigError(
        "validation_split: too few rows to split into training and validation "
        "sets with validation_split=" +
        std::to_string(fraction) + " (rows: " + std::to_string(n) +
        ", training rows: " + std::to_string(split_at) + ")");
  }
  auto part = [&](std::size_t begin, std::size_t end) {
    Arrays<X, Y> out{slice_rows(data.x, begin, end), slice_rows(data.y, begin, end), std::nullopt};
    if (data.sample_weight) out.sample_weight = data.sample_weight->slice_rows(begin, end);
    return out;
  };
  return {part(0, split_at), part(split_at, n)};
}

/// `validation_split` of `x` and `y` without sample weights.
template <ArrayLike X, ArrayLike Y>
std::pair<Arrays<X, Y>, Arrays<X, Y>> validation_split(const X& x, const Y& y, double fraction) {
  return validation_split(Arrays<X, Y>{x, y, std::nullopt}, fraction);
}

}  // namespace loadstar
