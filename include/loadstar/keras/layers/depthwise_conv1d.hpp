/// \file
/// `DepthwiseConv1D`: Keras's depthwise 1-D convolution over sequences (a depthwise 2-D convolution
/// of height 1).
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/depthwise_convolution.hpp"

namespace loadstar::keras::layers {

/// `DepthwiseConv1D`'s Keras arguments after `kernel_size`, with Keras's defaults.
struct DepthwiseConv1DOptions {
  std::size_t strides = 1;
  /// `"valid"`, `"same"` or `"causal"` (tf.keras 2: `(kernel_size - 1) * dilation_rate`
  /// zeros before the first step).
  std::string padding = "valid";
  /// The number of depthwise output channels per input channel.
  std::size_t depth_multiplier = 1;
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::size_t dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer depthwise_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `DepthwiseConv1D`: inputs `(steps, in)` (channels_last) or `(in, steps)`
/// (channels_first), `depthwise_kernel` `(kernel_size, in, depth_multiplier)` as Keras stores it,
/// `bias`
/// `(in * depth_multiplier,)`; `valid`, `same` or (tf.keras 2) `causal` padding, strides or
/// dilation.
/// \code
/// DepthwiseConv1D dw(5, {.padding = "causal", .depth_multiplier = 2});
/// \endcode
class DepthwiseConv1D : public detail::DepthwiseConvolution {
 public:
  LOADSTAR_DECL DepthwiseConv1D(std::size_t kernel_size, DepthwiseConv1DOptions options = {});

  std::string class_name() const override { return "DepthwiseConv1D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  std::size_t kernel_size_;
  DepthwiseConv1DOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

DepthwiseConv1D::DepthwiseConv1D(std::size_t kernel_size, DepthwiseConv1DOptions options)
    : DepthwiseConvolution(options.name, 0, options.depth_multiplier, options.activation,
                           options.use_bias, options.depthwise_initializer, Initializer::zeros(),
                           options.bias_initializer),
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

Shape DepthwiseConv1D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(input_shapes, 1, Size2(1, kernel_size_), Size2(1, options_.strides),
                       Size2(1, options_.dilation_rate), options_.padding, seed);
}

nlohmann::json DepthwiseConv1D::get_config() const {
  auto config = depthwise_config();
  config["kernel_size"] = {kernel_size_};
  config["strides"] = {options_.strides};
  config["dilation_rate"] = {options_.dilation_rate};
  config["padding"] = options_.padding;
  return config;
}

std::shared_ptr<Layer> DepthwiseConv1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "DepthwiseConv1D");
  // tf.keras 2 writes the keys of its base class Conv: groups 1.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  for (const char* key : {"depthwise_regularizer", "depthwise_constraint"})
    read.expect(key, nullptr, "loadstar has no regularizers or constraints");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of one");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same" && padding != "causal")
    read.fail("padding", "\"valid\", \"same\" or \"causal\"");
  return detail::finish_layer(
      read, std::make_shared<DepthwiseConv1D>(
                detail::config_size1(read, "kernel_size", 1),
                DepthwiseConv1DOptions{
                    .strides = detail::config_size1(read, "strides", 1),
                    .padding = padding,
                    .depth_multiplier =
                        read.has("depth_multiplier") ? read.positive("depth_multiplier") : 1,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size1(read, "dilation_rate", 1),
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
