/// \file
/// `SeparableConv1D`: Keras's depthwise separable 1-D convolution: a depthwise convolution, then a
/// pointwise (size 1) convolution to `filters` channels.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/depthwise_convolution.hpp"

namespace loadstar::keras::layers {

/// `SeparableConv1D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct SeparableConv1DOptions {
  std::size_t strides = 1;
  /// `"valid"`, `"same"` or `"causal"` (tf.keras 2: `(kernel_size - 1) * dilation_rate`
  /// zeros before the first step).
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::size_t dilation_rate = 1;
  /// The number of depthwise output channels per input channel.
  std::size_t depth_multiplier = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer depthwise_initializer = Initializer::glorot_uniform();
  Initializer pointwise_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `SeparableConv1D`: inputs `(steps, in)` (channels_last) or `(in, steps)`
/// (channels_first), `depthwise_kernel` `(kernel_size, in, depth_multiplier)`, `pointwise_kernel`
/// `(1, in * depth_multiplier, filters)` and `bias` `(filters,)` as Keras stores them; `valid`,
/// `same` or (tf.keras 2) `causal` padding, strides or dilation.
/// \code
/// SeparableConv1D conv(16, 3, {.padding = "same", .activation = "relu"});
/// \endcode
class SeparableConv1D : public detail::DepthwiseConvolution {
 public:
  LOADSTAR_DECL SeparableConv1D(std::size_t filters, std::size_t kernel_size,
                                SeparableConv1DOptions options = {});

  std::string class_name() const override { return "SeparableConv1D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  std::size_t kernel_size_;
  SeparableConv1DOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

SeparableConv1D::SeparableConv1D(std::size_t filters, std::size_t kernel_size,
                                 SeparableConv1DOptions options)
    : DepthwiseConvolution(options.name, filters, options.depth_multiplier, options.activation,
                           options.use_bias, options.depthwise_initializer,
                           options.pointwise_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  if (options_.padding != "valid" && options_.padding != "same" && options_.padding != "causal") {
    throw ConfigError(label() + ": padding must be 'valid', 'same' or 'causal' but is '" +
                      options_.padding + "'");
  }
  check_sizes(std::span(&kernel_size_, 1), std::span(&options_.strides, 1),
              std::span(&options_.dilation_rate, 1));
}

Shape SeparableConv1D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(input_shapes, 1, Size2(1, kernel_size_), Size2(1, options_.strides),
                       Size2(1, options_.dilation_rate), options_.padding, seed);
}

nlohmann::json SeparableConv1D::get_config() const {
  auto config = depthwise_config();
  config["kernel_size"] = {kernel_size_};
  config["strides"] = {options_.strides};
  config["dilation_rate"] = {options_.dilation_rate};
  config["padding"] = options_.padding;
  return config;
}

std::shared_ptr<Layer> SeparableConv1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "SeparableConv1D");
  // tf.keras 2 writes the keys of its base class Conv: groups 1 and (SeparableConv) a
  // kernel_initializer that Keras does not use.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  if (read.has("kernel_initializer"))
    detail::config_initializer(read, "kernel_initializer", Initializer::glorot_uniform());
  for (const char* key : {"depthwise_regularizer", "depthwise_constraint", "pointwise_regularizer",
                          "pointwise_constraint"})
    read.expect(key, nullptr, "loadstar has no regularizers or constraints");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of one");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same" && padding != "causal")
    read.fail("padding", "\"valid\", \"same\" or \"causal\"");
  return detail::finish_layer(
      read, std::make_shared<SeparableConv1D>(
                read.positive("filters"), detail::config_size1(read, "kernel_size", 1),
                SeparableConv1DOptions{
                    .strides = detail::config_size1(read, "strides", 1),
                    .padding = padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size1(read, "dilation_rate", 1),
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
