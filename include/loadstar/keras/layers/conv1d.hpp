/// \file
/// `Conv1D`: Keras's 1-D convolution over sequences (a 2-D convolution of height 1).
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/convolution.hpp"

namespace loadstar::keras::layers {

/// `Conv1D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv1DOptions {
  std::size_t strides = 1;
  /// `"valid"`, `"same"` or `"causal"` (left padding of `(kernel_size - 1) * dilation_rate`, so
  /// that step `t` of the output sees steps up to `t` of the input).
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default: `(steps, channels)`) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::size_t dilation_rate = 1;
  /// The number of groups the input and output channels are split into (both divisible by it):
  /// each group of filters sees its own group of input channels.
  std::size_t groups = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv1D`: inputs `(steps, in)` (channels_last) or `(in, steps)` (channels_first),
/// kernel `(kernel_size, in, filters)` as Keras stores it, `bias` `(filters,)`; `valid`, `same`
/// (TensorFlow's rule) or `causal` padding, strides, dilation and groups (kernel
/// `(kernel_size, in / groups, filters)`). Computed by the im2col + GEMM path of `Conv2D` with a
/// height of 1.
/// \code
/// Conv1D conv(64, 3, {.padding = "causal", .activation = "relu"});
/// \endcode
class Conv1D : public detail::Convolution {
 public:
  LOADSTAR_DECL Conv1D(std::size_t filters, std::size_t kernel_size, Conv1DOptions options = {});

  std::string class_name() const override { return "Conv1D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Steps of unknown length (a text model's), settled per batch; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  LOADSTAR_DECL Conv2DGeometry geometry_for(const Shape& in_last, Shape& out_last) const override;

 private:
  std::size_t kernel_size_;
  Conv1DOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv1D::Conv1D(std::size_t filters, std::size_t kernel_size, Conv1DOptions options)
    : Convolution(options.name, filters, options.activation, options.use_bias,
                  options.kernel_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  groups_ = options_.groups;
  if (groups_ == 0 || filters % std::max<std::size_t>(groups_, 1) != 0) {
    throw ConfigError(label() + ": groups must be positive and divide the " +
                      std::to_string(filters) + " filters but is " + std::to_string(groups_));
  }
  if (options_.padding != "valid" && options_.padding != "same" && options_.padding != "causal") {
    throw ConfigError(label() + ": padding must be 'valid', 'same' or 'causal' but is '" +
                      options_.padding + "'");
  }
  if (filters == 0 || kernel_size == 0 || options_.strides == 0 || options_.dilation_rate == 0) {
    throw ConfigError(label() +
                      ": filters, kernel_size, strides and dilation_rate must be positive");
  }
}

Shape Conv1D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 2);
  const Shape in = input_last(input_shapes[0]);
  if (in[1] == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(input_shapes[0]));
  }
  Shape out_last;
  const Conv2DGeometry g = geometry_for(in, out_last);
  return finish_build(input_shapes, g, Shape{kernel_size_, in[1], filters_}, out_last, seed);
}

Conv2DGeometry Conv1D::geometry_for(const Shape& in, Shape& out_last) const {
  AxisGeometry steps;
  if (in[0] == 0) {
    steps = {0, 0};  // a length settled per batch
  } else if (options_.padding == "causal") {
    // Keras pads (kernel_size - 1) * dilation_rate steps on the left, then convolves validly.
    steps = {(in[0] + options_.strides - 1) / options_.strides,
             (kernel_size_ - 1) * options_.dilation_rate};
  } else {
    steps = axis_geometry(in[0], kernel_size_, options_.strides, options_.dilation_rate,
                          options_.padding == "same");
    if (steps.out == 0) {
      throw ShapeError(label() + ": a kernel of size " + std::to_string(kernel_size_) +
                       " does not fit inputs of shape " +
                       (channels_first_ ? detail::move_channels(in, true) : in).str() +
                       " with valid padding");
    }
  }
  out_last = Shape{steps.out, filters_};
  return Conv2DGeometry{.in_h = 1,
                        .in_w = in[0],
                        .in_c = in[1],
                        .out_h = 1,
                        .out_w = steps.out,
                        .out_c = filters_,
                        .kernel_h = 1,
                        .kernel_w = kernel_size_,
                        .stride_h = 1,
                        .stride_w = options_.strides,
                        .dilation_h = 1,
                        .dilation_w = options_.dilation_rate,
                        .pad_top = 0,
                        .pad_left = steps.pad_before};
}

Shape Conv1D::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out_last;
  geometry_for(input_last(input_shapes[0]), out_last);
  return channels_first_ ? detail::move_channels(out_last, true) : out_last;
}

nlohmann::json Conv1D::get_config() const {
  auto config = convolution_config();
  config["kernel_size"] = {kernel_size_};
  config["strides"] = {options_.strides};
  config["padding"] = options_.padding;
  config["dilation_rate"] = {options_.dilation_rate};
  return config;
}

std::shared_ptr<Layer> Conv1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv1D");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of one");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same" && padding != "causal")
    read.fail("padding", "\"valid\", \"same\" or \"causal\"");
  return detail::finish_layer(
      read, std::make_shared<Conv1D>(
                read.positive("filters"), detail::config_size1(read, "kernel_size", 1),
                Conv1DOptions{
                    .strides = detail::config_size1(read, "strides", 1),
                    .padding = padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size1(read, "dilation_rate", 1),
                    .groups = read.has("groups") ? read.positive("groups") : 1,
                    .activation = detail::config_activation(read),
                    .use_bias = read.get("use_bias", true),
                    .kernel_initializer = detail::config_initializer(read, "kernel_initializer",
                                                                     Initializer::glorot_uniform()),
                    .bias_initializer =
                        detail::config_initializer(read, "bias_initializer", Initializer::zeros()),
                    .name = detail::config_name(read),
                }));
}

}  // namespace loadstar::keras::layers
#endif
