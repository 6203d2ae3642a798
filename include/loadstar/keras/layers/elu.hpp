/// \file
/// `ELU`: the exponential linear unit with Keras's `alpha`.
#pragma once

#include "loadstar/config.hpp"

#include <array>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `ELU`'s Keras arguments, with Keras's default `alpha = 1`.
struct ELUOptions {
  float alpha = 1.0F;
  std::string name = {};
};

/// Keras's `ELU` layer: `x` above 0, `alpha * (exp(x) - 1)` at or below.
/// \code
/// ELU elu({.alpha = 0.5F});
/// \endcode
class ELU : public detail::SameShapeLayer {
 public:
  explicit ELU(ELUOptions options = {}) : SameShapeLayer(options.name), alpha_(options.alpha) {}

  std::string class_name() const override { return "ELU"; }
  float alpha() const noexcept { return alpha_; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  float alpha_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

void ELU::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                  const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.layer_kernel({.op = keras::detail::LayerOp::elu, .alpha = alpha_},
                           std::array{inputs[0], output}, output.size());
}

void ELU::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                   const Tensor<float>& output_gradient,
                   std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.layer_kernel({.op = keras::detail::LayerOp::elu_backward, .alpha = alpha_},
                           std::array{inputs[0], output_gradient, input_gradients[0]},
                           input_gradients[0].size());
}

nlohmann::json ELU::get_config() const {
  auto config = base_config();
  config["alpha"] = alpha_;
  return config;
}

std::shared_ptr<Layer> ELU::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ELU");
  return detail::finish_layer(
      read, std::make_shared<ELU>(
                ELUOptions{.alpha = read.get("alpha", 1.0F), .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
