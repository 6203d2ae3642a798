/// \file
/// `UpSampling2D`: enlarges an image by whole factors (nearest, bilinear, bicubic, Lanczos, area).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <vector>

#include "loadstar/keras/layers/detail/image_resize.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `UpSampling2D`'s Keras arguments after `size`.
struct UpSampling2DOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  /// `"nearest"` (each pixel repeated), or `"bilinear"`, `"bicubic"`, `"lanczos3"`, `"lanczos5"`
  /// or `"area"` (`tf.image.resize` without antialiasing, half-pixel centres, as
  /// `detail::axis_taps` says); Keras lowercases it.
  std::string interpolation = "nearest";
  std::string name = {};
};

/// Keras's `UpSampling2D`: `(h, w, c)` to `(h * size.h, w * size.w, c)` (or the channels_first
/// equivalent).
/// \code
/// UpSampling2D up(2);
/// UpSampling2D smooth({2, 3}, {.interpolation = "bilinear"});
/// \endcode
class UpSampling2D : public detail::LayerBase {
 public:
  LOADSTAR_DECL explicit UpSampling2D(Size2 size = 2, UpSampling2DOptions options = {});

  std::string class_name() const override { return "UpSampling2D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Heights and widths of unknown length, settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The output shape for inputs of sample shape `in` (an unknown length giving one).
  Shape output_for(const Shape& in) const {
    return channels_first_ ? Shape{in[0], in[1] * size_.h, in[2] * size_.w}
                           : Shape{in[0] * size_.h, in[1] * size_.w, in[2]};
  }
  /// The image's sizes and each axis's taps for the batch `x` when they differ from the last's.
  LOADSTAR_DECL void settle(const Tensor<float>& x);
  /// The kernel `op` of nearest up-sampling (repeat, or its adjoint for the gradient) for a batch
  /// of `rows` images: on the device, where the other interpolations resample on the host.
  LOADSTAR_DECL keras::detail::LayerKernel nearest_kernel(keras::detail::LayerOp op,
                                                          std::size_t rows) const;
  /// Keras's `interpolation` lowercased, as Keras keeps it.
  static std::string lowercase(std::string name) {
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return name;
  }

  Size2 size_;
  detail::ResizeKind kind_;
  bool channels_first_ = false;
  std::size_t planes_ = 1, height_ = 0, width_ = 0, inner_ = 1;
  // Each axis's taps (nearest repeats: `o / size`) and `detail::resample`'s scratch.
  detail::AxisTaps row_taps_, column_taps_;
  std::vector<float> scratch_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

UpSampling2D::UpSampling2D(Size2 size, UpSampling2DOptions options)
    : LayerBase(options.name), size_(size), kind_(detail::ResizeKind::nearest) {
  channels_first_ = detail::parse_data_format(options.data_format, label());
  kind_ = detail::resize_kind(lowercase(options.interpolation), label());
  if (size.h == 0 || size.w == 0) throw ConfigError(label() + ": size must be positive");
}

Shape UpSampling2D::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 3);
  const Shape& in = input_shapes[0];
  // The image as (planes, h, w, inner): (1, h, w, c) channels_last, (c, h, w, 1) channels_first;
  // the taps are made for the first batch's sizes when a length is unknown.
  planes_ = channels_first_ ? in[0] : 1;
  inner_ = channels_first_ ? 1 : in[2];
  height_ = width_ = 0;
  const Shape out = output_for(in);
  remember(input_shapes, out);
  return out;
}

Shape UpSampling2D::output_shape_for(std::span<const Shape> input_shapes) const {
  return output_for(input_shapes[0]);
}

void UpSampling2D::settle(const Tensor<float>& x) {
  const Shape in = x.shape().row_shape();
  const std::size_t height = channels_first_ ? in[1] : in[0];
  const std::size_t width = channels_first_ ? in[2] : in[1];
  if (height == height_ && width == width_) return;
  height_ = height;
  width_ = width;
  row_taps_ = detail::axis_taps(kind_, false, 0, height_, 0, height_ * size_.h);
  column_taps_ = detail::axis_taps(kind_, false, 0, width_, 0, width_ * size_.w);
}

void UpSampling2D::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                           const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  if (kind_ == detail::ResizeKind::nearest) {
    ctx.backend.layer_kernel(nearest_kernel(keras::detail::LayerOp::repeat, inputs[0].rows()),
                             std::array{inputs[0], output}, output.size());
    return;
  }
  const Tensor<float> tensors[] = {inputs[0], output};
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    detail::resample(t[0].data(), t[1].data(), t[0].rows() * planes_, height_, width_, inner_,
                     row_taps_, column_taps_, 0.0F, false, scratch_);
  });
}

void UpSampling2D::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                            const Tensor<float>& output_gradient,
                            std::span<const Tensor<float>> input_gradients,
                            const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(inputs[0]);
  if (kind_ == detail::ResizeKind::nearest) {
    ctx.backend.layer_kernel(
        nearest_kernel(keras::detail::LayerOp::repeat_backward, inputs[0].rows()),
        std::array{output_gradient, input_gradients[0]}, input_gradients[0].size());
    return;
  }
  const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
  ctx.backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    detail::resample(t[0].data(), t[1].data(), inputs[0].rows() * planes_, height_, width_, inner_,
                     row_taps_, column_taps_, 0.0F, true, scratch_);
  });
}

keras::detail::LayerKernel UpSampling2D::nearest_kernel(keras::detail::LayerOp op,
                                                        std::size_t rows) const {
  keras::detail::LayerKernel kernel{.op = op};
  kernel.box = {.count = rows * planes_,
                .inner = inner_,
                .small = {height_, width_, 1},
                .large = {height_ * size_.h, width_ * size_.w, 1}};
  return kernel;
}

nlohmann::json UpSampling2D::get_config() const {
  auto config = base_config();
  config["size"] = {size_.h, size_.w};
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  config["interpolation"] = detail::resize_kind_name(kind_);
  return config;
}

std::shared_ptr<Layer> UpSampling2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "UpSampling2D");
  const std::string interpolation = read.get("interpolation", "nearest");
  if (!detail::parse_resize_kind(lowercase(interpolation))) {
    read.fail("interpolation",
              "\"nearest\", \"bilinear\", \"bicubic\", \"lanczos3\", \"lanczos5\" or \"area\"");
  }
  return detail::finish_layer(
      read,
      std::make_shared<UpSampling2D>(
          detail::config_size2(read, "size", 2),
          UpSampling2DOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                 : "channels_last",
                              .interpolation = interpolation,
                              .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
