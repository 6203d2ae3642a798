/// \file
/// The crop-or-pad-then-resize of `Resizing` and `CenterCrop` over channels_last images, as
/// `tf.image.resize` (half-pixel centres), and the separable resampling `UpSampling2D` shares.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// How an image is resampled: Keras's `interpolation`.
enum class ResizeKind { bilinear, nearest, bicubic, lanczos3, lanczos5, area };

/// Keras's name of `kind` (`"bilinear"`, ...).
LOADSTAR_DECL const char* resize_kind_name(ResizeKind kind);
/// The kind Keras names `interpolation`, or none.
LOADSTAR_DECL std::optional<ResizeKind> parse_resize_kind(const std::string& interpolation);
/// The kind Keras names `interpolation`; `ConfigError` naming `label` and the names otherwise.
LOADSTAR_DECL ResizeKind resize_kind(const std::string& interpolation, const std::string& label);

/// One axis of a separable resampling: output `i` is the sum over `k` in
/// `[offsets[i], offsets[i + 1])` of `weight[k]` times input `index[k]`, or times the fill value
/// where `index[k]` is `fill` (a padded sample).
struct AxisTaps {
  static constexpr std::size_t fill = std::numeric_limits<std::size_t>::max();
  std::vector<std::size_t> offsets, index;
  std::vector<float> weight;
  std::size_t size() const noexcept { return offsets.empty() ? 0 : offsets.size() - 1; }
};

/// The taps of `out` outputs resampling an axis of `in` samples starting at input `start`, with
/// `pad` fill samples before and after them (`out` samples the `in + 2 * pad` of the padded
/// axis), as `tf.image.resize` computes them at half-pixel centres: output `i` samples
/// `s = (i + 0.5) * n / out - 0.5` of an axis of `n` samples.
/// - `nearest`: sample `min(floor((i + 0.5) * n / out), n - 1)` (in float32, as TensorFlow).
/// - `bilinear`, `bicubic` (Keys's cubic, `a = -0.5`), `lanczos3`, `lanczos5`: the kernel at
///   `|s - p| / k` for every sample `p` in its support, the weights scaled to sum to 1 (0 when
///   they sum to less than 1000 float32 epsilons): TensorFlow's `scale_and_translate` and JAX's
///   `image.resize`; `k` is `max(n / out, 1)` with `antialias` (the kernel widened to a low-pass
///   filter when shrinking), 1 otherwise (TensorFlow's `resize_bilinear` and `resize_bicubic` are
///   these weights without antialiasing).
/// - `area`: TensorFlow's `resize_area`, the mean of the box `[i * n / out, (i + 1) * n / out)`,
///   each sample weighted by its overlap (antialiasing does not apply).
LOADSTAR_DECL AxisTaps axis_taps(ResizeKind kind, bool antialias, std::size_t start, std::size_t in,
                                 std::size_t pad, std::size_t out);

/// `planes` images of `height x width` pixels of `inner` contiguous values each, resampled to
/// `rows.size() x cols.size()` pixels: rows first, through `scratch`, then columns. `fill` is the
/// value of padded samples. `adjoint` computes the input gradient from the output gradient
/// instead (`x` the output gradient, `y` the input gradient, overwritten; padding takes none).
LOADSTAR_DECL void resample(const float* x, float* y, std::size_t planes, std::size_t height,
                            std::size_t width, std::size_t inner, const AxisTaps& rows,
                            const AxisTaps& cols, float fill, bool adjoint,
                            std::vector<float>& scratch);

