/// \file
/// `Activation` (the layer): applies an activation function to its input.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Activation`'s Keras arguments after `activation`.
struct ActivationOptions {
  std::string name = {};
};

/// Keras's `Activation` layer, `keras::layers::Activation` (the enumeration of functions is
/// `keras::Activation`).
/// \code
/// Activation relu("relu");
/// \endcode
class Activation : public detail::SameShapeLayer {
 public:
  explicit Activation(std::string_view activation, ActivationOptions options = {})
      : SameShapeLayer(options.name), activation_(activation_from_name(activation)) {}

  std::string class_name() const override { return "Activation"; }
  keras::Activation activation() const noexcept { return activation_; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  keras::Activation activation_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

void Activation::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                         const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.activation_forward(activation_, inputs[0], output);
}

void Activation::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const Tensor<float>& output_gradient,
                          std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.activation_backward(activation_, inputs[0], output, output_gradient,
                                  input_gradients[0]);
}

nlohmann::json Activation::get_config() const {
  auto config = base_config();
  config["activation"] = activation_name(activation_);
  return config;
}

std::shared_ptr<Layer> Activation::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Activation");
  return detail::finish_layer(
      read, std::make_shared<Activation>(detail::config_activation(read),
                                         ActivationOptions{.name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
