/// \file
/// What each thread of the CUDA backend's kernels computes, as `__host__ __device__` functions
/// (plain functions under a host compiler): the element-wise math, the index arithmetic of the
/// convolution and pooling kernels and the fixed-order column reductions. They follow the CPU
/// backend (keras/backend/cpu_backend.hpp) operation for operation, so that host tests run every
/// kernel's per-thread work over all threads and compare with it without a GPU; the kernels
/// (kernels.cuh) only map threads to these calls. The per-element formulas that both backends
/// compute (keras/detail/activation_formulas.hpp, layer_formulas.hpp and
/// keras/losses/detail/row_formulas.hpp) and the kinds and geometry structs
/// (keras/backend/kinds.hpp) are the CPU backend's own, included here; so is step_math.hpp, the
/// per-thread work of the optimizer step, the row losses and the mean metrics. This header
/// includes no CUDA header and nothing else of the executor.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loadstar/config.hpp"
#include "loadstar/cuda/detail/step_math.hpp"
#include "loadstar/keras/backend/kinds.hpp"
#include "loadstar/keras/detail/activation_formulas.hpp"
#include "loadstar/keras/detail/attention_rows.hpp"
#include "loadstar/keras/detail/layer_formulas.hpp"
#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/detail/layer_norm_formulas.hpp"
#include "loadstar/keras/detail/recurrent_kernels.hpp"
#include "loadstar/keras/losses/detail/row_formulas.hpp"

namespace loadstar::cuda::detail {

/// An axis permutation: the output's dimensions and, for each output axis, the stride of the
/// input axis it reads.
struct PermuteDims {
  static constexpr std::size_t max_rank = 8;
  std::size_t rank = 0;
  std::size_t out_dims[max_rank] = {};
  std::size_t in_strides[max_rank] = {};
};

// The kinds and geometry the kernels take are the executor's types (step_math.hpp names the
// optimizer, loss and metric kinds).
using keras::Activation;
using keras::Conv2DGeometry;
using keras::Pool2DGeometry;

// The per-element formulas are the CPU backend's, one element (or one line) at a time.
using keras::detail::activate;
using keras::detail::activation_gradient;
using keras::detail::AttentionCall;
using keras::detail::AttentionShape;
using keras::detail::batch_norm_dy_xhat;
using keras::detail::batch_norm_gradient;
using keras::detail::batch_norm_inverse_std;
using keras::detail::batch_norm_value;
using keras::detail::column_sum_value;
using keras::detail::dropout_keeps;
using keras::detail::dropout_value;
using keras::detail::index_in_range;
using keras::detail::LayerKernel;
using keras::detail::LayerTensors;
using keras::detail::max_of;
using keras::detail::moving_average_value;
using keras::detail::RecurrentKernel;
using keras::detail::RecurrentTensors;
using keras::detail::relu_gradient;
using keras::detail::relu_passes;
using keras::detail::relu_value;
using keras::detail::softmax_backward_line;
using keras::detail::softmax_forward_line;
using keras::detail::squared_deviation;

// --- Column reductions: fixed chunks of rows, partial sums in double, added in a fixed order
// --------

/// The rows each chunk of a column reduction sums: all of them up to 512 (one chunk: the CPU
/// backend's sequential double sum, bit for bit); beyond, 64, so that a narrow matrix (a
/// convolution's bias gradient: many rows, few columns) still gives the device enough threads to
/// keep its memory busy, or more where a grid's y dimension (65535) needs fewer chunks. A
/// function of the row count alone, so that the order of additions (and the result, bit for bit)
/// never depends on the device or the launch.
LOADSTAR_HOST_DEVICE inline std::size_t reduction_chunk_rows(std::size_t rows) noexcept {
  if (rows <= 512) return 512;
  const std::size_t by_grid = (rows + 65534) / 65535;
  return by_grid > 64 ? by_grid : 64;
}

LOADSTAR_HOST_DEVICE inline std::size_t reduction_chunks(std::size_t rows) noexcept {
  const std::size_t chunk = reduction_chunk_rows(rows);
  return rows == 0 ? 1 : (rows + chunk - 1) / chunk;
}

/// The doubles of device scratch the column reductions (`column_sums`, `moments`,
/// `batch_norm_backward`) need for `rows x columns`: the per-chunk partial sums and two sums per
/// column.
LOADSTAR_HOST_DEVICE inline std::size_t reduction_scratch(std::size_t rows,
                                                          std::size_t columns) noexcept {
  return reduction_chunks(rows) * columns + 2 * columns;
}

/// The sum of `value(r, j)` over the rows of chunk `chunk`, in row order.
template <class Value>
LOADSTAR_HOST_DEVICE double column_partial(const Value& value, std::size_t rows, std::size_t chunk,
                                           std::size_t j) noexcept {
  const std::size_t chunk_rows = reduction_chunk_rows(rows);
  const std::size_t r0 = chunk * chunk_rows;
  const std::size_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  double sum = 0.0;
  for (std::size_t r = r0; r < r1; ++r)
    sum += value(r, j);
  return sum;
}

/// The lanes that add a column's partial sums (the threads of one block of
/// `column_tree_finish_kernel`).
inline constexpr unsigned reduction_lanes = 256;

/// Lane `lane`'s share of column `j`'s partial sums (`partials[chunk * columns + j]`): chunks
/// `lane`, `lane + reduction_lanes`, ..., added in that order.
LOADSTAR_HOST_DEVICE inline double column_lane_sum(const double* partials, std::size_t chunks,
                                                   std::size_t columns, std::size_t j,
                                                   std::size_t lane) noexcept {
  double sum = 0.0;
  for (std::size_t c = lane; c < chunks; c += reduction_lanes)
    sum += partials[c * columns + j];
  return sum;
}

/// Column `j`'s total: one chunk's partial sum as it is; several chunks' added by lane
/// (`column_lane_sum`), then the lanes pairwise in a fixed tree (lane `t` takes lane
/// `t + 128`, then `t + 64`, ..., `t + 1`), as `column_tree_finish_kernel`'s threads add them.
LOADSTAR_HOST_DEVICE inline double column_total(const double* partials, std::size_t chunks,
                                                std::size_t columns, std::size_t j) noexcept {
  if (chunks == 1) return partials[j];
  double lanes[reduction_lanes];
  for (std::size_t t = 0; t < reduction_lanes; ++t)
    lanes[t] = column_lane_sum(partials, chunks, columns, j, t);
  for (std::size_t stride = reduction_lanes / 2; stride > 0; stride /= 2)
    for (std::size_t t = 0; t < stride; ++t)
      lanes[t] += lanes[t + stride];
  return lanes[0];
}

/// `x[r, j]` of a `(rows, columns)` matrix.
struct ElementValue {
  const float* x;
  std::size_t columns;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    return x[r * columns + j];
  }
};

