/// \file
/// `InputLayer`: the entry point of a model, declaring the shape of one sample.
#pragma once

#include "loadstar/config.hpp"

#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `InputLayer`'s Keras arguments after `shape`.
struct InputLayerOptions {
  std::string name = {};
};

/// Keras's `InputLayer`: passes its input through and fixes the shape of a sample (without the
/// batch axis).
/// \code
/// InputLayer input(Shape{28, 28});
/// \endcode
class InputLayer : public detail::ShapeOnlyLayer {
 public:
  explicit InputLayer(Shape shape, InputLayerOptions options = {})
      : ShapeOnlyLayer(options.name), shape_(shape) {}

  std::string class_name() const override { return "InputLayer"; }
  /// The shape of one sample.
  const Shape& shape() const noexcept { return shape_; }

  /// Accepts no inputs (the model feeds the data) or one of the declared shape.
  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Declared with axes of unknown length (`batch_input_shape: [null, null]`), it passes each
  /// batch's lengths on.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
  }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// Reads Keras 2's `batch_input_shape` or Keras 3's `batch_shape`; any `dtype` (the data are
  /// converted to float32 when fed).
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Shape shape_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape InputLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  if (input_shapes.size() > 1 || (input_shapes.size() == 1 && input_shapes[0] != shape_)) {
    throw ShapeError(label() + ": declared for inputs of shape " + batch_str(shape_) + " but got " +
                     (input_shapes.empty() ? std::string("none") : input_shapes[0].str()));
  }
  const Shape one[] = {shape_};
  remember(one, shape_);
  return shape_;
}

nlohmann::json InputLayer::get_config() const {
  return {{"batch_input_shape", keras::detail::batch_shape_json(shape_)},
          {"dtype", "float32"},
          {"sparse", false},
          {"ragged", false},
          {"name", name()}};
}

std::shared_ptr<Layer> InputLayer::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "InputLayer");
  read.expect("sparse", false, "loadstar has no sparse inputs");
  read.expect("ragged", false, "loadstar has no ragged inputs");
  const char* key = read.has("batch_shape") ? "batch_shape" : "batch_input_shape";
  return std::make_shared<InputLayer>(detail::config_batch_shape(read, key),
                                      InputLayerOptions{.name = detail::config_name(read)});
}

}  // namespace loadstar::keras::layers
#endif