/// A layer mapping `(batch, h, w, c)` images to `(batch, height, width, c)`: a box of the input
/// (the whole image, a centred crop or Keras's `crop_to_aspect_ratio` box, or the image padded to
/// the aspect ratio) resampled as `axis_taps` says; the backward pass is the resampling's
/// adjoint.
class ImageResizeLayer : public LayerBase {
 public:
  /// The box of an `h` by `w` image that is resized (rows and columns from `top`, `left`), with
  /// `pad_rows` rows of the fill value above and below it and `pad_cols` columns left and right.
  struct Box {
    std::size_t top = 0, left = 0, height = 0, width = 0;
    std::size_t pad_rows = 0, pad_cols = 0;
  };

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Images of unknown height and width (a model that resizes whatever it is given), each
  /// batch's box and taps made for its size; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape>) const override {
    return Shape{height_, width_, channels_};
  }

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
  /// Keras's `pad_to_aspect_ratio` box (TensorFlow's backend): the whole image with
  /// `int((max(h, int(w * height / width)) - h) / 2)` rows of padding above and below, or the
  /// columns' equivalent.
  LOADSTAR_DECL static Box padded_box(std::size_t h, std::size_t w, std::size_t height,
                                      std::size_t width);

 protected:
  LOADSTAR_DECL ImageResizeLayer(std::string name, std::size_t height, std::size_t width,
                                 ResizeKind kind, bool antialias = false, float fill_value = 0.0F);

  /// The box of an `h` by `w` input that is resized to the output.
  virtual Box box(std::size_t h, std::size_t w) const = 0;

  std::size_t height_, width_;
  ResizeKind kind_;
  bool antialias_;
  float fill_value_;

 private:
  /// The box and taps for `h` by `w` images when they differ from the last's.
  LOADSTAR_DECL void settle(std::size_t h, std::size_t w);

  AxisTaps row_taps_, col_taps_;
  std::vector<float> scratch_;
  std::size_t in_h_ = 0, in_w_ = 0, channels_ = 0;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

const char* resize_kind_name(ResizeKind kind) {
  switch (kind) {
    case ResizeKind::nearest:
      return "nearest";
    case ResizeKind::bicubic:
      return "bicubic";
    case ResizeKind::lanczos3:
      return "lanczos3";
    case ResizeKind::lanczos5:
      return "lanczos5";
    case ResizeKind::area:
      return "area";
    case ResizeKind::bilinear:
      break;
  }
  return "bilinear";
}

std::optional<ResizeKind> parse_resize_kind(const std::string& interpolation) {
  for (ResizeKind kind : {ResizeKind::bilinear, ResizeKind::nearest, ResizeKind::bicubic,
                          ResizeKind::lanczos3, ResizeKind::lanczos5, ResizeKind::area}) {
    if (interpolation == resize_kind_name(kind)) return kind;
  }
  return std::nullopt;
}

ResizeKind resize_kind(const std::string& interpolation, const std::string& label) {
  if (const auto kind = parse_resize_kind(interpolation)) return *kind;
  throw ConfigError(label +
                    ": interpolation must be \"bilinear\", \"nearest\", \"bicubic\", "
                    "\"lanczos3\", \"lanczos5\" or \"area\" but is \"" +
                    interpolation + "\"");
}

AxisTaps axis_taps(ResizeKind kind, bool antialias, std::size_t start, std::size_t in,
                   std::size_t pad, std::size_t out) {
  const std::size_t n = in + 2 * pad;
  AxisTaps taps;
  taps.offsets.reserve(out + 1);
  taps.offsets.push_back(0);
  const auto push = [&](std::size_t p, double weight) {
    taps.index.push_back(p < pad || p >= pad + in ? AxisTaps::fill : start + (p - pad));
    taps.weight.push_back(static_cast<float>(weight));
  };
  const double scale = static_cast<double>(n) / static_cast<double>(out);
  for (std::size_t i = 0; i < out; ++i) {
    if (kind == ResizeKind::nearest) {
      const float source = std::floor((static_cast<float>(i) + 0.5F) *
                                      (static_cast<float>(n) / static_cast<float>(out)));
      push(std::min(static_cast<std::size_t>(source), n - 1), 1.0);
    } else if (kind == ResizeKind::area) {
      const double low = static_cast<double>(i) * scale, high = static_cast<double>(i + 1) * scale;
      for (auto p = static_cast<std::size_t>(std::floor(low));
           static_cast<double>(p) < high && p < n; ++p) {
        const double overlap =
            std::min(static_cast<double>(p + 1), high) - std::max(static_cast<double>(p), low);
        if (overlap > 0.0) push(p, overlap / scale);
      }
    } else {
      const double radius = kind == ResizeKind::bilinear   ? 1.0
                            : kind == ResizeKind::bicubic  ? 2.0
                            : kind == ResizeKind::lanczos3 ? 3.0
                                                           : 5.0;
      const auto kernel = [&](double x) {
        if (x >= radius) return 0.0;
        if (kind == ResizeKind::bilinear) return 1.0 - x;
        if (kind == ResizeKind::bicubic) {  // Keys's cubic with a = -0.5
          return x < 1.0 ? ((1.5 * x - 2.5) * x) * x + 1.0 : ((-0.5 * x + 2.5) * x - 4.0) * x + 2.0;
        }
        if (x <= 1e-3) return 1.0;  // sinc's limit, as TensorFlow and JAX take it
        const double pi = 3.14159265358979323846;
        return radius * std::sin(pi * x) * std::sin(pi * x / radius) / (pi * pi * x * x);
      };
      const double widen = antialias ? std::max(scale, 1.0) : 1.0;
      const double source = (static_cast<double>(i) + 0.5) * scale - 0.5;
      const double first = std::max(std::ceil(source - radius * widen), 0.0);
      const double last = std::min(std::floor(source + radius * widen), static_cast<double>(n - 1));
      double sum = 0.0;
      for (double p = first; p <= last; p += 1.0)
        sum += kernel(std::abs(source - p) / widen);
      // Each weight over the sum, none when the sum is about 0 (as TensorFlow and JAX).
      if (std::abs(sum) > 1000.0 * std::numeric_limits<float>::epsilon()) {
        for (double p = first; p <= last; p += 1.0) {
          const double weight = kernel(std::abs(source - p) / widen);
          if (weight != 0.0) push(static_cast<std::size_t>(p), weight / sum);
        }
      }
    }
    taps.offsets.push_back(taps.index.size());
  }
  return taps;
}

