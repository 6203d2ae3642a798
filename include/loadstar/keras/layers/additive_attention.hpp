/// \file
/// `AdditiveAttention`: Keras's additive (Bahdanau-style) attention layer.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/layers/detail/dense_attention.hpp"

namespace loadstar::keras::layers {

/// `AdditiveAttention`'s Keras arguments, with Keras's defaults.
struct AdditiveAttentionOptions {
  /// A trainable `scale` `(dim,)` (glorot_uniform) weighting the features of the scores.
  bool use_scale = true;
  /// Dropout on the attention probabilities, in training.
  float dropout = 0.0F;
  /// The dropout's seed (null: the model's).
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Keras's call argument `use_causal_mask`, applied to every call of the layer.
  bool use_causal_mask = false;
  /// Keras's call argument `return_attention_scores`, applied to every call of the layer: the
  /// output, then the attention distribution `(Tq, Tv)` it applied (after dropout in training,
  /// as in Keras); call the layer with `call_outputs`.
  bool return_attention_scores = false;
  std::string name = {};
};

/// Keras's `AdditiveAttention`, called on `[query, value]` or `[query, value, key]` of shapes
/// `(Tq, dim)`, `(Tv, value_dim)`, `(Tv, dim)`: scores `sum_d scale[d] * tanh(q[d] + k[d])`,
/// then `softmax(scores) * value`, of shape `(Tq, value_dim)`. Weight: `scale` `(dim,)` with
/// `use_scale`.
/// \code
/// auto q = Input({8, 16}), v = Input({10, 16});
/// auto context = call(AdditiveAttention(), {q, v});
/// \endcode
class AdditiveAttention : public detail::DenseAttention {
 public:
  LOADSTAR_DECL explicit AdditiveAttention(AdditiveAttentionOptions options = {});

  std::string class_name() const override { return "AdditiveAttention"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

AdditiveAttention::AdditiveAttention(AdditiveAttentionOptions options)
    : DenseAttention(detail::ScoreMode::additive,
                     {.use_scale = options.use_scale,
                      .dropout = options.dropout,
                      .seed = options.seed,
                      .use_causal_mask = options.use_causal_mask,
                      .return_attention_scores = options.return_attention_scores,
                      .name = options.name}) {}

nlohmann::json AdditiveAttention::get_config() const {
  return attention_config();
}

std::shared_ptr<Layer> AdditiveAttention::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "AdditiveAttention");
  read.expect("score_mode", "dot", "AdditiveAttention has additive scores");
  const detail::DenseAttentionOptions options = read_options(read, true);
  return detail::finish_layer(read, std::make_shared<AdditiveAttention>(AdditiveAttentionOptions{
                                        .use_scale = options.use_scale,
                                        .dropout = options.dropout,
                                        .seed = options.seed,
                                        .use_causal_mask = options.use_causal_mask,
                                        .name = options.name}));
}

}  // namespace loadstar::keras::layers
#endif
