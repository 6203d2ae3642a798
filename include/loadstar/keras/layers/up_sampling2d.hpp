/// \file
/// `UpSampling2D`: enlarges an image by whole factors (nearest, bilinear, bicubic, Lanczos, area).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
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

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// One source of an output row (or column): input index `index` with weight `weight`.
  struct Tap {
    std::size_t index[2] = {0, 0};
    float weight[2] = {1.0F, 0.0F};
  };

  /// The taps of the `in * factor` outputs of one axis. Nearest: `o / factor`. Bilinear
  /// (`tf.image.resize`, half pixel centres, as PyTorch's `align_corners=False`): the source
  /// `(o + 0.5) / factor - 0.5`, clamped at 0, between its two neighbours.
  LOADSTAR_DECL std::vector<Tap> taps(std::size_t in, std::size_t factor) const;

  /// Zeroes `target`, then calls `f(output offset, input offset, weight)` for every tap of every
  /// output pixel of `batch` images (offsets of the pixel's first `inner_` element).
  template <class F>
  void visit(std::size_t batch, F&& f, const Tensor<float>& target) const {
    std::fill(target.begin(), target.end(), 0.0F);
    const std::size_t out_h = rows_.size(), out_w = columns_.size();
    const std::size_t taps = bilinear_ ? 2 : 1;
    for (std::size_t plane = 0; plane < batch * planes_; ++plane) {
      for (std::size_t oy = 0; oy < out_h; ++oy) {
        for (std::size_t ox = 0; ox < out_w; ++ox) {
          const std::size_t out = ((plane * out_h + oy) * out_w + ox) * inner_;
          for (std::size_t a = 0; a < taps; ++a) {
            for (std::size_t b = 0; b < taps; ++b) {
              const float weight = rows_[oy].weight[a] * columns_[ox].weight[b];
              if (weight == 0.0F) continue;
              const std::size_t in =
                  ((plane * height_ + rows_[oy].index[a]) * width_ + columns_[ox].index[b]) *
                  inner_;
              f(out, in, weight);
            }
          }
        }
      }
    }
  }

  Size2 size_;
  detail::ResizeKind kind_;
  bool bilinear_;
  bool channels_first_ = false;
  std::size_t planes_ = 1, height_ = 0, width_ = 0, inner_ = 1;
  std::vector<Tap> rows_;
  std::vector<Tap> columns_;
  // The other kinds: `detail::resample`'s taps and scratch.
  detail::AxisTaps row_taps_, column_taps_;
  std::vector<float> scratch_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

UpSampling2D::UpSampling2D(Size2 size, UpSampling2DOptions options)
    : LayerBase(options.name), size_(size), kind_(detail::ResizeKind::nearest), bilinear_(false) {
  channels_first_ = detail::parse_data_format(options.data_format, label());
  std::string interpolation = options.interpolation;
  std::transform(interpolation.begin(), interpolation.end(), interpolation.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  kind_ = detail::resize_kind(interpolation, label());
  bilinear_ = kind_ == detail::ResizeKind::bilinear;
  if (size.h == 0 || size.w == 0) throw ConfigError(label() + ": size must be positive");
}

Shape UpSampling2D::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 3);
  const Shape& in = input_shapes[0];
  // The image as (planes, h, w, inner): (1, h, w, c) channels_last, (c, h, w, 1) channels_first.
  planes_ = channels_first_ ? in[0] : 1;
  height_ = channels_first_ ? in[1] : in[0];
  width_ = channels_first_ ? in[2] : in[1];
  inner_ = channels_first_ ? 1 : in[2];
  const std::size_t h = height_ * size_.h, w = width_ * size_.w;
  if (kind_ == detail::ResizeKind::nearest || kind_ == detail::ResizeKind::bilinear) {
    rows_ = taps(height_, size_.h);
    columns_ = taps(width_, size_.w);
  } else {
    row_taps_ = detail::axis_taps(kind_, false, 0, height_, 0, h);
    column_taps_ = detail::axis_taps(kind_, false, 0, width_, 0, w);
  }
  const Shape out = channels_first_ ? Shape{in[0], h, w} : Shape{h, w, in[2]};
  remember(input_shapes, out);
  return out;
}

void UpSampling2D::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                           const CallContext& ctx) {
  check_inputs(inputs);
  const Tensor<float> tensors[] = {inputs[0], output};
  if (!row_taps_.offsets.empty()) {
    ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
      detail::resample(t[0].data(), t[1].data(), t[0].rows() * planes_, height_, width_, inner_,
                       row_taps_, column_taps_, 0.0F, false, scratch_);
    });
    return;
  }
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    visit(
        t[0].rows(),
        [&](std::size_t out, std::size_t in, float weight) {
          for (std::size_t k = 0; k < inner_; ++k)
            t[1].data()[out + k] += weight * t[0].data()[in + k];
        },
        t[1]);
  });
}

void UpSampling2D::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                            const Tensor<float>& output_gradient,
                            std::span<const Tensor<float>> input_gradients,
                            const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
  if (!row_taps_.offsets.empty()) {
    ctx.backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
      detail::resample(t[0].data(), t[1].data(), inputs[0].rows() * planes_, height_, width_,
                       inner_, row_taps_, column_taps_, 0.0F, true, scratch_);
    });
    return;
  }
  ctx.backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    visit(
        inputs[0].rows(),
        [&](std::size_t out, std::size_t in, float weight) {
          for (std::size_t k = 0; k < inner_; ++k)
            t[1].data()[in + k] += weight * t[0].data()[out + k];
        },
        t[1]);
  });
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
  try {
    std::string lower = interpolation;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    static_cast<void>(detail::resize_kind(lower, "up_sampling2d"));
  } catch (const ConfigError&) {
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

auto UpSampling2D::taps(std::size_t in, std::size_t factor) const -> std::vector<Tap> {
  std::vector<Tap> out(in * factor);
  for (std::size_t o = 0; o < out.size(); ++o) {
    if (!bilinear_) {
      out[o].index[0] = o / factor;
      continue;
    }
    const double source =
        std::max((static_cast<double>(o) + 0.5) / static_cast<double>(factor) - 0.5, 0.0);
    const auto low = static_cast<std::size_t>(std::floor(source));
    const double lerp = source - static_cast<double>(low);
    out[o].index[0] = std::min(low, in - 1);
    out[o].index[1] = std::min(low + 1, in - 1);
    out[o].weight[0] = static_cast<float>(1.0 - lerp);
    out[o].weight[1] = static_cast<float>(lerp);
  }
  return out;
}

}  // namespace loadstar::keras::layers
#endif
