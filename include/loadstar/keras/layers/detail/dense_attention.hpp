/// \file
/// `DenseAttention`: what Keras's `Attention` and `AdditiveAttention` share (tf.keras 2's
/// `BaseDenseAttention`): a call on `[query, value]` or `[query, value, key]`, scores, softmax
/// over the value steps with dropout in training, and the scores applied to the values.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/layers/detail/attention_core.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// How the scores of a `DenseAttention` are computed.
enum class ScoreMode {
  /// `Attention(score_mode="dot")`: `scale * q k^T` (`scale` its weight, or 1).
  dot,
  /// `Attention(score_mode="concat")`: `concat_score_weight * sum tanh(scale * (q + k))`.
  concat,
  /// `AdditiveAttention`: `sum scale[d] * tanh(q[d] + k[d])` (`scale` its weight, or ones).
  additive,
};

/// The options `Attention` and `AdditiveAttention` share, with Keras's defaults (`use_scale`'s
/// differs: each class sets it).
struct DenseAttentionOptions {
  bool use_scale = false;
  /// Dropout on the attention probabilities, in training.
  float dropout = 0.0F;
  /// The dropout's seed (null: the model's).
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Keras's call argument `use_causal_mask`, applied to every call of the layer.
  bool use_causal_mask = false;
  /// Keras's call argument `return_attention_scores`, applied to every call of the layer: the
  /// call returns the output, then the attention distribution `(Tq, Tv)` it applied (after
  /// dropout in training, as Keras's `_apply_scores` returns it); call it with `call_outputs`.
  bool return_attention_scores = false;
  std::string name = {};
};

/// Keras's attention over `[query, value]` or `[query, value, key]` (the key is the value when
/// absent) of shapes `(Tq, dim)`, `(Tv, value_dim)` and `(Tv, dim)`: the output is
/// `softmax(scores(query, key))` (over the value steps, with dropout in training) times the
/// values, of shape `(Tq, value_dim)`.
class DenseAttention : public LayerBase, public keras::detail::CallArguments {
 public:
  /// Keras's masks: masked value steps are not attended to, masked queries' outputs are 0, and
  /// the output has the query's mask.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  bool reads_masks() const noexcept override { return true; }
  LOADSTAR_DECL DenseAttention(ScoreMode mode, DenseAttentionOptions options);

