/// \file
/// The crop-then-resize of `Resizing` and `CenterCrop` over channels_last images, as
/// `tf.image.resize` without antialiasing (half-pixel centres).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// How `ImageResizeLayer` samples: Keras's `interpolation`.
enum class ResizeKind { bilinear, nearest, bicubic };

/// A layer mapping `(batch, h, w, c)` images to `(batch, height, width, c)`: a box of the input
/// (the whole image, a centred crop or Keras's `crop_to_aspect_ratio` box) resized bilinearly, by
/// nearest neighbour or bicubically; the backward pass is the resize's adjoint.
///
/// Bicubic is Keys's cubic convolution with `a = -0.5` at half-pixel centres, without
/// antialiasing: output `i` samples input `s = (i + 0.5) * in / out - 0.5` from the four pixels
/// `floor(s) - 1 .. floor(s) + 2`; a pixel outside the image weighs 0 and the others are scaled
/// to sum to 1 (TensorFlow's `resize_bicubic` with `half_pixel_centers`, whose weights come from
/// a table of the fraction in steps of 1/1024, and JAX's `image.resize`, exactly, as here).
class ImageResizeLayer : public LayerBase {
 public:
  /// The box of an `h` by `w` image that is resized (rows and columns from `top`, `left`).
  struct Box {
    std::size_t top = 0, left = 0, height = 0, width = 0;
  };

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  /// Keras's `crop_to_aspect_ratio` box (`smart_resize`): the largest centred box of an `h` by
  /// `w` image with the aspect ratio of `height` by `width`.
  LOADSTAR_DECL static Box aspect_box(std::size_t h, std::size_t w, std::size_t height,
                                      std::size_t width);

 protected:
  LOADSTAR_DECL ImageResizeLayer(std::string name, std::size_t height, std::size_t width,
                                 ResizeKind kind);

  /// The box of an `h` by `w` input that is resized to the output.
  virtual Box box(std::size_t h, std::size_t w) const = 0;

  std::size_t height_, width_;
  ResizeKind kind_;

 private:
  /// One output coordinate's two source coordinates (in the input) and the second's weight.
  struct Tap {
    std::size_t low, high;
    float weight;
  };
  LOADSTAR_DECL std::vector<Tap> taps(std::size_t start, std::size_t in, std::size_t out) const;
  /// Bicubic: one output coordinate's four source coordinates and their weights.
  struct CubicTap {
    std::size_t index[4];
    float weight[4];
  };
  LOADSTAR_DECL static std::vector<CubicTap> cubic_taps(std::size_t start, std::size_t in,
                                                        std::size_t out);
  /// The bicubic forward pass (`adjoint` false) or its adjoint (true) of one host kernel.
  LOADSTAR_DECL void cubic(std::span<const Tensor<float>> t, bool adjoint) const;

  std::vector<Tap> rows_, cols_;
  std::vector<CubicTap> cubic_rows_, cubic_cols_;
  std::size_t in_h_ = 0, in_w_ = 0, channels_ = 0;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

ImageResizeLayer::ImageResizeLayer(std::string name, std::size_t height, std::size_t width,
                                   ResizeKind kind)
    : LayerBase(std::move(name)), height_(height), width_(width), kind_(kind) {}

ImageResizeLayer::Box ImageResizeLayer::aspect_box(std::size_t h, std::size_t w, std::size_t height,
                                                   std::size_t width) {
  const auto crop_h = std::max<std::size_t>(
      std::min(h, static_cast<std::size_t>(double(w * height) / double(width))), 1);
  const auto crop_w = std::max<std::size_t>(
      std::min(w, static_cast<std::size_t>(double(h * width) / double(height))), 1);
  return {(h - crop_h) / 2, (w - crop_w) / 2, crop_h, crop_w};
}

std::vector<ImageResizeLayer::Tap> ImageResizeLayer::taps(std::size_t start, std::size_t in,
                                                          std::size_t out) const {
  // tf.image.resize with half-pixel centres: output i samples input (i + 0.5) * in / out - 0.5
  // (bilinear, clamped to the box) or floor((i + 0.5) * in / out) (nearest).
  const float scale = static_cast<float>(in) / static_cast<float>(out);
  std::vector<Tap> result(out);
  for (std::size_t i = 0; i < out; ++i) {
    if (kind_ == ResizeKind::nearest) {
      const auto source = static_cast<std::size_t>(
          std::min(std::floor((static_cast<float>(i) + 0.5F) * scale), static_cast<float>(in - 1)));
      result[i] = {start + source, start + source, 0.0F};
      continue;
    }
    const float source = (static_cast<float>(i) + 0.5F) * scale - 0.5F;
    const float floor = std::floor(source);
    const auto low = static_cast<std::size_t>(std::max(floor, 0.0F));
    const auto high = static_cast<std::size_t>(std::min(std::ceil(source), float(in - 1)));
    result[i] = {start + low, start + std::max(high, low), source - floor};
  }
  return result;
}

std::vector<ImageResizeLayer::CubicTap> ImageResizeLayer::cubic_taps(std::size_t start,
                                                                     std::size_t in,
                                                                     std::size_t out) {
  // Keys's kernel with a = -0.5 at the distance of each of the four pixels around the sample.
  constexpr double a = -0.5;
  const auto keys = [](double x) {
    x = std::abs(x);
    if (x <= 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
    if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
    return 0.0;
  };
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  std::vector<CubicTap> result(out);
  for (std::size_t i = 0; i < out; ++i) {
    const double source = (static_cast<double>(i) + 0.5) * scale - 0.5;
    const double base = std::floor(source);
    double weights[4], sum = 0.0;
    for (int k = 0; k < 4; ++k) {
      const double pixel = base - 1.0 + k;
      const bool inside = pixel >= 0.0 && pixel < static_cast<double>(in);
      weights[k] = inside ? keys(source - pixel) : 0.0;
      sum += weights[k];
      // A pixel outside weighs 0; its index stays inside the image.
      const double clamped = std::clamp(pixel, 0.0, static_cast<double>(in - 1));
      result[i].index[k] = start + static_cast<std::size_t>(clamped);
    }
    for (int k = 0; k < 4; ++k)
      result[i].weight[k] = static_cast<float>(weights[k] / sum);
  }
  return result;
}

void ImageResizeLayer::cubic(std::span<const Tensor<float>> t, bool adjoint) const {
  const std::size_t c = channels_, in_image = in_h_ * in_w_ * c, out_image = height_ * width_ * c;
  if (adjoint) std::fill(t[1].data(), t[1].data() + t[1].size(), 0.0F);
  for (std::size_t n = 0; n < t[0].rows(); ++n) {
    for (std::size_t i = 0; i < height_; ++i) {
      const CubicTap& r = cubic_rows_[i];
      for (std::size_t j = 0; j < width_; ++j) {
        const CubicTap& q = cubic_cols_[j];
        const std::size_t at = n * out_image + (i * width_ + j) * c;
        for (int u = 0; u < 4; ++u) {
          for (int v = 0; v < 4; ++v) {
            const float w = r.weight[u] * q.weight[v];
            if (w == 0.0F) continue;
            const std::size_t from = n * in_image + (r.index[u] * in_w_ + q.index[v]) * c;
            if (adjoint) {
              for (std::size_t k = 0; k < c; ++k)
                t[1].data()[from + k] += w * t[0].data()[at + k];
            } else {
              for (std::size_t k = 0; k < c; ++k)
                t[1].data()[at + k] += w * t[0].data()[from + k];
            }
          }
        }
      }
    }
  }
}

Shape ImageResizeLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() != 3 || in[0] == 0 || in[1] == 0) {
    throw ShapeError(label() + ": expects non-empty images (batch, height, width, channels) but " +
                     "got inputs of shape " + batch_str(in));
  }
  in_h_ = in[0];
  in_w_ = in[1];
  channels_ = in[2];
  const Box b = box(in_h_, in_w_);
  if (kind_ == ResizeKind::bicubic) {
    cubic_rows_ = cubic_taps(b.top, b.height, height_);
    cubic_cols_ = cubic_taps(b.left, b.width, width_);
  } else {
    rows_ = taps(b.top, b.height, height_);
    cols_ = taps(b.left, b.width, width_);
  }
  const Shape out{height_, width_, channels_};
  remember(input_shapes, out);
  return out;
}

void ImageResizeLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                               const CallContext& ctx) {
  check_inputs(inputs);
  const Tensor<float> tensors[] = {inputs[0], output};
  if (kind_ == ResizeKind::bicubic) {
    ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
      std::fill(t[1].data(), t[1].data() + t[1].size(), 0.0F);
      cubic(t, false);
    });
    return;
  }
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    const std::size_t c = channels_, in_image = in_h_ * in_w_ * c;
    for (std::size_t n = 0; n < t[0].rows(); ++n) {
      const float* x = t[0].data() + n * in_image;
      float* y = t[1].data() + n * height_ * width_ * c;
      for (std::size_t i = 0; i < height_; ++i) {
        const Tap& r = rows_[i];
        for (std::size_t j = 0; j < width_; ++j) {
          const Tap& q = cols_[j];
          const float* a = x + (r.low * in_w_ + q.low) * c;
          const float* b = x + (r.low * in_w_ + q.high) * c;
          const float* d = x + (r.high * in_w_ + q.low) * c;
          const float* e = x + (r.high * in_w_ + q.high) * c;
          for (std::size_t k = 0; k < c; ++k) {
            const float top = a[k] + (b[k] - a[k]) * q.weight;
            const float bottom = d[k] + (e[k] - d[k]) * q.weight;
            y[(i * width_ + j) * c + k] = top + (bottom - top) * r.weight;
          }
        }
      }
    }
  });
}

void ImageResizeLayer::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                                const Tensor<float>& output_gradient,
                                std::span<const Tensor<float>> input_gradients,
                                const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
  if (kind_ == ResizeKind::bicubic) {
    ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) { cubic(t, true); });
    return;
  }
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    const std::size_t c = channels_, in_image = in_h_ * in_w_ * c;
    std::fill(t[1].data(), t[1].data() + t[1].size(), 0.0F);
    for (std::size_t n = 0; n < t[0].rows(); ++n) {
      const float* dy = t[0].data() + n * height_ * width_ * c;
      float* dx = t[1].data() + n * in_image;
      for (std::size_t i = 0; i < height_; ++i) {
        const Tap& r = rows_[i];
        for (std::size_t j = 0; j < width_; ++j) {
          const Tap& q = cols_[j];
          const float w[] = {(1.0F - r.weight) * (1.0F - q.weight), (1.0F - r.weight) * q.weight,
                             r.weight * (1.0F - q.weight), r.weight * q.weight};
          float* targets[] = {dx + (r.low * in_w_ + q.low) * c, dx + (r.low * in_w_ + q.high) * c,
                              dx + (r.high * in_w_ + q.low) * c,
                              dx + (r.high * in_w_ + q.high) * c};
          for (std::size_t k = 0; k < c; ++k) {
            const float g = dy[(i * width_ + j) * c + k];
            for (int tap = 0; tap < 4; ++tap)
              targets[tap][k] += w[tap] * g;
          }
        }
      }
    }
  });
}

}  // namespace loadstar::keras::layers::detail
#endif
