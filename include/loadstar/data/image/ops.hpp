/// \file
/// Operations on decoded `(height, width, channels)` images, as `tf.image` defines them: `resize`
/// (bilinear, nearest, area, bicubic, with tf's half-pixel centres and `antialias=False`), crops,
/// flips, brightness and contrast, their seeded random variants, and torchvision's random resized
/// crop.
///
/// Random variants take an explicit seed (`map_with_seed` hands each element one) and draw from
/// loadstar's SplitMix64: the same seed gives the same result on every run and thread count, but
/// not the numbers tf's or torchvision's generators would draw.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/random.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::image {

/// The interpolations of `resize` (`tf.image.ResizeMethod`'s names).
enum class ResizeMethod { bilinear, nearest, area, bicubic };

/// The method named as Keras and tf name it: `"bilinear"`, `"nearest"`, `"area"` or `"bicubic"`;
/// throws `ConfigError` for tf's other methods (lanczos3, lanczos5, gaussian, mitchellcubic), which
/// are not implemented, and for unknown names.
inline ResizeMethod resize_method(std::string_view name) {
  if (name == "bilinear") return ResizeMethod::bilinear;
  if (name == "nearest") return ResizeMethod::nearest;
  if (name == "area") return ResizeMethod::area;
  if (name == "bicubic") return ResizeMethod::bicubic;
  if (name == "lanczos3" || name == "lanczos5" || name == "gaussian" || name == "mitchellcubic") {
    throw ConfigError("resize: interpolation '" + std::string(name) +
                      "' is not implemented (bilinear, nearest, area and bicubic are)");
  }
  throw ConfigError("resize: unknown interpolation '" + std::string(name) +
                    "' (expected bilinear, nearest, area or bicubic)");
}

