/// \file
/// What every built-in layer shares: naming in messages, shape checks, scratch buffers, config.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/constraints.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/shape_text.hpp"
#include "loadstar/keras/initializers.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/regularizers.hpp"
#include "loadstar/keras/warnings.hpp"

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
  LOADSTAR_DECL Tensor<float> get(Backend& backend, const Shape& shape);

 private:
  Tensor<float> buffer_;
};

/// Shared code of the built-in layers: input shapes checked against those of `build`, messages
/// that name the layer (`"dense layer 'fc1': ..."`), and Keras's common config keys.
class LayerBase : public Layer {
 public:
  using Layer::Layer;

 protected:
  /// `"max_pooling2d layer 'p'"`: Keras's snake_case class name, the one label of a layer in
  /// every message (the model names unnamed layers from the same words).
  std::string label() const { return keras::detail::layer_label(*this); }

  /// Throws `ShapeError` unless exactly `count` inputs are given.
  LOADSTAR_DECL void expect_inputs(std::span<const Shape> shapes, std::size_t count) const;

  /// Throws `ShapeError` unless the input has rank `rank` (without the batch axis).
  LOADSTAR_DECL void expect_rank(const Shape& shape, std::size_t rank) const;

  /// Records the shapes `build` accepted (the layer's built state), for `check_inputs`.
  void remember(std::span<const Shape> shapes, const Shape& output) {
    set_built(std::vector<Shape>(shapes.begin(), shapes.end()), output);
  }

  /// Throws `ShapeError` when a batch's input does not have the shape the layer was built for.
  LOADSTAR_DECL void check_inputs(std::span<const Tensor<float>> inputs) const;

  /// `"(None, 28, 28)"`: a shape with a free batch axis, as Keras prints it.
  static std::string batch_str(const Shape& shape) { return keras::detail::batch_shape_str(shape); }

  /// The keys every Keras layer config has, and `activity_regularizer` when the layer has one.
  nlohmann::json base_config() const {
    nlohmann::json config = {
        {"name", name()}, {"trainable", trainable()}, {"dtype", dtype_policy().to_json()}};
    if (activity_regularizer()) config["activity_regularizer"] = regularizer_json(nullptr);
    return config;
  }

  /// Writes Keras's `<key>_regularizer` and `<key>_constraint` of each of `keys` (`"kernel"`,
  /// `"bias"`, `"depthwise"`: `config_weight_options`'s spellings) into `config`: the layer's,
  /// or null.
  LOADSTAR_DECL void write_weight_options(nlohmann::json& config,
                                          std::initializer_list<const char*> keys) const;

  /// The config value of the regularizer of `weight` (the activity regularizer for null), or
  /// null.
  LOADSTAR_DECL nlohmann::json regularizer_json(const char* weight) const;

  /// The weight `index` (fixed at build, in Keras's order).
  Variable& weight(std::size_t index) { return weights_[index]; }
};

/// The mask of a call's input `i` (`CallContext::input_masks`), or an empty tensor.
inline Tensor<float> input_mask(const CallContext& ctx, std::size_t i = 0) {
  return i < ctx.input_masks.size() ? ctx.input_masks[i] : Tensor<float>();
}

/// A layer of one input whose output has the input's shape (`Activation`, `ReLU`, `LeakyReLU`,
/// `Dropout`): one `build` for all of them.
class SameShapeLayer : public LayerBase {
 public:
  /// Keras's `supports_masking`: the output has the input's mask.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  using LayerBase::LayerBase;

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Element by element: any axis may have an unknown length (a layer whose weights or noise
  /// follow the input's shape says `false`).
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
  }
};

/// A layer that changes the shape of its one input but not its values (`InputLayer`, `Flatten`,
/// `Reshape`): the output is the input's elements in the same row-major order, and so is the
/// input gradient.
class ShapeOnlyLayer : public LayerBase {
 public:
  using LayerBase::LayerBase;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
};

