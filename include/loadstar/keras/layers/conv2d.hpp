/// \file
/// `Conv2D`: Keras's 2-D convolution over images (im2col + GEMM).
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/convolution.hpp"

namespace loadstar::keras::layers {

/// `Conv2D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv2DOptions {
  Size2 strides = 1;
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size2 dilation_rate = 1;
  /// The number of groups the input and output channels are split into (both divisible by it):
  /// each group of filters sees its own group of input channels.
  std::size_t groups = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv2D`: inputs `(h, w, in)` (channels_last) or `(in, h, w)` (channels_first), kernel
/// `(kh, kw, in, filters)` in both formats as Keras stores it, `bias` `(filters,)`; `valid` or
/// `same` padding (TensorFlow's rule), strides, dilation and groups (kernel
/// `(kh, kw, in / groups, filters)`).
/// \code
/// Conv2D conv(32, 3, {.padding = "same", .activation = "relu"});
/// Conv2D strided(64, {3, 3}, {.strides = 2});
/// Conv2D planar(8, 3, {.data_format = "channels_first"});
/// Conv2D grouped(64, 3, {.groups = 4});
/// \endcode
class Conv2D : public detail::Convolution {
 public:
  LOADSTAR_DECL Conv2D(std::size_t filters, Size2 kernel_size, Conv2DOptions options = {});

  std::string class_name() const override { return "Conv2D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Heights and widths of unknown length (a fully convolutional model's
  /// `Input(shape=(None, None, 3))`), settled per batch; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  LOADSTAR_DECL Conv2DGeometry geometry_for(const Shape& in_last, Shape& out_last) const override;

 private:
  Size2 kernel_size_;
  Conv2DOptions options_;
  bool same_ = false;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv2D::Conv2D(std::size_t filters, Size2 kernel_size, Conv2DOptions options)
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
  same_ = detail::parse_padding(options_.padding, label());
  if (filters == 0 || kernel_size.h == 0 || kernel_size.w == 0 || options_.strides.h == 0 ||
      options_.strides.w == 0 || options_.dilation_rate.h == 0 || options_.dilation_rate.w == 0) {
    throw ConfigError(label() +
                      ": filters, kernel_size, strides and dilation_rate must be "
                      "positive");
  }
}

Shape Conv2D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 3);
  const Shape in = input_last(input_shapes[0]);
  if (in[2] == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(input_shapes[0]));
  }
  Shape out_last;
  const Conv2DGeometry g = geometry_for(in, out_last);
  return finish_build(input_shapes, g, Shape{kernel_size_.h, kernel_size_.w, in[2], filters_},
                      out_last, seed);
}

Conv2DGeometry Conv2D::geometry_for(const Shape& in, Shape& out_last) const {
  // An axis of unknown length (0) gives one of unknown length, settled per batch.
  const auto axis = [&](std::size_t length, std::size_t kernel, std::size_t stride,
                        std::size_t dilation) {
    return length == 0 ? AxisGeometry{0, 0}
                       : axis_geometry(length, kernel, stride, dilation, same_);
  };
  const auto h = axis(in[0], kernel_size_.h, options_.strides.h, options_.dilation_rate.h);
  const auto w = axis(in[1], kernel_size_.w, options_.strides.w, options_.dilation_rate.w);
  if ((in[0] != 0 && h.out == 0) || (in[1] != 0 && w.out == 0)) {
    throw ShapeError(label() + ": a " + std::to_string(kernel_size_.h) + "x" +
                     std::to_string(kernel_size_.w) + " kernel does not fit inputs of shape " +
                     (channels_first_ ? detail::move_channels(in, true) : in).str() +
                     " with valid padding");
  }
  out_last = Shape{h.out, w.out, filters_};
  return Conv2DGeometry{.in_h = in[0],
                        .in_w = in[1],
                        .in_c = in[2],
                        .out_h = h.out,
                        .out_w = w.out,
                        .out_c = filters_,
                        .kernel_h = kernel_size_.h,
                        .kernel_w = kernel_size_.w,
                        .stride_h = options_.strides.h,
                        .stride_w = options_.strides.w,
                        .dilation_h = options_.dilation_rate.h,
                        .dilation_w = options_.dilation_rate.w,
                        .pad_top = h.pad_before,
                        .pad_left = w.pad_before};
}

Shape Conv2D::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out_last;
  geometry_for(input_last(input_shapes[0]), out_last);
  return channels_first_ ? detail::move_channels(out_last, true) : out_last;
}

nlohmann::json Conv2D::get_config() const {
  auto config = convolution_config();
  config["kernel_size"] = {kernel_size_.h, kernel_size_.w};
  config["strides"] = {options_.strides.h, options_.strides.w};
  config["padding"] = same_ ? "same" : "valid";
  config["dilation_rate"] = {options_.dilation_rate.h, options_.dilation_rate.w};
  return config;
}

std::shared_ptr<Layer> Conv2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv2D");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of two");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  return detail::finish_layer(
      read, std::make_shared<Conv2D>(
                read.positive("filters"), detail::config_size2(read, "kernel_size", 1),
                Conv2DOptions{
                    .strides = detail::config_size2(read, "strides", 1),
                    .padding = padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size2(read, "dilation_rate", 1),
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