namespace detail {

template <class T>
void check_image(const Tensor<T>& image, const char* what) {
  if (image.rank() != 3 || image.empty()) {
    throw ShapeError(std::string(what) + ": expected a non-empty image of shape (height, width, " +
                     "channels) but got a " + image.description());
  }
}

// Bilinear weights of tf's HalfPixelScaler: in = (out + 0.5) * scale - 0.5.
struct LinearTap {
  std::size_t lower, upper;
  float lerp;
};
// The output spans input coordinates [offset, offset + extent) (the whole input for resize).
inline std::vector<LinearTap> linear_taps(std::size_t in_size, std::size_t out_size, float offset,
                                          float extent) {
  std::vector<LinearTap> taps(out_size);
  const float scale = extent / static_cast<float>(out_size);
  for (std::size_t i = 0; i < out_size; ++i) {
    const float in = offset + (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const float in_floor = std::floor(in);
    taps[i].lower =
        static_cast<std::size_t>(std::clamp(static_cast<std::int64_t>(in_floor), std::int64_t{0},
                                            static_cast<std::int64_t>(in_size) - 1));
    taps[i].upper = static_cast<std::size_t>(std::clamp(static_cast<std::int64_t>(std::ceil(in)),
                                                        std::int64_t{0},
                                                        static_cast<std::int64_t>(in_size) - 1));
    taps[i].lerp = in - in_floor;
  }
  return taps;
}

// One row of bilinear interpolation along x: value k of output pixel x is
// from[lower[x] + k] + (from[upper[x] + k] - from[lower[x] + k]) * weight[x]. `Channels` is the
// channel count when known at compile time (so the channel loop unrolls), else 0 and `c` is.
template <std::size_t Channels>
void lerp_row(const float* from, const std::size_t* lower, const std::size_t* upper,
              const float* weight, std::size_t width, std::size_t c, float* to) {
  const std::size_t channels = Channels == 0 ? c : Channels;
  for (std::size_t x = 0; x < width; ++x, to += channels) {
    const float* a = from + lower[x];
    const float* b = from + upper[x];
    const float w = weight[x];
    for (std::size_t k = 0; k < channels; ++k)
      to[k] = a[k] + (b[k] - a[k]) * w;
  }
}

// Bilinear interpolation of the taps `ys` x `xs`, as two passes: each input row that an output row
// samples is interpolated along x once (and kept while the next output row samples it too), then
// each output row is the lerp of its two interpolated rows along y. Each value is the same float
// expressions in the same order as the per-pixel formula
//   top = tl + (tr - tl) * wx, bottom = bl + (br - bl) * wx, out = top + (bottom - top) * wy,
// so the results are the same bits. The x pass unrolls the channels for 1, 3 and 4 of them; the
// y pass is one flat loop over `width * channels` values that the compiler vectorises.
template <TensorElement T>
void resize_bilinear(const T* in, std::size_t in_w, std::size_t c, const std::vector<LinearTap>& ys,
                     const std::vector<LinearTap>& xs, float* dst) {
  const std::size_t width = xs.size(), n = width * c;
  // The columns the taps read, [first, last]; a row is converted to float over that span only.
  std::size_t first = xs.front().lower, last = xs.front().upper;
  for (const auto& tx : xs) {
    first = std::min({first, tx.lower, tx.upper});
    last = std::max({last, tx.lower, tx.upper});
  }
  const std::size_t span = (last + 1 - first) * c;
  // Per output pixel: the offsets of its two samples in the span and its weight along x.
  std::vector<std::size_t> lower(width), upper(width);
  std::vector<float> weight(width);
  for (std::size_t x = 0; x < width; ++x) {
    lower[x] = (xs[x].lower - first) * c;
    upper[x] = (xs[x].upper - first) * c;
    weight[x] = xs[x].lerp;
  }
  auto lerp = c == 1 ? &lerp_row<1> : c == 3 ? &lerp_row<3> : c == 4 ? &lerp_row<4> : &lerp_row<0>;
  constexpr bool converted = !std::is_same_v<T, float>;
  std::vector<float> scratch(2 * n + (converted ? span : 0));
  float* rows[2] = {scratch.data(), scratch.data() + n};
  float* samples = scratch.data() + 2 * n;
  std::size_t held[2] = {std::numeric_limits<std::size_t>::max(),
                         std::numeric_limits<std::size_t>::max()};
  auto interpolate = [&](std::size_t y, std::size_t slot) {
    const T* row = in + (y * in_w + first) * c;
    const float* from;
    if constexpr (converted) {
      for (std::size_t i = 0; i < span; ++i)
        samples[i] = static_cast<float>(row[i]);
      from = samples;
    } else {
      from = row;
    }
    lerp(from, lower.data(), upper.data(), weight.data(), width, c, rows[slot]);
    held[slot] = y;
  };
  for (const auto& ty : ys) {
    // The slot of the top row (ty.lower), then of the bottom one without evicting the top.
    const std::size_t top = held[0] == ty.lower   ? 0
                            : held[1] == ty.lower ? 1
                            : held[0] == ty.upper ? 1
                                                  : 0;
    if (held[top] != ty.lower) interpolate(ty.lower, top);
    const std::size_t bottom = held[top] == ty.upper ? top : 1 - top;
    if (held[bottom] != ty.upper) interpolate(ty.upper, bottom);
    const float* top_row = rows[top];
    const float* bottom_row = rows[bottom];
    const float wy = ty.lerp;
    for (std::size_t j = 0; j < n; ++j)
      dst[j] = top_row[j] + (bottom_row[j] - top_row[j]) * wy;
    dst += n;
  }
}

// One row of `width` pixels reversed; `Channels` is the channel count when known at compile time
// (so the channel loop unrolls), else 0 and `c` is.
template <class T, std::size_t Channels>
void mirror_row(const T* row, std::size_t width, std::size_t c, T* to) {
  const std::size_t channels = Channels == 0 ? c : Channels;
  for (std::size_t x = 0; x < width; ++x, to += channels) {
    const T* from = row + (width - 1 - x) * channels;
    for (std::size_t k = 0; k < channels; ++k)
      to[k] = from[k];
  }
}

// tf's nearest neighbour with half-pixel centres: floor((out + 0.5) * scale), clamped.
inline std::vector<std::size_t> nearest_taps(std::size_t in_size, std::size_t out_size,
                                             float offset, float extent) {
  std::vector<std::size_t> taps(out_size);
  const float scale = extent / static_cast<float>(out_size);
  for (std::size_t i = 0; i < out_size; ++i) {
    const auto in =
        static_cast<std::int64_t>(std::floor(offset + (static_cast<float>(i) + 0.5f) * scale));
    taps[i] = static_cast<std::size_t>(
        std::clamp(in, std::int64_t{0}, static_cast<std::int64_t>(in_size) - 1));
  }
  return taps;
}

// tf's ResizeArea: output cell [i * scale, (i + 1) * scale) averages the input cells it covers,
// each weighted by the covered length.
struct AreaTaps {
  std::vector<std::size_t> first;  // first[i]..first[i + 1]: the taps of output i
  std::vector<std::size_t> index;
  std::vector<float> weight;
};
inline AreaTaps area_taps(std::size_t in_size, std::size_t out_size, float offset, float extent) {
  AreaTaps taps;
  const float scale = extent / static_cast<float>(out_size);
  taps.first.push_back(0);
  for (std::size_t i = 0; i < out_size; ++i) {
    const float in0 = offset + static_cast<float>(i) * scale;
    const float in1 = offset + static_cast<float>(i + 1) * scale;
    const auto start = static_cast<std::int64_t>(std::floor(in0));
    const auto end = static_cast<std::int64_t>(std::ceil(in1));
    for (std::int64_t k = start; k < end; ++k) {
      const float kf = static_cast<float>(k);
      float w;
      if (kf < in0) {
        w = kf + 1 > in1 ? scale : kf + 1 - in0;
      } else {
        w = kf + 1 > in1 ? in1 - kf : 1.0f;
      }
      taps.index.push_back(static_cast<std::size_t>(
          std::clamp(k, std::int64_t{0}, static_cast<std::int64_t>(in_size) - 1)));
      taps.weight.push_back(w);
    }
    taps.first.push_back(taps.index.size());
  }
  return taps;
}

// tf's ResizeBicubic with half-pixel centres (resize_bicubic_op.cc): Keys' cubic convolution
// (a = -0.5) at the four inputs around in = (out + 0.5) * scale - 0.5, its weights looked up in a
// table of 1025 entries (the fraction rounded to 1/1024), taps outside the input given weight 0
// and the four renormalised to sum to 1.
struct CubicTap {
  std::size_t index[4];
  float weight[4];
};
inline const std::vector<float>& keys_cubic_table() {
  static const std::vector<float> table = [] {
    constexpr double a = -0.5;
    std::vector<float> t(2 * 1025);
    for (std::size_t i = 0; i <= 1024; ++i) {
      float x = static_cast<float>(static_cast<double>(i) / 1024.0);
      t[2 * i] = static_cast<float>(((a + 2) * x - (a + 3)) * x * x + 1);
      x += 1.0f;
      t[2 * i + 1] = static_cast<float>(((a * x - 5 * a) * x + 8 * a) * x - 4 * a);
    }
    return t;
  }();
  return table;
}
inline std::vector<CubicTap> cubic_taps(std::size_t in_size, std::size_t out_size, float offset,
                                        float extent) {
  const auto& table = keys_cubic_table();
  std::vector<CubicTap> taps(out_size);
  const float scale = extent / static_cast<float>(out_size);
  const auto last = static_cast<std::int64_t>(in_size) - 1;
  for (std::size_t i = 0; i < out_size; ++i) {
    const float in = offset + (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    const auto loc = static_cast<std::int64_t>(std::floor(in));
    const float delta = in - static_cast<float>(loc);
    const auto at = static_cast<std::size_t>(std::lrint(delta * 1024.0f));
    const float w[4] = {table[2 * at + 1], table[2 * at], table[2 * (1024 - at)],
                        table[2 * (1024 - at) + 1]};
    float sum = 0.0f;
    for (std::size_t k = 0; k < 4; ++k) {
      const std::int64_t index = loc - 1 + static_cast<std::int64_t>(k);
      taps[i].index[k] = static_cast<std::size_t>(std::clamp(index, std::int64_t{0}, last));
      taps[i].weight[k] = index >= 0 && index <= last ? w[k] : 0.0f;
      sum += taps[i].weight[k];
    }
    if (std::abs(sum) >= 1000.0f * std::numeric_limits<float>::min()) {
      for (float& weight : taps[i].weight)
        weight *= 1.0f / sum;
    }
  }
  return taps;
}

}  // namespace detail

/// Resizes an image to `(height, width)` as `tf.image.resize(image, size, method,
/// antialias=False)`: pixel centres at half-integers, float32 output for every method (tf keeps
/// the input dtype for nearest; here the values are the same). Throws `ShapeError` for an image
/// that is not a non-empty rank-3 tensor or a target size of 0.
/// \code
/// Tensor<float> small = image::resize(decoded, 224, 224, image::ResizeMethod::bilinear);
/// \endcode
template <TensorElement T>
Tensor<float> resize(const Tensor<T>& image, std::size_t height, std::size_t width,
                     ResizeMethod method = ResizeMethod::bilinear) {
  detail::check_image(image, "resize");
  return resize_box(image, 0.0f, 0.0f, static_cast<float>(image.dim(0)),
                    static_cast<float>(image.dim(1)), height, width, method);
}

/// `resize` of the box `[top, top + box_height) x [left, left + box_width)` of the image, in
/// (fractional) pixel coordinates: the output spans the box with tf's half-pixel centres, and
/// samples outside the image are clamped to its edge.
template <TensorElement T>
Tensor<float> resize_box(const Tensor<T>& image, float top, float left, float box_height,
                         float box_width, std::size_t height, std::size_t width,
                         ResizeMethod method = ResizeMethod::bilinear) {
  detail::check_image(image, "resize");
  if (height == 0 || width == 0) {
    throw ShapeError("resize: the target size must be positive but is " + std::to_string(height) +
                     "x" + std::to_string(width));
  }
  const std::size_t in_h = image.dim(0), in_w = image.dim(1), c = image.dim(2);
  auto out = Tensor<float>::uninitialized(Shape{height, width, c});
  const T* in = image.begin();
  float* dst = out.begin();
  auto at = [&](std::size_t y, std::size_t x, std::size_t k) {
    return static_cast<float>(in[(y * in_w + x) * c + k]);
  };
  if (method == ResizeMethod::bilinear) {
    detail::resize_bilinear(in, in_w, c, detail::linear_taps(in_h, height, top, box_height),
                            detail::linear_taps(in_w, width, left, box_width), dst);
  } else if (method == ResizeMethod::nearest) {
    const auto ys = detail::nearest_taps(in_h, height, top, box_height);
    const auto xs = detail::nearest_taps(in_w, width, left, box_width);
    for (std::size_t y = 0; y < height; ++y)
      for (std::size_t x = 0; x < width; ++x)
        for (std::size_t k = 0; k < c; ++k)
          *dst++ = at(ys[y], xs[x], k);
  } else if (method == ResizeMethod::bicubic) {
    // Along x for the four rows, then along y, as tf does.
    const auto ys = detail::cubic_taps(in_h, height, top, box_height);
    const auto xs = detail::cubic_taps(in_w, width, left, box_width);
    for (std::size_t y = 0; y < height; ++y) {
      const auto& ty = ys[y];
      for (std::size_t x = 0; x < width; ++x) {
        const auto& tx = xs[x];
        for (std::size_t k = 0; k < c; ++k) {
          float rows[4];
          for (std::size_t r = 0; r < 4; ++r) {
            rows[r] = at(ty.index[r], tx.index[0], k) * tx.weight[0] +
                      at(ty.index[r], tx.index[1], k) * tx.weight[1] +
                      at(ty.index[r], tx.index[2], k) * tx.weight[2] +
                      at(ty.index[r], tx.index[3], k) * tx.weight[3];
          }
          *dst++ = rows[0] * ty.weight[0] + rows[1] * ty.weight[1] + rows[2] * ty.weight[2] +
                   rows[3] * ty.weight[3];
        }
      }
    }
  } else {
    const auto ys = detail::area_taps(in_h, height, top, box_height);
    const auto xs = detail::area_taps(in_w, width, left, box_width);
    const float scale = 1.0f / ((box_height / static_cast<float>(height)) *
                                (box_width / static_cast<float>(width)));
    std::vector<float> sum(c);
    for (std::size_t y = 0; y < height; ++y) {
      for (std::size_t x = 0; x < width; ++x) {
        std::fill(sum.begin(), sum.end(), 0.0f);
        for (std::size_t i = ys.first[y]; i < ys.first[y + 1]; ++i) {
          for (std::size_t j = xs.first[x]; j < xs.first[x + 1]; ++j) {
            const float w = ys.weight[i] * xs.weight[j];
            for (std::size_t k = 0; k < c; ++k)
              sum[k] += w * at(ys.index[i], xs.index[j], k);
          }
        }
        for (std::size_t k = 0; k < c; ++k)
          *dst++ = sum[k] * scale;
      }
    }
  }
  return out;
}

/// The window `[top, top + height) x [left, left + width)` of an image (a copy), as
/// `tf.image.crop_to_bounding_box`; throws `ShapeError` when it is not inside the image.
template <TensorElement T>
Tensor<T> crop_to_bounding_box(const Tensor<T>& image, std::size_t top, std::size_t left,
                               std::size_t height, std::size_t width) {
  detail::check_image(image, "crop_to_bounding_box");
  const std::size_t in_h = image.dim(0), in_w = image.dim(1), c = image.dim(2);
  if (height == 0 || width == 0 || top + height > in_h || left + width > in_w) {
    throw ShapeError("crop_to_bounding_box: window of " + std::to_string(height) + "x" +
                     std::to_string(width) + " at (" + std::to_string(top) + ", " +
                     std::to_string(left) + ") is empty or outside the " + std::to_string(in_h) +
                     "x" + std::to_string(in_w) + " image");
  }
  auto out = Tensor<T>::uninitialized(Shape{height, width, c});
  const T* in = image.begin();
  T* dst = out.begin();
  for (std::size_t y = 0; y < height; ++y)
    std::copy_n(in + ((top + y) * in_w + left) * c, width * c, dst + y * width * c);
  return out;
}

/// The image cropped at the centre to the aspect ratio of `(height, width)`, then resized to it,
/// as Keras's `smart_resize` (`crop_to_aspect_ratio=True` of its dataset utilities): the crop keeps
/// `int(float32(width * height) / width_target)` rows (or columns), starting at
/// `int(float32(excess) / 2)`.
template <TensorElement T>
Tensor<float> smart_resize(const Tensor<T>& image, std::size_t height, std::size_t width,
                           ResizeMethod method = ResizeMethod::bilinear) {
  detail::check_image(image, "smart_resize");
  if (height == 0 || width == 0) {
    throw ShapeError("smart_resize: the target size must be positive but is " +
                     std::to_string(height) + "x" + std::to_string(width));
  }
  const std::size_t in_h = image.dim(0), in_w = image.dim(1);
  auto crop_h =
      static_cast<std::size_t>(static_cast<float>(in_w * height) / static_cast<float>(width));
  auto crop_w =
      static_cast<std::size_t>(static_cast<float>(in_h * width) / static_cast<float>(height));
  crop_h = std::clamp<std::size_t>(crop_h, 1, in_h);
  crop_w = std::clamp<std::size_t>(crop_w, 1, in_w);
  const auto top = static_cast<std::size_t>(static_cast<float>(in_h - crop_h) / 2);
  const auto left = static_cast<std::size_t>(static_cast<float>(in_w - crop_w) / 2);
  return resize(crop_to_bounding_box(image, top, left, crop_h, crop_w), height, width, method);
}

/// The image resized to fit `(height, width)` with its aspect ratio kept and padded with zeros,
/// as `tf.image.resize_with_pad` (`pad_to_aspect_ratio=True` of Keras's utilities): the resized
/// size is `floor(size / ratio)` with `ratio = max(in_w / width, in_h / height)`, placed at
/// `floor((target - size / ratio) / 2)`.
template <TensorElement T>
Tensor<float> resize_with_pad(const Tensor<T>& image, std::size_t height, std::size_t width,
                              ResizeMethod method = ResizeMethod::bilinear) {
  detail::check_image(image, "resize_with_pad");
  if (height == 0 || width == 0) {
    throw ShapeError("resize_with_pad: the target size must be positive but is " +
                     std::to_string(height) + "x" + std::to_string(width));
  }
  const auto in_h = static_cast<float>(image.dim(0)), in_w = static_cast<float>(image.dim(1));
  const auto out_h = static_cast<float>(height), out_w = static_cast<float>(width);
  const float ratio = std::max(in_w / out_w, in_h / out_h);
  const float resized_h = in_h / ratio, resized_w = in_w / ratio;
  const auto new_h =
      std::clamp<std::size_t>(static_cast<std::size_t>(std::floor(resized_h)), 1, height);
  const auto new_w =
      std::clamp<std::size_t>(static_cast<std::size_t>(std::floor(resized_w)), 1, width);
  const auto top = static_cast<std::size_t>(std::max(0.0f, std::floor((out_h - resized_h) / 2)));
  const auto left = static_cast<std::size_t>(std::max(0.0f, std::floor((out_w - resized_w) / 2)));
  const auto resized = resize(image, new_h, new_w, method);
  const std::size_t c = image.dim(2);
  Tensor<float> out(Shape{height, width, c});
  for (std::size_t y = 0; y < new_h && top + y < height; ++y) {
    std::copy_n(resized.begin() + y * new_w * c, std::min(new_w, width - left) * c,
                out.begin() + ((top + y) * width + left) * c);
  }
  return out;
}

/// The central `fraction` of each side, as `tf.image.central_crop`: the window starts at
/// `int((size - size * fraction) / 2)` and keeps `size - 2 * start`. Throws `ConfigError` for a
/// fraction outside `(0, 1]`.
template <TensorElement T>
Tensor<T> central_crop(const Tensor<T>& image, double fraction) {
  detail::check_image(image, "central_crop");
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    throw ConfigError("central_crop: central_fraction must be in (0, 1] but is " +
                      std::to_string(fraction));
  }
  if (fraction == 1.0) return image;
  const auto h = static_cast<double>(image.dim(0)), w = static_cast<double>(image.dim(1));
  const auto top = static_cast<std::size_t>((h - h * fraction) / 2);
  const auto left = static_cast<std::size_t>((w - w * fraction) / 2);
  return crop_to_bounding_box(image, top, left, image.dim(0) - 2 * top, image.dim(1) - 2 * left);
}

/// A `height` x `width` window at a uniformly drawn offset, as `tf.image.random_crop` with size
/// `(height, width, channels)`; throws `ShapeError` when the window is larger than the image.
template <TensorElement T>
Tensor<T> random_crop(const Tensor<T>& image, std::size_t height, std::size_t width,
                      std::uint64_t seed) {
  detail::check_image(image, "random_crop");
  if (height == 0 || width == 0 || height > image.dim(0) || width > image.dim(1)) {
    throw ShapeError("random_crop: size " + std::to_string(height) + "x" + std::to_string(width) +
                     " is empty or larger than the image's " + std::to_string(image.dim(0)) + "x" +
                     std::to_string(image.dim(1)));
  }
  SplitMix64 rng(seed);
  const auto top = static_cast<std::size_t>(rng.below(image.dim(0) - height + 1));
  const auto left = static_cast<std::size_t>(rng.below(image.dim(1) - width + 1));
  return crop_to_bounding_box(image, top, left, height, width);
}

/// The image mirrored left to right (`tf.image.flip_left_right`).
template <TensorElement T>
Tensor<T> flip_left_right(const Tensor<T>& image) {
  detail::check_image(image, "flip_left_right");
  const std::size_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  auto out = Tensor<T>::uninitialized(image.shape());
  const T* in = image.begin();
  T* dst = out.begin();
  auto mirror = c == 1   ? &detail::mirror_row<T, 1>
                : c == 3 ? &detail::mirror_row<T, 3>
                : c == 4 ? &detail::mirror_row<T, 4>
                         : &detail::mirror_row<T, 0>;
  for (std::size_t y = 0; y < h; ++y)
    mirror(in + y * w * c, w, c, dst + y * w * c);
  return out;
}

/// The image mirrored top to bottom (`tf.image.flip_up_down`).
template <TensorElement T>
Tensor<T> flip_up_down(const Tensor<T>& image) {
  detail::check_image(image, "flip_up_down");
  const std::size_t h = image.dim(0), row = image.dim(1) * image.dim(2);
  auto out = Tensor<T>::uninitialized(image.shape());
  const T* in = image.begin();
  T* dst = out.begin();
  for (std::size_t y = 0; y < h; ++y)
    std::copy_n(in + y * row, row, dst + (h - 1 - y) * row);
  return out;
}

/// `flip_left_right` with probability 1/2 (`tf.image.random_flip_left_right`); otherwise the
/// image itself (shared, not copied).
template <TensorElement T>
Tensor<T> random_flip_left_right(const Tensor<T>& image, std::uint64_t seed) {
  return SplitMix64(seed).uniform() < 0.5 ? flip_left_right(image) : image;
}

/// `flip_up_down` with probability 1/2 (`tf.image.random_flip_up_down`).
template <TensorElement T>
Tensor<T> random_flip_up_down(const Tensor<T>& image, std::uint64_t seed) {
  return SplitMix64(seed).uniform() < 0.5 ? flip_up_down(image) : image;
}

/// `image + delta` (`tf.image.adjust_brightness` on a float image).
inline Tensor<float> adjust_brightness(const Tensor<float>& image, float delta) {
  auto out = Tensor<float>::uninitialized(image.shape());
  std::transform(image.begin(), image.end(), out.begin(), [=](float v) { return v + delta; });
  return out;
}

/// `(x - mean) * factor + mean` with the mean of each channel over the image's pixels
/// (`tf.image.adjust_contrast` on a float image).
inline Tensor<float> adjust_contrast(const Tensor<float>& image, float factor) {
  detail::check_image(image, "adjust_contrast");
  const std::size_t pixels = image.dim(0) * image.dim(1), c = image.dim(2);
  std::vector<double> mean(c, 0.0);
  const float* in = image.begin();
  for (std::size_t p = 0; p < pixels; ++p)
    for (std::size_t k = 0; k < c; ++k)
      mean[k] += in[p * c + k];
  for (auto& m : mean)
    m /= static_cast<double>(pixels);
  auto out = Tensor<float>::uninitialized(image.shape());
  float* dst = out.begin();
  for (std::size_t p = 0; p < pixels; ++p) {
    for (std::size_t k = 0; k < c; ++k) {
      const auto m = static_cast<float>(mean[k]);
      dst[p * c + k] = (in[p * c + k] - m) * factor + m;
    }
  }
  return out;
}

/// `adjust_brightness` by a delta drawn uniformly from `[-max_delta, max_delta)`
/// (`tf.image.random_brightness`); throws `ConfigError` for a negative `max_delta`.
inline Tensor<float> random_brightness(const Tensor<float>& image, float max_delta,
                                       std::uint64_t seed) {
  if (!(max_delta >= 0)) {
    throw ConfigError("random_brightness: max_delta must be non-negative but is " +
                      std::to_string(max_delta));
  }
  const double u = SplitMix64(seed).uniform();
  return adjust_brightness(image, static_cast<float>((2 * u - 1) * max_delta));
}

/// `adjust_contrast` by a factor drawn uniformly from `[lower, upper)`
/// (`tf.image.random_contrast`); throws `ConfigError` unless `0 <= lower < upper`.
inline Tensor<float> random_contrast(const Tensor<float>& image, float lower, float upper,
                                     std::uint64_t seed) {
  if (!(lower >= 0 && lower < upper)) {
    throw ConfigError("random_contrast: expected 0 <= lower < upper but lower is " +
                      std::to_string(lower) + " and upper " + std::to_string(upper));
  }
  const double u = SplitMix64(seed).uniform();
  return adjust_contrast(image, static_cast<float>(lower + u * (upper - lower)));
}

/// The scale and aspect-ratio ranges of `random_resized_crop` (torchvision's defaults).
struct RandomResizedCropOptions {
  /// The range of the crop's area as a fraction of the image's.
  std::array<double, 2> scale = {0.08, 1.0};
  /// The range of the crop's width / height.
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  /// The interpolation of the resize.
  ResizeMethod method = ResizeMethod::bilinear;
};

/// A window `[top, top + height) x [left, left + width)` of an image.
struct CropWindow {
  std::size_t top = 0, left = 0, height = 0, width = 0;
  friend bool operator==(const CropWindow&, const CropWindow&) = default;
};

/// The window torchvision's `RandomResizedCrop.get_params` chooses for an image of
/// `height` x `width`: up to 10 draws of an area fraction uniform in `scale` and an aspect ratio
/// log-uniform in `ratio`, the first that fits, at a uniform offset; otherwise the central crop
/// clamped to the ratio range. Throws `ConfigError` for empty or inverted ranges.
inline CropWindow random_resized_crop_window(std::size_t height, std::size_t width,
                                             std::uint64_t seed,
                                             const RandomResizedCropOptions& options = {}) {
  const auto& [s0, s1] = options.scale;
  const auto& [r0, r1] = options.ratio;
  if (!(s0 > 0 && s0 <= s1) || !(r0 > 0 && r0 <= r1)) {
    throw ConfigError(
        "random_resized_crop: scale and ratio must be positive ranges (lower <= "
        "upper) but are [" +
        std::to_string(s0) + ", " + std::to_string(s1) + "] and [" + std::to_string(r0) + ", " +
        std::to_string(r1) + "]");
  }
  SplitMix64 rng(seed);
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_r0 = std::log(r0), log_r1 = std::log(r1);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (s0 + (s1 - s0) * rng.uniform());
    const double aspect = std::exp(log_r0 + (log_r1 - log_r0) * rng.uniform());
    const auto w = static_cast<std::int64_t>(std::round(std::sqrt(target * aspect)));
    const auto h = static_cast<std::int64_t>(std::round(std::sqrt(target / aspect)));
    if (w > 0 && h > 0 && static_cast<std::size_t>(w) <= width &&
        static_cast<std::size_t>(h) <= height) {
      CropWindow window{0, 0, static_cast<std::size_t>(h), static_cast<std::size_t>(w)};
      window.top = static_cast<std::size_t>(rng.below(height - window.height + 1));
      window.left = static_cast<std::size_t>(rng.below(width - window.width + 1));
      return window;
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::size_t w = width, h = height;
  if (in_ratio < r0) {
    h = static_cast<std::size_t>(std::round(static_cast<double>(w) / r0));
  } else if (in_ratio > r1) {
    w = static_cast<std::size_t>(std::round(static_cast<double>(h) * r1));
  }
  h = std::clamp<std::size_t>(h, 1, height);
  w = std::clamp<std::size_t>(w, 1, width);
  return {(height - h) / 2, (width - w) / 2, h, w};
}

/// torchvision's `RandomResizedCrop(size=(height, width))` on a decoded image: the window of
/// `random_resized_crop_window`, resized (tf's `resize`, without antialiasing). For JPEG bytes,
/// `decode_random_resized_crop` (`<loadstar/data/image/crop_decode.hpp>`) decodes only the window,
/// at a reduced scale where it can.
template <TensorElement T>
Tensor<float> random_resized_crop(const Tensor<T>& image, std::size_t height, std::size_t width,
                                  std::uint64_t seed,
                                  const RandomResizedCropOptions& options = {}) {
  detail::check_image(image, "random_resized_crop");
  const auto window = random_resized_crop_window(image.dim(0), image.dim(1), seed, options);
  return resize(crop_to_bounding_box(image, window.top, window.left, window.height, window.width),
                height, width, options.method);
}

}  // namespace loadstar::image
