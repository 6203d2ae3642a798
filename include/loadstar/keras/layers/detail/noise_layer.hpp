/// \file
/// What the training-only noise layers share (`SpatialDropout1D/2D/3D`, `GaussianNoise`,
/// `GaussianDropout`, `AlphaDropout`): the key of a step's noise, as `Dropout`'s, and the
/// identity outside training.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <functional>
#include <optional>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"
#include "loadstar/random.hpp"

namespace loadstar::keras::layers::detail {

/// The key of a layer's noise in one step: from `(seed or ctx.seed, ctx.step, name)`, so that a
/// run (and a resumed run) draws the same noise, `forward` and `backward` of a step the same, and
/// steps and layers different.
inline std::uint64_t noise_key(std::optional<std::uint64_t> seed, const CallContext& ctx,
                               const std::string& name) {
  return SplitMix64::mix(SplitMix64::mix(seed.value_or(ctx.seed)) ^
                         SplitMix64::mix(ctx.step + 0x632BE59BD9B4E019ULL) ^ stable_hash(name));
}

/// A layer that adds or multiplies noise in training and is the identity otherwise. Subclasses
/// give the element-wise kernel (keras/detail/layer_kernels.hpp) of the noise of a batch, which
/// the backend runs under the step's key.
class NoiseLayer : public SameShapeLayer {
 public:
  NoiseLayer(std::string name, std::optional<std::uint64_t> seed)
      : SameShapeLayer(std::move(name)), seed_(seed) {}

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  /// The kernel of the noise: the output from the input, or with `backward` the
  /// input gradient from the output gradient (none: the gradient passes unchanged).
  virtual std::optional<keras::detail::LayerKernel> noise_kernel(bool backward) const = 0;
  /// `seed` as the config writes it (null when absent).
  nlohmann::json seed_json() const {
    return seed_ ? nlohmann::json(*seed_) : nlohmann::json(nullptr);
  }

  std::optional<std::uint64_t> seed_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

void NoiseLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                         const CallContext& ctx) {
  check_inputs(inputs);
  if (!ctx.training) {
    ctx.backend.copy(inputs[0], output);
    return;
  }
  const std::uint64_t key = noise_key(seed_, ctx, name());
  const auto kernel = noise_kernel(false);
  LOADSTAR_ASSERT(kernel, "noise layer: the forward pass needs a kernel");
  ctx.backend.layer_kernel(*kernel, std::array{inputs[0], output}, output.size(), key);
}

void NoiseLayer::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                          const Tensor<float>& output_gradient,
                          std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  if (!ctx.training) {
    ctx.backend.copy(output_gradient, input_gradients[0]);
    return;
  }
  const auto kernel = noise_kernel(true);
  if (!kernel) {
    ctx.backend.copy(output_gradient, input_gradients[0]);
    return;
  }
  ctx.backend.layer_kernel(*kernel, std::array{output_gradient, input_gradients[0]},
                           input_gradients[0].size(), noise_key(seed_, ctx, name()));
}

}  // namespace loadstar::keras::layers::detail
#endif
