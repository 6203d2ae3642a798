/// \file
/// `Conv1DTranspose`: Keras's transposed 1-D convolution (a `Conv2DTranspose` of height 1).
#pragma once

#include "loadstar/config.hpp"

#include <optional>

#include "loadstar/keras/layers/detail/convolution_transpose.hpp"

namespace loadstar::keras::layers {

/// `Conv1DTranspose`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv1DTransposeOptions {
  std::size_t strides = 1;
  /// `"valid"` or `"same"`.
  std::string padding = "valid";
  /// The extra size of the output along each axis, below the stride; empty: Keras's `None` (the
  /// output size follows from the padding alone).
  std::optional<std::size_t> output_padding = std::nullopt;
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::size_t dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv1DTranspose`: inputs `(steps, in)` (channels_last) or `(in, steps)`
/// (channels_first), kernel `(kernel_size, filters, in)` as Keras stores it, `bias` `(filters,)`;
/// the output length as `Conv2DTranspose`'s.
/// \code
/// Conv1DTranspose up(8, 4, {.strides = 2, .padding = "same"});
/// \endcode
class Conv1DTranspose : public detail::ConvolutionTranspose {
 public:
  LOADSTAR_DECL Conv1DTranspose(std::size_t filters, std::size_t kernel_size,
                                Conv1DTransposeOptions options = {});

  std::string class_name() const override { return "Conv1DTranspose"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  std::size_t kernel_size_;
  Conv1DTransposeOptions options_;
  bool same_ = false;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv1DTranspose::Conv1DTranspose(std::size_t filters, std::size_t kernel_size,
                                 Conv1DTransposeOptions options)
    : ConvolutionTranspose(options.name, filters, options.activation, options.use_bias,
                           options.kernel_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  same_ = detail::parse_padding(options_.padding, label());
  const std::size_t padding = options_.output_padding.value_or(0);
  check_sizes(std::span(&kernel_size_, 1), std::span(&options_.strides, 1),
              std::span(&options_.dilation_rate, 1), std::span(&padding, 1));
}

Shape Conv1DTranspose::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_spatial(
      input_shapes, 1, Size2(1, kernel_size_), Size2(1, options_.strides),
      Size2(1, options_.dilation_rate), same_,
      (options_.output_padding ? std::optional<Size2>(Size2(0, *options_.output_padding))
                               : std::nullopt),
      seed);
}

nlohmann::json Conv1DTranspose::get_config() const {
  auto config = transpose_config();
  config["kernel_size"] = {kernel_size_};
  config["strides"] = {options_.strides};
  config["dilation_rate"] = {options_.dilation_rate};
  config["output_padding"] = nullptr;
  if (options_.output_padding) config["output_padding"] = {*options_.output_padding};
  config["padding"] = same_ ? "same" : "valid";
  return config;
}

std::shared_ptr<Layer> Conv1DTranspose::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv1DTranspose");
  // tf.keras 2 writes the groups of its base class Conv.
  read.expect("groups", 1, "loadstar has no grouped convolutions");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of one");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  std::optional<std::size_t> output_padding;
  if (const nlohmann::json* v = read.find("output_padding"); v != nullptr && !v->is_null()) {
    const auto size = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() >= 0;
    };
    if (size(*v)) {
      output_padding = v->get<std::size_t>();
    } else if (v->is_array() && v->size() == 1 && size((*v)[0])) {
      output_padding = (*v)[0].get<std::size_t>();
    } else {
      read.fail("output_padding", "null, a non-negative integer or a list of one");
    }
  }
  return detail::finish_layer(
      read, std::make_shared<Conv1DTranspose>(
                read.positive("filters"), detail::config_size1(read, "kernel_size", 1),
                Conv1DTransposeOptions{
                    .strides = detail::config_size1(read, "strides", 1),
                    .padding = padding,
                    .output_padding = output_padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size1(read, "dilation_rate", 1),
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
