/// \file
/// `SeparableConv2D`: Keras's depthwise separable 2-D convolution: a depthwise convolution, then a
/// pointwise (1x1) convolution to `filters` channels.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/depthwise_convolution.hpp"

namespace loadstar::keras::layers {

/// `SeparableConv2D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct SeparableConv2DOptions {
  Size2 strides = 1;
  /// `"valid"` or `"same"`.
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size2 dilation_rate = 1;
  /// The number of depthwise output channels per input channel.
  std::size_t depth_multiplier = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer depthwise_initializer = Initializer::glorot_uniform();
  Initializer pointwise_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `SeparableConv2D`: inputs `(h, w, in)` (channels_last) or `(in, h, w)` (channels_first),
/// `depthwise_kernel` `(kh, kw, in, depth_multiplier)`, `pointwise_kernel`
/// `(1, 1, in * depth_multiplier, filters)` and `bias` `(filters,)` as Keras stores them; the bias
/// and activation follow the pointwise step. `valid` or `same` padding, strides or dilation.
/// \code
/// SeparableConv2D conv(32, 3, {.padding = "same", .activation = "relu"});
/// \endcode
class SeparableConv2D : public detail::DepthwiseConvolution {
 public:
  LOADSTAR_DECL SeparableConv2D(std::size_t filters, Size2 kernel_size,
                                SeparableConv2DOptions options = {});

  std::string class_name() const override { return "SeparableConv2D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Size2 kernel_size_;
  SeparableConv2DOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

SeparableConv2D::SeparableConv2D(std::size_t filters, Size2 kernel_size,
                                 SeparableConv2DOptions options)
    : DepthwiseConvolution(options.name, filters, options.depth_multiplier, options.activation,
                           options.use_bias, options.depthwise_initializer,
                           options.pointwise_initializer, options.bias_initializer),
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

Shape SeparableConv2D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(input_shapes, 2, kernel_size_, options_.strides, options_.dilation_rate,
                       options_.padding, seed);
}

nlohmann::json SeparableConv2D::get_config() const {
  auto config = depthwise_config();
  config["kernel_size"] = {kernel_size_.h, kernel_size_.w};
  config["strides"] = {options_.strides.h, options_.strides.w};
  config["dilation_rate"] = {options_.dilation_rate.h, options_.dilation_rate.w};
  config["padding"] = options_.padding;
  return config;
}

std::shared_ptr<Layer> SeparableConv2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "SeparableConv2D");
  // tf.keras 2 writes the keys of its base class Conv: groups 1 and (SeparableConv) a
  // kernel_initializer that Keras does not use.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  if (read.has("kernel_initializer"))
    detail::config_initializer(read, "kernel_initializer", Initializer::glorot_uniform());
  for (const char* key : {"depthwise_regularizer", "depthwise_constraint", "pointwise_regularizer",
                          "pointwise_constraint"})
    read.expect(key, nullptr, "loadstar has no regularizers or constraints");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of two");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  return detail::finish_layer(
      read, std::make_shared<SeparableConv2D>(
                read.positive("filters"), detail::config_size2(read, "kernel_size", 1),
                SeparableConv2DOptions{
                    .strides = detail::config_size2(read, "strides", 1),
                    .padding = padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size2(read, "dilation_rate", 1),
                    .depth_multiplier =
                        read.has("depth_multiplier") ? read.positive("depth_multiplier") : 1,
                    .activation = detail::config_activation(read),
                    .use_bias = read.get("use_bias", true),
                    .depthwise_initializer = detail::config_initializer(
                        read, "depthwise_initializer", Initializer::glorot_uniform()),
                    .pointwise_initializer = detail::config_initializer(
                        read, "pointwise_initializer", Initializer::glorot_uniform()),
                    .bias_initializer =
                        detail::config_initializer(read, "bias_initializer", Initializer::zeros()),
                    .name = detail::config_name(read),
                }));
}

}  // namespace loadstar::keras::layers
#endif
