/// \file
/// The attention computation of `MultiHeadAttention` and `Attention` (dot-product scores) one row
/// at a time: its sizes and call (`AttentionShape`, `AttentionCall`), the masked softmax of a row
/// of scores, and each query row's output and gradients and each key row's gradients, as
/// `__host__ __device__` functions. The CPU computes attention with Eigen's products per head
/// (keras/layers/detail/attention_core.hpp), calling `masked_softmax_row` for its rows; the CUDA
/// backend runs these functions, a device thread per row (`Backend::attention_forward`).
/// Dependency-free but for the formulas it calls.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loadstar/keras/detail/attention_formulas.hpp"
#include "loadstar/keras/detail/layer_formulas.hpp"

namespace loadstar::keras::detail {

/// The sizes of one attention call. Queries are `(batch, query_steps, heads, key_dim)`, keys
/// `(batch, value_steps, heads, key_dim)`, values `(batch, value_steps, heads, value_dim)` and
/// the output `(batch, query_steps, heads, value_dim)`, all row-major (what a projection to
/// `heads * dim` columns gives); the probabilities are `(batch, heads, query_steps,
/// value_steps)`, Keras's attention scores.
struct AttentionShape {
  std::size_t batch = 1;
  std::size_t heads = 1;
  std::size_t query_steps = 1;
  std::size_t value_steps = 1;
  std::size_t key_dim = 1;
  std::size_t value_dim = 1;

  LOADSTAR_HOST_DEVICE std::size_t probabilities() const noexcept {
    return batch * heads * query_steps * value_steps;
  }
};

/// What one call asks beyond the tensors: Keras's `use_causal_mask`, and the dropout on the
/// probabilities (inverted dropout at `rate` under `key`, in training only).
struct AttentionCall {
  bool causal = false;
  float rate = 0.0F;
  bool training = false;
  std::uint64_t key = 0;
  /// Keras's masks of the inputs (host pointers to 1 or 0; null where an input has none): the
  /// queries' `(batch, query_steps)`, the values' and the keys' `(batch, value_steps)`. A masked
  /// value or key step is not attended to (Keras subtracts 1e9 from its scores).
  const float* query_mask = nullptr;
  const float* value_mask = nullptr;
  const float* key_mask = nullptr;
  /// Keras's `attention_mask` of `MultiHeadAttention`'s call (host pointer; null: none):
  /// `(batch, query_steps, value_steps)`, 0 where query step `i` does not attend to value step
  /// `j`.
  const float* attention_mask = nullptr;
  /// How a masked query is treated: `MultiHeadAttention` joins the query's mask to the attention
  /// mask (its row attends to nothing), `Attention` and `AdditiveAttention` zero its output.
  bool query_mask_in_scores = false;
  /// Which probabilities a call returns as its attention scores: those after dropout
  /// (`Attention` and `AdditiveAttention`, whose Keras `_apply_scores` returns the weights it
  /// applied) or before (`MultiHeadAttention`).
  bool scores_after_dropout = false;