ImageResizeLayer::Box ImageResizeLayer::aspect_box(std::size_t h, std::size_t w, std::size_t height,
                                                   std::size_t width) {
  const auto crop_h = std::max<std::size_t>(
      std::min(h, static_cast<std::size_t>(double(w * height) / double(width))), 1);
  const auto crop_w = std::max<std::size_t>(
      std::min(w, static_cast<std::size_t>(double(h * width) / double(height))), 1);
  return {(h - crop_h) / 2, (w - crop_w) / 2, crop_h, crop_w};
}

void resample(const float* x, float* y, std::size_t planes, std::size_t height, std::size_t width,
              std::size_t inner, const AxisTaps& rows, const AxisTaps& cols, float fill,
              bool adjoint, std::vector<float>& scratch) {
  // The rows pass makes an out_h x width image per plane in `scratch`; a padded column of the
  // padded image is the fill value in every row, so after the rows pass it is `fill` times the
  // row's weight sum.
  const std::size_t out_h = rows.size(), out_w = cols.size();
  const std::size_t row = width * inner, out_row = out_w * inner;
  // The rows' weight sums after the image (no allocation once `scratch` has grown).
  scratch.assign(out_h * row + out_h, 0.0F);
  float* row_sums = scratch.data() + out_h * row;
  for (std::size_t i = 0; i < out_h; ++i)
    for (std::size_t k = rows.offsets[i]; k < rows.offsets[i + 1]; ++k)
      row_sums[i] += rows.weight[k];
  for (std::size_t plane = 0; plane < planes; ++plane) {
    const float* in = x + plane * (adjoint ? out_h * out_row : height * row);
    float* out = y + plane * (adjoint ? height * row : out_h * out_row);
    if (!adjoint) {
      for (std::size_t i = 0; i < out_h; ++i) {
        float* t = scratch.data() + i * row;
        std::fill(t, t + row, 0.0F);
        for (std::size_t k = rows.offsets[i]; k < rows.offsets[i + 1]; ++k) {
          const float w = rows.weight[k];
          if (rows.index[k] == AxisTaps::fill) {
            for (std::size_t e = 0; e < row; ++e)
              t[e] += w * fill;
            continue;
          }
          const float* source = in + rows.index[k] * row;
          for (std::size_t e = 0; e < row; ++e)
            t[e] += w * source[e];
        }
      }
      for (std::size_t i = 0; i < out_h; ++i) {
        const float* t = scratch.data() + i * row;
        for (std::size_t j = 0; j < out_w; ++j) {
          float* target = out + i * out_row + j * inner;
          std::fill(target, target + inner, 0.0F);
          for (std::size_t k = cols.offsets[j]; k < cols.offsets[j + 1]; ++k) {
            const float w = cols.weight[k];
            if (cols.index[k] == AxisTaps::fill) {
              for (std::size_t e = 0; e < inner; ++e)
                target[e] += w * fill * row_sums[i];
              continue;
            }
            const float* source = t + cols.index[k] * inner;
            for (std::size_t e = 0; e < inner; ++e)
              target[e] += w * source[e];
          }
        }
      }
      continue;
    }
    // The adjoint: the columns' transpose into `scratch`, then the rows' into the input gradient.
    std::fill(scratch.data(), scratch.data() + out_h * row, 0.0F);
    for (std::size_t i = 0; i < out_h; ++i) {
      float* t = scratch.data() + i * row;
      for (std::size_t j = 0; j < out_w; ++j) {
        const float* g = in + i * out_row + j * inner;
        for (std::size_t k = cols.offsets[j]; k < cols.offsets[j + 1]; ++k) {
          if (cols.index[k] == AxisTaps::fill) continue;
          const float w = cols.weight[k];
          float* target = t + cols.index[k] * inner;
          for (std::size_t e = 0; e < inner; ++e)
            target[e] += w * g[e];
        }
      }
    }
    std::fill(out, out + height * row, 0.0F);
    for (std::size_t i = 0; i < out_h; ++i) {
      const float* t = scratch.data() + i * row;
      for (std::size_t k = rows.offsets[i]; k < rows.offsets[i + 1]; ++k) {
        if (rows.index[k] == AxisTaps::fill) continue;
        const float w = rows.weight[k];
        float* target = out + rows.index[k] * row;
        for (std::size_t e = 0; e < row; ++e)
          target[e] += w * t[e];
      }
    }
  }
}