using keras::detail::ConfigReader;

/// A reader of a layer's Keras config whose errors name the layer: `layer 'fc1' (Dense):
/// config.units: expected a positive integer but found "ten"`.
inline ConfigReader layer_config(const nlohmann::json& config, std::string_view class_name) {
  return ConfigReader::of(config, "layer", class_name);
}

/// A shape with a free batch axis (`[null, 28, 28, 1]`, Keras's `batch_input_shape`) without the
/// batch axis; every other axis must be a positive integer (loadstar's shapes are fixed).
LOADSTAR_DECL Shape config_batch_shape(const ConfigReader& read, std::string_view key);

/// Checks the keys every Keras layer config may hold (`trainable`, `dtype`, `batch_input_shape`)
/// and applies `trainable` to the layer built from the config.
LOADSTAR_DECL std::shared_ptr<Layer> finish_layer(const ConfigReader& read,
                                                  std::shared_ptr<Layer> layer);

/// The weight a Keras config key names: `kernel_regularizer`'s `"kernel"`, `depthwise_...`'s
/// `"depthwise_kernel"`; the keys of every built-in layer's weights.
LOADSTAR_DECL std::string weight_of_key(std::string_view key);

/// Reads Keras's `<weight>_regularizer` and `<weight>_constraint` keys (`kernel`, `bias`,
/// `alpha`, `gamma`, `beta`, `embeddings`, `depthwise`, `pointwise`, `recurrent`) and
/// `activity_regularizer`, resolved through the regularizer and constraint registries, onto
/// `layer`. An unknown class (or a Python function's name) throws `ConfigError` naming the layer,
/// the key and the class; a key of a weight the layer does not have is refused when the model is
/// made.
LOADSTAR_DECL void config_weight_options(const ConfigReader& read, Layer& layer);

/// The layer's `name` (empty when absent: the model names it).
inline std::string config_name(const ConfigReader& read) {
  return read.get("name", "");
}

/// A config's activation: a name (`"relu"`) or a serialised `{"class_name": "relu", ...}`,
/// resolved through the activation registry; `"linear"` when absent or null.
LOADSTAR_DECL std::string config_activation(const ConfigReader& read);

/// A config's pair of sizes: `[3, 3]` or `3`, each positive.
LOADSTAR_DECL Size2 config_size2(const ConfigReader& read, std::string_view key, Size2 fallback);

/// A config's size of a 1-D layer: `[3]` or `3`, positive (tf.keras writes 1-tuples as lists).
LOADSTAR_DECL std::size_t config_size1(const ConfigReader& read, std::string_view key,
                                       std::size_t fallback);

/// A config's initializer, resolved through the initializer registry (custom ones included).
LOADSTAR_DECL Initializer config_initializer(const ConfigReader& read, std::string_view key,
                                             Initializer fallback);

/// A config's axis: an integer, or a list of one (`[3]`, as some tf.keras versions write
/// BatchNormalization's axis).
LOADSTAR_DECL int config_axis(const ConfigReader& read, int fallback);

/// A config's `data_format`: `true` for `"channels_first"`, `false` for `"channels_last"` (also
/// when absent or null: Keras's default `image_data_format()`).
LOADSTAR_DECL bool config_channels_first(const ConfigReader& read);

/// `"channels_last"` (`false`) or `"channels_first"` (`true`); anything else throws `ConfigError`
/// naming the layer.
LOADSTAR_DECL bool parse_data_format(const std::string& format, const std::string& label);

/// The `transpose` axes of a batch of rank `rank` (batch axis included) that move the channel
/// axis from 1 to the end (`[0, 2, ..., rank - 1, 1]`), or with `to_first` back
/// (`[0, rank - 1, 1, ..., rank - 2]`).
LOADSTAR_DECL std::vector<std::size_t> channel_axes(std::size_t rank, bool to_first);

