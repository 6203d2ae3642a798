/// \file
/// `Dropout`: zeroes a random fraction of its inputs while training.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <functional>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"
#include "loadstar/keras/layers/detail/noise_shape.hpp"

namespace loadstar::keras::layers {

/// `Dropout`'s Keras arguments after `rate`.
struct DropoutOptions {
  /// Keras's `noise_shape` (batch axis first, null entries the input's sizes): one draw per
  /// element of this shape, shared along the axes where it is 1; null, a draw per element.
  nlohmann::json noise_shape = nullptr;
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name = {};
};

/// Keras's `Dropout`: in training each element is dropped with probability `rate` and the kept
/// ones are scaled by `1 / (1 - rate)` (inverted dropout); outside training it is the identity.
/// The mask derives from `(seed or ctx.seed, ctx.step, name)`, so runs are reproducible. With a
/// `noise_shape`, element `i` is kept when its draw (`detail::NoiseShape::index`) is.
/// \code
/// Dropout dropout(0.5);
/// \endcode
class Dropout : public detail::SameShapeLayer {
 public:
  LOADSTAR_DECL explicit Dropout(double rate, DropoutOptions options = {});

  std::string class_name() const override { return "Dropout"; }
  double rate() const noexcept { return rate_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Without `noise_shape`, element by element; a `noise_shape`'s masks follow the input's shape.
  bool takes_unknown_axes() const noexcept override { return !noise_.active(); }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The mask's key: the same in `forward` and `backward` of one step, different across steps
  /// and layers.
  LOADSTAR_DECL std::uint64_t key(const CallContext& ctx) const;

  /// Inverted dropout of `x` into `y` by the draws of the noise shape.
  LOADSTAR_DECL void drop_shared(const Tensor<float>& x, const Tensor<float>& y,
                                 const CallContext& ctx) const;

  double rate_;
  DropoutOptions options_;
  detail::NoiseShape noise_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Dropout::Dropout(double rate, DropoutOptions options)
    : SameShapeLayer(options.name),
      rate_(rate),
      options_(std::move(options)),
      noise_(options_.noise_shape) {
  if (!(rate >= 0.0 && rate < 1.0)) {
    throw ConfigError(label() + ": rate must be in [0, 1) but is " + std::to_string(rate));
  }
}

Shape Dropout::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  const Shape out = SameShapeLayer::build(input_shapes, seed);
  noise_.build(input_shapes[0], label());
  return out;
}

void Dropout::drop_shared(const Tensor<float>& x, const Tensor<float>& y,
                          const CallContext& ctx) const {
  const auto scale = static_cast<float>(1.0 / (1.0 - rate_));
  ctx.backend.layer_kernel(
      {.op = keras::detail::LayerOp::dropout, .map = noise_.map(), .scale = scale, .rate = rate_},
      std::array{x, y}, y.size(), key(ctx));
}

void Dropout::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  if (ctx.training && noise_.active()) {
    noise_.check_rows(inputs[0].shape()[0], label());
    drop_shared(inputs[0], output, ctx);
  } else if (ctx.training) {
    ctx.backend.dropout(inputs[0], output, static_cast<float>(rate_), key(ctx));
  } else {
    ctx.backend.copy(inputs[0], output);
  }
}

void Dropout::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  if (ctx.training && noise_.active()) {
    drop_shared(output_gradient, input_gradients[0], ctx);
  } else if (ctx.training) {
    ctx.backend.dropout(output_gradient, input_gradients[0], static_cast<float>(rate_), key(ctx));
  } else {
    ctx.backend.copy(output_gradient, input_gradients[0]);
  }
}

nlohmann::json Dropout::get_config() const {
  auto config = base_config();
  config["rate"] = rate_;
  config["noise_shape"] = noise_.json();
  config["seed"] = options_.seed ? nlohmann::json(*options_.seed) : nlohmann::json(nullptr);
  return config;
}

std::shared_ptr<Layer> Dropout::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Dropout");
  const auto rate = read.get<double>("rate");
  if (!(rate >= 0 && rate < 1)) read.fail("rate", "a number in [0, 1)");
  DropoutOptions options{.noise_shape = detail::NoiseShape::read(read).json(),
                         .name = detail::config_name(read)};
  options.seed = read.optional<std::uint64_t>("seed");
  return detail::finish_layer(read, std::make_shared<Dropout>(rate, options));
}

std::uint64_t Dropout::key(const CallContext& ctx) const {
  const std::uint64_t seed = options_.seed.value_or(ctx.seed);
  return SplitMix64::mix(SplitMix64::mix(seed) ^ SplitMix64::mix(ctx.step + 0x632BE59BD9B4E019ULL) ^
                         stable_hash(name()));
}

}  // namespace loadstar::keras::layers
#endif
