/// \file
/// Keras's `class_weight`: per-class weights turned into one sample weight per row.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "loadstar/data/array_like.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// A weight per class index, as Keras's `fit(class_weight={0: 1.0, 1: 5.0})`.
using ClassWeight = std::map<std::int64_t, float>;

namespace detail {
template <TensorElement T>
Tensor<float> class_weight_of_tensor(const Tensor<T>& y, const std::string& name,
                                     const ClassWeight& class_weight) {
  if (y.rank() == 0 || y.rank() > 2) {
    throw ShapeError("class_weight: " + name + " must have rank 1 or 2 but is a " +
                     y.description() + " (Keras does not support it for 3+ dimensional targets)");
  }
  y.require_host(("class_weight (reading the classes of " + name + ")").c_str());
  const std::size_t n = y.rows();
  const std::size_t width = y.row_size();
  Tensor<float> weights = Tensor<float>::uninitialized({n});
  for (std::size_t i = 0; i < n; ++i) {
    const T* row = y.data() + i * width;
    std::int64_t label = 0;
    if (y.rank() == 2 && width > 1) {
      // One-hot or probabilities: the class is the argmax, as tf.keras's data adapter does.
      std::size_t best = 0;
      for (std::size_t j = 1; j < width; ++j) {
        if (row[j] > row[best]) best = j;
      }
      label = static_cast<std::int64_t>(best);
    } else if (width == 1) {
      label = static_cast<std::int64_t>(std::llround(static_cast<double>(row[0])));
    } else {
      throw ShapeError("class_weight: " + name + " is a " + y.description() +
                       " with no class per row");
    }
    const auto found = class_weight.find(label);
    if (found == class_weight.end()) {
      throw ConfigError("class_weight: no weight for class " + std::to_string(label) + " (row " +
                        std::to_string(i) + " of " + name + "); class_weight has " +
                        std::to_string(class_weight.size()) + " classes");
    }
    weights.data()[i] = found->second;
  }
  return weights;
}
}  // namespace detail

/// One sample weight per row of `y` from a weight per class, as Keras's `fit(class_weight=...)`.
///
/// `y` holds class indices (shape `(n,)` or `(n, 1)`) or one-hot rows (shape `(n, classes)`,
/// whose class is the argmax). Throws `ConfigError` when `y` has several members (Keras supports
/// `class_weight` for single-output models only) or a class of `y` has no weight, and
/// `ShapeError` for targets of rank 3 or more.
template <ArrayLike Y>
Tensor<float> class_weight_to_sample_weight(const Y& y, const ClassWeight& class_weight) {
  if (member_count(y) != 1) {
    throw ConfigError("class_weight: supported for a single output only but y has " +
                      std::to_string(member_count(y)) + " arrays");
  }
  Tensor<float> weights;
  for_each_member(y, "y", [&](const std::string& name, const auto& tensor) {
    weights = detail::class_weight_of_tensor(tensor, name, class_weight);
  });
  return weights;
}

/// The sample weights Keras's `fit` uses: `sample_weight`, or weights made from
/// `class_weight`, or none. Throws `ConfigError` when both are given, as Keras does.
template <ArrayLike Y>
std::optional<Tensor<float>> resolve_sample_weight(const Y& y,
                                                   std::optional<Tensor<float>> sample_weight,
                                                   const std::optional<ClassWeight>& class_weight) {
  if (sample_weight && class_weight) {
    throw ConfigError(
        "fit: sample_weight and class_weight were both given; Keras accepts one or the other");
  }
  if (class_weight) return class_weight_to_sample_weight(y, *class_weight);
  return sample_weight;
}

}  // namespace loadstar
