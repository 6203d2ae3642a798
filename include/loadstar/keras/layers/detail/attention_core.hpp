/// \file
/// The attention computation the attention layers share (`MultiHeadAttention`, `Attention`,
/// `AdditiveAttention`): scores, Keras's causal mask, softmax over the value steps, dropout on
/// the probabilities and their product with the values, and the gradients of all of it. Host
/// code, run inside `Backend::host_kernel` (a device backend stages the tensors through the
/// host).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/detail/eigen.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/attention_formulas.hpp"
#include "loadstar/keras/detail/attention_rows.hpp"
#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/detail/layer_formulas.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/random.hpp"

namespace loadstar::keras::layers::detail {

using keras::detail::AttentionCall;
using keras::detail::AttentionShape;
using keras::detail::masked_softmax_row;

/// The key of a call's dropout on the probabilities: from `(seed or ctx.seed, ctx.step, the
/// layer's name)`, as `Dropout`'s, so that a training step's forward and backward (and a rerun)
/// draw the same mask.
inline std::uint64_t attention_dropout_key(std::optional<std::uint64_t> seed,
                                           const CallContext& ctx, const std::string& name) {
  return SplitMix64::mix(SplitMix64::mix(seed.value_or(ctx.seed)) ^
                         SplitMix64::mix(ctx.step + 0x3C6EF372FE94F82AULL) ^ stable_hash(name));
}

/// Reads the keyword arguments of an attention layer's call from a config (tensors taken out):
/// `use_causal_mask` (a boolean; `absent` when the call does not give it) into `causal`;
/// `training` (null: the model's), `mask` (null) and `return_attention_scores` (false) as
/// Keras's defaults; `return_attention_scores` into `*scores` (not null for every attention
/// layer). `attention_mask` and the `*_mask` arguments are refused by name, as is
/// any other argument. `seen` says whether an earlier call was read; a call whose
/// `use_causal_mask` or `return_attention_scores` differs from it is refused. Throws
/// `ConfigError` beginning with `where`.
inline void read_attention_kwargs(const nlohmann::json& kwargs, const std::string& where,
                                  bool absent, bool& causal, bool& seen, bool* scores,
                                  bool* attention_mask = nullptr) {
  bool this_causal = absent;
  bool this_scores = false;
  for (const auto& [key, value] : kwargs.items()) {
    if (key == "use_causal_mask") {
      if (!value.is_boolean()) {
        throw ConfigError(where + ": use_causal_mask: expected a boolean but found " +
                          value.dump());
      }
      this_causal = value.get<bool>();
    } else if ((key == "training" || key == "mask") && value.is_null()) {
      continue;
    } else if (key == "return_attention_scores") {
      if (!value.is_boolean()) {
        throw ConfigError(where + ": return_attention_scores: expected a boolean but found " +
                          value.dump());
      }
      this_scores = value.get<bool>();
    } else if (key == "attention_mask" && attention_mask != nullptr &&
               (value.is_null() || keras::detail::is_tensor_reference(value))) {
      // A tensor: the call's last input (MultiHeadAttention's `attention_mask`).
      *attention_mask = !value.is_null();
    } else if (key == "attention_mask" || key == "query_mask" || key == "value_mask" ||
               key == "key_mask" || key == "mask") {
      throw ConfigError(where + ": the call argument '" + key +
                        "' is not supported (loadstar's attention layers take no masks; "
                        "use_causal_mask is)");
    } else {
      throw ConfigError(where + ": unknown call argument '" + key + "'");
    }
  }
  if (seen && this_causal != causal) {
    throw ConfigError(where + ": use_causal_mask is " + (this_causal ? "true" : "false") +
                      " but an earlier call of the layer has " + (causal ? "true" : "false") +
                      " (loadstar applies one use_causal_mask to every call of a layer)");
  }
  if (scores != nullptr && seen && this_scores != *scores) {
    throw ConfigError(where + ": return_attention_scores is " + (this_scores ? "true" : "false") +
                      " but an earlier call of the layer has " + (*scores ? "true" : "false") +
                      " (loadstar applies one return_attention_scores to every call of a layer)");
  }
  causal = this_causal;
  if (scores != nullptr) *scores = this_scores;
  seen = true;
}

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstStridedMatrix = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;
using StridedMatrix = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;

/// Head `h` of sample `b` of a `(batch, steps, heads, dim)` tensor: a `steps x dim` matrix whose
/// rows are `heads * dim` apart.
inline ConstStridedMatrix head_of(const float* data, std::size_t b, std::size_t h,
                                  std::size_t steps, std::size_t heads, std::size_t dim) {
  return ConstStridedMatrix(data + (b * steps * heads + h) * dim, Eigen::Index(steps),
                            Eigen::Index(dim), Eigen::OuterStride<>(Eigen::Index(heads * dim)));
}
inline StridedMatrix head_of(float* data, std::size_t b, std::size_t h, std::size_t steps,
                             std::size_t heads, std::size_t dim) {
  return StridedMatrix(data + (b * steps * heads + h) * dim, Eigen::Index(steps), Eigen::Index(dim),
                       Eigen::OuterStride<>(Eigen::Index(heads * dim)));
}

/// The scaled dot-product score `scale * q k^T` (`MultiHeadAttention` with `1 / sqrt(key_dim)`,
/// `Attention` with its `scale` weight or 1) and its gradients.
struct DotScore {
  float scale = 1.0F;
  /// Where the gradient of `scale` is added (a trainable scale), or null.
  double* scale_gradient = nullptr;

