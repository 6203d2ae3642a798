/// \file
/// `ReLU` and `LeakyReLU`: rectified linear units with Keras's parameters.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `ReLU`'s Keras arguments, with Keras's defaults.
struct ReLUOptions {
  std::optional<float> max_value = std::nullopt;
  float negative_slope = 0.0F;
  float threshold = 0.0F;
  std::string name = {};
};

namespace detail {

/// The common part: `max_value` above it, `x` from `threshold`, `negative_slope * (x - threshold)`
/// below.
class ReLUBase : public SameShapeLayer {
 public:
  explicit ReLUBase(ReLUOptions options)
      : SameShapeLayer(options.name), options_(std::move(options)) {}

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  ReLUOptions options_;
};

}  // namespace detail

/// Keras's `ReLU` layer.
/// \code
/// ReLU relu6({.max_value = 6.0F});
/// \endcode
class ReLU : public detail::ReLUBase {
 public:
  LOADSTAR_DECL explicit ReLU(ReLUOptions options = {});

  std::string class_name() const override { return "ReLU"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

/// `LeakyReLU`'s Keras arguments, with Keras 2's default `alpha = 0.3`.
struct LeakyReLUOptions {
  float alpha = 0.3F;
  std::string name = {};
};

/// Keras's `LeakyReLU`: `x` for `x >= 0`, `alpha * x` below.
/// \code
/// LeakyReLU leaky({.alpha = 0.1F});
/// \endcode
class LeakyReLU : public detail::ReLUBase {
 public:
  explicit LeakyReLU(LeakyReLUOptions options = {})
      : ReLUBase(ReLUOptions{.negative_slope = options.alpha, .name = options.name}) {}

  std::string class_name() const override { return "LeakyReLU"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

void ReLUBase::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                       const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.relu_forward(inputs[0], output, options_.max_value, options_.negative_slope,
                           options_.threshold);
}

void ReLUBase::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                        const Tensor<float>& output_gradient,
                        std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.relu_backward(inputs[0], output_gradient, input_gradients[0], options_.max_value,
                            options_.negative_slope, options_.threshold);
}

}  // namespace loadstar::keras::layers::detail
namespace loadstar::keras::layers {

ReLU::ReLU(ReLUOptions options) : ReLUBase(std::move(options)) {
  if (options_.negative_slope < 0.0F || options_.threshold < 0.0F ||
      (options_.max_value && *options_.max_value < 0.0F)) {
    throw ConfigError(label() + ": max_value, negative_slope and threshold must be >= 0");
  }
}

nlohmann::json ReLU::get_config() const {
  auto config = base_config();
  config["max_value"] =
      options_.max_value ? nlohmann::json(*options_.max_value) : nlohmann::json(nullptr);
  config["negative_slope"] = options_.negative_slope;
  config["threshold"] = options_.threshold;
  return config;
}

std::shared_ptr<Layer> ReLU::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ReLU");
  ReLUOptions options{
      .negative_slope = read.get("negative_slope", 0.0F),
      .threshold = read.get("threshold", 0.0F),
      .name = detail::config_name(read),
  };
  options.max_value = read.optional<float>("max_value");
  return detail::finish_layer(read, std::make_shared<ReLU>(options));
}

nlohmann::json LeakyReLU::get_config() const {
  auto config = base_config();
  config["alpha"] = options_.negative_slope;
  return config;
}

std::shared_ptr<Layer> LeakyReLU::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "LeakyReLU");
  // Keras 3 renamed `alpha` to `negative_slope`.
  const float alpha = read.get("alpha", read.get("negative_slope", 0.3F));
  return detail::finish_layer(read, std::make_shared<LeakyReLU>(LeakyReLUOptions{
                                        .alpha = alpha, .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