/// `(x[r, j] - mean[j])^2`, in double.
struct SquaredDeviation {
  const float* x;
  const double* mean;
  std::size_t columns;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    return squared_deviation(x[r * columns + j], mean[j]);
  }
};

/// `dy * (x - mean) * inv`: what `batch_norm_backward` sums for `dgamma`.
struct DyXhat {
  const float* x;
  const float* mean;
  const float* variance;
  const float* dy;
  float epsilon;
  std::size_t columns;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    const double inv = batch_norm_inverse_std(variance[j], epsilon);
    return batch_norm_dy_xhat(x[r * columns + j], mean[j], dy[r * columns + j], inv);
  }
};

/// `dy * xhat` of `LayerNormalization`'s line `r` (its mean and inverse at `stats[2 r]` and
/// `stats[2 r + 1]`): what `layer_norm_backward` sums for `dgamma`.
struct LayerNormDyXhat {
  const float* x;
  const float* dy;
  const double* stats;
  std::size_t columns;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    const keras::detail::LayerNormLine s{stats[2 * r], stats[2 * r + 1]};
    return keras::detail::layer_norm_dy_xhat(x[r * columns + j], dy[r * columns + j], s);
  }
};

/// Line `line` of `LayerNormalization`'s backward pass: its statistics into `stats` and, when
/// `dx` is not null, its input gradient.
LOADSTAR_HOST_DEVICE inline void layer_norm_backward_line(const float* x, const float* gamma,
                                                          float epsilon, const float* dy, float* dx,
                                                          double* stats, std::size_t width,
                                                          std::size_t line) noexcept {
  const float* in = x + line * width;
  const float* d = dy + line * width;
  const keras::detail::LayerNormLine s = keras::detail::layer_norm_line(in, width, epsilon);
  stats[2 * line] = s.mean;
  stats[2 * line + 1] = s.inverse;
  if (dx == nullptr) return;
  const keras::detail::LayerNormSums sums = keras::detail::layer_norm_sums(in, d, gamma, width, s);
  for (std::size_t p = 0; p < width; ++p)
    dx[line * width + p] =
        keras::detail::layer_norm_gradient(in[p], d[p], gamma, p, width, s, sums);
}

/// Line `line` of `LayerNormalization`'s output.
LOADSTAR_HOST_DEVICE inline void layer_norm_forward_line(const float* x, const float* gamma,
                                                         const float* beta, float epsilon, float* y,
                                                         std::size_t width,
                                                         std::size_t line) noexcept {
  const float* in = x + line * width;
  const keras::detail::LayerNormLine s = keras::detail::layer_norm_line(in, width, epsilon);
  for (std::size_t p = 0; p < width; ++p)
    y[line * width + p] = keras::detail::layer_norm_value(in[p], s, gamma, beta, p);
}

/// The doubles of device scratch `layer_norm_backward` needs: a column reduction's over the
/// lines, then two statistics per line.
LOADSTAR_HOST_DEVICE inline std::size_t layer_norm_scratch(std::size_t lines,
                                                           std::size_t width) noexcept {
  return reduction_scratch(lines, width) + 2 * lines;
}

// --- Index arithmetic ---------------------------------------------------------------------------

/// Division by a divisor fixed for a launch, for the index arithmetic of the convolution and
/// pooling kernels; `value` is the divisor. This primary template (64-bit indices, for tensors of
/// 2^31 elements or more) divides as C++ does. A size of zero is held too (a kernel over an empty
/// tensor has no element, so nothing divides by it).
template <class Index>
struct Divisor {
  Index value = 1;
  Divisor() = default;
  explicit Divisor(Index d) noexcept : value(d) {}
  LOADSTAR_HOST_DEVICE Index quotient(Index n) const noexcept { return n / value; }
};

