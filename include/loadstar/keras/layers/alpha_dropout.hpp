/// \file
/// `AlphaDropout`: dropout that keeps the mean and variance of SELU activations.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>

#include "loadstar/keras/layers/detail/noise_layer.hpp"
#include "loadstar/keras/layers/detail/noise_shape.hpp"

namespace loadstar::keras::layers {

/// `AlphaDropout`'s Keras arguments after `rate`.
struct AlphaDropoutOptions {
  /// Keras's `noise_shape` (batch axis first, null entries the input's sizes), or null.
  nlohmann::json noise_shape = nullptr;
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name = {};
};

/// Keras's `AlphaDropout`: in training each element (or each draw of `noise_shape`) is kept with
/// probability `1 - rate` and a dropped one set to `alpha' = -1.6732632423543772 *
/// 1.0507009873554805` (SELU's negative saturation), then `a * x + b` with
/// `a = ((1 - rate) * (1 + rate * alpha'^2))^-0.5` and `b = -a * alpha' * rate`, as Keras 3's
/// `AlphaDropout.call`; the identity outside training (and for `rate` 0). The draw derives from
/// `(seed or ctx.seed, ctx.step, name)`, as `Dropout`'s.
/// \code
/// AlphaDropout dropout(0.1);
/// \endcode
class AlphaDropout : public detail::NoiseLayer {
 public:
  /// Throws `ConfigError` unless `rate` is in `[0, 1)`.
  LOADSTAR_DECL explicit AlphaDropout(double rate, AlphaDropoutOptions options = {});

  std::string class_name() const override { return "AlphaDropout"; }
  double rate() const noexcept { return rate_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  std::optional<keras::detail::LayerKernel> noise_kernel(bool backward) const override {
    return keras::detail::LayerKernel{.op = backward
                                                ? keras::detail::LayerOp::alpha_dropout_backward
                                                : keras::detail::LayerOp::alpha_dropout,
                                      .map = noise_.map(),
                                      .scale = a_,
                                      .offset = b_,
                                      .dropped = dropped_,
                                      .rate = rate_};
  }

 private:
  double rate_;
  detail::NoiseShape noise_;
  float a_ = 1.0F, b_ = 0.0F, dropped_ = 0.0F;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

AlphaDropout::AlphaDropout(double rate, AlphaDropoutOptions options)
    : NoiseLayer(options.name, options.seed), rate_(rate), noise_(options.noise_shape) {
  if (!(rate >= 0.0 && rate < 1.0))
    throw ConfigError(label() + ": rate must be in [0, 1) but is " + std::to_string(rate));
  // keras/src/layers/regularization/alpha_dropout.py.
  const double alpha = 1.6732632423543772848170429916717;
  const double scale = 1.0507009873554804934193349852946;
  const double alpha_p = -alpha * scale;
  const double a = std::pow((1.0 - rate) * (1.0 + rate * alpha_p * alpha_p), -0.5);
  const double b = -a * alpha_p * rate;
  a_ = static_cast<float>(a);
  b_ = static_cast<float>(b);
  dropped_ = static_cast<float>(a * alpha_p + b);
}

Shape AlphaDropout::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  const Shape out = NoiseLayer::build(input_shapes, seed);
  noise_.build(input_shapes[0], label());
  return out;
}

void AlphaDropout::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                           const CallContext& ctx) {
  if (ctx.training && !inputs.empty() && inputs[0].rank() > 0)
    noise_.check_rows(inputs[0].shape()[0], label());
  NoiseLayer::forward(inputs, output, ctx);
}

nlohmann::json AlphaDropout::get_config() const {
  auto config = base_config();
  config["rate"] = rate_;
  config["noise_shape"] = noise_.json();
  config["seed"] = seed_json();
  return config;
}

std::shared_ptr<Layer> AlphaDropout::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "AlphaDropout");
  const auto rate = read.get<double>("rate");
  if (!(rate >= 0 && rate < 1)) read.fail("rate", "a number in [0, 1)");
  return detail::finish_layer(
      read, std::make_shared<AlphaDropout>(
                rate, AlphaDropoutOptions{.noise_shape = detail::NoiseShape::read(read).json(),
                                          .seed = read.optional<std::uint64_t>("seed"),
                                          .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
