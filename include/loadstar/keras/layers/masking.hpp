/// \file
/// `Masking`: marks the steps of a sequence whose features all equal a value as masked.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Masking`'s Keras arguments.
struct MaskingOptions {
  float mask_value = 0.0F;
  std::string name = {};
};

/// Keras's `Masking`: a step `x[b, ..., :]` whose features all equal `mask_value` is masked: its
/// output is 0 and the output's mask `(batch, ...)` is 0 there (1 elsewhere), which the layers
/// after it follow (`MaskFlow`: a recurrent layer skips the step and carries its state).
/// \code
/// Masking padding({.mask_value = 0.0F});
/// \endcode
class Masking : public detail::SameShapeLayer {
 public:
  explicit Masking(MaskingOptions options = {})
      : SameShapeLayer(options.name), mask_value_(options.mask_value) {}

  std::string class_name() const override { return "Masking"; }
  float mask_value() const noexcept { return mask_value_; }

  MaskFlow mask_flow() const noexcept override { return MaskFlow::computes; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  LOADSTAR_DECL void compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                                  const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The `masking` kernel (keras/detail/recurrent_kernels.hpp) over the steps of `x`: `tensors`
  /// are `x`, the values kept where a step counts and where they go, and the mask (each but `x`
  /// empty when not wanted).
  LOADSTAR_DECL void apply(const Tensor<float>& x, std::span<const Tensor<float>> tensors,
                           const CallContext& ctx) const;
  float mask_value_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

void Masking::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  const Tensor<float> tensors[] = {inputs[0], inputs[0], output};
  apply(inputs[0], tensors, ctx);
}

void Masking::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const Tensor<float> tensors[] = {inputs[0], output_gradient, input_gradients[0]};
  apply(inputs[0], tensors, ctx);
}

void Masking::compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                           const CallContext& ctx) {
  const Tensor<float> tensors[] = {inputs[0], Tensor<float>(), Tensor<float>(), mask};
  apply(inputs[0], tensors, ctx);
}

void Masking::apply(const Tensor<float>& x, std::span<const Tensor<float>> tensors,
                    const CallContext& ctx) const {
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::masking;
  k.width = x.shape()[x.rank() - 1];
  k.value = mask_value_;
  const std::size_t steps = k.width == 0 ? 0 : x.size() / k.width;
  ctx.backend.recurrent_kernel(k, tensors, steps);
}

nlohmann::json Masking::get_config() const {
  auto config = base_config();
  config["mask_value"] = mask_value_;
  return config;
}

std::shared_ptr<Layer> Masking::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Masking");
  return detail::finish_layer(
      read, std::make_shared<Masking>(MaskingOptions{.mask_value = read.get("mask_value", 0.0F),
                                                     .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