/// Division of 32-bit indices below 2^31 by a multiplication and a shift (Granlund and
/// Montgomery, "Division by invariant integers using multiplication", 1994): with `shift` the
/// smallest power of two not below `d` and `magic = floor(2^32 (2^shift - d) / d) + 1`,
/// `n / d = (umulhi(n, magic) + n) >> shift` for every `n < 2^31` and `1 <= d <= 2^31`. A GPU
/// divides a 32-bit integer in about 20 instructions and a 64-bit one in a subroutine; this takes
/// three.
template <>
struct Divisor<std::uint32_t> {
  std::uint32_t value = 1, magic = 1, shift = 0;
  Divisor() = default;
  explicit Divisor(std::uint32_t d) noexcept : value(d) {
    if (d == 0) return;  // an empty tensor's size: its kernels compute nothing, divide nothing
    while (shift < 31 && (std::uint32_t{1} << shift) < d)
      ++shift;
    const std::uint64_t one = 1;
    magic = static_cast<std::uint32_t>(((one << 32U) * ((one << shift) - d)) / d + 1);
  }
  LOADSTAR_HOST_DEVICE std::uint32_t quotient(std::uint32_t n) const noexcept {
#if defined(__CUDA_ARCH__)
    const std::uint32_t high = __umulhi(n, magic);
#else
    const auto high = static_cast<std::uint32_t>((std::uint64_t{n} * magic) >> 32U);
#endif
    return (high + n) >> shift;
  }
};

/// Whether indices up to each of `largest` take the 32-bit arithmetic (`Divisor<std::uint32_t>`).
template <class... Sizes>
constexpr bool fits_32bit_index(Sizes... largest) noexcept {
  return ((static_cast<std::size_t>(largest) < (std::size_t{1} << 31U)) && ...);
}

/// `f(IndexOf<std::uint32_t>(g))` where every index fits 32 bits, else
/// `f(IndexOf<std::size_t>(g))`: the kernels are launched, and emulated, through this choice.
template <template <class> class IndexOf, class Dims, class F>
decltype(auto) with_index(bool fits_32bit, const Dims& g, F&& f) {
  if (fits_32bit) return f(IndexOf<std::uint32_t>(g));
  return f(IndexOf<std::size_t>(g));
}

/// Element `i`'s image, row, column and channel in a row-major (batch, height, width, channels)
/// tensor, from the divisors by its channels, width and height.
template <class Index>
struct Nhwc {
  Index b, h, w, c;
};

template <class Index>
LOADSTAR_HOST_DEVICE inline Nhwc<Index> nhwc_of(Index i, const Divisor<Index>& channels,
                                                const Divisor<Index>& width,
                                                const Divisor<Index>& height) noexcept {
  const Index pixel = channels.quotient(i);       // (b * height + h) * width + w
  const Index image_row = width.quotient(pixel);  // b * height + h
  const Index b = height.quotient(image_row);
  return {b, image_row - b * height.value, pixel - image_row * width.value,
          i - pixel * channels.value};
}

/// A convolution's geometry as its kernels index it: each size that an index is divided by as a
/// `Divisor` (its `value` the size), the others as `Index`.
template <class Index>
struct ConvIndex {
  using index_type = Index;
  Divisor<Index> in_h, in_w, in_c, out_h, out_w, kernel_w, stride_h, stride_w;
  Divisor<Index> patch;  // kernel_h * kernel_w * in_c: a row of the columns
  Index kernel_h = 1, dilation_h = 1, dilation_w = 1, pad_top = 0, pad_left = 0;

  explicit ConvIndex(const Conv2DGeometry& g) noexcept
      : in_h(Index(g.in_h)),
        in_w(Index(g.in_w)),
        in_c(Index(g.in_c)),
        out_h(Index(g.out_h)),
        out_w(Index(g.out_w)),
        kernel_w(Index(g.kernel_w)),
        stride_h(Index(g.stride_h)),
        stride_w(Index(g.stride_w)),
        patch(Index(g.kernel_h * g.kernel_w * g.in_c)),
        kernel_h(Index(g.kernel_h)),
        dilation_h(Index(g.dilation_h)),
        dilation_w(Index(g.dilation_w)),
        pad_top(Index(g.pad_top)),
        pad_left(Index(g.pad_left)) {}
};

/// Whether every index of the convolution's kernels (its input, its columns and the positions
/// they reach) stays below 2^31.
inline bool conv_fits_32bit(const Conv2DGeometry& g) noexcept {
  return fits_32bit_index(g.batch * g.in_h * g.in_w * g.in_c,
                          g.batch * g.out_h * g.out_w * g.kernel_h * g.kernel_w * g.in_c,
                          g.out_h * g.stride_h + g.kernel_h * g.dilation_h + g.in_h + g.pad_top,
                          g.out_w * g.stride_w + g.kernel_w * g.dilation_w + g.in_w + g.pad_left);
}