/// A sample shape `(c, d1, ..., dn)` as `(d1, ..., dn, c)`, or back with `to_first`.
LOADSTAR_DECL Shape move_channels(const Shape& shape, bool to_first);

/// For each element of a sample of shape `in` (row-major), the row-major index of its
/// coordinates on the axes that `on` marks, into `index`: the statistic or group an element
/// belongs to when the other axes are reduced over.
LOADSTAR_DECL void indices_on_axes(const Shape& in, const std::vector<bool>& on,
                                   std::vector<std::size_t>& index);

/// `"valid"` or `"same"`; anything else throws `ConfigError` naming the layer.
LOADSTAR_DECL bool parse_padding(const std::string& padding, const std::string& label);

}  // namespace detail
}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

Tensor<float> Scratch::get(Backend& backend, const Shape& shape) {
  if (shape.elements() > buffer_.size() || buffer_.empty() || buffer_.device() != backend.device())
    buffer_ = backend.allocate(Shape{std::max<std::size_t>(shape.elements(), 1)});
  return buffer_.slice_rows(0, shape.elements()).reshape(shape);
}

void LayerBase::expect_inputs(std::span<const Shape> shapes, std::size_t count) const {
  if (shapes.size() != count) {
    throw ShapeError(label() + ": expects " + std::to_string(count) + " input" +
                     (count == 1 ? "" : "s") + " but got " + std::to_string(shapes.size()));
  }
}

void LayerBase::expect_rank(const Shape& shape, std::size_t rank) const {
  if (shape.rank() != rank) {
    throw ShapeError(label() + ": expects rank-" + std::to_string(rank) +
                     " inputs (without the batch axis) but got " + shape.str());
  }
}

void LayerBase::check_inputs(std::span<const Tensor<float>> inputs) const {
  const std::vector<Shape>& shapes = built_input_shapes();
  if (inputs.size() != shapes.size()) {
    throw ShapeError(label() + ": built for " + std::to_string(shapes.size()) +
                     " inputs but called with " + std::to_string(inputs.size()));
  }
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].rank() == 0 ||
        !keras::detail::fits_declared(shapes[i], inputs[i].shape().row_shape())) {
      throw ShapeError(label() + ": expects inputs of shape " + batch_str(shapes[i]) + " but got " +
                       inputs[i].shape().str());
    }
  }
}

Shape SameShapeLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

void ShapeOnlyLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.copy(inputs[0], output);
}

void ShapeOnlyLayer::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.copy(output_gradient, input_gradients[0]);
}

Shape config_batch_shape(const ConfigReader& read, std::string_view key) {
  const nlohmann::json* value = read.find(key);
  const auto fits = [&] {
    if (value == nullptr || !value->is_array() || value->empty()) return false;
    if (!(*value)[0].is_null() && !(*value)[0].is_number_integer()) return false;
    for (std::size_t i = 1; i < value->size(); ++i) {
      const auto& d = (*value)[i];
      if (!d.is_null() && (!d.is_number_integer() || d.get<std::int64_t>() <= 0)) return false;
    }
    return true;
  };
  if (!fits()) read.fail(key, "a batch shape [null, positive integers or null...]");
  // null: an axis of unknown length (`keras::none`), settled per batch.
  std::vector<std::size_t> dims;
  for (std::size_t i = 1; i < value->size(); ++i)
    dims.push_back((*value)[i].is_null() ? 0 : (*value)[i].get<std::size_t>());
  return Shape(dims);
}

std::shared_ptr<Layer> finish_layer(const ConfigReader& read, std::shared_ptr<Layer> layer) {
  layer->set_trainable(read.get("trainable", true));
  if (const nlohmann::json* dtype = read.find("dtype"); dtype != nullptr && !dtype->is_null()) {
    // Keras 2 writes "float32" or {"class_name": "Policy", "config": {"name": "mixed_float16"}};
    // Keras 3 a DTypePolicy {"class_name": "DTypePolicy", "config": {"name": "float32"}}.
    layer->set_dtype_policy(
        mixed_precision::Policy::from_json(*dtype, read.owner() + ": " + read.path("dtype")));
  }
  if (read.has("batch_input_shape")) config_batch_shape(read, "batch_input_shape");
  config_weight_options(read, *layer);
  return layer;
}

