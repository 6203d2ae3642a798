/// \file
/// The per-element formulas of the attention layers (`MultiHeadAttention`, `Attention`,
/// `AdditiveAttention`): Keras's causal mask, the attention dropout's element index, and the
/// `tanh` score terms of `AdditiveAttention` and of `Attention(score_mode="concat")`. Host and
/// device code (`LOADSTAR_HOST_DEVICE`), so that a device kernel computes the same expressions.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

namespace loadstar::keras::detail {

/// The number of value steps query step `i` attends to among `value_steps`: Keras's causal mask
/// (`row_index >= col_index`, both counted from 1 by `cumsum`) keeps `j <= i`; without it, all.
LOADSTAR_HOST_DEVICE inline std::size_t attended_steps(std::size_t i, std::size_t value_steps,
                                                       bool causal) noexcept {
  if (!causal) return value_steps;
  return i + 1 < value_steps ? i + 1 : value_steps;
}

/// The element index the attention dropout draws for: probability `(b, h, i, j)` of scores
/// shaped `(batch, heads, query_steps, value_steps)`, row-major (`dropout_keeps`' counter).
LOADSTAR_HOST_DEVICE inline std::uint64_t attention_dropout_index(
    std::size_t b, std::size_t h, std::size_t i, std::size_t j, std::size_t heads,
    std::size_t query_steps, std::size_t value_steps) noexcept {
  return ((static_cast<std::uint64_t>(b) * heads + h) * query_steps + i) * value_steps + j;
}

/// One term `tanh(scale * (q + k))` of an additive score (Keras's `AdditiveAttention` sums
/// `scale[d] * tanh(q[d] + k[d])`; `Attention(score_mode="concat")` sums
/// `tanh(scale * (q[d] + k[d]))` times `concat_score_weight`).
LOADSTAR_HOST_DEVICE inline float additive_term(float q, float k, float scale) noexcept {
  return ::tanhf(scale * (q + k));
}

/// The derivative of `tanh` at the point whose value is `t`: `1 - t * t`.
LOADSTAR_HOST_DEVICE inline float tanh_slope(float t) noexcept {
  return 1.0F - t * t;
}

}  // namespace loadstar::keras::detail