/// `with_index` for a convolution's kernels.
template <class F>
decltype(auto) with_conv_index(const Conv2DGeometry& g, F&& f) {
  return with_index<ConvIndex>(conv_fits_32bit(g), g, static_cast<F&&>(f));
}

// --- Convolution unfolding -----------------------------------------------------------------------

/// Element `k = (kh * kernel_w + kw) * in_c + c` of a row of im2col's columns.
template <class Index>
struct PatchOffset {
  Index kh, kw, c;
};

template <class Index>
LOADSTAR_HOST_DEVICE inline PatchOffset<Index> patch_offset(const ConvIndex<Index>& g,
                                                            Index k) noexcept {
  const Index kernel_pos = g.in_c.quotient(k);  // kh * kernel_w + kw
  const Index kh = g.kernel_w.quotient(kernel_pos);
  return {kh, kernel_pos - kh * g.kernel_w.value, k - kernel_pos * g.in_c.value};
}

/// The input element that output position `(b, oh, ow)` sees at patch offset `at`, or 0 in the
/// padding.
template <class Index>
LOADSTAR_HOST_DEVICE inline float unfolded_input(const float* x, const ConvIndex<Index>& g, Index b,
                                                 Index oh, Index ow,
                                                 const PatchOffset<Index>& at) noexcept {
  // The input position plus the padding, so that it stays unsigned.
  const Index h = oh * g.stride_h.value + at.kh * g.dilation_h;
  const Index w = ow * g.stride_w.value + at.kw * g.dilation_w;
  const bool inside = h >= g.pad_top && w >= g.pad_left && h - g.pad_top < g.in_h.value &&
                      w - g.pad_left < g.in_w.value;
  return inside ? x[((b * g.in_h.value + (h - g.pad_top)) * g.in_w.value + (w - g.pad_left)) *
                        g.in_c.value +
                    at.c]
                : 0.0F;
}

/// Element `i` of im2col's `columns`: row `(b, oh, ow)`, column `(kh, kw, c)`.
template <class Index>
LOADSTAR_HOST_DEVICE inline float im2col_value(const float* x, const ConvIndex<Index>& g,
                                               Index i) noexcept {
  const Nhwc<Index> at = nhwc_of(i, g.patch, g.out_w, g.out_h);
  return unfolded_input(x, g, at.b, at.h, at.w, patch_offset(g, at.c));
}

/// A convolution's weight gradients as a column reduction over its output positions (the rows
/// of `dz`, `rows x filters`), read from the input without unfolding it: column `p * filters + f`
/// (`p < patch`) sums im2col's element `(r, p)` times `dz[r, f]` (the kernel gradient's
/// `(p, f)`), column `patch * filters + f` sums `dz[r, f]` (the bias gradient's `f`). This
/// writes the partial sums over chunk `chunk` (`column_partial`'s rows, in row order, in double:
/// each product of two floats is exact) of the `Group` columns from `j` on (a group lies inside
/// one of the two parts: `filters` is a multiple of `Group`), so that one thread reads each input
/// element once for `Group` filters; every column's sum is the same whatever the group.
template <std::size_t Group, class Index>
LOADSTAR_HOST_DEVICE void conv_weight_partials(const float* x, const ConvIndex<Index>& g,
                                               const float* dz, std::size_t rows,
                                               std::size_t filters, std::size_t chunk,
                                               std::size_t j, double* out) noexcept {
  const std::size_t chunk_rows = reduction_chunk_rows(rows);
  const std::size_t r0 = chunk * chunk_rows;
  const std::size_t r1 = r0 + chunk_rows < rows ? r0 + chunk_rows : rows;
  const std::size_t kernel_terms = std::size_t(g.patch.value) * filters;
  double sums[Group];
  for (std::size_t k = 0; k < Group; ++k)
    sums[k] = 0.0;
  if (j >= kernel_terms) {
    const float* d = dz + (j - kernel_terms);
    for (std::size_t r = r0; r < r1; ++r)
      for (std::size_t k = 0; k < Group; ++k)
        sums[k] += d[r * filters + k];
  } else {
    const auto p = Index(j / filters);
    const float* d = dz + (j - std::size_t(p) * filters);
    const PatchOffset<Index> at = patch_offset(g, p);
    // Row r0's output position (b, oh, ow), then stepped row by row.
    const auto first = Index(r0);
    const Index t = g.out_w.quotient(first);
    Index ow = first - t * g.out_w.value;
    Index b = g.out_h.quotient(t);
    Index oh = t - b * g.out_h.value;
    for (std::size_t r = r0; r < r1; ++r) {
      const double v = unfolded_input(x, g, b, oh, ow, at);
      for (std::size_t k = 0; k < Group; ++k)
        sums[k] += v * double(d[r * filters + k]);
      if (++ow == g.out_w.value) {
        ow = 0;
        if (++oh == g.out_h.value) {
          oh = 0;
          ++b;
        }
      }
    }
  }
  for (std::size_t k = 0; k < Group; ++k)
    out[k] = sums[k];
}

