/// \file
/// `DepthwiseConv2D`: Keras's depthwise 2-D convolution: each input channel convolved with its own
/// `depth_multiplier` filters (a direct loop over channels-last pixels).
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/depthwise_convolution.hpp"

namespace loadstar::keras::layers {

/// `DepthwiseConv2D`'s Keras arguments after `kernel_size`, with Keras's defaults.
struct DepthwiseConv2DOptions {
  Size2 strides = 1;
  /// `"valid"` or `"same"`.
  std::string padding = "valid";
  /// The number of depthwise output channels per input channel.
  std::size_t depth_multiplier = 1;
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size2 dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer depthwise_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `DepthwiseConv2D`: inputs `(h, w, in)` (channels_last) or `(in, h, w)` (channels_first),
/// `depthwise_kernel` `(kh, kw, in, depth_multiplier)` as Keras stores it, `bias`
/// `(in * depth_multiplier,)`; output channel `c * depth_multiplier + m` is input channel `c`
/// convolved with `depthwise_kernel[..., c, m]`. `valid` or `same` padding (TensorFlow's rule),
/// strides or dilation.
/// \code
/// DepthwiseConv2D dw(3, {.padding = "same", .depth_multiplier = 2});
/// \endcode
class DepthwiseConv2D : public detail::DepthwiseConvolution {
 public:
  LOADSTAR_DECL DepthwiseConv2D(Size2 kernel_size, DepthwiseConv2DOptions options = {});

  std::string class_name() const override { return "DepthwiseConv2D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Size2 kernel_size_;
  DepthwiseConv2DOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

DepthwiseConv2D::DepthwiseConv2D(Size2 kernel_size, DepthwiseConv2DOptions options)
    : DepthwiseConvolution(options.name, 0, options.depth_multiplier, options.activation,
                           options.use_bias, options.depthwise_initializer, Initializer::zeros(),
                           options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  if (options_.padding != "valid" && options_.padding != "same") {
    throw ConfigError(label() + ": padding must be 'valid' or 'same' but is '" + options_.padding +
                      "'");
  }
  const std::size_t kernel[] = {kernel_size_.h, kernel_size_.w};
  const std::size_t strides[] = {options_.strides.h, options_.strides.w};
  const std::size_t dilation[] = {options_.dilation_rate.h, options_.dilation_rate.w};
  check_sizes(kernel, strides, dilation);
}

Shape DepthwiseConv2D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(input_shapes, 2, kernel_size_, options_.strides, options_.dilation_rate,
                       options_.padding, seed);
}

nlohmann::json DepthwiseConv2D::get_config() const {
  auto config = depthwise_config();
  config["kernel_size"] = {kernel_size_.h, kernel_size_.w};
  config["strides"] = {options_.strides.h, options_.strides.w};
  config["dilation_rate"] = {options_.dilation_rate.h, options_.dilation_rate.w};
  config["padding"] = options_.padding;
  return config;
}

std::shared_ptr<Layer> DepthwiseConv2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "DepthwiseConv2D");
  // tf.keras 2 writes the keys of its base class Conv: groups 1.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  for (const char* key : {"depthwise_regularizer", "depthwise_constraint"})
    read.expect(key, nullptr, "loadstar has no regularizers or constraints");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of two");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  return detail::finish_layer(
      read, std::make_shared<DepthwiseConv2D>(
                detail::config_size2(read, "kernel_size", 1),
                DepthwiseConv2DOptions{
                    .strides = detail::config_size2(read, "strides", 1),
                    .padding = padding,
                    .depth_multiplier =
                        read.has("depth_multiplier") ? read.positive("depth_multiplier") : 1,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size2(read, "dilation_rate", 1),
                    .activation = detail::config_activation(read),
                    .use_bias = read.get("use_bias", true),
                    .depthwise_initializer = detail::config_initializer(
                        read, "depthwise_initializer", Initializer::glorot_uniform()),
                    .bias_initializer =
                        detail::config_initializer(read, "bias_initializer", Initializer::zeros()),
                    .name = detail::config_name(read),
                }));
}

}  // namespace loadstar::keras::layers
#endif
