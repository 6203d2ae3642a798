// Reference values of tests/keras/generate_losses_metrics_optimizers.py and the further
// generators, shared by the loss, metric and optimizer tests, and the element-wise comparison that
// reports index, value and target.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/tensor.hpp>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace reference_values {

using loadstar::Shape;
using loadstar::Tensor;

// The checked-in reference values in tests/keras/reference/<file>.
inline nlohmann::json load_reference(std::string_view file) {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  const std::string path = std::string(root) + "/tests/keras/reference/" + std::string(file);
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open the reference values " << path);
  return nlohmann::json::parse(in);
}

// The checked-in reference values of tests/keras/generate_losses_metrics_optimizers.py.
inline const nlohmann::json& reference() {
  static const nlohmann::json json = load_reference("losses_metrics_optimizers.json");
  return json;
}

inline Tensor<float> tensor_of(const nlohmann::json& values, const nlohmann::json& shape) {
  const auto v = values.get<std::vector<float>>();
  return Tensor<float>(Shape(shape.get<std::vector<std::size_t>>()), std::span<const float>(v));
}

// |value - target| <= absolute + relative * |target|, element by element, reporting the index.
inline void check_close(std::string_view what, std::span<const float> values,
                        const std::vector<double>& targets, double absolute, double relative) {
  REQUIRE(values.size() == targets.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double tolerance = absolute + relative * std::abs(targets[i]);
    INFO(what, " at index ", i, ": value ", values[i], ", target ", targets[i]);
    CHECK(std::abs(values[i] - targets[i]) <= tolerance);
  }
}

}  // namespace reference_values