/// Writes (or with `accumulate`, adds) column `j`'s total of `conv_weight_partials` into the
/// kernel gradient (`patch x filters`) or the bias gradient.
/// Output element `i` (channels-last `(batch, out_h, out_w, out_c)`) of a depthwise convolution
/// (`Backend::depthwise_forward`, keras/detail/depthwise_loops.hpp's layout): the bias, then the
/// kernel's taps that fall inside the input, rows then columns, as the CPU's loops add them.
LOADSTAR_HOST_DEVICE inline float depthwise_value(const float* x, const keras::Conv2DGeometry& g,
                                                  const float* kernel, const float* bias,
                                                  std::size_t i) noexcept {
  const std::size_t out_c = g.out_c, multiplier = out_c / g.in_c;
  const std::size_t j = i % out_c, p = i / out_c;
  const std::size_t ox = p % g.out_w, oy = p / g.out_w % g.out_h, b = p / g.out_w / g.out_h;
  const std::size_t c = j / multiplier;
  float sum = bias != nullptr ? bias[j] : 0.0F;
  for (std::size_t ky = 0; ky < g.kernel_h; ++ky) {
    const std::size_t sy = oy * g.stride_h + ky * g.dilation_h;  // the input row plus pad_top
    if (sy < g.pad_top || sy - g.pad_top >= g.in_h) continue;
    for (std::size_t kx = 0; kx < g.kernel_w; ++kx) {
      const std::size_t sx = ox * g.stride_w + kx * g.dilation_w;
      if (sx < g.pad_left || sx - g.pad_left >= g.in_w) continue;
      sum += x[((b * g.in_h + sy - g.pad_top) * g.in_w + sx - g.pad_left) * g.in_c + c] *
             kernel[(ky * g.kernel_w + kx) * out_c + j];
    }
  }
  return sum;
}

/// Element `i` of a depthwise convolution's input gradient (`(batch, in_h, in_w, in_c)`) from the
/// pre-bias output gradient `dz`: the outputs whose taps read it, in the CPU's order of additions
/// (output rows and columns ascending, which is kernel rows and columns descending), each over
/// the channel's `multiplier` outputs.
LOADSTAR_HOST_DEVICE inline float depthwise_input_gradient(const float* dz,
                                                           const keras::Conv2DGeometry& g,
                                                           const float* kernel,
                                                           std::size_t i) noexcept {
  const std::size_t in_c = g.in_c, out_c = g.out_c, multiplier = out_c / in_c;
  const std::size_t c = i % in_c, p = i / in_c;
  const std::size_t ix = p % g.in_w, iy = p / g.in_w % g.in_h, b = p / g.in_w / g.in_h;
  float sum = 0.0F;
  for (std::size_t ky = g.kernel_h; ky-- > 0;) {
    const std::size_t sy = iy + g.pad_top, ry = ky * g.dilation_h;  // sy = oy * stride + ry
    if (sy < ry || (sy - ry) % g.stride_h != 0 || (sy - ry) / g.stride_h >= g.out_h) continue;
    const std::size_t oy = (sy - ry) / g.stride_h;
    for (std::size_t kx = g.kernel_w; kx-- > 0;) {
      const std::size_t sx = ix + g.pad_left, rx = kx * g.dilation_w;
      if (sx < rx || (sx - rx) % g.stride_w != 0 || (sx - rx) / g.stride_w >= g.out_w) continue;
      const std::size_t ox = (sx - rx) / g.stride_w;
      const float* d = dz + ((b * g.out_h + oy) * g.out_w + ox) * out_c + c * multiplier;
      const float* k = kernel + (ky * g.kernel_w + kx) * out_c + c * multiplier;
      for (std::size_t m = 0; m < multiplier; ++m)
        sum += d[m] * k[m];
    }
  }
  return sum;
}

/// The terms of a depthwise convolution's weight gradients, for `column_reduce` over the output
/// positions `r` (`batch * out_h * out_w`): column `j < kernel_terms` is kernel element `j`
/// (`(kernel_h, kernel_w, out_c)` flat), its input element times the output gradient, or 0 where
/// the tap falls in the padding; the `out_c` columns after them the bias's, the output gradient.
struct DepthwiseWeightValue {
  const float* x;
  const float* dz;
  keras::Conv2DGeometry g;
  std::size_t kernel_terms;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    const std::size_t out_c = g.out_c;
    if (j >= kernel_terms) return dz[r * out_c + (j - kernel_terms)];
    const std::size_t jo = j % out_c, tap = j / out_c;
    const std::size_t ky = tap / g.kernel_w, kx = tap % g.kernel_w;
    const std::size_t ox = r % g.out_w, oy = r / g.out_w % g.out_h, b = r / g.out_w / g.out_h;
    const std::size_t sy = oy * g.stride_h + ky * g.dilation_h;
    const std::size_t sx = ox * g.stride_w + kx * g.dilation_w;
    if (sy < g.pad_top || sy - g.pad_top >= g.in_h || sx < g.pad_left || sx - g.pad_left >= g.in_w)
      return 0.0;
    const std::size_t c = jo / (out_c / g.in_c);
    return static_cast<double>(
               x[((b * g.in_h + sy - g.pad_top) * g.in_w + sx - g.pad_left) * g.in_c + c]) *
           static_cast<double>(dz[r * out_c + jo]);
  }
};

