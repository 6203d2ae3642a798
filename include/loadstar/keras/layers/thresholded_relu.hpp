/// \file
/// `ThresholdedReLU`: tf.keras's rectifier that passes only values above `theta`.
#pragma once

#include "loadstar/config.hpp"

#include <array>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `ThresholdedReLU`'s tf.keras arguments, with its default `theta = 1`.
struct ThresholdedReLUOptions {
  float theta = 1.0F;
  std::string name = {};
};

/// tf.keras's `ThresholdedReLU` (Keras 3 removed it; files written by tf.keras load): `x` above
/// `theta`, else 0.
/// \code
/// ThresholdedReLU gate({.theta = 0.5F});
/// \endcode
class ThresholdedReLU : public detail::SameShapeLayer {
 public:
  LOADSTAR_DECL explicit ThresholdedReLU(ThresholdedReLUOptions options = {});

  std::string class_name() const override { return "ThresholdedReLU"; }
  float theta() const noexcept { return theta_; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  float theta_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

ThresholdedReLU::ThresholdedReLU(ThresholdedReLUOptions options)
    : SameShapeLayer(options.name), theta_(options.theta) {
  // tf.keras: "theta of a Thresholded ReLU layer cannot be a negative value".
  if (!(theta_ >= 0.0F))
    throw ConfigError(label() + ": theta must be >= 0 but is " + std::to_string(theta_));
}

void ThresholdedReLU::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.layer_kernel({.op = keras::detail::LayerOp::thresholded_relu, .alpha = theta_},
                           std::array{inputs[0], output}, output.size());
}

void ThresholdedReLU::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                               const Tensor<float>& output_gradient,
                               std::span<const Tensor<float>> input_gradients,
                               const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.layer_kernel(
      {.op = keras::detail::LayerOp::thresholded_relu_backward, .alpha = theta_},
      std::array{inputs[0], output_gradient, input_gradients[0]}, input_gradients[0].size());
}

nlohmann::json ThresholdedReLU::get_config() const {
  auto config = base_config();
  config["theta"] = theta_;
  return config;
}

std::shared_ptr<Layer> ThresholdedReLU::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ThresholdedReLU");
  const float theta = read.get("theta", 1.0F);
  if (!(theta >= 0.0F)) read.fail("theta", "a number >= 0");
  return detail::finish_layer(read, std::make_shared<ThresholdedReLU>(ThresholdedReLUOptions{
                                        .theta = theta, .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
