/// \file
/// `Add`: the element-wise sum of its inputs.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Add`'s Keras arguments.
struct AddOptions {
  std::string name = {};
};

/// Keras's `Add`: the sum of two or more inputs of the same shape.
/// \code
/// Add residual;
/// \endcode
class Add : public detail::LayerBase {
 public:
  /// The output's mask is the OR of the inputs' masks (Keras 3's merge layers).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::any_of; }
  explicit Add(AddOptions options = {}) : LayerBase(options.name) {}

  std::string class_name() const override { return "Add"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Inputs with the same axes of unknown length (a residual connection in a text model).
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    for (const auto& gradient : input_gradients)
      if (!gradient.empty()) ctx.backend.copy(output_gradient, gradient);
  }

  nlohmann::json get_config() const override { return base_config(); }

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Add::build(std::span<const Shape> input_shapes, std::uint64_t) {
  if (input_shapes.size() < 2) {
    throw ShapeError(label() + ": expects at least 2 inputs but got " +
                     std::to_string(input_shapes.size()));
  }
  for (const Shape& s : input_shapes) {
    if (s != input_shapes[0]) {
      throw ShapeError(label() + ": inputs must have the same shape but got " +
                       batch_str(input_shapes[0]) + " and " + batch_str(s));
    }
  }
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

Shape Add::output_shape_for(std::span<const Shape> input_shapes) const {
  for (const Shape& s : input_shapes) {
    if (s != input_shapes[0]) {
      throw ShapeError(label() + ": inputs must have the same shape but got " +
                       batch_str(input_shapes[0]) + " and " + batch_str(s));
    }
  }
  return input_shapes[0];
}

void Add::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                  const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.add(inputs[0], inputs[1], output);
  for (std::size_t i = 2; i < inputs.size(); ++i)
    ctx.backend.add(output, inputs[i], output);
}

std::shared_ptr<Layer> Add::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Add");
  return detail::finish_layer(read,
                              std::make_shared<Add>(AddOptions{.name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
