/// \file
/// `Conv2DTranspose`: Keras's transposed 2-D convolution (the gradient of a `Conv2D` with respect
/// to its input), as in decoders and U-Nets.
#pragma once

#include "loadstar/config.hpp"

#include <optional>

#include "loadstar/keras/layers/detail/convolution_transpose.hpp"

namespace loadstar::keras::layers {

/// `Conv2DTranspose`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv2DTransposeOptions {
  Size2 strides = 1;
  /// `"valid"` or `"same"`.
  std::string padding = "valid";
  /// The extra size of the output along each axis, below the stride; empty: Keras's `None` (the
  /// output size follows from the padding alone).
  std::optional<Size2> output_padding = std::nullopt;
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size2 dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv2DTranspose`: inputs `(h, w, in)` (channels_last) or `(in, h, w)` (channels_first),
/// kernel `(kh, kw, filters, in)` as Keras stores it, `bias` `(filters,)`. The output has
/// `h * strides` rows with `same` padding and `h * strides + max(kh - strides, 0)` with `valid`
/// (dilated kernel sizes), or `(h - 1) * strides + kh - 2 * pad + output_padding` with an
/// `output_padding` (pad `kh // 2` for `same`, 0 for `valid`); the padding is TensorFlow's.
/// \code
/// Conv2DTranspose up(16, 3, {.strides = 2, .padding = "same", .activation = "relu"});
/// \endcode
class Conv2DTranspose : public detail::ConvolutionTranspose {
 public:
  LOADSTAR_DECL Conv2DTranspose(std::size_t filters, Size2 kernel_size,
                                Conv2DTransposeOptions options = {});

  std::string class_name() const override { return "Conv2DTranspose"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Size2 kernel_size_;
  Conv2DTransposeOptions options_;
  bool same_ = false;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv2DTranspose::Conv2DTranspose(std::size_t filters, Size2 kernel_size,
                                 Conv2DTransposeOptions options)
    : ConvolutionTranspose(options.name, filters, options.activation, options.use_bias,
                           options.kernel_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  same_ = detail::parse_padding(options_.padding, label());
  const std::size_t kernel[] = {kernel_size_.h, kernel_size_.w};
  const std::size_t strides[] = {options_.strides.h, options_.strides.w};
  const std::size_t dilation[] = {options_.dilation_rate.h, options_.dilation_rate.w};
  const std::size_t padding[] = {options_.output_padding ? options_.output_padding->h : 0,
                                 options_.output_padding ? options_.output_padding->w : 0};
  check_sizes(kernel, strides, dilation, padding);
}

Shape Conv2DTranspose::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(input_shapes, 2, kernel_size_, options_.strides, options_.dilation_rate,
                       same_, options_.output_padding, seed);
}

nlohmann::json Conv2DTranspose::get_config() const {
  auto config = transpose_config();
  config["kernel_size"] = {kernel_size_.h, kernel_size_.w};
  config["strides"] = {options_.strides.h, options_.strides.w};
  config["dilation_rate"] = {options_.dilation_rate.h, options_.dilation_rate.w};
  config["output_padding"] = nullptr;
  if (options_.output_padding)
    config["output_padding"] = {options_.output_padding->h, options_.output_padding->w};
  config["padding"] = same_ ? "same" : "valid";
  return config;
}

std::shared_ptr<Layer> Conv2DTranspose::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv2DTranspose");
  // tf.keras 2 writes the groups of its base class Conv.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of two");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  std::optional<Size2> output_padding;
  if (const nlohmann::json* v = read.find("output_padding"); v != nullptr && !v->is_null()) {
    const auto size = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() >= 0;
    };
    if (size(*v)) {
      output_padding = Size2(v->get<std::size_t>());
    } else if (v->is_array() && v->size() == 2 && size((*v)[0]) && size((*v)[1])) {
      output_padding = Size2((*v)[0].get<std::size_t>(), (*v)[1].get<std::size_t>());
    } else {
      read.fail("output_padding", "null, a non-negative integer or a list of two");
    }
  }
  return detail::finish_layer(
      read, std::make_shared<Conv2DTranspose>(
                read.positive("filters"), detail::config_size2(read, "kernel_size", 1),
                Conv2DTransposeOptions{
                    .strides = detail::config_size2(read, "strides", 1),
                    .padding = padding,
                    .output_padding = output_padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size2(read, "dilation_rate", 1),
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