struct ConvWeightFinish {
  float* dkernel;
  float* dbias;
  std::size_t kernel_terms;
  bool accumulate;
  LOADSTAR_HOST_DEVICE void operator()(std::size_t j, double sum) const noexcept {
    float* out = j < kernel_terms ? dkernel + j : dbias + (j - kernel_terms);
    *out = accumulate ? *out + static_cast<float>(sum) : static_cast<float>(sum);
  }
};

/// Element `i` of col2im's `dx`: the column elements that unfold from input element `i`, added
/// in the CPU backend's order (rows ascending, which is kernel offsets descending).
template <class Index>
LOADSTAR_HOST_DEVICE inline float col2im_value(const float* columns, const ConvIndex<Index>& g,
                                               Index i) noexcept {
  const auto [b, ih, iw, c] = nhwc_of(i, g.in_c, g.in_w, g.in_h);
  float sum = 0.0F;
  for (Index kh = g.kernel_h; kh-- > 0;) {
    const Index reach_h = kh * g.dilation_h;
    if (ih + g.pad_top < reach_h) continue;
    const Index h = ih + g.pad_top - reach_h;
    const Index oh = g.stride_h.quotient(h);
    if (oh * g.stride_h.value != h || oh >= g.out_h.value) continue;
    for (Index kw = g.kernel_w.value; kw-- > 0;) {
      const Index reach_w = kw * g.dilation_w;
      if (iw + g.pad_left < reach_w) continue;
      const Index w = iw + g.pad_left - reach_w;
      const Index ow = g.stride_w.quotient(w);
      if (ow * g.stride_w.value != w || ow >= g.out_w.value) continue;
      const Index row = (b * g.out_h.value + oh) * g.out_w.value + ow;
      sum += columns[row * g.patch.value + (kh * g.kernel_w.value + kw) * g.in_c.value + c];
    }
  }
  return sum;
}

// --- Pooling -----------------------------------------------------------------------------------

/// A pooling's geometry as its kernels index it (as `ConvIndex`).
template <class Index>
struct PoolIndex {
  using index_type = Index;
  Divisor<Index> in_h, in_w, channels, out_h, out_w, stride_h, stride_w;
  Index pool_h = 1, pool_w = 1, pad_top = 0, pad_left = 0;

  explicit PoolIndex(const Pool2DGeometry& g) noexcept
      : in_h(Index(g.in_h)),
        in_w(Index(g.in_w)),
        channels(Index(g.channels)),
        out_h(Index(g.out_h)),
        out_w(Index(g.out_w)),
        stride_h(Index(g.stride_h)),
        stride_w(Index(g.stride_w)),
        pool_h(Index(g.pool_h)),
        pool_w(Index(g.pool_w)),
        pad_top(Index(g.pad_top)),
        pad_left(Index(g.pad_left)) {}
};

/// Whether every index of the pooling's kernels stays below 2^31.
inline bool pool_fits_32bit(const Pool2DGeometry& g) noexcept {
  return fits_32bit_index(g.batch * g.in_h * g.in_w * g.channels,
                          g.batch * g.out_h * g.out_w * g.channels,
                          g.out_h * g.stride_h + g.pool_h + g.in_h + g.pad_top,
                          g.out_w * g.stride_w + g.pool_w + g.in_w + g.pad_left);
}

/// `with_index` for a pooling's kernels.
template <class F>
decltype(auto) with_pool_index(const Pool2DGeometry& g, F&& f) {
  return with_index<PoolIndex>(pool_fits_32bit(g), g, static_cast<F&&>(f));
}

/// Positions `[begin, end)` of one axis.
template <class Index>
struct Span {
  Index begin, end;
};

/// The input positions of window `o` of one axis, clipped to the input.
template <class Index>
LOADSTAR_HOST_DEVICE inline Span<Index> window_span(Index o, Index stride, Index pad, Index pool,
                                                    Index in) noexcept {
  const Index start = o * stride;  // the first position plus the padding
  const Index stop = start + pool;
  return {start > pad ? start - pad : 0, stop <= pad ? 0 : (stop - pad < in ? stop - pad : in)};
}

/// The windows `[begin, end)` of one axis that contain input position `p`: window `o` covers
/// `[o * stride - pad, o * stride - pad + pool)`, so `p + pad - pool < o * stride <= p + pad`.
template <class Index>
LOADSTAR_HOST_DEVICE inline Span<Index> windows_containing(Index p, const Divisor<Index>& stride,
                                                           Index pad, Index pool,
                                                           Index out) noexcept {
  const Index high = p + pad;
  const Index first = high + 1 > pool ? stride.quotient(high + 1 - pool + stride.value - 1) : 0;
  const Index last = stride.quotient(high) + 1;
  return {first, last < out ? last : out};
}

template <class Index>
LOADSTAR_HOST_DEVICE inline Index pool_in_index(const PoolIndex<Index>& g, Index b, Index ih,
                                                Index iw) noexcept {
  return ((b * g.in_h.value + ih) * g.in_w.value + iw) * g.channels.value;
}