  ScoreMode score_mode() const noexcept { return mode_; }
  const DenseAttentionOptions& options() const noexcept { return options_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Steps of unknown length (a text model's), the features known.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return Shape{input_shapes[0][0], value_features_};
  }
  /// With `return_attention_scores`: the output, then the scores.
  std::size_t output_count() const noexcept override {
    return options_.return_attention_scores ? 2 : 1;
  }
  std::vector<Shape> extra_output_shapes(std::span<const Shape> input_shapes) const override {
    if (!options_.return_attention_scores) return {};
    return {Shape{input_shapes[0][0], input_shapes[1][0]}};
  }
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  std::vector<std::string> tensor_arguments() const override { return {}; }
  LOADSTAR_DECL nlohmann::json call_kwargs() const override;
  LOADSTAR_DECL void apply_call_kwargs(const nlohmann::json& kwargs,
                                       const std::string& where) override;

 protected:
  /// The keys of both classes' configs: `use_scale`, `dropout`, `seed`.
  LOADSTAR_DECL nlohmann::json attention_config() const;
  /// Reads `use_scale` (default `use_scale`), `dropout` and `seed` of a config.
  LOADSTAR_DECL static DenseAttentionOptions read_options(const ConfigReader& read, bool use_scale);

 private:
  LOADSTAR_DECL AttentionShape geometry(std::size_t batch) const;
  /// The forward pass of `staged_` on the backend's own attention kernels, for dot-product
  /// scores of a fixed scale (Keras's default); `false` where the host computes it.
  LOADSTAR_DECL bool device_attention(Backend& backend, const AttentionShape& s,
                                      const AttentionCall& call);

  ScoreMode mode_;
  DenseAttentionOptions options_;
  bool constructed_causal_;
  bool kwargs_seen_ = false;
  std::size_t query_steps_ = 0, value_steps_ = 0, features_ = 0, value_features_ = 0;
  Scratch probabilities_, zero_gradient_, key_gradient_;
  std::vector<Tensor<float>> staged_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

DenseAttention::DenseAttention(ScoreMode mode, DenseAttentionOptions options)
    : LayerBase(options.name),
      mode_(mode),
      options_(std::move(options)),
      constructed_causal_(options_.use_causal_mask) {
  if (!(options_.dropout >= 0.0F && options_.dropout < 1.0F)) {
    throw ConfigError(label() + ": dropout must be in [0, 1) but is " +
                      std::to_string(options_.dropout));
  }
}

Shape DenseAttention::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  if (input_shapes.size() != 2 && input_shapes.size() != 3) {
    throw ShapeError(label() +
                     ": expects 2 inputs [query, value] or 3 [query, value, key] but got " +
                     std::to_string(input_shapes.size()));
  }
  const Shape& query = input_shapes[0];
  const Shape& value = input_shapes[1];
  const Shape& key = input_shapes.size() == 3 ? input_shapes[2] : value;
  if (query.rank() != 2 || value.rank() != 2 || key.rank() != 2 || key[0] != value[0] ||
      key[1] != query[1]) {
    throw ShapeError(label() +
                     ": expects a query (None, Tq, dim), a value (None, Tv, value_dim) and a key "
                     "(None, Tv, dim) but got " +
                     batch_str(query) + ", " + batch_str(value) + " and " + batch_str(key));
  }
  if (query[1] == 0 || value[1] == 0) {
    throw ShapeError(label() + ": the features of the query and the value must have known " +
                     "lengths but they are " + batch_str(query) + " and " + batch_str(value));
  }
  query_steps_ = query[0];
  value_steps_ = value[0];
  features_ = query[1];
  value_features_ = value[1];
  if (weights_.empty()) {
    if (mode_ == ScoreMode::additive) {
      if (options_.use_scale) {
        Tensor<float> scale({features_});
        Initializer::glorot_uniform().fill(scale, seed);
        add_weight("scale", scale);
      }
    } else {
      if (options_.use_scale) add_weight("scale", Tensor<float>(Shape{}, 1.0F));
      if (mode_ == ScoreMode::concat)
        add_weight("concat_score_weight", Tensor<float>(Shape{}, 1.0F));
    }
  } else if (mode_ == ScoreMode::additive && weights_[0].value.size() != features_) {
    throw ShapeError(label() + ": scale has " + std::to_string(weights_[0].value.size()) +
                     " elements but the query has " + std::to_string(features_) + " features");
  }
  Shape out{query_steps_, value_features_};
  remember(input_shapes, out);
  return out;
}

AttentionShape DenseAttention::geometry(std::size_t batch) const {
  return {.batch = batch,
          .heads = 1,
          .query_steps = query_steps_,
          .value_steps = value_steps_,
          .key_dim = features_,
          .value_dim = value_features_};
}

namespace {

/// The score of a `DenseAttention` of `mode` from its weights' host views (`scale`, then
/// `concat_score_weight` where the layer has them), with its gradients added to `gradients`
/// (one double per element of the weights, in the same order) when not null.
template <class F>
void with_score(ScoreMode mode, bool use_scale, std::span<const Tensor<float>> weights,
                double* gradients, F&& f) {
  if (mode == ScoreMode::dot) {
    DotScore score{.scale = use_scale ? weights[0].data()[0] : 1.0F,
                   .scale_gradient = use_scale ? gradients : nullptr};
    f(score);
  } else if (mode == ScoreMode::concat) {
    const std::size_t w = use_scale ? 1 : 0;
    AdditiveScore score{.scale = use_scale ? weights[0].data()[0] : 1.0F,
                        .weight = weights[w].data()[0],
                        .scale_gradient = use_scale && gradients != nullptr ? gradients : nullptr,
                        .weight_gradient = gradients != nullptr ? gradients + w : nullptr};
    f(score);
  } else {
    AdditiveScore score{.feature_weights = use_scale ? weights[0].data() : nullptr,
                        .feature_gradients = use_scale ? gradients : nullptr};
    f(score);
  }
}

}  // namespace

void DenseAttention::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) {
  check_inputs(inputs);
  const std::size_t batch = inputs[0].dim(0);
  query_steps_ = inputs[0].dim(1);  // this batch's lengths
  value_steps_ = inputs[1].dim(1);
  const AttentionShape s = geometry(batch);
  AttentionCall call{.causal = options_.use_causal_mask,
                     .rate = options_.dropout,
                     .training = ctx.training,
                     .key = attention_dropout_key(options_.seed, ctx, name()),
                     .scores_after_dropout = true};
  // t: query, value, key, probabilities, output, the query's and the value's masks, the weights.
  staged_ = {inputs[0],
             inputs[1],
             inputs.size() == 3 ? inputs[2] : inputs[1],
             probabilities_.get(ctx.backend, {s.probabilities()}),
             output,
             input_mask(ctx, 0),
             input_mask(ctx, 1)};
  for (const auto& w : weights_)
    staged_.push_back(w.value);
  if (!device_attention(ctx.backend, s, call)) {
    ctx.backend.host_kernel(staged_, [&](std::span<const Tensor<float>> t) {
      call.query_mask = t[5].empty() ? nullptr : t[5].data();
      call.value_mask = t[6].empty() ? nullptr : t[6].data();
      with_score(mode_, options_.use_scale, t.subspan(7), nullptr, [&](const auto& score) {
        attention_forward(s, call, score, t[0].data(), t[2].data(), t[1].data(), t[3].data(),
                          t[4].data());
      });
    });
  }
  if (ctx.extra_outputs.empty()) return;
  // The returned scores: the distribution the values were weighted by, dropped in training. A
  // probability's dropout draws at its flat index (`attention_dropout_index` of one head), as
  // `Backend::dropout` draws.
  const Tensor<float> scores = ctx.extra_outputs[0].reshape({s.probabilities()});
  if (call.drops()) {
    ctx.backend.dropout(staged_[3], scores, call.rate, call.key);
  } else {
    ctx.backend.copy(staged_[3], scores);
  }
}