  LOADSTAR_HOST_DEVICE bool drops() const noexcept { return training && rate > 0.0F; }
  LOADSTAR_HOST_DEVICE bool masked() const noexcept {
    return query_mask != nullptr || value_mask != nullptr || key_mask != nullptr ||
           attention_mask != nullptr;
  }
  /// Whether the output of query `i` of sample `b` is zeroed (`Attention`'s masked query).
  LOADSTAR_HOST_DEVICE bool zeroes_query(std::size_t b, std::size_t i,
                                         std::size_t query_steps) const noexcept {
    return query_mask != nullptr && !query_mask_in_scores &&
           query_mask[b * query_steps + i] == 0.0F;
  }
};

/// The probabilities of row `i` of sample `b` with the call's masks: Keras's softmax of the
/// scores less 1e9 where a step is masked (causal, value, key or, for `MultiHeadAttention`,
/// query), whose masked steps come out 0. A row with every step masked takes equal
/// probabilities, as Keras's float32 arithmetic gives them (the scores less 1e9 round to the same
/// number for scores under 32 in magnitude).
/// Whether row `i` of sample `b` attends to value step `j` (of the `n` it may, causally).
LOADSTAR_HOST_DEVICE inline bool attention_allowed(const AttentionCall& call, std::size_t b,
                                                   std::size_t i, std::size_t j,
                                                   std::size_t query_steps, std::size_t value_steps,
                                                   std::size_t n, bool query_out) noexcept {
  return j < n && !query_out &&
         (call.value_mask == nullptr || call.value_mask[b * value_steps + j] != 0.0F) &&
         (call.key_mask == nullptr || call.key_mask[b * value_steps + j] != 0.0F) &&
         (call.attention_mask == nullptr ||
          call.attention_mask[(b * query_steps + i) * value_steps + j] != 0.0F);
}

LOADSTAR_HOST_DEVICE inline void masked_softmax_row(const AttentionCall& call, std::size_t b,
                                                    std::size_t i, std::size_t query_steps,
                                                    std::size_t value_steps, std::size_t n,
                                                    const float* scores, float* row) noexcept {
  const bool query_out = call.query_mask != nullptr && call.query_mask_in_scores &&
                         call.query_mask[b * query_steps + i] == 0.0F;
  float top = -INFINITY;
  std::size_t count = 0;
  for (std::size_t j = 0; j < value_steps; ++j) {
    if (!attention_allowed(call, b, i, j, query_steps, value_steps, n, query_out)) continue;
    top = max_of(top, scores[j]);
    ++count;
  }
  if (count == 0) {
    for (std::size_t j = 0; j < value_steps; ++j)
      row[j] = 1.0F / static_cast<float>(value_steps);
    return;
  }
  float sum = 0.0F;
  for (std::size_t j = 0; j < value_steps; ++j) {
    row[j] = attention_allowed(call, b, i, j, query_steps, value_steps, n, query_out)
                 ? ::expf(scores[j] - top)
                 : 0.0F;
    sum += row[j];
  }
  for (std::size_t j = 0; j < value_steps; ++j)
    row[j] /= sum;
}

/// The keep scale of probability `(b, h, i, j)` under the call's dropout (1 without).
LOADSTAR_HOST_DEVICE inline float attention_keep(const AttentionShape& s, const AttentionCall& call,
                                                 std::uint64_t key, std::size_t b, std::size_t h,
                                                 std::size_t i, std::size_t j) noexcept {
  if (!call.drops()) return 1.0F;
  const bool keeps = dropout_keeps(
      key, attention_dropout_index(b, h, i, j, s.heads, s.query_steps, s.value_steps), call.rate);
  return keeps ? 1.0F / (1.0F - call.rate) : 0.0F;
}

/// Query row `i` of head `h` of sample `b`: its scores `scale * q k^T` and probabilities into
/// `probabilities` (before dropout), and, when `out` is not null, its output `sum_j drop(p_j)
/// v_j` (0 for a query `Attention` zeroes). `key` is the dropout's key (`call.key`'s value).
LOADSTAR_HOST_DEVICE inline void attention_forward_row(
    const AttentionShape& s, const AttentionCall& call, float scale, std::uint64_t key,
    const float* q, const float* k, const float* v, float* probabilities, float* out, std::size_t b,
    std::size_t h, std::size_t i) noexcept {
  const std::size_t hq = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  const float* qi = q + (b * s.query_steps + i) * hq + h * s.key_dim;
  float* row = probabilities + ((b * s.heads + h) * s.query_steps + i) * s.value_steps;
  for (std::size_t j = 0; j < s.value_steps; ++j) {
    const float* kj = k + (b * s.value_steps + j) * hq + h * s.key_dim;
    float dot = 0.0F;
    for (std::size_t d = 0; d < s.key_dim; ++d)
      dot += qi[d] * kj[d];
    row[j] = dot * scale;
  }
  // Masked positions get probability 0: Keras adds -1e9 to their scores.
  const std::size_t n = attended_steps(i, s.value_steps, call.causal);
  if (call.masked()) {
    masked_softmax_row(call, b, i, s.query_steps, s.value_steps, n, row, row);
  } else {
    softmax_forward_line(row, row, n, 1, 0);
    for (std::size_t j = n; j < s.value_steps; ++j)
      row[j] = 0.0F;
  }
  if (out == nullptr) return;
  float* oi = out + (b * s.query_steps + i) * hv + h * s.value_dim;
  const bool zero = call.zeroes_query(b, i, s.query_steps);
  for (std::size_t e = 0; e < s.value_dim; ++e)
    oi[e] = 0.0F;
  if (zero) return;
  for (std::size_t j = 0; j < s.value_steps; ++j) {
    const float pj = row[j] * attention_keep(s, call, key, b, h, i, j);
    if (pj == 0.0F) continue;
    const float* vj = v + (b * s.value_steps + j) * hv + h * s.value_dim;
    for (std::size_t e = 0; e < s.value_dim; ++e)
      oi[e] += pj * vj[e];
  }
}

/// The backward pass of query row `i` (head `h`, sample `b`): the scores' gradient into
/// `scores_gradient` (laid out as the probabilities), from the output's gradient `dout` and,
/// when not null, the returned probabilities' `dprobabilities`; and `scale * ds k` added to the
/// query's gradient `dq` (when not null).
LOADSTAR_HOST_DEVICE inline void attention_query_gradient_row(
    const AttentionShape& s, const AttentionCall& call, float scale, std::uint64_t key,
    const float* k, const float* v, const float* probabilities, const float* dout,
    const float* dprobabilities, float* scores_gradient, float* dq, std::size_t b, std::size_t h,
    std::size_t i) noexcept {
  const std::size_t hq = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  const std::size_t at = ((b * s.heads + h) * s.query_steps + i) * s.value_steps;
  const float* p = probabilities + at;
  float* ds = scores_gradient + at;
  // A zeroed output passes no gradient back.
  const bool zero = call.zeroes_query(b, i, s.query_steps);
  const float* doi = dout + (b * s.query_steps + i) * hv + h * s.value_dim;
  for (std::size_t j = 0; j < s.value_steps; ++j) {
    // d drop(p) = dout v^T; dp = drop(d drop(p)), with a returned probability's own gradient
    // before or after the dropout as the call returns them.
    float dpd = 0.0F;
    if (!zero) {
      const float* vj = v + (b * s.value_steps + j) * hv + h * s.value_dim;
      for (std::size_t e = 0; e < s.value_dim; ++e)
        dpd += doi[e] * vj[e];
    }
    if (dprobabilities != nullptr && call.scores_after_dropout) dpd += dprobabilities[at + j];
    float dp = dpd * attention_keep(s, call, key, b, h, i, j);
    if (dprobabilities != nullptr && !call.scores_after_dropout) dp += dprobabilities[at + j];
    ds[j] = dp;
  }
  // Softmax along the row (masked positions have p = 0, so their score gradient is 0).
  softmax_backward_line(p, ds, ds, s.value_steps, 1, 0);
  if (dq == nullptr) return;
  float* dqi = dq + (b * s.query_steps + i) * hq + h * s.key_dim;
  for (std::size_t j = 0; j < s.value_steps; ++j) {
    const float g = scale * ds[j];
    if (g == 0.0F) continue;
    const float* kj = k + (b * s.value_steps + j) * hq + h * s.key_dim;
    for (std::size_t d = 0; d < s.key_dim; ++d)
      dqi[d] += g * kj[d];
  }
}

/// The backward pass of key and value row `j` (head `h`, sample `b`), after every query row's
/// `attention_query_gradient_row`: `scale * ds^T q` added to the key's gradient `dk` and
/// `drop(p)^T dout` to the value's `dv` (each when not null).
LOADSTAR_HOST_DEVICE inline void attention_key_gradient_row(
    const AttentionShape& s, const AttentionCall& call, float scale, std::uint64_t key,
    const float* q, const float* probabilities, const float* dout, const float* scores_gradient,
    float* dk, float* dv, std::size_t b, std::size_t h, std::size_t j) noexcept {
  const std::size_t hq = s.heads * s.key_dim, hv = s.heads * s.value_dim;
  float* dkj = dk == nullptr ? nullptr : dk + (b * s.value_steps + j) * hq + h * s.key_dim;
  float* dvj = dv == nullptr ? nullptr : dv + (b * s.value_steps + j) * hv + h * s.value_dim;
  for (std::size_t i = 0; i < s.query_steps; ++i) {
    const std::size_t at = ((b * s.heads + h) * s.query_steps + i) * s.value_steps + j;
    if (dkj != nullptr) {
      const float g = scale * scores_gradient[at];
      const float* qi = q + (b * s.query_steps + i) * hq + h * s.key_dim;
      if (g != 0.0F)
        for (std::size_t d = 0; d < s.key_dim; ++d)
          dkj[d] += g * qi[d];
    }
    if (dvj != nullptr && !call.zeroes_query(b, i, s.query_steps)) {
      const float pd = probabilities[at] * attention_keep(s, call, key, b, h, i, j);
      const float* doi = dout + (b * s.query_steps + i) * hv + h * s.value_dim;
      if (pd != 0.0F)
        for (std::size_t e = 0; e < s.value_dim; ++e)
          dvj[e] += pd * doi[e];
    }
  }
}

}  // namespace loadstar::keras::detail