  void scores(const ConstStridedMatrix& q, const ConstStridedMatrix& k, RowMatrix& s) const {
    s.noalias() = q * k.transpose();
    s *= scale;
  }
  /// Adds the gradients of the queries and keys for the score gradient `ds`.
  void gradient(const ConstStridedMatrix& q, const ConstStridedMatrix& k, const RowMatrix& ds,
                StridedMatrix& dq, StridedMatrix& dk) const {
    if (dq.size() > 0) dq.noalias() += scale * (ds * k);
    if (dk.size() > 0) dk.noalias() += scale * (ds.transpose() * q);
    if (scale_gradient != nullptr) {
      const RowMatrix raw = q * k.transpose();
      *scale_gradient += static_cast<double>((ds.array() * raw.array()).sum());
    }
  }
};

/// The additive score `weight * sum_d w[d] * tanh(scale * (q[d] + k[d]))`: `AdditiveAttention`
/// (`w` its `scale` weight or ones, `scale` and `weight` 1) and `Attention(score_mode="concat")`
/// (`w` ones, `scale` its scale weight or 1, `weight` its `concat_score_weight`).
struct AdditiveScore {
  /// The per-feature weights `w` (null: ones).
  const float* feature_weights = nullptr;
  float scale = 1.0F;
  float weight = 1.0F;
  /// Where the gradients of `w` (per feature), `scale` and `weight` are added, or null.
  double* feature_gradients = nullptr;
  double* scale_gradient = nullptr;
  double* weight_gradient = nullptr;

