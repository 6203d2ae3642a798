/// \file
/// `Rescaling`: multiplies by a scale and adds an offset (`1 / 255` for images).
#pragma once

#include "loadstar/config.hpp"

#include <array>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Rescaling`'s Keras arguments after `scale`.
struct RescalingOptions {
  float offset = 0.0F;
  std::string name = {};
};

/// Keras's `Rescaling`: `x * scale + offset`.
/// \code
/// Rescaling to_unit(1.0F / 255.0F);
/// Rescaling to_symmetric(1.0F / 127.5F, {.offset = -1.0F});
/// \endcode
class Rescaling : public detail::SameShapeLayer {
 public:
  explicit Rescaling(float scale, RescalingOptions options = {})
      : SameShapeLayer(options.name), scale_(scale), offset_(options.offset) {}

  std::string class_name() const override { return "Rescaling"; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  float scale_, offset_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

void Rescaling::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                        const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.layer_kernel(
      {.op = keras::detail::LayerOp::affine, .scale = scale_, .offset = offset_},
      std::array{inputs[0], output}, output.size());
}

void Rescaling::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                         const Tensor<float>& output_gradient,
                         std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.layer_kernel({.op = keras::detail::LayerOp::affine, .scale = scale_},
                           std::array{output_gradient, input_gradients[0]},
                           input_gradients[0].size());
}

nlohmann::json Rescaling::get_config() const {
  auto config = base_config();
  config["scale"] = scale_;
  config["offset"] = offset_;
  return config;
}

std::shared_ptr<Layer> Rescaling::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Rescaling");
  // Keras 3 also takes a scale or offset per channel (a list): loadstar takes numbers only.
  return detail::finish_layer(
      read, std::make_shared<Rescaling>(read.get<float>("scale"),
                                        RescalingOptions{.offset = read.get("offset", 0.0F),
                                                         .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
