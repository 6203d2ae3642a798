/// \file
/// `GaussianNoise`: adds zero-mean normal noise while training.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/noise_layer.hpp"

namespace loadstar::keras::layers {

/// `GaussianNoise`'s Keras arguments after `stddev`.
struct GaussianNoiseOptions {
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name = {};
};

/// Keras's `GaussianNoise`: `x + stddev * n` with `n` standard normal in training, the identity
/// otherwise; the noise derives from `(seed or ctx.seed, ctx.step, name)`.
/// \code
/// GaussianNoise noise(0.1F);
/// \endcode
class GaussianNoise : public detail::NoiseLayer {
 public:
  LOADSTAR_DECL explicit GaussianNoise(float stddev, GaussianNoiseOptions options = {});

  std::string class_name() const override { return "GaussianNoise"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  std::optional<keras::detail::LayerKernel> noise_kernel(bool backward) const override {
    if (backward) return std::nullopt;
    return keras::detail::LayerKernel{.op = keras::detail::LayerOp::gaussian_noise,
                                      .scale = stddev_};
  }

 private:
  float stddev_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

GaussianNoise::GaussianNoise(float stddev, GaussianNoiseOptions options)
    : NoiseLayer(options.name, options.seed), stddev_(stddev) {
  if (!(stddev >= 0.0F))
    throw ConfigError(label() + ": stddev must be >= 0 but is " + std::to_string(stddev));
}

nlohmann::json GaussianNoise::get_config() const {
  auto config = base_config();
  config["stddev"] = stddev_;
  config["seed"] = seed_json();
  return config;
}

std::shared_ptr<Layer> GaussianNoise::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GaussianNoise");
  const auto stddev = read.get<float>("stddev");
  if (!(stddev >= 0.0F)) read.fail("stddev", "a number >= 0");
  return detail::finish_layer(
      read, std::make_shared<GaussianNoise>(
                stddev, GaussianNoiseOptions{.seed = read.optional<std::uint64_t>("seed"),
                                             .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
