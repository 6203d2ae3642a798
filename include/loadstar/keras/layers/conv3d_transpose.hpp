/// \file
/// `Conv3DTranspose`: Keras's transposed 3-D convolution (the gradient of a `Conv3D` with respect
/// to its input).
#pragma once

#include "loadstar/config.hpp"

#include <optional>

#include "loadstar/keras/layers/detail/convolution3d.hpp"

namespace loadstar::keras::layers {

/// `Conv3DTranspose`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv3DTransposeOptions {
  Size3 strides = {1, 1, 1};
  /// `"valid"` or `"same"` (TensorFlow's rule).
  std::string padding = "valid";
  /// The extra size of the output along each axis, below the stride; empty: Keras's `None`.
  std::optional<Size3> output_padding = std::nullopt;
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size3 dilation_rate = {1, 1, 1};
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv3DTranspose`: inputs `(d, h, w, in)` (channels_last) or `(in, d, h, w)`
/// (channels_first), kernel `(kd, kh, kw, filters, in)` as Keras stores it, `bias` `(filters,)`;
/// each output size as `Conv2DTranspose`'s (`same`: `d * strides`; `valid`:
/// `d * strides + max(kd - strides, 0)`; with `output_padding`:
/// `(d - 1) * strides + kd - 2 * pad + output_padding`).
/// \code
/// Conv3DTranspose up(8, {3, 3, 3}, {.strides = {2, 2, 2}, .padding = "same"});
/// \endcode
class Conv3DTranspose : public detail::Convolution3D {
 public:
  LOADSTAR_DECL Conv3DTranspose(std::size_t filters, Size3 kernel_size,
                                Conv3DTransposeOptions options = {});

  std::string class_name() const override { return "Conv3DTranspose"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Size3 kernel_size_;
  Conv3DTransposeOptions options_;
  bool same_ = false;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv3DTranspose::Conv3DTranspose(std::size_t filters, Size3 kernel_size,
                                 Conv3DTransposeOptions options)
    : Convolution3D(options.name, true, filters, options.activation, options.use_bias,
                    options.kernel_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  same_ = detail::parse_padding(options_.padding, label());
  check_sizes(kernel_size_, options_.strides, options_.dilation_rate,
              options_.output_padding.value_or(Size3{0, 0, 0}));
}

Shape Conv3DTranspose::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_volume(input_shapes, kernel_size_, options_.strides, options_.dilation_rate, same_,
                      options_.output_padding, seed);
}

nlohmann::json Conv3DTranspose::get_config() const {
  auto config = convolution3d_config();
  config["kernel_size"] = kernel_size_;
  config["strides"] = options_.strides;
  config["padding"] = same_ ? "same" : "valid";
  config["dilation_rate"] = options_.dilation_rate;
  config["output_padding"] = nullptr;
  if (options_.output_padding) config["output_padding"] = *options_.output_padding;
  return config;
}

std::shared_ptr<Layer> Conv3DTranspose::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv3DTranspose");
  read.expect("groups", 1, "loadstar has no grouped 3-D convolutions");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of three");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  std::optional<Size3> output_padding;
  if (const nlohmann::json* v = read.find("output_padding"); v != nullptr && !v->is_null()) {
    const auto size = [](const nlohmann::json& e) {
      return e.is_number_integer() && e.get<std::int64_t>() >= 0;
    };
    if (size(*v)) {
      output_padding = Size3{v->get<std::size_t>(), v->get<std::size_t>(), v->get<std::size_t>()};
    } else if (v->is_array() && v->size() == 3 && std::all_of(v->begin(), v->end(), size)) {
      output_padding =
          Size3{(*v)[0].get<std::size_t>(), (*v)[1].get<std::size_t>(), (*v)[2].get<std::size_t>()};
    } else {
      read.fail("output_padding", "null, a non-negative integer or a list of three");
    }
  }
  return detail::finish_layer(
      read, std::make_shared<Conv3DTranspose>(
                read.positive("filters"), detail::config_size3(read, "kernel_size", {1, 1, 1}),
                Conv3DTransposeOptions{
                    .strides = detail::config_size3(read, "strides", {1, 1, 1}),
                    .padding = padding,
                    .output_padding = output_padding,
                    .data_format =
                        detail::config_channels_first(read) ? "channels_first" : "channels_last",
                    .dilation_rate = detail::config_size3(read, "dilation_rate", {1, 1, 1}),
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