ImageResizeLayer::ImageResizeLayer(std::string name, std::size_t height, std::size_t width,
                                   ResizeKind kind, bool antialias, float fill_value)
    : LayerBase(std::move(name)),
      height_(height),
      width_(width),
      kind_(kind),
      antialias_(antialias),
      fill_value_(fill_value) {}

ImageResizeLayer::Box ImageResizeLayer::padded_box(std::size_t h, std::size_t w, std::size_t height,
                                                   std::size_t width) {
  // In float32 and truncated, as TensorFlow's backend computes them; the padding goes on both
  // sides of one axis only.
  const auto pad_h = std::max(
      h, static_cast<std::size_t>(static_cast<float>(w * height) / static_cast<float>(width)));
  const auto pad_w = std::max(
      w, static_cast<std::size_t>(static_cast<float>(h * width) / static_cast<float>(height)));
  Box box{0, 0, h, w};
  box.pad_rows = static_cast<std::size_t>(static_cast<float>(pad_h - h) / 2.0F);
  box.pad_cols = static_cast<std::size_t>(static_cast<float>(pad_w - w) / 2.0F);
  return box;
}

Shape ImageResizeLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() != 3 || in[2] == 0) {
    throw ShapeError(label() + ": expects images (batch, height, width, channels) of known " +
                     "channels but got inputs of shape " + batch_str(in));
  }
  channels_ = in[2];
  in_h_ = in_w_ = 0;
  if (in[0] != 0 && in[1] != 0) settle(in[0], in[1]);
  const Shape out{height_, width_, channels_};
  remember(input_shapes, out);
  return out;
}

void ImageResizeLayer::settle(std::size_t h, std::size_t w) {
  if (h == in_h_ && w == in_w_) return;
  const Box b = box(h, w);
  row_taps_ = axis_taps(kind_, antialias_, b.top, b.height, b.pad_rows, height_);
  col_taps_ = axis_taps(kind_, antialias_, b.left, b.width, b.pad_cols, width_);
  in_h_ = h;
  in_w_ = w;
}

void ImageResizeLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                               const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0].dim(1), inputs[0].dim(2));
  const Tensor<float> tensors[] = {inputs[0], output};
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    resample(t[0].data(), t[1].data(), t[0].rows(), in_h_, in_w_, channels_, row_taps_, col_taps_,
             fill_value_, false, scratch_);
  });
}

void ImageResizeLayer::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                                const Tensor<float>& output_gradient,
                                std::span<const Tensor<float>> input_gradients,
                                const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(input_gradients[0].dim(1), input_gradients[0].dim(2));
  const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    resample(t[0].data(), t[1].data(), t[1].rows(), in_h_, in_w_, channels_, row_taps_, col_taps_,
             fill_value_, true, scratch_);
  });
}

}  // namespace loadstar::keras::layers::detail
#endif