  void scores(const ConstStridedMatrix& q, const ConstStridedMatrix& k, RowMatrix& s) const {
    for (Eigen::Index i = 0; i < s.rows(); ++i) {
      for (Eigen::Index j = 0; j < s.cols(); ++j) {
        double sum = 0.0;
        for (Eigen::Index d = 0; d < q.cols(); ++d) {
          const float t = keras::detail::additive_term(q(i, d), k(j, d), scale);
          sum += static_cast<double>(feature_weights == nullptr ? t : feature_weights[d] * t);
        }
        s(i, j) = weight * static_cast<float>(sum);
      }
    }
  }
  void gradient(const ConstStridedMatrix& q, const ConstStridedMatrix& k, const RowMatrix& ds,
                StridedMatrix& dq, StridedMatrix& dk) const {
    for (Eigen::Index i = 0; i < ds.rows(); ++i) {
      for (Eigen::Index j = 0; j < ds.cols(); ++j) {
        const float g = ds(i, j);
        if (g == 0.0F) continue;
        double sum = 0.0;
        for (Eigen::Index d = 0; d < q.cols(); ++d) {
          const float t = keras::detail::additive_term(q(i, d), k(j, d), scale);
          const float w = feature_weights == nullptr ? 1.0F : feature_weights[d];
          sum += static_cast<double>(w * t);
          if (feature_gradients != nullptr) feature_gradients[d] += double(g) * weight * t;
          // d score / d (scale * (q + k)) for this feature.
          const float inner = g * weight * w * keras::detail::tanh_slope(t);
          if (dq.size() > 0) dq(i, d) += inner * scale;
          if (dk.size() > 0) dk(j, d) += inner * scale;
          if (scale_gradient != nullptr) *scale_gradient += double(inner) * (q(i, d) + k(j, d));
        }
        if (weight_gradient != nullptr) *weight_gradient += double(g) * sum;
      }
    }
  }
};

/// Writes `out` and the probabilities (`probabilities`, before dropout) of attention over
/// `q`, `k`, `v` (host pointers in the layouts of `AttentionShape`); with a null `out`, only the
/// probabilities.
template <class Score>
void attention_forward(const AttentionShape& s, const AttentionCall& call, const Score& score,
                       const float* q, const float* k, const float* v, float* probabilities,
                       float* out) {
  RowMatrix scores(Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
  const float keep_scale = call.drops() ? 1.0F / (1.0F - call.rate) : 1.0F;
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const auto qh = head_of(q, b, h, s.query_steps, s.heads, s.key_dim);
      const auto kh = head_of(k, b, h, s.value_steps, s.heads, s.key_dim);
      const auto vh = head_of(v, b, h, s.value_steps, s.heads, s.value_dim);
      score.scores(qh, kh, scores);
      float* p = probabilities + (b * s.heads + h) * s.query_steps * s.value_steps;
      for (std::size_t i = 0; i < s.query_steps; ++i) {
        // Masked positions get probability 0: Keras adds -1e9 to their scores, which `exp`
        // takes to 0 in float.
        const std::size_t n = keras::detail::attended_steps(i, s.value_steps, call.causal);
        float* row = p + i * s.value_steps;
        if (call.masked()) {
          masked_softmax_row(call, b, i, s.query_steps, s.value_steps, n,
                             scores.data() + i * s.value_steps, row);
          continue;
        }
        keras::detail::softmax_forward_line(scores.data() + i * s.value_steps, row, n, 1, 0);
        std::fill(row + n, row + s.value_steps, 0.0F);
      }
      if (out == nullptr) continue;
      Eigen::Map<RowMatrix> ph(p, Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
      auto oh = head_of(out, b, h, s.query_steps, s.heads, s.value_dim);
      if (call.drops()) {
        RowMatrix dropped = ph;
        for (std::size_t i = 0; i < s.query_steps; ++i)
          for (std::size_t j = 0; j < s.value_steps; ++j)
            dropped(Eigen::Index(i), Eigen::Index(j)) *=
                keras::detail::dropout_keeps(call.key,
                                             keras::detail::attention_dropout_index(
                                                 b, h, i, j, s.heads, s.query_steps, s.value_steps),
                                             call.rate)
                    ? keep_scale
                    : 0.0F;
        oh.noalias() = dropped * vh;
      } else {
        oh.noalias() = ph * vh;
      }
      for (std::size_t i = 0; call.query_mask != nullptr && i < s.query_steps; ++i)
        if (call.zeroes_query(b, i, s.query_steps)) oh.row(Eigen::Index(i)).setZero();
    }
  }
}

/// Adds the gradients of `q`, `k` and `v` (`dq`, `dk`, `dv`; a null one is not needed) for the
/// output gradient `dout`, given the probabilities `attention_forward` wrote for the same call;
/// `dprobabilities` (null: none) is the gradient of the probabilities themselves, when the call
/// returns them as its attention scores.
template <class Score>
void attention_backward(const AttentionShape& s, const AttentionCall& call, const Score& score,
                        const float* q, const float* k, const float* v, const float* probabilities,
                        const float* dout, float* dq, float* dk, float* dv,
                        const float* dprobabilities = nullptr) {
  RowMatrix dp(Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
  RowMatrix ds(Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
  RowMatrix dropped, zeroed;
  const float keep_scale = call.drops() ? 1.0F / (1.0F - call.rate) : 1.0F;
  const auto keeps = [&](std::size_t b, std::size_t h, std::size_t i, std::size_t j) {
    return keras::detail::dropout_keeps(
        call.key,
        keras::detail::attention_dropout_index(b, h, i, j, s.heads, s.query_steps, s.value_steps),
        call.rate);
  };
  for (std::size_t b = 0; b < s.batch; ++b) {
    for (std::size_t h = 0; h < s.heads; ++h) {
      const auto qh = head_of(q, b, h, s.query_steps, s.heads, s.key_dim);
      const auto kh = head_of(k, b, h, s.value_steps, s.heads, s.key_dim);
      const auto vh = head_of(v, b, h, s.value_steps, s.heads, s.value_dim);
      ConstStridedMatrix doh = head_of(dout, b, h, s.query_steps, s.heads, s.value_dim);
      if (call.query_mask != nullptr && !call.query_mask_in_scores) {
        // A zeroed output passes no gradient back.
        zeroed = doh;
        for (std::size_t i = 0; i < s.query_steps; ++i)
          if (call.zeroes_query(b, i, s.query_steps)) zeroed.row(Eigen::Index(i)).setZero();
        new (&doh) ConstStridedMatrix(zeroed.data(), zeroed.rows(), zeroed.cols(),
                                      Eigen::OuterStride<>(zeroed.cols()));
      }
      const float* p = probabilities + (b * s.heads + h) * s.query_steps * s.value_steps;
      Eigen::Map<const RowMatrix> ph(p, Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
      // out = drop(p) v: dv += drop(p)^T dout; d drop(p) = dout v^T; dp = drop(d drop(p)).
      dropped = ph;
      if (call.drops()) {
        for (std::size_t i = 0; i < s.query_steps; ++i)
          for (std::size_t j = 0; j < s.value_steps; ++j)
            dropped(Eigen::Index(i), Eigen::Index(j)) *= keeps(b, h, i, j) ? keep_scale : 0.0F;
      }
      if (dv != nullptr) {
        auto dvh = head_of(dv, b, h, s.value_steps, s.heads, s.value_dim);
        dvh.noalias() += dropped.transpose() * doh;
      }
      dp.noalias() = doh * vh.transpose();
      const auto returned_gradient = [&] {
        return Eigen::Map<const RowMatrix>(
            dprobabilities + (b * s.heads + h) * s.query_steps * s.value_steps,
            Eigen::Index(s.query_steps), Eigen::Index(s.value_steps));
      };
      // Scores returned after dropout take their gradient through the dropout mask.
      if (dprobabilities != nullptr && call.scores_after_dropout) dp += returned_gradient();
      if (call.drops()) {
        for (std::size_t i = 0; i < s.query_steps; ++i)
          for (std::size_t j = 0; j < s.value_steps; ++j)
            dp(Eigen::Index(i), Eigen::Index(j)) *= keeps(b, h, i, j) ? keep_scale : 0.0F;
      }
      // Scores returned before dropout take their own gradient.
      if (dprobabilities != nullptr && !call.scores_after_dropout) dp += returned_gradient();
      // Softmax along each row (masked positions have p = 0, so their score gradient is 0).
      for (std::size_t i = 0; i < s.query_steps; ++i)
        keras::detail::softmax_backward_line(p + i * s.value_steps, dp.data() + i * s.value_steps,
                                             ds.data() + i * s.value_steps, s.value_steps, 1, 0);
      StridedMatrix dqh(nullptr, 0, 0, Eigen::OuterStride<>(1));
      StridedMatrix dkh(nullptr, 0, 0, Eigen::OuterStride<>(1));
      if (dq != nullptr)
        new (&dqh) StridedMatrix(head_of(dq, b, h, s.query_steps, s.heads, s.key_dim));
      if (dk != nullptr)
        new (&dkh) StridedMatrix(head_of(dk, b, h, s.value_steps, s.heads, s.key_dim));
      score.gradient(qh, kh, ds, dqh, dkh);
    }
  }
}

}  // namespace loadstar::keras::layers::detail