bool DenseAttention::device_attention(Backend& backend, const AttentionShape& s,
                                      const AttentionCall& call) {
  // Dot-product scores of a fixed scale (Keras's default Attention): a backend's own kernels.
  if (mode_ != ScoreMode::dot || options_.use_scale) return false;
  const Tensor<float> tensors[] = {staged_[0], staged_[2],      staged_[1],
                                   staged_[3], staged_[4],      staged_[5],
                                   staged_[6], Tensor<float>(), Tensor<float>()};
  return backend.attention_forward(s, call, 1.0F, tensors);
}

void DenseAttention::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) {
  const std::size_t batch = inputs[0].dim(0);
  query_steps_ = inputs[0].dim(1);  // this batch's lengths
  value_steps_ = inputs[1].dim(1);
  const AttentionShape s = geometry(batch);
  AttentionCall call{.causal = options_.use_causal_mask,
                     .rate = options_.dropout,
                     .training = ctx.training,
                     .key = attention_dropout_key(options_.seed, ctx, name()),
                     .scores_after_dropout = true};
  const auto wanted = [&](std::size_t i) {
    return i < input_gradients.size() ? input_gradients[i] : Tensor<float>();
  };
  const bool has_key = inputs.size() == 3;
  // An output nothing reads (when the scores are returned too) has a zero gradient.
  Tensor<float> dy = output_gradient;
  if (dy.empty()) {
    dy = zero_gradient_.get(ctx.backend, {batch, query_steps_, value_features_});
    ctx.backend.fill(dy, 0.0F);
  }
  const Tensor<float> dscores =
      ctx.extra_output_gradients.empty() || ctx.extra_output_gradients[0].empty()
          ? Tensor<float>()
          : ctx.extra_output_gradients[0].reshape({s.probabilities()});
  // t: query, value, key, probabilities, output gradient, dquery, dvalue, dkey, the query's and
  // the value's masks, the scores' gradient, then the weights and their gradients.
  staged_ = {inputs[0],
             inputs[1],
             has_key ? inputs[2] : inputs[1],
             probabilities_.get(ctx.backend, {s.probabilities()}),
             dy,
             wanted(0),
             wanted(1),
             has_key ? wanted(2) : Tensor<float>(),
             input_mask(ctx, 0),
             input_mask(ctx, 1),
             dscores};
  const std::size_t n = weights_.size();
  for (const auto& w : weights_)
    staged_.push_back(w.value);
  for (const auto& w : weights_)
    staged_.push_back(w.trainable ? w.gradient : Tensor<float>());
  if (mode_ == ScoreMode::dot && !options_.use_scale) {
    // The probabilities again (a shared layer's forward of another call may have overwritten
    // them), then the gradients, on the backend's own kernels where it has them. Without a key
    // input the key is the value: its gradient adds to the value's.
    const Tensor<float> dk = has_key || staged_[6].empty()
                                 ? staged_[7]
                                 : key_gradient_.get(ctx.backend, staged_[6].shape());
    const Tensor<float> forward[] = {staged_[0], staged_[2],      staged_[1],
                                     staged_[3], Tensor<float>(), staged_[8],
                                     staged_[9], Tensor<float>(), Tensor<float>()};
    const Tensor<float> backward[] = {
        staged_[0], staged_[2], staged_[1], staged_[3],      staged_[4],      staged_[5], dk,
        staged_[6], staged_[8], staged_[9], Tensor<float>(), Tensor<float>(), staged_[10]};
    if (ctx.backend.attention_forward(s, call, 1.0F, forward) &&
        ctx.backend.attention_backward(s, call, 1.0F, backward)) {
      if (!has_key && !staged_[6].empty()) ctx.backend.axpy(1.0F, dk, staged_[6]);
      return;
    }
  }
  ctx.backend.host_kernel(staged_, [&](std::span<const Tensor<float>> t) {
    call.query_mask = t[8].empty() ? nullptr : t[8].data();
    call.value_mask = t[9].empty() ? nullptr : t[9].data();
    const float* returned_gradient = t[10].empty() ? nullptr : t[10].data();
    std::size_t elements = 0;
    for (std::size_t i = 0; i < n; ++i)
      elements += t[11 + i].size();
    std::vector<double> gradients(elements, 0.0);
    // The key's gradient goes to its own buffer; without a key input it adds to the value's.
    std::vector<float> key_gradient;
    float* dk = t[7].empty() ? nullptr : t[7].data();
    if (!has_key && !t[6].empty()) {
      key_gradient.assign(t[6].size(), 0.0F);
      dk = key_gradient.data();
    }
    for (std::size_t i = 5; i < 8; ++i)
      if (!t[i].empty()) std::fill(t[i].data(), t[i].data() + t[i].size(), 0.0F);
    with_score(mode_, options_.use_scale, t.subspan(11, n), gradients.data(),
               [&](const auto& score) {
                 // The probabilities are recomputed (a shared layer's forward of another call
                 // may have overwritten them); the dropout mask derives from the same key.
                 attention_forward(s, call, score, t[0].data(), t[2].data(), t[1].data(),
                                   t[3].data(), nullptr);
                 attention_backward(s, call, score, t[0].data(), t[2].data(), t[1].data(),
                                    t[3].data(), t[4].data(), t[5].empty() ? nullptr : t[5].data(),
                                    dk, t[6].empty() ? nullptr : t[6].data(), returned_gradient);
               });
    for (std::size_t i = 0; i < key_gradient.size(); ++i)
      t[6].data()[i] += key_gradient[i];
    std::size_t at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Tensor<float>& gradient = t[11 + n + i];
      for (std::size_t e = 0; e < t[11 + i].size(); ++e, ++at)
        if (!gradient.empty()) gradient.data()[e] += static_cast<float>(gradients[at]);
    }
  });
}