/// The input index of the first maximum of window `(b, oh, ow)` of channel `c`, as the CPU
/// backend picks it (the first element, then any strictly greater one).
template <class Index>
LOADSTAR_HOST_DEVICE inline Index window_argmax(const float* x, const PoolIndex<Index>& g, Index b,
                                                Index oh, Index ow, Index c) noexcept {
  const Span<Index> h = window_span(oh, g.stride_h.value, g.pad_top, g.pool_h, g.in_h.value);
  const Span<Index> w = window_span(ow, g.stride_w.value, g.pad_left, g.pool_w, g.in_w.value);
  float top = -INFINITY;
  Index arg = ~Index{0};
  for (Index ih = h.begin; ih < h.end; ++ih) {
    for (Index iw = w.begin; iw < w.end; ++iw) {
      const Index index = pool_in_index(g, b, ih, iw) + c;
      if (arg == ~Index{0} || x[index] > top) {
        top = x[index];
        arg = index;
      }
    }
  }
  return arg;
}

/// Output element `i` of max (or average) pooling.
template <class Index>
LOADSTAR_HOST_DEVICE inline float pool_forward_value(const float* x, const PoolIndex<Index>& g,
                                                     bool max, Index i) noexcept {
  const auto [b, oh, ow, c] = nhwc_of(i, g.channels, g.out_w, g.out_h);
  const Span<Index> h = window_span(oh, g.stride_h.value, g.pad_top, g.pool_h, g.in_h.value);
  const Span<Index> w = window_span(ow, g.stride_w.value, g.pad_left, g.pool_w, g.in_w.value);
  float acc = max ? -INFINITY : 0.0F;
  Index count = 0;
  for (Index ih = h.begin; ih < h.end; ++ih) {
    for (Index iw = w.begin; iw < w.end; ++iw) {
      const float v = x[pool_in_index(g, b, ih, iw) + c];
      acc = max ? max_of(acc, v) : acc + v;
      ++count;
    }
  }
  return max ? acc : acc / static_cast<float>(count);
}

/// Input gradient element `i`: the gradients of the windows that contain it (and, for max
/// pooling, chose it), added in window order as the CPU backend adds them. `x` is read only for
/// max pooling.
template <class Index>
LOADSTAR_HOST_DEVICE inline float pool_backward_value(const float* x, const PoolIndex<Index>& g,
                                                      const float* dy, bool max, Index i) noexcept {
  const auto [b, ih, iw, c] = nhwc_of(i, g.channels, g.in_w, g.in_h);
  const Span<Index> hs = windows_containing(ih, g.stride_h, g.pad_top, g.pool_h, g.out_h.value);
  const Span<Index> ws = windows_containing(iw, g.stride_w, g.pad_left, g.pool_w, g.out_w.value);
  float sum = 0.0F;
  for (Index oh = hs.begin; oh < hs.end; ++oh) {
    for (Index ow = ws.begin; ow < ws.end; ++ow) {
      const Index out_index =
          ((b * g.out_h.value + oh) * g.out_w.value + ow) * g.channels.value + c;
      if (max) {
        if (window_argmax(x, g, b, oh, ow, c) == i) sum += dy[out_index];
      } else {
        const Span<Index> h = window_span(oh, g.stride_h.value, g.pad_top, g.pool_h, g.in_h.value);
        const Span<Index> w = window_span(ow, g.stride_w.value, g.pad_left, g.pool_w, g.in_w.value);
        const Index count = (h.end - h.begin) * (w.end - w.begin);
        sum += dy[out_index] / static_cast<float>(count);
      }
    }
  }
  return sum;
}

/// `pool_backward_value`, with `relu` carried on through the ReLU whose output `x` is: 0 where
/// `x[i]` is not positive (`relu_passes`), as `activation_gradient`'s ReLU gives.
template <class Index>
LOADSTAR_HOST_DEVICE inline float pool_input_gradient(const float* x, const PoolIndex<Index>& g,
                                                      const float* dy, bool max, bool relu,
                                                      Index i) noexcept {
  return relu && !relu_passes(x[i]) ? 0.0F : pool_backward_value(x, g, dy, max, i);
}

/// Whether no input position lies in two windows (the strides are at least the pool sizes): then
/// max pooling's input gradient is written window by window (`max_pool_window_gradient`).
inline bool pool_windows_disjoint(const Pool2DGeometry& g) noexcept {
  return g.stride_h >= g.pool_h && g.stride_w >= g.pool_w;
}

/// Whether the windows also cover every input position exactly once: no padding, strides equal to
/// the pool sizes, and the last window ending at the input's end. Otherwise the positions that no
/// window covers get their zero gradient from a fill first.
inline bool pool_windows_tile(const Pool2DGeometry& g) noexcept {
  return g.stride_h == g.pool_h && g.stride_w == g.pool_w && g.pad_top == 0 && g.pad_left == 0 &&
         g.out_h * g.pool_h == g.in_h && g.out_w * g.pool_w == g.in_w;
}

