/// \file
/// The base of `SpatialDropout1D/2D/3D`: dropout of whole channels.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/noise_layer.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of `SpatialDropout1D/2D/3D` after `rate`.
struct SpatialDropoutOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"` (`SpatialDropout2D/3D` only).
  std::string data_format = "channels_last";
  std::optional<std::uint64_t> seed = std::nullopt;
  std::string name = {};
};

namespace detail {

/// Keras's `SpatialDropout*D`: in training each channel of each sample is dropped whole with
/// probability `rate` (Keras's `noise_shape` `(batch, 1, ..., channels)`), kept ones scaled by
/// `1 / (1 - rate)`; the identity otherwise.
class SpatialDropout : public NoiseLayer {
 public:
  /// Keras's spatial dropouts do not support masking.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::stops; }
  /// `class_name` is the layer's (the base answers `class_name()`, so that its constructor's
  /// messages name the layer).
  LOADSTAR_DECL SpatialDropout(const char* class_name, std::size_t spatial, double rate,
                               const SpatialDropoutOptions& options);

  std::string class_name() const override { return class_name_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Steps, heights and widths of unknown length: each batch's channels are dropped over its
  /// own sizes; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    sample_size_ = inputs[0].shape().row_shape().elements();
    NoiseLayer::forward(inputs, output, ctx);
  }
  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    sample_size_ = inputs[0].shape().row_shape().elements();
    NoiseLayer::backward(inputs, output, output_gradient, input_gradients, ctx);
  }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// The layer of `class_name` with `spatial` axes from its config.
  LOADSTAR_DECL static std::shared_ptr<Layer> from_keras_config(const nlohmann::json& config,
                                                                const char* class_name,
                                                                std::size_t spatial);

 protected:
  // One draw per (sample, channel), the same mask for the values and their gradients.
  std::optional<keras::detail::LayerKernel> noise_kernel(bool) const override {
    const std::size_t spatial = sample_size_ / channels_;
    const std::array<std::size_t, 3> dims{0, channels_first_ ? channels_ : spatial,
                                          channels_first_ ? spatial : channels_};
    const std::array<std::size_t, 3> strides{channels_, channels_first_ ? 1U : 0U,
                                             channels_first_ ? 0U : 1U};
    return keras::detail::LayerKernel{
        .op = keras::detail::LayerOp::dropout,
        .map = keras::detail::broadcast_map(dims.data(), strides.data(), 3),
        .scale = scale_,
        .rate = rate_};
  }

 private:
  const char* class_name_;
  std::size_t spatial_;
  double rate_;
  float scale_;
  bool channels_first_ = false;
  std::size_t channels_ = 1, sample_size_ = 1;
};

}  // namespace detail
}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

SpatialDropout::SpatialDropout(const char* class_name, std::size_t spatial, double rate,
                               const SpatialDropoutOptions& options)
    : NoiseLayer(options.name, options.seed),
      class_name_(class_name),
      spatial_(spatial),
      rate_(rate),
      scale_(static_cast<float>(1.0 / (1.0 - rate))) {
  channels_first_ = parse_data_format(options.data_format, label());
  if (!(rate >= 0.0 && rate < 1.0))
    throw ConfigError(label() + ": rate must be in [0, 1) but is " + std::to_string(rate));
}

Shape SpatialDropout::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], spatial_ + 1);
  const Shape& in = input_shapes[0];
  channels_ = channels_first_ ? in[0] : in[spatial_];
  if (channels_ == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(in));
  }
  sample_size_ = in.elements();
  remember(input_shapes, in);
  return in;
}

nlohmann::json SpatialDropout::get_config() const {
  auto config = base_config();
  config["rate"] = rate_;
  if (spatial_ > 1) config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  config["noise_shape"] = nullptr;
  config["seed"] = seed_json();
  return config;
}

std::shared_ptr<Layer> SpatialDropout::from_keras_config(const nlohmann::json& config,
                                                         const char* class_name,
                                                         std::size_t spatial) {
  const auto read = layer_config(config, class_name);
  const auto rate = read.get<double>("rate");
  if (!(rate >= 0 && rate < 1)) read.fail("rate", "a number in [0, 1)");
  // Keras writes Dropout's noise_shape, which its SpatialDropout computes itself.
  read.expect("noise_shape", nullptr, "SpatialDropout drops whole channels");
  if (spatial == 1) read.expect("data_format", nullptr, "SpatialDropout1D has channels last");
  return finish_layer(
      read, std::make_shared<SpatialDropout>(
                class_name, spatial, rate,
                SpatialDropoutOptions{
                    .data_format = config_channels_first(read) ? "channels_first" : "channels_last",
                    .seed = read.optional<std::uint64_t>("seed"),
                    .name = config_name(read)}));
}

}  // namespace loadstar::keras::layers::detail
#endif