nlohmann::json DenseAttention::call_kwargs() const {
  nlohmann::json kwargs = nlohmann::json::object();
  if (options_.use_causal_mask) kwargs["use_causal_mask"] = true;
  if (options_.return_attention_scores) kwargs["return_attention_scores"] = true;
  return kwargs;
}

void DenseAttention::apply_call_kwargs(const nlohmann::json& kwargs, const std::string& where) {
  // A call without use_causal_mask has the layer's own (tf.keras 2.4's `causal` config), else
  // none, as in Keras.
  read_attention_kwargs(kwargs, where, constructed_causal_, options_.use_causal_mask, kwargs_seen_,
                        &options_.return_attention_scores);
}

nlohmann::json DenseAttention::attention_config() const {
  auto config = base_config();
  config["use_scale"] = options_.use_scale;
  config["dropout"] = options_.dropout;
  config["seed"] = options_.seed ? nlohmann::json(*options_.seed) : nlohmann::json(nullptr);
  return config;
}

DenseAttentionOptions DenseAttention::read_options(const ConfigReader& read, bool use_scale) {
  DenseAttentionOptions options;
  options.use_scale = read.get("use_scale", use_scale);
  const double dropout = read.get("dropout", 0.0);
  if (!(dropout >= 0.0 && dropout < 1.0)) read.fail("dropout", "a number in [0, 1)");
  options.dropout = static_cast<float>(dropout);
  options.seed = read.optional<std::uint64_t>("seed");
  // tf.keras 2.4's `causal` (later a call argument, `use_causal_mask`).
  options.use_causal_mask = read.get("causal", false);
  options.name = config_name(read);
  return options;
}

}  // namespace loadstar::keras::layers::detail
#endif
