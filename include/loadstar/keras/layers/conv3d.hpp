/// \file
/// `Conv3D`: Keras's 3-D convolution over volumes (direct loops over channels-last voxels).
#pragma once

#include "loadstar/config.hpp"

#include <optional>

#include "loadstar/keras/layers/detail/convolution3d.hpp"

namespace loadstar::keras::layers {

/// `Conv3D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv3DOptions {
  Size3 strides = {1, 1, 1};
  /// `"valid"` or `"same"` (TensorFlow's rule).
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  Size3 dilation_rate = {1, 1, 1};
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv3D`: inputs `(d, h, w, in)` (channels_last) or `(in, d, h, w)` (channels_first),
/// kernel `(kd, kh, kw, in, filters)` as Keras stores it, `bias` `(filters,)`; `valid` or `same`
/// padding, strides and dilation.
/// \code
/// Conv3D conv(8, {3, 3, 3}, {.padding = "same", .activation = "relu"});
/// \endcode
class Conv3D : public detail::Convolution3D {
 public:
  LOADSTAR_DECL Conv3D(std::size_t filters, Size3 kernel_size, Conv3DOptions options = {});

  std::string class_name() const override { return "Conv3D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  Size3 kernel_size_;
  Conv3DOptions options_;
  bool same_ = false;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Conv3D::Conv3D(std::size_t filters, Size3 kernel_size, Conv3DOptions options)
    : Convolution3D(options.name, false, filters, options.activation, options.use_bias,
                    options.kernel_initializer, options.bias_initializer),
      kernel_size_(kernel_size),
      options_(std::move(options)) {
  channels_first_ = detail::parse_data_format(options_.data_format, label());
  same_ = detail::parse_padding(options_.padding, label());
  check_sizes(kernel_size_, options_.strides, options_.dilation_rate, Size3{0, 0, 0});
}

Shape Conv3D::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  return build_volume(input_shapes, kernel_size_, options_.strides, options_.dilation_rate, same_,
                      std::nullopt, seed);
}

nlohmann::json Conv3D::get_config() const {
  auto config = convolution3d_config();
  config["kernel_size"] = kernel_size_;
  config["strides"] = options_.strides;
  config["padding"] = same_ ? "same" : "valid";
  config["dilation_rate"] = options_.dilation_rate;
  config["groups"] = 1;
  return config;
}

std::shared_ptr<Layer> Conv3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Conv3D");
  read.expect("groups", 1, "loadstar has no grouped 3-D convolutions");
  if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of three");
  const std::string padding = read.get("padding", "valid");
  if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
  return detail::finish_layer(
      read, std::make_shared<Conv3D>(
                read.positive("filters"), detail::config_size3(read, "kernel_size", {1, 1, 1}),
                Conv3DOptions{
                    .strides = detail::config_size3(read, "strides", {1, 1, 1}),
                    .padding = padding,
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
