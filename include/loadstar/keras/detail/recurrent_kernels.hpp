/// \file
/// The element-wise kernels of the recurrent layers (`SimpleRNN`, `LSTM`, `GRU`, their
/// `Bidirectional` and `StackedRNNCells` wrappers) around their matrix products: turning a
/// sequence time-major and back, the gate arithmetic of one step forward and backward
/// (keras/detail/recurrent_formulas.hpp), what a mask does to a step, and recurrent dropout's
/// masks. `Backend::recurrent_kernel` runs one of them over its elements; every backend calls
/// `recurrent_element` for element `i`, the CPU on the host and the CUDA backend in a device
/// thread, so that both compute the same formula. Host and device code (`LOADSTAR_HOST_DEVICE`);
/// dependency-free but for the formulas it calls.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loadstar/keras/detail/layer_formulas.hpp"
#include "loadstar/keras/detail/recurrent_formulas.hpp"
#include "loadstar/random.hpp"

namespace loadstar::keras::detail {

/// Which kernel `recurrent_element` runs, with its tensors `t[0..]` in the order given here.
/// Time-major buffers are `(steps * batch, width)`, row `s * batch + b` step `s` of sample `b`;
/// batch-major ones `(batch, steps, width)`. "Per step" tensors are one step's `(batch, ...)`
/// rows; `width` is `gates * units`.
enum class RecurrentOp : std::uint32_t {
  /// `t[1]` = `t[0]` reordered between batch-major and time-major (`to_batch_major`; reversed
  /// along time with `reverse`), `width` values a row. Elements: `t[1]`'s.
  sequence_order,
  /// `t[1]` = `t[0]` `(batch, steps, width)` reversed along its steps. Elements: `t[1]`'s.
  reverse_steps,
  /// One LSTM step: `t[0]` the pre-activations `z` `(batch, width)`, `t[1]` the previous carry,
  /// writes the carry `t[2]` and state `t[3]` `(batch, units)`. Elements: `batch * units`.
  lstm_forward,
  /// A `reset_after=False` GRU's `q = r * h_prev` (times the candidate's recurrent dropout mask
  /// `t[4]` when given): `t[0]` the input projection, `t[1]` the recurrent projection, `t[2]`
  /// `h_prev`, writes `t[3]`. Elements: `batch * units`.
  gru_reset_hidden,
  /// One GRU step: `t[0]` input projection, `t[1]` recurrent projection, `t[2]` the reset
  /// projection `(r * h_prev) U` (`reset_after=False`; else `t[1]` again), `t[3]` `h_prev`,
  /// writes `h` to `t[4]`. Elements: `batch * units`.
  gru_forward,
  /// A masked step keeps the states before it: where the step's mask `t[0]` `(batch)` is 0,
  /// `t[2]` = `t[1]` (`h`) and `t[4]` = `t[3]` (an LSTM's carry, when given). Elements:
  /// `batch * units`.
  keep_masked,
  /// Zeroes the rows of `t[1]` (`width` values each) whose mask in `t[0]` (time-major
  /// `(steps, batch)`) is 0: `t[1]` is time-major rows, or batch-major `(batch, steps, width)`
  /// with `batch_major`. Elements: `t[1]`'s.
  zero_masked,
  /// The backward LSTM step: `t[0]` `z`, `t[1]` `c_prev`, `t[2]` `c`, `t[3]` `dh`, `t[4]` `dc`
  /// (read, then replaced by `dc_prev`), writes `dz` to `t[5]`. Elements: `batch * units`.
  lstm_backward,
  /// The backward GRU step from `dh` (`t[4]`, replaced by its direct share of `dh_prev`): `t[0]`
  /// input projection, `t[1]` recurrent projection, `t[2]` reset projection (or `t[1]`), `t[3]`
  /// `h_prev`; writes `dz` `t[5]`, the recurrent projection's gradient `t[6]` and, for
  /// `reset_after=False`, the reset projection's `t[7]` (the candidate's block only). Elements:
  /// `batch * units`.
  gru_backward,
  /// The second backward step of a `reset_after=False` GRU: `t[0]` input projection, `t[1]`
  /// recurrent projection, `t[2]` `h_prev`, `t[3]` `dq` (times the candidate's dropout mask
  /// `t[7]` when given); writes the reset gate's gradients into `t[4]` and `t[5]` and adds
  /// `q`'s share of `dh_prev` to `t[6]`. Elements: `batch * units`.
  gru_backward_reset,
  /// A masked step passes its state gradients back unchanged: where the mask `t[0]` `(batch)` is
  /// 0, `t[2]` = `t[1]` (the saved `dh`), `t[5]` = `t[4]` (an LSTM's saved `dc`, when given), and
  /// the step's rows of `t[3]` (`dz`), `t[6]` and `t[7]` (a GRU's projection gradients, when
  /// given) are zeroed. Elements: `batch * width`.
  masked_backward,
  /// `count` dropout masks into `t[0]` (`count` blocks of `each` values): value `i` of mask `m`
  /// is `1 / (1 - rate)` where `dropout_keeps` keeps it under the stream
  /// `mix64(key ^ mix64(first_stream + m))`, else 0. Elements: `count * each`.
  dropout_masks,
  /// `t[2]` rows `m * rows + r` = row `r` of `t[0]` `(rows, width)` times row `m * batch + r %
  /// batch` of the masks `t[1]`, for `count` masks. Elements: `count * rows * width`.
  apply_masks,
  /// `t[2]` `(rows, width)` = (or += with `accumulate`) the sum over `count` groups of `t[0]`'s
  /// rows `g * rows + r` times the masks `t[1]`'s rows `g * batch + r % batch`. Elements:
  /// `rows * width`.
  masked_group_sum,
  /// `Bidirectional`'s merge: the forward direction's output `t[0]` and the backward's `t[1]`
  /// (in its processing order, reversed back along the `steps`) into `t[2]` by `merge` (concat
  /// `units + second_units` wide, sum, mul or ave `units` wide), or with `merge` none into `t[2]`
  /// and `t[3]`. Elements: `batch * steps * (units + second_units)` (concat and none) or
  /// `batch * steps * units`.
  bidirectional_merge,
  /// Its adjoint: from `t[0]` and `t[1]` (the directions' outputs, for mul) and the merged
  /// output's gradient `t[2]` (with none: the forward one, and `t[5]` the backward one), writes
  /// the directions' gradients `t[3]` and `t[4]` (each skipped when not given).
  bidirectional_split,
  /// The mask of `Embedding(mask_zero=True)` that the recurrent layers read: `t[1]` is 1 where
  /// the index `t[0]` is not 0 (Keras's `not_equal(cast(inputs, int32), 0)`: 0.5 is index 0),
  /// else 0, `width` values a row. Elements: `t[0]`'s.
  token_mask,
  /// `Masking`: a step of `t[0]` `(rows, width)` counts unless its every feature equals `value`
  /// (Keras's `any(not_equal(x, mask_value), axis=-1)`: a NaN counts). Writes the step's mask
  /// (1 or 0) to `t[3]` and `t[2]` = `t[1]`'s row where it counts, else 0 (each when given).
  /// Elements: `rows`, one step each.
  masking,
  /// `GlobalAveragePooling1D` over a mask: `t[2]` `(batch, width)` = the mean of `t[0]`
  /// `(batch, steps, width)` over the steps whose mask `t[1]` `(batch, steps)` is not 0.
  /// Elements: `batch * width`.
  masked_average,
  /// Its adjoint: `t[2]` `(batch, steps, width)` = `t[1]` `(batch, width)` over the count of
  /// unmasked steps at the steps whose mask `t[0]` is not 0, else 0. Elements: `batch * width`.
  masked_average_backward,
};

/// `Bidirectional`'s `merge_mode`.
enum class RecurrentMerge : std::uint32_t { concat, sum, mul, ave, none };

/// The sizes and options of one `recurrent_element` kernel (see `RecurrentOp` for what each
/// uses).
struct RecurrentKernel {
  RecurrentOp op = RecurrentOp::sequence_order;
  RecurrentMerge merge = RecurrentMerge::concat;
  RecurrentActivations activations;
  std::size_t batch = 0, steps = 0, units = 0, width = 0, rows = 0, count = 0, each = 0;
  /// `Bidirectional`'s backward direction's units.
  std::size_t second_units = 0;
  std::uint64_t first_stream = 0;
  double rate = 0.0;
  /// `Masking`'s `mask_value`.
  float value = 0.0F;
  bool reverse = false, to_batch_major = false, batch_major = false, reset_after = false,
       accumulate = false;
};

/// The tensors of one kernel, in `RecurrentOp`'s order (null where one is not given).
struct RecurrentTensors {
  static constexpr std::size_t max = 8;
  float* t[max] = {};
};

/// The length of the rows `recurrent_element` takes kernel `k`'s elements in: element `i` is
/// column `i % length` of row `i / length`.
LOADSTAR_HOST_DEVICE inline std::size_t recurrent_row_length(const RecurrentKernel& k) noexcept {
  switch (k.op) {
    case RecurrentOp::lstm_forward:
    case RecurrentOp::gru_reset_hidden:
    case RecurrentOp::gru_forward:
    case RecurrentOp::keep_masked:
    case RecurrentOp::lstm_backward:
    case RecurrentOp::gru_backward:
    case RecurrentOp::gru_backward_reset:
      return k.units;
    case RecurrentOp::dropout_masks:
      return k.each;
    case RecurrentOp::masking:
      return 1;
    case RecurrentOp::bidirectional_merge:
    case RecurrentOp::bidirectional_split:
      return k.merge == RecurrentMerge::concat || k.merge == RecurrentMerge::none
                 ? k.units + k.second_units
                 : k.units;
    default:
      return k.width;
  }
}

/// An op as a type (`with_recurrent_op`).
template <RecurrentOp Op>
struct OpConstant {
  static constexpr RecurrentOp value = Op;
};

/// Column `column` of row `row` (`recurrent_row_length`) of kernel `k` (whose `op` is `Op`)
/// over `tensors`; `key` is the dropout masks' key.
template <RecurrentOp Op>
LOADSTAR_HOST_DEVICE inline void recurrent_element_of(const RecurrentKernel& k,
                                                      const RecurrentTensors& tensors,
                                                      [[maybe_unused]] std::uint64_t key,
                                                      std::size_t row,
                                                      std::size_t column) noexcept {
  [[maybe_unused]] float* const* t = tensors.t;
  [[maybe_unused]] const std::size_t u = k.units, width = k.width;
  if constexpr (Op == RecurrentOp::sequence_order) {
    // Time-major step `s` of sample `b` is its batch-major position `s`, or `steps - 1 - s`
    // reversed.
    std::size_t source = 0;
    if (k.to_batch_major) {
      const std::size_t b = row / k.steps, position = row % k.steps;
      source = (k.reverse ? k.steps - 1 - position : position) * k.batch + b;
    } else {
      const std::size_t s = row / k.batch, b = row % k.batch;
      source = b * k.steps + (k.reverse ? k.steps - 1 - s : s);
    }
    t[1][row * width + column] = t[0][source * width + column];
    return;
  } else if constexpr (Op == RecurrentOp::reverse_steps) {
    const std::size_t b = row / k.steps, s = row % k.steps;
    t[1][row * width + column] = t[0][(b * k.steps + (k.steps - 1 - s)) * width + column];
    return;
  } else if constexpr (Op == RecurrentOp::lstm_forward) {
    const std::size_t i = row * u + column;
    lstm_forward(t[0] + row * width, u, column, t[1][i], k.activations, t[2][i], t[3][i]);
    return;
  } else if constexpr (Op == RecurrentOp::gru_reset_hidden) {
    const std::size_t i = row * u + column;
    t[3][i] = gru_reset(t[0] + row * width, t[1] + row * width, u, column, k.activations) *
              t[2][i] * (t[4] == nullptr ? 1.0F : t[4][i]);
    return;
  } else if constexpr (Op == RecurrentOp::gru_forward) {
    const std::size_t i = row * u + column, at = row * width;
    t[4][i] = gru_forward(t[0] + at, t[1] + at, t[2] + at, u, column, t[3][i], k.reset_after,
                          k.activations);
    return;
  } else if constexpr (Op == RecurrentOp::keep_masked) {
    if (t[0][row] != 0.0F) return;
    const std::size_t i = row * u + column;
    t[2][i] = t[1][i];
    if (t[4] != nullptr) t[4][i] = t[3][i];
    return;
  } else if constexpr (Op == RecurrentOp::zero_masked) {
    const std::size_t at = k.batch_major ? (row % k.steps) * k.batch + row / k.steps : row;
    if (t[0][at] == 0.0F) t[1][row * width + column] = 0.0F;
    return;
  } else if constexpr (Op == RecurrentOp::lstm_backward) {
    const std::size_t i = row * u + column;
    t[4][i] = lstm_backward(t[0] + row * width, u, column, t[1][i], t[2][i], t[3][i], t[4][i],
                            k.activations, t[5] + row * width);
    return;
  } else if constexpr (Op == RecurrentOp::gru_backward) {
    const std::size_t i = row * u + column, at = row * width;
    t[4][i] = gru_backward(t[0] + at, t[1] + at, t[2] + at, u, column, t[3][i], t[4][i],
                           k.reset_after, k.activations, t[5] + at, t[6] + at);
    if (!k.reset_after) {
      // Only the candidate's block reaches `(r * h_prev) U`.
      float* d = t[7] + at;
      d[column] = 0.0F;
      d[u + column] = 0.0F;
      d[2 * u + column] = t[5][at + 2 * u + column];
    }
    return;
  } else if constexpr (Op == RecurrentOp::gru_backward_reset) {
    const std::size_t i = row * u + column, at = row * width;
    const float dq = t[7] == nullptr ? t[3][i] : t[3][i] * t[7][i];
    t[6][i] += gru_backward_reset(t[0] + at, t[1] + at, u, column, t[2][i], dq, k.activations,
                                  t[4] + at, t[5] + at);
    return;
  } else if constexpr (Op == RecurrentOp::masked_backward) {
    if (t[0][row] != 0.0F) return;
    const std::size_t i = row * width + column;
    t[3][i] = 0.0F;
    if (t[6] != nullptr) t[6][i] = 0.0F;
    if (t[7] != nullptr) t[7][i] = 0.0F;
    if (column < u) {
      t[2][row * u + column] = t[1][row * u + column];
      if (t[5] != nullptr) t[5][row * u + column] = t[4][row * u + column];
    }
    return;
  } else if constexpr (Op == RecurrentOp::dropout_masks) {
    const std::uint64_t stream = mix64(key ^ mix64(k.first_stream + row));
    const auto scale = static_cast<float>(1.0 / (1.0 - k.rate));
    t[0][row * k.each + column] = dropout_keeps(stream, column, k.rate) ? scale : 0.0F;
    return;
  } else if constexpr (Op == RecurrentOp::apply_masks) {
    // Row `m * rows + r` of the dropped values.
    const std::size_t m = row / k.rows, r = row % k.rows;
    t[2][row * width + column] =
        t[0][r * width + column] * t[1][(m * k.batch + r % k.batch) * width + column];
    return;
  } else if constexpr (Op == RecurrentOp::masked_group_sum) {
    const std::size_t i = row * width + column;
    float sum = k.accumulate ? t[2][i] : 0.0F;
    for (std::size_t g = 0; g < k.count; ++g) {
      sum += t[0][(g * k.rows + row) * width + column] *
             t[1][(g * k.batch + row % k.batch) * width + column];
    }
    t[2][i] = sum;
    return;
  } else if constexpr (Op == RecurrentOp::bidirectional_merge) {
    const std::size_t ub = k.second_units;
    const std::size_t b = row / k.steps, s = row % k.steps;
    const float* f = t[0] + row * u;
    const float* r = t[1] + (b * k.steps + (k.steps - 1 - s)) * ub;
    switch (k.merge) {
      case RecurrentMerge::concat:
        t[2][row * (u + ub) + column] = column < u ? f[column] : r[column - u];
        return;
      case RecurrentMerge::none:
        if (column < u) {
          t[2][row * u + column] = f[column];
        } else {
          t[3][row * ub + column - u] = r[column - u];
        }
        return;
      case RecurrentMerge::sum:
        t[2][row * u + column] = f[column] + r[column];
        return;
      case RecurrentMerge::mul:
        t[2][row * u + column] = f[column] * r[column];
        return;
      case RecurrentMerge::ave:
        t[2][row * u + column] = (f[column] + r[column]) / 2.0F;
        return;
    }
    return;
  } else if constexpr (Op == RecurrentOp::bidirectional_split) {
    const std::size_t ub = k.second_units;
    const std::size_t b = row / k.steps, s = row % k.steps;
    const std::size_t fi = row * u, ri = (b * k.steps + (k.steps - 1 - s)) * ub;
    float* df = t[3];
    float* dr = t[4];
    if (k.merge == RecurrentMerge::concat || k.merge == RecurrentMerge::none) {
      const bool none = k.merge == RecurrentMerge::none;
      if (column < u) {
        if (df != nullptr) df[fi + column] = t[2][none ? fi + column : row * (u + ub) + column];
      } else if (dr != nullptr) {
        dr[ri + column - u] = none ? t[5][row * ub + column - u] : t[2][row * (u + ub) + column];
      }
      return;
    }
    const float dy = t[2][row * u + column];
    if (k.merge == RecurrentMerge::mul) {
      if (df != nullptr) df[fi + column] = dy * t[1][ri + column];
      if (dr != nullptr) dr[ri + column] = dy * t[0][fi + column];
    } else {
      const float d = k.merge == RecurrentMerge::sum ? dy : dy / 2.0F;
      if (df != nullptr) df[fi + column] = d;
      if (dr != nullptr) dr[ri + column] = d;
    }
    return;
  } else if constexpr (Op == RecurrentOp::token_mask) {
    const std::size_t i = row * width + column;
    t[1][i] = ::truncf(t[0][i]) != 0.0F ? 1.0F : 0.0F;
    return;
  } else if constexpr (Op == RecurrentOp::masking) {
    const float* x = t[0] + row * width;
    bool counts = false;
    for (std::size_t f = 0; f < width && !counts; ++f)
      counts = !(x[f] == k.value);
    if (t[3] != nullptr) t[3][row] = counts ? 1.0F : 0.0F;
    if (t[2] == nullptr) return;
    for (std::size_t f = 0; f < width; ++f)
      t[2][row * width + f] = counts ? t[1][row * width + f] : 0.0F;
    return;
  } else if constexpr (Op == RecurrentOp::masked_average) {
    // Keras: sum(where(mask, x, 0), steps) / sum(mask, steps), the steps in order.
    float sum = 0.0F, count = 0.0F;
    for (std::size_t s = 0; s < k.steps; ++s) {
      if (t[1][row * k.steps + s] == 0.0F) continue;
      count += 1.0F;
      sum += t[0][(row * k.steps + s) * width + column];
    }
    t[2][row * width + column] = sum / count;
    return;
  } else if constexpr (Op == RecurrentOp::masked_average_backward) {
    const float* m = t[0] + row * k.steps;
    float count = 0.0F;
    for (std::size_t s = 0; s < k.steps; ++s)
      count += m[s] != 0.0F ? 1.0F : 0.0F;
    const float dy = t[1][row * width + column];
    for (std::size_t s = 0; s < k.steps; ++s)
      t[2][(row * k.steps + s) * width + column] = m[s] != 0.0F ? dy / count : 0.0F;
    return;
  }
}

/// Calls `f` with kernel `k`'s op as a compile-time constant (`OpConstant`): on the device with
/// a device `f`, on the host with a host one (the host's loop, `recurrent_elements`).
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class F>
LOADSTAR_HOST_DEVICE inline void with_recurrent_op(RecurrentOp op, F&& f) noexcept {
  switch (op) {
    case RecurrentOp::sequence_order:
      f(OpConstant<RecurrentOp::sequence_order>{});
      return;
    case RecurrentOp::reverse_steps:
      f(OpConstant<RecurrentOp::reverse_steps>{});
      return;
    case RecurrentOp::lstm_forward:
      f(OpConstant<RecurrentOp::lstm_forward>{});
      return;
    case RecurrentOp::gru_reset_hidden:
      f(OpConstant<RecurrentOp::gru_reset_hidden>{});
      return;
    case RecurrentOp::gru_forward:
      f(OpConstant<RecurrentOp::gru_forward>{});
      return;
    case RecurrentOp::keep_masked:
      f(OpConstant<RecurrentOp::keep_masked>{});
      return;
    case RecurrentOp::zero_masked:
      f(OpConstant<RecurrentOp::zero_masked>{});
      return;
    case RecurrentOp::lstm_backward:
      f(OpConstant<RecurrentOp::lstm_backward>{});
      return;
    case RecurrentOp::gru_backward:
      f(OpConstant<RecurrentOp::gru_backward>{});
      return;
    case RecurrentOp::gru_backward_reset:
      f(OpConstant<RecurrentOp::gru_backward_reset>{});
      return;
    case RecurrentOp::masked_backward:
      f(OpConstant<RecurrentOp::masked_backward>{});
      return;
    case RecurrentOp::dropout_masks:
      f(OpConstant<RecurrentOp::dropout_masks>{});
      return;
    case RecurrentOp::apply_masks:
      f(OpConstant<RecurrentOp::apply_masks>{});
      return;
    case RecurrentOp::masked_group_sum:
      f(OpConstant<RecurrentOp::masked_group_sum>{});
      return;
    case RecurrentOp::bidirectional_merge:
      f(OpConstant<RecurrentOp::bidirectional_merge>{});
      return;
    case RecurrentOp::bidirectional_split:
      f(OpConstant<RecurrentOp::bidirectional_split>{});
      return;
    case RecurrentOp::token_mask:
      f(OpConstant<RecurrentOp::token_mask>{});
      return;
    case RecurrentOp::masking:
      f(OpConstant<RecurrentOp::masking>{});
      return;
    case RecurrentOp::masked_average:
      f(OpConstant<RecurrentOp::masked_average>{});
      return;
    case RecurrentOp::masked_average_backward:
      f(OpConstant<RecurrentOp::masked_average_backward>{});
      return;
  }
}

/// Column `column` of row `row` (`recurrent_row_length`) of kernel `k` over `tensors`.
LOADSTAR_HOST_DEVICE inline void recurrent_element(const RecurrentKernel& k,
                                                   const RecurrentTensors& tensors,
                                                   std::uint64_t key, std::size_t row,
                                                   std::size_t column) noexcept {
  with_recurrent_op(k.op, [&](auto op) {
    recurrent_element_of<decltype(op)::value>(k, tensors, key, row, column);
  });
}

/// Element `i` of kernel `k` (one device thread's work): column `i % length` of row
/// `i / length`.
LOADSTAR_HOST_DEVICE inline void recurrent_element(const RecurrentKernel& k,
                                                   const RecurrentTensors& tensors,
                                                   std::uint64_t key, std::size_t i) noexcept {
  const std::size_t length = recurrent_row_length(k);
  recurrent_element(k, tensors, key, i / length, i % length);
}

/// `rows` rows of `length` elements of kernel `k`, whose op is `Op`, in order: one function per
/// op (not inlined into the dispatch), so that the compiler inlines the op's formulas into its
/// loop.
template <RecurrentOp Op>
[[gnu::noinline]] void recurrent_rows(const RecurrentKernel& k, const RecurrentTensors& tensors,
                                      std::uint64_t key, std::size_t rows,
                                      std::size_t length) noexcept {
  for (std::size_t row = 0; row < rows; ++row)
    for (std::size_t column = 0; column < length; ++column)
      recurrent_element_of<Op>(k, tensors, key, row, column);
}

/// Every element of kernel `k` (`elements` of them) in order, row by row: the host's loop, the
/// op chosen once.
inline void recurrent_elements(const RecurrentKernel& k, const RecurrentTensors& tensors,
                               std::uint64_t key, std::size_t elements) noexcept {
  const std::size_t length = recurrent_row_length(k);
  if (length == 0) return;
  with_recurrent_op(k.op, [&](auto op) {
    recurrent_rows<decltype(op)::value>(k, tensors, key, elements / length, length);
  });
}

}  // namespace loadstar::keras::detail
