/// \file
/// The loops of a depthwise convolution over channels-last batches (`DepthwiseConv1D`/`2D` and the
/// first step of `SeparableConv1D`/`2D`), written over ranges of output rows and of images so that
/// a backend can split them over threads: `Backend::depthwise_forward`/`depthwise_backward` run
/// them whole through `host_kernel`, `CpuBackend` splits them over its threads. The channels are
/// contiguous, so every loop runs along them (no im2col: the operation is memory-bound), in blocks
/// of `depthwise_block` channels kept in registers across the kernel's taps.
#pragma once

#include <algorithm>
#include <cstddef>

#include "loadstar/keras/backend/kinds.hpp"

namespace loadstar::keras::detail {

/// The channels one register block of the depthwise loops holds.
inline constexpr std::size_t depthwise_block = 16;

/// The taps of a kernel axis that fall inside the input for output position `o`:
/// `[begin, end)`, with input position `o * stride + k * dilation - pad` for tap `k`.
struct DepthwiseTaps {
  std::size_t begin = 0, end = 0;
};

inline DepthwiseTaps depthwise_taps(std::size_t o, std::size_t stride, std::size_t dilation,
                                    std::size_t pad, std::size_t kernel, std::size_t in) noexcept {
  const std::size_t start = o * stride;  // input position of tap 0, plus pad
  std::size_t begin = 0;
  if (start < pad) begin = (pad - start + dilation - 1) / dilation;
  std::size_t end = kernel;
  // Tap k is inside while start + k * dilation < in + pad.
  if (start + (kernel - 1) * dilation >= in + pad)
    end = start >= in + pad ? 0 : (in + pad - start + dilation - 1) / dilation;
  return {begin, std::max(begin, std::min(end, kernel))};
}

/// `z = depthwise(x) (+ bias)` for output rows `[r0, r1)` (row `b * out_h + oy`) of channels-last
/// `x` `(batch, in_h, in_w, in_c)` with the kernel `(kernel_h, kernel_w, in_c, multiplier)`
/// (Keras's layout, `g.out_c = in_c * multiplier`): output channel `c * multiplier + m` is input
/// channel `c` convolved with `kernel[..., c, m]`. `bias` may be null.
inline void depthwise_forward_rows(const float* x, const Conv2DGeometry& g, const float* kernel,
                                   const float* bias, float* z, std::size_t r0, std::size_t r1) {
  const std::size_t in_c = g.in_c, out_c = g.out_c, multiplier = out_c / in_c;
  for (std::size_t r = r0; r < r1; ++r) {
    const std::size_t b = r / g.out_h, oy = r % g.out_h;
    const DepthwiseTaps ty =
        depthwise_taps(oy, g.stride_h, g.dilation_h, g.pad_top, g.kernel_h, g.in_h);
    const std::size_t iy0 = oy * g.stride_h - g.pad_top;  // modulo 2^n; used with ky >= ty.begin
    for (std::size_t ox = 0; ox < g.out_w; ++ox) {
      const DepthwiseTaps tx =
          depthwise_taps(ox, g.stride_w, g.dilation_w, g.pad_left, g.kernel_w, g.in_w);
      const std::size_t ix0 = ox * g.stride_w - g.pad_left;
      float* __restrict out = z + (r * g.out_w + ox) * out_c;
      const auto input = [&](std::size_t ky, std::size_t kx) {
        return x +
               ((b * g.in_h + iy0 + ky * g.dilation_h) * g.in_w + ix0 + kx * g.dilation_w) * in_c;
      };
      const auto taps = [&](std::size_t ky, std::size_t kx) {
        return kernel + (ky * g.kernel_w + kx) * out_c;
      };
      if (multiplier != 1) {
        for (std::size_t j = 0; j < out_c; ++j)
          out[j] = bias != nullptr ? bias[j] : 0.0F;
        for (std::size_t ky = ty.begin; ky < ty.end; ++ky) {
          for (std::size_t kx = tx.begin; kx < tx.end; ++kx) {
            const float* in = input(ky, kx);
            const float* k = taps(ky, kx);
            for (std::size_t c = 0; c < in_c; ++c)
              for (std::size_t m = 0; m < multiplier; ++m)
                out[c * multiplier + m] += in[c] * k[c * multiplier + m];
          }
        }
        continue;
      }
      std::size_t c0 = 0;
      for (; c0 + depthwise_block <= in_c; c0 += depthwise_block) {
        float acc[depthwise_block];
        for (std::size_t j = 0; j < depthwise_block; ++j)
          acc[j] = bias != nullptr ? bias[c0 + j] : 0.0F;
        for (std::size_t ky = ty.begin; ky < ty.end; ++ky) {
          for (std::size_t kx = tx.begin; kx < tx.end; ++kx) {
            const float* __restrict in = input(ky, kx) + c0;
            const float* __restrict k = taps(ky, kx) + c0;
            for (std::size_t j = 0; j < depthwise_block; ++j)
              acc[j] += in[j] * k[j];
          }
        }
        for (std::size_t j = 0; j < depthwise_block; ++j)
          out[c0 + j] = acc[j];
      }
      if (c0 == in_c) continue;
      for (std::size_t c = c0; c < in_c; ++c)
        out[c] = bias != nullptr ? bias[c] : 0.0F;
      for (std::size_t ky = ty.begin; ky < ty.end; ++ky) {
        for (std::size_t kx = tx.begin; kx < tx.end; ++kx) {
          const float* __restrict in = input(ky, kx);
          const float* __restrict k = taps(ky, kx);
          for (std::size_t c = c0; c < in_c; ++c)
            out[c] += in[c] * k[c];
        }
      }
    }
  }
}

/// The adjoint of `depthwise_forward_rows` for images `[b0, b1)`, from the pre-bias gradient `dz`:
/// `dx` of those images (skipped when null) is written; the kernel's and the bias's gradients of
/// those images are added into `dkernel` and `dbias` (each skipped when null) when `accumulate`,
/// else written there.
inline void depthwise_backward_images(const float* x, const Conv2DGeometry& g, const float* kernel,
                                      const float* dz, float* dx, float* dkernel, float* dbias,
                                      std::size_t b0, std::size_t b1, bool accumulate) {
  const std::size_t in_c = g.in_c, out_c = g.out_c, multiplier = out_c / in_c;
  const std::size_t image = g.in_h * g.in_w * in_c;
  if (dx != nullptr) std::fill(dx + b0 * image, dx + b1 * image, 0.0F);
  if (dkernel != nullptr && !accumulate)
    std::fill(dkernel, dkernel + g.kernel_h * g.kernel_w * out_c, 0.0F);
  if (dbias != nullptr && !accumulate) std::fill(dbias, dbias + out_c, 0.0F);
  for (std::size_t b = b0; b < b1; ++b) {
    for (std::size_t oy = 0; oy < g.out_h; ++oy) {
      const DepthwiseTaps ty =
          depthwise_taps(oy, g.stride_h, g.dilation_h, g.pad_top, g.kernel_h, g.in_h);
      const std::size_t iy0 = oy * g.stride_h - g.pad_top;
      for (std::size_t ox = 0; ox < g.out_w; ++ox) {
        const DepthwiseTaps tx =
            depthwise_taps(ox, g.stride_w, g.dilation_w, g.pad_left, g.kernel_w, g.in_w);
        const std::size_t ix0 = ox * g.stride_w - g.pad_left;
        const float* __restrict d = dz + ((b * g.out_h + oy) * g.out_w + ox) * out_c;
        if (dbias != nullptr) {
          for (std::size_t j = 0; j < out_c; ++j)
            dbias[j] += d[j];
        }
        for (std::size_t ky = ty.begin; ky < ty.end; ++ky) {
          for (std::size_t kx = tx.begin; kx < tx.end; ++kx) {
            const std::size_t pixel =
                ((b * g.in_h + iy0 + ky * g.dilation_h) * g.in_w + ix0 + kx * g.dilation_w) * in_c;
            const std::size_t tap = (ky * g.kernel_w + kx) * out_c;
            const float* __restrict in = x + pixel;
            if (multiplier == 1) {
              if (dkernel != nullptr) {
                float* __restrict dk = dkernel + tap;
                for (std::size_t c = 0; c < in_c; ++c)
                  dk[c] += in[c] * d[c];
              }
              if (dx != nullptr) {
                const float* __restrict k = kernel + tap;
                float* __restrict out = dx + pixel;
                for (std::size_t c = 0; c < in_c; ++c)
                  out[c] += d[c] * k[c];
              }
              continue;
            }
            if (dkernel != nullptr) {
              float* dk = dkernel + tap;
              for (std::size_t c = 0; c < in_c; ++c)
                for (std::size_t m = 0; m < multiplier; ++m)
                  dk[c * multiplier + m] += in[c] * d[c * multiplier + m];
            }
            if (dx != nullptr) {
              const float* k = kernel + tap;
              float* out = dx + pixel;
              for (std::size_t c = 0; c < in_c; ++c)
                for (std::size_t m = 0; m < multiplier; ++m)
                  out[c] += d[c * multiplier + m] * k[c * multiplier + m];
            }
          }
        }
      }
    }
  }
}

}  // namespace loadstar::keras::detail
