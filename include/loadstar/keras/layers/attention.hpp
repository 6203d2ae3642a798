/// \file
/// `Attention`: Keras's dot-product (Luong-style) attention layer.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/layers/detail/dense_attention.hpp"

namespace loadstar::keras::layers {

/// `Attention`'s Keras arguments, with Keras's defaults.
struct AttentionOptions {
  /// A trainable scalar `scale` (initialized to 1) multiplying the scores.
  bool use_scale = false;
  /// `"dot"`: scores `q k^T`; `"concat"`: `concat_score_weight * sum tanh(q + k)` over the
  /// features.
  std::string score_mode = "dot";
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

/// Keras's `Attention`, called on `[query, value]` or `[query, value, key]` of shapes
/// `(Tq, dim)`, `(Tv, value_dim)`, `(Tv, dim)`: `softmax(scores) * value`, of shape
/// `(Tq, value_dim)`. Weights: `scale` `()` with `use_scale`, then `concat_score_weight` `()`
/// with `score_mode="concat"`, both starting at 1.
/// \code
/// auto q = Input({8, 16}), v = Input({10, 16});
/// auto context = call(Attention({.use_scale = true}), {q, v});
/// \endcode
class Attention : public detail::DenseAttention {
 public:
  LOADSTAR_DECL explicit Attention(AttentionOptions options = {});

  std::string class_name() const override { return "Attention"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

namespace detail {
inline ScoreMode attention_score_mode(const std::string& mode) {
  if (mode == "dot") return ScoreMode::dot;
  if (mode == "concat") return ScoreMode::concat;
  throw ConfigError("attention layer: score_mode must be 'dot' or 'concat' but is '" + mode + "'");
}
}  // namespace detail

Attention::Attention(AttentionOptions options)
    : DenseAttention(detail::attention_score_mode(options.score_mode),
                     {.use_scale = options.use_scale,
                      .dropout = options.dropout,
                      .seed = options.seed,
                      .use_causal_mask = options.use_causal_mask,
                      .return_attention_scores = options.return_attention_scores,
                      .name = options.name}) {}

nlohmann::json Attention::get_config() const {
  auto config = attention_config();
  config["score_mode"] = score_mode() == detail::ScoreMode::dot ? "dot" : "concat";
  return config;
}

std::shared_ptr<Layer> Attention::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Attention");
  const detail::DenseAttentionOptions options = read_options(read, false);
  const std::string mode = read.get("score_mode", "dot");
  if (mode != "dot" && mode != "concat") read.fail("score_mode", "\"dot\" or \"concat\"");
  return detail::finish_layer(
      read, std::make_shared<Attention>(AttentionOptions{.use_scale = options.use_scale,
                                                         .score_mode = mode,
                                                         .dropout = options.dropout,
                                                         .seed = options.seed,
                                                         .use_causal_mask = options.use_causal_mask,
                                                         .name = options.name}));
}

}  // namespace loadstar::keras::layers
#endif