std::string weight_of_key(std::string_view key) {
  if (key == "depthwise" || key == "pointwise" || key == "recurrent")
    return std::string(key) + "_kernel";
  return std::string(key);
}

void config_weight_options(const ConfigReader& read, Layer& layer) {
  for (const char* key : {"kernel", "bias", "alpha", "gamma", "beta", "embeddings", "depthwise",
                          "pointwise", "recurrent"}) {
    const std::string regularizer = std::string(key) + "_regularizer";
    const std::string constraint = std::string(key) + "_constraint";
    if (read.has(regularizer)) {
      layer.set_regularizer(weight_of_key(key), read.nested(regularizer, [&] {
        return Registry<Regularizer>::instance().create(*read.find(regularizer));
      }));
    }
    if (read.has(constraint)) {
      layer.set_constraint(weight_of_key(key), read.nested(constraint, [&] {
        return Registry<Constraint>::instance().create(*read.find(constraint));
      }));
    }
  }
  if (read.has("activity_regularizer")) {
    layer.set_activity_regularizer(read.nested("activity_regularizer", [&] {
      return Registry<Regularizer>::instance().create(*read.find("activity_regularizer"));
    }));
  }
}

nlohmann::json LayerBase::regularizer_json(const char* weight) const {
  if (weight == nullptr) {
    return activity_regularizer() ? activity_regularizer()->to_json() : nlohmann::json(nullptr);
  }
  const WeightOptions* options = weight_options(weight_of_key(weight));
  return options != nullptr && options->regularizer ? options->regularizer->to_json()
                                                    : nlohmann::json(nullptr);
}

void LayerBase::write_weight_options(nlohmann::json& config,
                                     std::initializer_list<const char*> keys) const {
  for (const char* key : keys) {
    const WeightOptions* options = weight_options(weight_of_key(key));
    config[std::string(key) + "_regularizer"] = regularizer_json(key);
    config[std::string(key) + "_constraint"] = options != nullptr && options->constraint
                                                   ? options->constraint->to_json()
                                                   : nlohmann::json(nullptr);
  }
}

std::string config_activation(const ConfigReader& read) {
  if (!read.has("activation")) return "linear";
  return read.nested("activation", [&] {
    return activation_name(
        Registry<keras::Activation>::instance().create(read.json()["activation"]));
  });
}

Size2 config_size2(const ConfigReader& read, std::string_view key, Size2 fallback) {
  if (!read.has(key)) return fallback;
  const nlohmann::json& v = *read.find(key);
  const auto positive = [](const nlohmann::json& d) {
    return d.is_number_integer() && d.get<std::int64_t>() > 0;
  };
  if (positive(v)) return Size2(v.get<std::size_t>());
  if (v.is_array() && v.size() == 2 && positive(v[0]) && positive(v[1]))
    return Size2(v[0].get<std::size_t>(), v[1].get<std::size_t>());
  read.fail(key, "a positive integer or a list of two");
}

std::size_t config_size1(const ConfigReader& read, std::string_view key, std::size_t fallback) {
  if (!read.has(key)) return fallback;
  const nlohmann::json& v = *read.find(key);
  const auto positive = [](const nlohmann::json& d) {
    return d.is_number_integer() && d.get<std::int64_t>() > 0;
  };
  if (positive(v)) return v.get<std::size_t>();
  if (v.is_array() && v.size() == 1 && positive(v[0])) return v[0].get<std::size_t>();
  read.fail(key, "a positive integer or a list of one");
}

