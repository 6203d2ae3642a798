// The PyTorch reference cases of tests/keras/generate_layers*.py and the run of one case through a
// layer built from its config: outputs, input gradients, weight gradients and updated weights
// are checked element by element, reporting the index, the value and the target.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <loadstar/keras/detail/call_arguments.hpp>
#include <loadstar/keras/layers.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace layer_cases {

using loadstar::Shape;
using loadstar::Tensor;

// float32 against float64 targets: 1e-5 relative plus 1e-5 absolute.
inline constexpr double relative_tolerance = 1e-5;
inline constexpr double absolute_tolerance = 1e-5;

/// The reference file `tests/keras/reference/<file>`.
inline nlohmann::json load(const std::string& file) {
  const char* dir = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(dir != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  std::ifstream in(std::string(dir) + "/tests/keras/reference/" + file);
  REQUIRE_MESSAGE(in.good(), "cannot open tests/keras/reference/" << file);
  return nlohmann::json::parse(in);
}

inline Shape shape_of(const nlohmann::json& j) {
  return Shape(j.get<std::vector<std::size_t>>());
}

inline Tensor<float> tensor_of(const nlohmann::json& values, const Shape& shape) {
  std::vector<float> v;
  for (const auto& x : values)
    v.push_back(x.get<float>());
  return Tensor<float>(shape, std::span<const float>(v));
}

/// A deterministic input: `scale * sin(phase + i * step)` at element `i`.
inline Tensor<float> wave(const Shape& shape, float scale, float phase = 0.0F, float step = 0.41F) {
  Tensor<float> t(shape);
  float v = phase;
  for (float& x : t) {
    x = scale * std::sin(v);
    v += step;
  }
  return t;
}

/// Whether two tensors have the same shape and the same bits.
inline bool same_bits(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline void check_close(const std::string& what, const Tensor<float>& actual,
                        const nlohmann::json& target) {
  REQUIRE_MESSAGE(actual.size() == target.size(),
                  what << ": " << actual.size() << " values but " << target.size() << " targets");
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double t = target[i].get<double>();
    const double a = actual.data()[i];
    if (!(std::abs(a - t) <= absolute_tolerance + relative_tolerance * std::abs(t))) {
      FAIL_CHECK(what << ": index " << i << " is " << a << " but the target is " << t);
      return;
    }
  }
}

/// Runs one reference case through `backend` and checks every target.
inline void run_case(const nlohmann::json& c, loadstar::keras::Backend& backend) {
  using namespace loadstar::keras;
  const std::string name = c["name"];
  INFO("case ", name, " with ", backend.threads(), " threads");
  auto config = c["config"];
  config["name"] = name;
  auto layer = layers::LayerRegistry::instance().create(c["class_name"], config);
  // The keyword arguments of the Keras call (the attention layers' use_causal_mask).
  if (c.contains("call_kwargs")) {
    auto* arguments = dynamic_cast<loadstar::keras::detail::CallArguments*>(layer.get());
    REQUIRE_MESSAGE(arguments != nullptr, c["class_name"] << " takes no call arguments");
    arguments->apply_call_kwargs(c["call_kwargs"], name);
  }
  std::vector<Shape> batch_shapes, sample_shapes;
  for (const auto& s : c["input_shapes"]) {
    batch_shapes.push_back(shape_of(s));
    sample_shapes.push_back(batch_shapes.back().row_shape());
  }
  const Shape out_shape = layer->build(sample_shapes, 7);
  CHECK(out_shape.prepend(batch_shapes[0][0]) == shape_of(c["output_shape"]));
  for (auto& w : layer->weights()) {
    REQUIRE_MESSAGE(c["weights"].contains(w.name), "weight " << w.name << " has no reference");
    w.value = backend.from_host(tensor_of(c["weights"][w.name], w.value.shape()));
    if (!w.gradient.empty()) w.gradient = backend.allocate(w.gradient.shape());
  }
  std::vector<Tensor<float>> inputs, input_gradients;
  for (std::size_t i = 0; i < batch_shapes.size(); ++i) {
    inputs.push_back(backend.from_host(tensor_of(c["inputs"][i], batch_shapes[i])));
    input_gradients.push_back(c["input_gradients"][i].is_null() && !c.value("self_attention", false)
                                  ? Tensor<float>()
                                  : backend.allocate(batch_shapes[i]));
  }
  // The seed and step of the call draw its dropout masks (the recurrent layers' dropout cases).
  const CallContext ctx{.backend = backend,
                        .training = c["training"].get<bool>(),
                        .seed = c.value("seed", std::uint64_t{0}),
                        .step = c.value("step", std::uint64_t{0})};
  const Shape output_shape = shape_of(c["output_shape"]);
  const Tensor<float> output = backend.from_host(Tensor<float>(output_shape, std::nanf("")));
  layer->forward(inputs, output, ctx);
  check_close("output", backend.to_host(output), c["output"]);
  const Tensor<float> upstream = backend.from_host(tensor_of(c["upstream"], output_shape));
  layer->backward(inputs, output, upstream, input_gradients, ctx);
  // One tensor given as every input (self-attention): its gradient is the sum of the inputs'.
  if (c.value("self_attention", false)) {
    for (std::size_t i = 1; i < inputs.size(); ++i)
      backend.add(input_gradients[0], input_gradients[i], input_gradients[0]);
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!c["input_gradients"][i].is_null())
      check_close("gradient of input " + std::to_string(i), backend.to_host(input_gradients[i]),
                  c["input_gradients"][i]);
  }
  for (const auto& w : layer->weights()) {
    if (w.trainable) {
      REQUIRE(c["weight_gradients"].contains(w.name));
      check_close("gradient of " + w.name, backend.to_host(w.gradient),
                  c["weight_gradients"][w.name]);
    } else if (c["updated_weights"].contains(w.name)) {
      check_close("updated " + w.name, backend.to_host(w.value), c["updated_weights"][w.name]);
    }
  }
}

}  // namespace layer_cases