/// Writes the input gradient of max-pooling window `i = (b, oh, ow, c)` where windows are disjoint
/// (`pool_windows_disjoint`): the window's first maximum gets the window's gradient, the rest of
/// it zero. These are `pool_backward_value`'s bits (its sum starts from zero, so `-0.0` becomes
/// `0.0` as there), with one thread per window instead of one per input element, and the window's
/// maximum found once instead of once per element. With `relu` (`x` is a ReLU's output), the
/// gradient is carried on through that ReLU: 0 where the maximum is not positive, as
/// `activation_gradient`'s ReLU gives.
template <class Index>
LOADSTAR_HOST_DEVICE inline void max_pool_window_gradient(const float* x, const PoolIndex<Index>& g,
                                                          const float* dy, float* dx, bool relu,
                                                          Index i) noexcept {
  const auto [b, oh, ow, c] = nhwc_of(i, g.channels, g.out_w, g.out_h);
  const Index arg = window_argmax(x, g, b, oh, ow, c);
  const float gradient = relu && !relu_passes(x[arg]) ? 0.0F : 0.0F + dy[i];
  const Span<Index> h = window_span(oh, g.stride_h.value, g.pad_top, g.pool_h, g.in_h.value);
  const Span<Index> w = window_span(ow, g.stride_w.value, g.pad_left, g.pool_w, g.in_w.value);
  for (Index ih = h.begin; ih < h.end; ++ih) {
    for (Index iw = w.begin; iw < w.end; ++iw) {
      const Index index = pool_in_index(g, b, ih, iw) + c;
      dx[index] = index == arg ? gradient : 0.0F;
    }
  }
}

/// Output element `i = (b, c)` of global pooling over `pixels` positions.
LOADSTAR_HOST_DEVICE inline float global_pool_forward_value(const float* x, bool max,
                                                            std::size_t pixels,
                                                            std::size_t channels,
                                                            std::size_t i) noexcept {
  const float* in = x + (i / channels) * pixels * channels + i % channels;
  float acc = max ? -INFINITY : 0.0F;
  for (std::size_t p = 0; p < pixels; ++p)
    acc = max ? max_of(acc, in[p * channels]) : acc + in[p * channels];
  return max ? acc : acc / static_cast<float>(pixels);
}

/// Writes the input gradient of output element `i = (b, c)` of global pooling.
LOADSTAR_HOST_DEVICE inline void global_pool_backward_line(const float* x, bool max,
                                                           const float* dy, float* dx,
                                                           std::size_t pixels, std::size_t channels,
                                                           std::size_t i) noexcept {
  const std::size_t base = (i / channels) * pixels * channels + i % channels;
  if (max) {
    std::size_t arg = 0;
    for (std::size_t p = 0; p < pixels; ++p) {
      dx[base + p * channels] = 0.0F;
      if (x[base + p * channels] > x[base + arg * channels]) arg = p;
    }
    if (pixels > 0) dx[base + arg * channels] = dy[i];
  } else {
    const float share = dy[i] / static_cast<float>(pixels);
    for (std::size_t p = 0; p < pixels; ++p)
      dx[base + p * channels] = share;
  }
}

// --- Indexing and layout -------------------------------------------------------------------------

/// Element `i` of gather's output: row `indices[i / width]` of `table` (`rows` rows; cast toward
/// zero), or 0 for an index outside it (which the check of the indices reports).
LOADSTAR_HOST_DEVICE inline float gather_value(const float* indices, const float* table,
                                               std::size_t rows, std::size_t width,
                                               std::size_t i) noexcept {
  const float index = indices[i / width];
  if (!index_in_range(index, rows)) return 0.0F;
  return table[static_cast<std::size_t>(index) * width + i % width];
}

/// Column `c` of scatter_add: the rows' gradients added over the indices in order, as on the CPU
/// (an index outside the table's `rows` rows adds nothing).
LOADSTAR_HOST_DEVICE inline void scatter_add_column(const float* indices, std::size_t count,
                                                    const float* dy, std::size_t rows,
                                                    std::size_t width, float* table_gradient,
                                                    std::size_t c) noexcept {
  for (std::size_t i = 0; i < count; ++i) {
    if (!index_in_range(indices[i], rows)) continue;
    const auto row = static_cast<std::size_t>(indices[i]);
    table_gradient[row * width + c] += dy[i * width + c];
  }
}

/// After the search for the first bad index (its position's bits in `record[1]`, all ones when
/// none): `record[2]` = that index's value, as the row loss's record of a bad label.
LOADSTAR_HOST_DEVICE inline void record_bad_index(const float* indices, double* record) noexcept {
  unsigned long long first = 0;
  memcpy(&first, record + 1, sizeof first);
  record[2] = first == ~0ULL ? 0.0 : static_cast<double>(indices[first]);
}

/// The input offset that output element `i` of a permutation reads.
LOADSTAR_HOST_DEVICE inline std::size_t permute_offset(const PermuteDims& d,
                                                       std::size_t i) noexcept {
  std::size_t rest = i;
  std::size_t offset = 0;
  for (std::size_t axis = d.rank; axis-- > 0;) {
    offset += (rest % d.out_dims[axis]) * d.in_strides[axis];
    rest /= d.out_dims[axis];
  }
  return offset;
}

/// `x[r, j]` of a `(rows, columns)` matrix of doubles.
struct DoubleElementValue {
  const double* x;
  std::size_t columns;
  LOADSTAR_HOST_DEVICE double operator()(std::size_t r, std::size_t j) const noexcept {
    return x[r * columns + j];
  }
};

}  // namespace loadstar::cuda::detail
