/// \file
/// The element-wise kernels of the layers that have no backend operation of their own: the
/// cropping, zero padding and nearest up-sampling layers of 1 to 3 spatial axes, `ELU`,
/// `ThresholdedReLU`, `PReLU` (with its `shared_axes` and its alpha gradient), `Rescaling`, and
/// the training noise of `Dropout` with a `noise_shape`, the spatial dropouts, `GaussianNoise`,
/// `GaussianDropout` and `AlphaDropout`. `Backend::layer_kernel` runs one of them over its
/// elements; every backend calls `layer_element_of` for element `i`, the CPU in a host loop and
/// the CUDA backend in a device thread, so that both compute the same formula. Host and device
/// code (`LOADSTAR_HOST_DEVICE`); dependency-free but for the formulas it calls.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "loadstar/keras/detail/layer_formulas.hpp"
#include "loadstar/keras/detail/rounded_arithmetic.hpp"
#include "loadstar/random.hpp"

namespace loadstar::keras::detail {

/// Which kernel `layer_element_of` runs, with its tensors `t[0..]` in the order given here, over
/// the elements named.
enum class LayerOp : std::uint32_t {
  /// Zero padding: `t[1]` (the large grid of `box`) = `t[0]` (the small one) inside the box at
  /// `box.offset`, 0 outside. `ZeroPadding*`'s forward pass and `Cropping*`'s backward pass.
  /// Elements: `t[1]`'s.
  pad,
  /// Cropping: `t[1]` (the small grid) = the box at `box.offset` of `t[0]` (the large one).
  /// `Cropping*`'s forward pass and `ZeroPadding*`'s backward pass. Elements: `t[1]`'s.
  crop,
  /// Nearest up-sampling by whole factors (`box.large / box.small` per axis): `t[1]` (large) at
  /// position `o` of each axis = `t[0]` (small) at `o / factor`. Elements: `t[1]`'s.
  repeat,
  /// Its adjoint: `t[1]` (small) = the sum of `t[0]` (large) over the block each position was
  /// repeated into, in the block's row-major order. Elements: `t[1]`'s.
  repeat_backward,
  /// `ELU`: `t[1]` = `elu_layer_value(t[0], alpha)`. Elements: `t[0]`'s.
  elu,
  /// Its gradient: `t[2]` = `elu_layer_gradient(x = t[0], dy = t[1], alpha)`.
  elu_backward,
  /// `ThresholdedReLU`: `t[1]` = `t[0]` above `theta`, else 0. Elements: `t[0]`'s.
  thresholded_relu,
  /// Its gradient: `t[2]` = `t[1]` (`dy`) where `t[0]` (`x`) is above `theta`, else 0.
  thresholded_relu_backward,
  /// `Rescaling`: `t[1]` = `t[0] * scale + offset` (no offset added when it is 0), rounded after
  /// each operation. Elements: `t[0]`'s.
  affine,
  /// `PReLU`: `t[2]` = `prelu_value(t[0], t[1][map(i)])`, `t[1]` the slopes. Elements: `t[0]`'s.
  prelu,
  /// Its input gradient: `t[3]` = `prelu_gradient(x = t[0], dy = t[2], t[1][map(i)])`.
  prelu_backward,
  /// Its slopes' gradient: `t[3][a]` += the sum of `dy * x` (`t[2]`, `t[0]`) over the elements of
  /// negative `x` whose slope is `a`, in their flat order. Elements: `t[3]`'s (the slopes').
  prelu_alpha_gradient,
  /// Inverted dropout of shared draws: `t[1]` = `t[0] * scale` where `dropout_keeps(key, map(i),
  /// rate)`, else 0 (forward and backward alike). Elements: `t[0]`'s.
  dropout,
  /// `GaussianNoise`: `t[1]` = `t[0] + scale * normal_at(key, i)`. Elements: `t[0]`'s.
  gaussian_noise,
  /// `GaussianDropout`: `t[1]` = `t[0] * (1 + scale * normal_at(key, i))` (forward and backward
  /// alike). Elements: `t[0]`'s.
  gaussian_dropout,
  /// `AlphaDropout`: where kept (`rate` 0, or `dropout_keeps(key, map(i), rate)`), `t[1]` =
  /// `scale * t[0] + offset`, else `dropped`. Elements: `t[0]`'s.
  alpha_dropout,
  /// Its gradient: `t[1]` = `scale * t[0]` (`dy`) where kept, else 0.
  alpha_dropout_backward,
  /// `UnitNormalization`: `t[1]` = `t[0] / sqrt(max(sum(t[0]^2), 1e-12))`, the sum (in double,
  /// in flat order) over the elements of each group, the elements of index `g` under `map`.
  /// Elements: the groups (each writes its elements).
  unit_normalize,
  /// Its gradient: `t[2]` = `s * dy - x * s^3 * sum(x * dy)` (`x` = `t[0]`, `dy` = `t[1]`, `s`
  /// the group's scale; `s * dy` alone below the floor). Elements: the groups.
  unit_normalize_backward,
};

/// A sample of up to 3 spatial axes as `(count, d[0], d[1], d[2], inner)` in a small and a large
/// grid: `count` samples times planes, `inner` floats per position, missing axes of size 1.
struct SpatialBox {
  std::size_t count = 0, inner = 1;
  std::size_t small[3] = {1, 1, 1}, large[3] = {1, 1, 1};
  /// Where the small grid starts inside the large one (padding and cropping).
  std::size_t offset[3] = {0, 0, 0};
};

/// A flat index's position in a tensor broadcast along some axes (PReLU's slopes, a dropout's
/// `noise_shape`): the index seen as coordinates of `dims` (the first axis taking the rest, so
/// that its size need not be known), each times its `strides` (0 along a broadcast axis). Axes
/// that broadcast alike are merged (`broadcast_map`). No axes: the index itself.
struct BroadcastMap {
  static constexpr std::size_t max_axes = 8;
  std::size_t axes = 0;
  std::size_t dims[max_axes] = {};
  std::size_t strides[max_axes] = {};
};

/// The position of flat index `i` under `map`.
LOADSTAR_HOST_DEVICE inline std::size_t broadcast_index(const BroadcastMap& map,
                                                        std::size_t i) noexcept {
  if (map.axes == 0) return i;
  std::size_t index = 0;
  for (std::size_t d = map.axes - 1; d > 0; --d) {
    index += (i % map.dims[d]) * map.strides[d];
    i /= map.dims[d];
  }
  return index + i * map.strides[0];
}

/// The map of a tensor of `axes` axes of sizes `dims` (the first may be 0, unknown) read at
/// `strides` (0 where it broadcasts), its axes merged where they broadcast alike: contiguous runs
/// of strides, and runs of broadcast axes. At most `BroadcastMap::max_axes` merged axes.
inline BroadcastMap broadcast_map(const std::size_t* dims, const std::size_t* strides,
                                  std::size_t axes) noexcept {
  // Merged from the last axis backwards, then reversed.
  BroadcastMap reversed;
  std::size_t count = 0;
  for (std::size_t d = axes; d-- > 0;) {
    if (count > 0) {
      std::size_t& last_dim = reversed.dims[count - 1];
      const std::size_t last_stride = reversed.strides[count - 1];
      const bool both_broadcast = strides[d] == 0 && last_stride == 0;
      const bool contiguous = strides[d] != 0 && strides[d] == last_stride * last_dim;
      if (both_broadcast || contiguous) {
        last_dim *= dims[d];
        continue;
      }
    }
    LOADSTAR_ASSERT(count < BroadcastMap::max_axes, "broadcast_map: too many axes to merge");
    reversed.dims[count] = dims[d];
    reversed.strides[count] = strides[d];
    ++count;
  }
  BroadcastMap map{};
  map.axes = count;
  for (std::size_t d = 0; d < count; ++d) {
    map.dims[d] = reversed.dims[count - 1 - d];
    map.strides[d] = reversed.strides[count - 1 - d];
  }
  return map;
}

/// The sizes and options of one `layer_element_of` kernel (see `LayerOp` for what each uses).
struct LayerKernel {
  LayerOp op = LayerOp::pad;
  SpatialBox box{};
  BroadcastMap map{};
  /// `ELU`'s alpha, `ThresholdedReLU`'s theta.
  float alpha = 0.0F;
  /// `Rescaling`'s scale and offset; a dropout's kept scale; the Gaussian layers' standard
  /// deviation; `AlphaDropout`'s affine `a` (`scale`) and `b` (`offset`).
  float scale = 1.0F, offset = 0.0F;
  /// `AlphaDropout`'s value of a dropped element.
  float dropped = 0.0F;
  double rate = 0.0;
};

/// The tensors of one kernel, in `LayerOp`'s order (null where one is not given).
struct LayerTensors {
  static constexpr std::size_t max = 4;
  float* t[max] = {};
};

/// The position of element `i` of a grid of `dims` (`count` of them, `inner` floats each
/// position) as `(p, a, b, c, k)`.
struct GridPosition {
  std::size_t p, a, b, c, k;
};
LOADSTAR_HOST_DEVICE inline GridPosition grid_position(const std::size_t* dims, std::size_t inner,
                                                       std::size_t i) noexcept {
  GridPosition g{};
  g.k = i % inner;
  i /= inner;
  g.c = i % dims[2];
  i /= dims[2];
  g.b = i % dims[1];
  i /= dims[1];
  g.a = i % dims[0];
  g.p = i / dims[0];
  return g;
}

/// The flat index of `(p, a, b, c, k)` in a grid of `dims`, `inner` floats each position.
LOADSTAR_HOST_DEVICE inline std::size_t grid_index(const std::size_t* dims, std::size_t inner,
                                                   std::size_t p, std::size_t a, std::size_t b,
                                                   std::size_t c, std::size_t k) noexcept {
  return (((p * dims[0] + a) * dims[1] + b) * dims[2] + c) * inner + k;
}

/// Calls `f` with the flat index of each element whose index under `map` is `a`, in flat order:
/// the coordinates of `a` fixed, the broadcast axes walked as an odometer, the last fastest (the
/// first axis's size in `dims[0]`).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
LOADSTAR_HOST_DEVICE inline void for_each_broadcast(const BroadcastMap& map, std::size_t a,
                                                    F&& f) noexcept {
  std::size_t base = 0, stride = 1, total = 1;
  std::size_t flat_strides[BroadcastMap::max_axes] = {};
  for (std::size_t d = map.axes; d-- > 0;) {
    flat_strides[d] = stride;
    if (map.strides[d] != 0) {
      base += (a / map.strides[d]) % map.dims[d] * stride;
    } else {
      total *= map.dims[d];
    }
    stride *= map.dims[d];
  }
  std::size_t counter[BroadcastMap::max_axes] = {};
  std::size_t offset = 0;
  for (std::size_t j = 0; j < total; ++j) {
    f(base + offset);
    for (std::size_t d = map.axes; d-- > 0;) {
      if (map.strides[d] != 0) continue;
      offset += flat_strides[d];
      if (++counter[d] < map.dims[d]) break;
      offset -= counter[d] * flat_strides[d];
      counter[d] = 0;
    }
  }
}

/// `1 / sqrt(max(sum, 1e-12))`: the scale of `UnitNormalization` (`tf.math.l2_normalize`).
LOADSTAR_HOST_DEVICE inline double unit_scale(double sum) noexcept {
  return 1.0 / ::sqrt(sum < 1e-12 ? 1e-12 : sum);
}

/// Element `i` of kernel `k` (whose `op` is `Op`) over `tensors`; `key` keys the noise.
template <LayerOp Op>
LOADSTAR_HOST_DEVICE inline void layer_element_of(const LayerKernel& k, const LayerTensors& tensors,
                                                  [[maybe_unused]] std::uint64_t key,
                                                  std::size_t i) noexcept {
  float* const* t = tensors.t;
  [[maybe_unused]] const SpatialBox& box = k.box;
  if constexpr (Op == LayerOp::pad) {
    const GridPosition g = grid_position(box.large, box.inner, i);
    // Unsigned: a position before the offset wraps around and is outside too.
    const std::size_t a = g.a - box.offset[0], b = g.b - box.offset[1], c = g.c - box.offset[2];
    const bool inside = a < box.small[0] && b < box.small[1] && c < box.small[2];
    t[1][i] = inside ? t[0][grid_index(box.small, box.inner, g.p, a, b, c, g.k)] : 0.0F;
  } else if constexpr (Op == LayerOp::crop) {
    const GridPosition g = grid_position(box.small, box.inner, i);
    t[1][i] = t[0][grid_index(box.large, box.inner, g.p, g.a + box.offset[0], g.b + box.offset[1],
                              g.c + box.offset[2], g.k)];
  } else if constexpr (Op == LayerOp::repeat) {
    const GridPosition g = grid_position(box.large, box.inner, i);
    const std::size_t fa = box.large[0] / box.small[0], fb = box.large[1] / box.small[1],
                      fc = box.large[2] / box.small[2];
    t[1][i] = t[0][grid_index(box.small, box.inner, g.p, g.a / fa, g.b / fb, g.c / fc, g.k)];
  } else if constexpr (Op == LayerOp::repeat_backward) {
    const GridPosition g = grid_position(box.small, box.inner, i);
    const std::size_t fa = box.large[0] / box.small[0], fb = box.large[1] / box.small[1],
                      fc = box.large[2] / box.small[2];
    float sum = 0.0F;
    for (std::size_t da = 0; da < fa; ++da)
      for (std::size_t db = 0; db < fb; ++db)
        for (std::size_t dc = 0; dc < fc; ++dc)
          sum += t[0][grid_index(box.large, box.inner, g.p, g.a * fa + da, g.b * fb + db,
                                 g.c * fc + dc, g.k)];
    t[1][i] = sum;
  } else if constexpr (Op == LayerOp::elu) {
    t[1][i] = elu_layer_value(t[0][i], k.alpha);
  } else if constexpr (Op == LayerOp::elu_backward) {
    t[2][i] = elu_layer_gradient(t[0][i], t[1][i], k.alpha);
  } else if constexpr (Op == LayerOp::thresholded_relu) {
    t[1][i] = thresholded_relu_value(t[0][i], k.alpha);
  } else if constexpr (Op == LayerOp::thresholded_relu_backward) {
    t[2][i] = t[0][i] > k.alpha ? t[1][i] : 0.0F;
  } else if constexpr (Op == LayerOp::affine) {
    const float scaled = mul_rn(t[0][i], k.scale);
    t[1][i] = k.offset == 0.0F ? scaled : add_rn(scaled, k.offset);
  } else if constexpr (Op == LayerOp::prelu) {
    t[2][i] = prelu_value(t[0][i], t[1][broadcast_index(k.map, i)]);
  } else if constexpr (Op == LayerOp::prelu_backward) {
    t[3][i] = prelu_gradient(t[0][i], t[2][i], t[1][broadcast_index(k.map, i)]);
  } else if constexpr (Op == LayerOp::prelu_alpha_gradient) {
    // d(-alpha * relu(-x)) / d alpha = min(x, 0), summed over the elements of slope `i`.
    float sum = t[3][i];
    for_each_broadcast(k.map, i, [&](std::size_t e) {
      if (t[0][e] < 0.0F) sum = add_rn(sum, mul_rn(t[2][e], t[0][e]));
    });
    t[3][i] = sum;
  } else if constexpr (Op == LayerOp::dropout) {
    t[1][i] = dropout_keeps(key, broadcast_index(k.map, i), k.rate) ? t[0][i] * k.scale : 0.0F;
  } else if constexpr (Op == LayerOp::gaussian_noise) {
    t[1][i] = add_rn(t[0][i], mul_rn(k.scale, normal_at(key, i)));
  } else if constexpr (Op == LayerOp::gaussian_dropout) {
    t[1][i] = t[0][i] * add_rn(1.0F, mul_rn(k.scale, normal_at(key, i)));
  } else if constexpr (Op == LayerOp::alpha_dropout) {
    const bool kept = k.rate <= 0.0 || dropout_keeps(key, broadcast_index(k.map, i), k.rate);
    t[1][i] = kept ? add_rn(mul_rn(k.scale, t[0][i]), k.offset) : k.dropped;
  } else if constexpr (Op == LayerOp::alpha_dropout_backward) {
    const bool kept = k.rate <= 0.0 || dropout_keeps(key, broadcast_index(k.map, i), k.rate);
    t[1][i] = kept ? k.scale * t[0][i] : 0.0F;
  } else if constexpr (Op == LayerOp::unit_normalize) {
    const float* x = t[0];
    double sum = 0.0;
    for_each_broadcast(
        k.map, i, [&](std::size_t e) { sum = dadd_rn(sum, dmul_rn(double(x[e]), double(x[e]))); });
    const double s = unit_scale(sum);
    for_each_broadcast(k.map, i,
                       [&](std::size_t e) { t[1][e] = static_cast<float>(double(x[e]) * s); });
  } else if constexpr (Op == LayerOp::unit_normalize_backward) {
    const float *x = t[0], *dy = t[1];
    double squares = 0.0, dots = 0.0;
    for_each_broadcast(k.map, i, [&](std::size_t e) {
      squares = dadd_rn(squares, dmul_rn(double(x[e]), double(x[e])));
      dots = dadd_rn(dots, dmul_rn(double(x[e]), double(dy[e])));
    });
    // y = x * s with s = 1 / sqrt(sum x^2): dx = s * dy - x * s^3 * sum(x * dy); below the
    // floor 1e-12 the scale is a constant and dx = s * dy.
    const double s = unit_scale(squares);
    for_each_broadcast(k.map, i, [&](std::size_t e) {
      const double tail = squares > 1e-12 ? double(x[e]) * s * s * s * dots : 0.0;
      t[2][e] = static_cast<float>(dsub_rn(dmul_rn(s, double(dy[e])), tail));
    });
  }
}

/// An op as a type (`with_layer_op`).
template <LayerOp Op>
struct LayerOpConstant {
  static constexpr LayerOp value = Op;
};

/// Calls `f` with op `op` as a compile-time constant (`LayerOpConstant`): on the device with a
/// device `f`, on the host with a host one (the host's loop, `layer_elements`).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
LOADSTAR_HOST_DEVICE inline void with_layer_op(LayerOp op, F&& f) noexcept {
#define LOADSTAR_LAYER_OP_CASE(name)     \
  case LayerOp::name:                    \
    f(LayerOpConstant<LayerOp::name>{}); \
    return;
  switch (op) {
    LOADSTAR_LAYER_OP_CASE(pad)
    LOADSTAR_LAYER_OP_CASE(crop)
    LOADSTAR_LAYER_OP_CASE(repeat)
    LOADSTAR_LAYER_OP_CASE(repeat_backward)
    LOADSTAR_LAYER_OP_CASE(elu)
    LOADSTAR_LAYER_OP_CASE(elu_backward)
    LOADSTAR_LAYER_OP_CASE(thresholded_relu)
    LOADSTAR_LAYER_OP_CASE(thresholded_relu_backward)
    LOADSTAR_LAYER_OP_CASE(affine)
    LOADSTAR_LAYER_OP_CASE(prelu)
    LOADSTAR_LAYER_OP_CASE(prelu_backward)
    LOADSTAR_LAYER_OP_CASE(prelu_alpha_gradient)
    LOADSTAR_LAYER_OP_CASE(dropout)
    LOADSTAR_LAYER_OP_CASE(gaussian_noise)
    LOADSTAR_LAYER_OP_CASE(gaussian_dropout)
    LOADSTAR_LAYER_OP_CASE(alpha_dropout)
    LOADSTAR_LAYER_OP_CASE(alpha_dropout_backward)
    LOADSTAR_LAYER_OP_CASE(unit_normalize)
    LOADSTAR_LAYER_OP_CASE(unit_normalize_backward)
  }
#undef LOADSTAR_LAYER_OP_CASE
}

/// Element `i` of kernel `k` over `tensors` (one device thread's work).
LOADSTAR_HOST_DEVICE inline void layer_element(const LayerKernel& k, const LayerTensors& tensors,
                                               std::uint64_t key, std::size_t i) noexcept {
  with_layer_op(k.op, [&](auto op) { layer_element_of<decltype(op)::value>(k, tensors, key, i); });
}

/// The box kernels (`pad`, `crop`, `repeat`, `repeat_backward`) on the host, a row of the grid
/// written at a time: the same sources and sums, in the same order, as `layer_element_of`'s,
/// the positions found once a row rather than once an element.
template <LayerOp Op>
void box_rows(const SpatialBox& box, const LayerTensors& tensors) noexcept {
  const float* in = tensors.t[0];
  float* out = tensors.t[1];
  const std::size_t inner = box.inner;
  // The grid written: the large one for pad and repeat, the small one for crop and the adjoint.
  const std::size_t* dims = Op == LayerOp::pad || Op == LayerOp::repeat ? box.large : box.small;
  const std::size_t rows = box.count * dims[0] * dims[1], run = dims[2] * inner;
  const std::size_t fa = box.large[0] / box.small[0], fb = box.large[1] / box.small[1],
                    fc = box.large[2] / box.small[2];
  for (std::size_t r = 0; r < rows; ++r) {
    const std::size_t b = r % dims[1], a = r / dims[1] % dims[0], p = r / dims[1] / dims[0];
    float* row = out + r * run;
    if constexpr (Op == LayerOp::pad) {
      const std::size_t sa = a - box.offset[0], sb = b - box.offset[1];
      std::fill(row, row + run, 0.0F);
      if (sa >= box.small[0] || sb >= box.small[1]) continue;
      const float* source = in + grid_index(box.small, inner, p, sa, sb, 0, 0);
      std::copy(source, source + box.small[2] * inner, row + box.offset[2] * inner);
    } else if constexpr (Op == LayerOp::crop) {
      const float* source = in + grid_index(box.large, inner, p, a + box.offset[0],
                                            b + box.offset[1], box.offset[2], 0);
      std::copy(source, source + run, row);
    } else if constexpr (Op == LayerOp::repeat) {
      const float* source = in + grid_index(box.small, inner, p, a / fa, b / fb, 0, 0);
      for (std::size_t c = 0; c < dims[2]; ++c)
        std::copy(source + c / fc * inner, source + (c / fc + 1) * inner, row + c * inner);
    } else {
      std::fill(row, row + run, 0.0F);
      for (std::size_t da = 0; da < fa; ++da) {
        for (std::size_t db = 0; db < fb; ++db) {
          const float* source =
              in + grid_index(box.large, inner, p, a * fa + da, b * fb + db, 0, 0);
          for (std::size_t c = 0; c < box.large[2]; ++c)
            for (std::size_t e = 0; e < inner; ++e)
              row[c / fc * inner + e] += source[c * inner + e];
        }
      }
    }
  }
}

/// Elements `[0, elements)` of kernel `k`, whose op is `Op`, in order: one function per op (not
/// inlined into the dispatch), so that the compiler inlines the op's formula into its loop.
template <LayerOp Op>
[[gnu::noinline]] void layer_loop(const LayerKernel& k, const LayerTensors& tensors,
                                  std::uint64_t key, std::size_t elements) noexcept {
  if constexpr (Op == LayerOp::pad || Op == LayerOp::crop || Op == LayerOp::repeat ||
                Op == LayerOp::repeat_backward) {
    box_rows<Op>(k.box, tensors);
  } else {
    for (std::size_t i = 0; i < elements; ++i)
      layer_element_of<Op>(k, tensors, key, i);
  }
}

/// Every element of kernel `k` in order: the host's loop, the op chosen once.
inline void layer_elements(const LayerKernel& k, const LayerTensors& tensors, std::uint64_t key,
                           std::size_t elements) noexcept {
  with_layer_op(k.op, [&](auto op) { layer_loop<decltype(op)::value>(k, tensors, key, elements); });
}

/// Whether op `op` draws noise from its key (which changes from step to step).
LOADSTAR_HOST_DEVICE inline bool layer_op_keyed(LayerOp op) noexcept {
  return op == LayerOp::dropout || op == LayerOp::gaussian_noise ||
         op == LayerOp::gaussian_dropout || op == LayerOp::alpha_dropout ||
         op == LayerOp::alpha_dropout_backward;
}

}  // namespace loadstar::keras::detail