Initializer config_initializer(const ConfigReader& read, std::string_view key,
                               Initializer fallback) {
  if (!read.has(key)) return fallback;
  const nlohmann::json& value = *read.find(key);
  try {
    return read.nested(key, [&] { return Registry<Initializer>::instance().create(value); });
  } catch (const ConfigError&) {
    // An initializer loadstar cannot build (a Python function among them) only creates weights,
    // which a loaded file provides: kept as written, with a warning, so that the file loads for
    // predict, summary and fine-tuning. Any other bad initializer config stays an error.
    const nlohmann::json* name = &value;
    if (value.is_object() && value.contains("class_name")) name = &value["class_name"];
    if (!name->is_string()) throw;
    const std::string class_name = name->get<std::string>();
    const CustomObjects* custom = keras::detail::current_custom_objects();
    if (Registry<Initializer>::instance().contains(class_name) ||
        (custom != nullptr && custom->find<Initializer>(class_name) != nullptr))
      throw;
    const bool function = class_name == "function" && value.is_object() &&
                          value.contains("config") && value["config"].is_string();
    const std::string what =
        function ? "the Python function '" + value["config"].get<std::string>() + "'"
                 : "'" + class_name + "'";
    warn(read.owner() + ": " + read.path(key) + ": initializer " + what +
         " is not supported by loadstar; its weights start at zero until a file's weights are "
         "loaded into them");
    return Initializer::unresolved(value);
  }
}

int config_axis(const ConfigReader& read, int fallback) {
  if (!read.has("axis")) return fallback;
  const nlohmann::json& v = *read.find("axis");
  if (v.is_array() && v.size() == 1 && keras::detail::ConfigValue<int>::fits(v[0]))
    return v[0].get<int>();
  if (!keras::detail::ConfigValue<int>::fits(v)) read.fail("axis", "an integer or a list of one");
  return v.get<int>();
}

bool config_channels_first(const ConfigReader& read) {
  const std::string format = read.get("data_format", "channels_last");
  if (format == "channels_first") return true;
  if (format != "channels_last")
    read.fail("data_format", "\"channels_last\" or \"channels_first\"");
  return false;
}

bool parse_data_format(const std::string& format, const std::string& label) {
  if (format == "channels_first") return true;
  if (format == "channels_last") return false;
  throw ConfigError(label + ": data_format must be 'channels_last' or 'channels_first' but is '" +
                    format + "'");
}

std::vector<std::size_t> channel_axes(std::size_t rank, bool to_first) {
  std::vector<std::size_t> axes{0};
  if (to_first) axes.push_back(rank - 1);
  for (std::size_t i = 1; i + 1 < rank; ++i)
    axes.push_back(to_first ? i : i + 1);
  if (!to_first) axes.push_back(1);
  return axes;
}

void indices_on_axes(const Shape& in, const std::vector<bool>& on,
                     std::vector<std::size_t>& index) {
  index.assign(in.elements(), 0);
  for (std::size_t e = 0; e < index.size(); ++e) {
    std::size_t rest = e, at = 0, stride = 1;
    for (std::size_t i = in.rank(); i-- > 0;) {
      const std::size_t coordinate = rest % in[i];
      rest /= in[i];
      if (on[i]) {
        at += coordinate * stride;
        stride *= in[i];
      }
    }
    index[e] = at;
  }
}

Shape move_channels(const Shape& shape, bool to_first) {
  std::vector<std::size_t> dims(shape.begin(), shape.end());
  if (dims.size() < 2) return shape;
  if (to_first) {
    std::rotate(dims.rbegin(), dims.rbegin() + 1, dims.rend());
  } else {
    std::rotate(dims.begin(), dims.begin() + 1, dims.end());
  }
  return Shape(dims);
}

bool parse_padding(const std::string& padding, const std::string& label) {
  if (padding == "same") return true;
  if (padding == "valid") return false;
  throw ConfigError(label + ": padding must be 'valid' or 'same' but is '" + padding + "'");
}

}  // namespace loadstar::keras::layers::detail
#endif
