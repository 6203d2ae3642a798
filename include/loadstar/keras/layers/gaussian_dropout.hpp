/// \file
/// `GaussianDropout`: multiplies by normal noise of mean 1 while training.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>

#include "loadstar/keras/layers/detail/noise_layer.hpp"

namespace loadstar::keras::layers {

/// `GaussianDropout`'s Keras arguments after `rate`.
struct GaussianDropoutOptions {
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name = {};
};

/// Keras's `GaussianDropout`: `x * (1 + sqrt(rate / (1 - rate)) * n)` with `n` standard normal
/// in training, the identity otherwise.
/// \code
/// GaussianDropout noise(0.2);
/// \endcode
class GaussianDropout : public detail::NoiseLayer {
 public:
  LOADSTAR_DECL explicit GaussianDropout(double rate, GaussianDropoutOptions options = {});

  std::string class_name() const override { return "GaussianDropout"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  // The same factor multiplies the values and their gradients.
  std::optional<keras::detail::LayerKernel> noise_kernel(bool) const override {
    return keras::detail::LayerKernel{.op = keras::detail::LayerOp::gaussian_dropout,
                                      .scale = stddev_};
  }

 private:
  double rate_;
  float stddev_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

GaussianDropout::GaussianDropout(double rate, GaussianDropoutOptions options)
    : NoiseLayer(options.name, options.seed),
      rate_(rate),
      stddev_(static_cast<float>(std::sqrt(rate / (1.0 - rate)))) {
  if (!(rate >= 0.0 && rate < 1.0))
    throw ConfigError(label() + ": rate must be in [0, 1) but is " + std::to_string(rate));
}

nlohmann::json GaussianDropout::get_config() const {
  auto config = base_config();
  config["rate"] = rate_;
  config["seed"] = seed_json();
  return config;
}

std::shared_ptr<Layer> GaussianDropout::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GaussianDropout");
  const auto rate = read.get<double>("rate");
  if (!(rate >= 0 && rate < 1)) read.fail("rate", "a number in [0, 1)");
  return detail::finish_layer(
      read, std::make_shared<GaussianDropout>(
                rate, GaussianDropoutOptions{.seed = read.optional<std::uint64_t>("seed"),
                                             .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
