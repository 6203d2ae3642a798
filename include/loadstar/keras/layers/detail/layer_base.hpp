/// \file
/// What every built-in layer shares: naming in messages, shape checks, scratch buffers, config.
#pragma once

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/initializers.hpp"
#include "loadstar/keras/layer.hpp"

namespace loadstar::keras::layers {

/// Two sizes (height, width) of a kernel, stride, pool or dilation; `3` means `(3, 3)` as Keras.
struct Size2 {
  std::size_t h = 1;
  std::size_t w = 1;
  Size2(std::size_t both) : h(both), w(both) {}  // NOLINT: `3` reads as Keras's `3`
  Size2(std::size_t height, std::size_t width) : h(height), w(width) {}
  friend bool operator==(const Size2&, const Size2&) = default;
};

namespace detail {

/// A buffer in the backend's memory, sized on the first batch and reused: `get` returns a view of
/// the shape asked for, reallocating only when a batch is larger than every batch before (or the
/// backend's memory is another).
class Scratch {
 public:
  Tensor<float> get(Backend& backend, const Shape& shape) {
    if (shape.elements() > buffer_.size() || buffer_.empty() ||
        buffer_.device() != backend.device())
      buffer_ = backend.allocate(Shape{std::max<std::size_t>(shape.elements(), 1)});
    return buffer_.slice_rows(0, shape.elements()).reshape(shape);
  }

 private:
  Tensor<float> buffer_;
};

/// Shared code of the built-in layers: input shapes checked against those of `build`, messages
/// that name the layer (`"dense layer 'fc1': ..."`), and Keras's common config keys.
class LayerBase : public Layer {
 public:
  using Layer::Layer;

 protected:
  /// `"dense layer 'fc1'"`.
  std::string label() const {
    std::string kind = class_name();
    std::transform(kind.begin(), kind.end(), kind.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return kind + " layer '" + name() + "'";
  }

  /// Throws `ShapeError` unless exactly `count` inputs are given.
  void expect_inputs(std::span<const Shape> shapes, std::size_t count) const {
    if (shapes.size() != count) {
      throw ShapeError(label() + ": expects " + std::to_string(count) + " input" +
                       (count == 1 ? "" : "s") + " but got " + std::to_string(shapes.size()));
    }
  }

  /// Throws `ShapeError` unless the input has rank `rank` (without the batch axis).
  void expect_rank(const Shape& shape, std::size_t rank) const {
    if (shape.rank() != rank) {
      throw ShapeError(label() + ": expects rank-" + std::to_string(rank) +
                       " inputs (without the batch axis) but got " + shape.str());
    }
  }

  /// Remembers the shapes `build` accepted, for `check_inputs`.
  void remember(std::span<const Shape> shapes, const Shape& output) {
    input_shapes_.assign(shapes.begin(), shapes.end());
    output_shape_ = output;
  }

  /// Throws `ShapeError` when a batch's input does not have the shape the layer was built for.
  void check_inputs(std::span<const Tensor<float>> inputs) const {
    if (inputs.size() != input_shapes_.size()) {
      throw ShapeError(label() + ": built for " + std::to_string(input_shapes_.size()) +
                       " inputs but called with " + std::to_string(inputs.size()));
    }
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].rank() == 0 || inputs[i].shape().row_shape() != input_shapes_[i]) {
        throw ShapeError(label() + ": expects inputs of shape " + batch_str(input_shapes_[i]) +
                         " but got " + inputs[i].shape().str());
      }
    }
  }

  /// `"(None, 28, 28)"`: a shape with a free batch axis, as Keras prints it.
  static std::string batch_str(const Shape& shape) {
    std::string s = "(None";
    for (std::size_t d : shape)
      s += ", " + std::to_string(d);
    return s + ")";
  }

  /// The keys every Keras layer config has.
  nlohmann::json base_config() const {
    return {{"name", name()}, {"trainable", true}, {"dtype", "float32"}};
  }

  /// The weight `index` (fixed at build, in Keras's order).
  Variable& weight(std::size_t index) { return weights_[index]; }

  std::vector<Shape> input_shapes_;
  Shape output_shape_;
};

/// A layer that changes the shape of its one input but not its values (`InputLayer`, `Flatten`,
/// `Reshape`): the output is the input's elements in the same row-major order, and so is the
/// input gradient.
class ShapeOnlyLayer : public LayerBase {
 public:
  using LayerBase::LayerBase;

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    ctx.backend.copy(inputs[0], output);
  }

  void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    if (input_gradients.empty() || input_gradients[0].empty()) return;
    ctx.backend.copy(output_gradient, input_gradients[0]);
  }
};

/// Reads `key` of a config as `T`, or `fallback` when absent or null.
template <class T>
T config_value(const nlohmann::json& config, const char* key, T fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  return config[key].get<T>();
}

/// A config's activation: a name, or Keras's serialised `{"class_name": "relu", ...}`.
inline std::string config_activation(const nlohmann::json& config) {
  if (!config.contains("activation") || config["activation"].is_null()) return "linear";
  const auto& a = config["activation"];
  if (a.is_object()) return a.value("class_name", std::string("linear"));
  return a.get<std::string>();
}

/// A config's pair of sizes: `[3, 3]` or `3`.
inline Size2 config_size2(const nlohmann::json& config, const char* key, Size2 fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  const auto& v = config[key];
  if (v.is_number()) return Size2(v.get<std::size_t>());
  return Size2(v.at(0).get<std::size_t>(), v.at(1).get<std::size_t>());
}

inline Initializer config_initializer(const nlohmann::json& config, const char* key,
                                      Initializer fallback) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  return Initializer::from_json(config[key]);
}

/// `"valid"` or `"same"`; anything else throws `ConfigError` naming the layer.
inline bool parse_padding(const std::string& padding, const std::string& label) {
  if (padding == "same") return true;
  if (padding == "valid") return false;
  throw ConfigError(label + ": padding must be 'valid' or 'same' but is '" + padding + "'");
}

}  // namespace detail
}  // namespace loadstar::keras::layers
