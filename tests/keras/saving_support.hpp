// Helpers shared by the tests of Keras model files: element-wise comparison with a tolerance, and
// small models trained a few steps.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <loadstar/keras.hpp>
#include <memory>
#include <string>
#include <vector>

namespace saving_support {

/// Checks `actual` against `expected` element-wise: |a - e| <= tolerance * max(1, |e|) (absolute
/// or relative, whichever is larger), reporting the first index, value and target that fail.
inline void check_close(const loadstar::Tensor<float>& actual,
                        const loadstar::Tensor<float>& expected, double tolerance) {
  REQUIRE(actual.shape() == expected.shape());
  std::size_t failures = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual.data()[i];
    const double e = expected.data()[i];
    if (!(std::abs(a - e) <= tolerance * std::max(1.0, std::abs(e)))) {
      if (failures++ == 0) {
        FAIL_CHECK("index " << i << ": " << a << " but Keras computed " << e << " (tolerance "
                            << tolerance << ")");
      }
    }
  }
  CHECK(failures == 0);
}

/// Whether two lists of tensors are bitwise equal.
inline bool same_weights(const std::vector<loadstar::Tensor<float>>& a,
                         const std::vector<loadstar::Tensor<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

/// Deterministic inputs and targets: `rows` rows of `features` values, `classes` one-hot-free
/// class indices.
inline loadstar::Tensor<float> inputs(std::size_t rows, std::size_t features, float phase = 0) {
  loadstar::Tensor<float> x({rows, features});
  for (std::size_t i = 0; i < x.size(); ++i)
    x.data()[i] = std::sin(0.37F * static_cast<float>(i) + phase);
  return x;
}

inline loadstar::Tensor<float> labels(std::size_t rows, std::size_t classes) {
  loadstar::Tensor<float> y({rows});
  for (std::size_t i = 0; i < rows; ++i)
    y.data()[i] = static_cast<float>((i * 7 + 3) % classes);
  return y;
}

/// A small Sequential MLP (Dense, BatchNormalization, Dense) with seeded weights.
inline std::unique_ptr<loadstar::keras::Sequential> sequential_mlp() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  set_random_seed(7);
  auto model = std::make_unique<Sequential>("mlp");
  model->add(Input({6}));
  model->add(Dense(8, {.activation = "relu"}));
  model->add(BatchNormalization());
  model->add(Dense(3, {.activation = "softmax"}));
  return model;
}

/// A small functional model with two branches joined by Concatenate.
inline std::unique_ptr<loadstar::keras::Model> functional_model() {
  using namespace loadstar::keras;
  using namespace loadstar::keras::layers;
  set_random_seed(11);
  auto input = Input({6}, "features");
  auto a = call(Dense(5, {.activation = "tanh", .name = "left"}), input);
  auto b = call(Dense(4, {.activation = "relu", .name = "right"}), input);
  auto joined = call(Concatenate(), std::vector<KerasTensor>{a, b});
  auto output = call(Dense(3, {.activation = "softmax", .name = "head"}), joined);
  return std::make_unique<Model>(input, output, "branches");
}

}  // namespace saving_support
