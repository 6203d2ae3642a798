/// \file
/// `GlobalAveragePooling1D` and `GlobalMaxPooling1D`: one value per channel of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/global_pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `GlobalAveragePooling1D`: `(steps, c)` (or `(c, steps)` with channels_first) to
/// `(c,)`, the mean over the steps (`(1, c)` or `(c, 1)` with `keepdims`).
/// \code
/// GlobalAveragePooling1D gap;
/// \endcode
class GlobalAveragePooling1D : public detail::GlobalPooling<false, 1> {
 public:
  explicit GlobalAveragePooling1D(GlobalPooling1DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

  /// With a mask on the input (Keras's `supports_masking`), the mean of the unmasked steps; the
  /// output has no mask.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::ends; }
  bool reads_masks() const noexcept override { return true; }
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 private:
  /// The input's mask `(batch, steps)`, or an empty tensor.
  LOADSTAR_DECL Tensor<float> mask_of(const Tensor<float>& x, const CallContext& ctx) const;
};

/// Keras's `GlobalMaxPooling1D`: `(steps, c)` (or `(c, steps)` with channels_first) to `(c,)`,
/// the maximum over the steps (`(1, c)` or `(c, 1)` with `keepdims`).
/// \code
/// GlobalMaxPooling1D gmp({.keepdims = true});
/// \endcode
class GlobalMaxPooling1D : public detail::GlobalPooling<true, 1> {
 public:
  explicit GlobalMaxPooling1D(GlobalPooling1DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Tensor<float> GlobalAveragePooling1D::mask_of(const Tensor<float>& x,
                                              const CallContext& ctx) const {
  if (ctx.input_masks.empty() || ctx.input_masks[0].empty()) return {};
  const Tensor<float>& mask = ctx.input_masks[0];
  if (channels_first() || mask.size() != x.dim(0) * x.dim(1)) {
    throw ShapeError(label() + ": takes a mask (batch, steps) on channels_last inputs but got a " +
                     "mask " + mask.shape().str() + " for inputs " + x.shape().str() +
                     (channels_first() ? " in channels_first" : ""));
  }
  return mask;
}

void GlobalAveragePooling1D::forward(std::span<const Tensor<float>> inputs,
                                     const Tensor<float>& output, const CallContext& ctx) {
  const Tensor<float> mask = mask_of(inputs[0], ctx);
  if (mask.empty()) {
    GlobalPooling::forward(inputs, output, ctx);
    return;
  }
  check_inputs(inputs);
  // Keras: sum(where(mask, x, 0), steps) / sum(mask, steps).
  const Tensor<float> tensors[] = {inputs[0], mask, output};
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::masked_average;
  k.steps = inputs[0].dim(1);
  k.width = inputs[0].dim(2);
  ctx.backend.recurrent_kernel(k, tensors, output.size());
}

void GlobalAveragePooling1D::backward(std::span<const Tensor<float>> inputs,
                                      const Tensor<float>& output,
                                      const Tensor<float>& output_gradient,
                                      std::span<const Tensor<float>> input_gradients,
                                      const CallContext& ctx) {
  const Tensor<float> mask = mask_of(inputs[0], ctx);
  if (mask.empty()) {
    GlobalPooling::backward(inputs, output, output_gradient, input_gradients, ctx);
    return;
  }
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const Tensor<float> tensors[] = {mask, output_gradient, input_gradients[0]};
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::masked_average_backward;
  k.steps = input_gradients[0].dim(1);
  k.width = input_gradients[0].dim(2);
  ctx.backend.recurrent_kernel(k, tensors, output_gradient.size());
}

std::shared_ptr<Layer> GlobalAveragePooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalAveragePooling1D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalAveragePooling1D>(options_from_config(read)));
}

std::shared_ptr<Layer> GlobalMaxPooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalMaxPooling1D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalMaxPooling1D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
