/// \file
/// `MultiHeadAttention`: Keras's multi-head scaled dot-product attention.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/layers/detail/attention_core.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `MultiHeadAttention`'s Keras arguments after `num_heads` and `key_dim`, with Keras's defaults.
struct MultiHeadAttentionOptions {
  /// The size of each head's value projection (Keras's default: `key_dim`).
  std::optional<std::size_t> value_dim = std::nullopt;
  /// Dropout on the attention probabilities, in training.
  float dropout = 0.0F;
  bool use_bias = true;
  /// The size of the output's last axis (Keras's default: the query's features).
  std::optional<std::size_t> output_shape = std::nullopt;
  /// The axes attention runs over, numbered as Keras does (the batch axis 0; a negative axis
  /// counts from the features, -2 the last step axis, as Keras 3.12 counts them: earlier versions
  /// counted on the projections, where -3 is the last step axis); empty: Keras's default, every
  /// axis but the batch and the features. The softmax runs over the attended axes jointly; the
  /// other step axes are batch axes, on which the query and the value must agree (for inputs
  /// `(batch, T, S, features)`, `{2}` attends over S for each T, `{1}` over T for each S).
  std::vector<int> attention_axes = {};
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  /// Regularizers and constraints of the four kernels and the four biases, as Keras gives its
  /// projections the layer's own.
  std::shared_ptr<Regularizer> kernel_regularizer = nullptr;
  std::shared_ptr<Regularizer> bias_regularizer = nullptr;
  std::shared_ptr<Constraint> kernel_constraint = nullptr;
  std::shared_ptr<Constraint> bias_constraint = nullptr;
  /// The dropout's seed (null: the model's).
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Keras's call argument `use_causal_mask` (query step `i` attends to value steps `j <= i`),
  /// applied to every call of the layer. Keras builds the mask along the first step axis, so it
  /// applies where attention runs over that axis alone: inputs `(batch, steps, features)`, or
  /// `attention_axes` `{1}`.
  bool use_causal_mask = false;
  /// Keras's call argument `return_attention_scores`, applied to every call of the layer: the
  /// call returns the attention probabilities (before dropout) beside the output; call the layer
  /// with `call_outputs`. Their shape is Keras's einsum's: `(batch, the axes not attended...,
  /// num_heads, the query's attended axes..., the value's attended axes...)`, the attended axes
  /// in the order of `attention_axes`; `(batch, num_heads, query steps, value steps)` for inputs
  /// `(batch, steps, features)`.
  bool return_attention_scores = false;
  /// Keras's call argument `attention_mask`, given to every call of the layer: the call's last
  /// input is a mask of the attention scores' shape without the heads (`(batch, query steps,
  /// value steps)` for inputs `(batch, steps, features)`), 1 where a query position may attend to
  /// a value position and 0 where not (joined with the inputs' masks and `use_causal_mask`, as
  /// Keras joins them).
  bool attention_mask = false;
  std::string name = {};
};

/// Keras's `MultiHeadAttention`, called on `[query, value]` or `[query, value, key]` (the key is
/// the value when absent) of shapes `(T, dim)` (or `(T1, ..., Tn, dim)`, attending over all the
/// steps, or over those `attention_axes` names): each of `num_heads` heads projects the query and
/// the key to `key_dim` features and the value to `value_dim`, takes `softmax(q k^T /
/// sqrt(key_dim))` over the value steps (with dropout on it in training) times the values, and
/// the heads' results are projected to the output. Weights in Keras's order and shapes:
/// `query/kernel` `(dim, num_heads, key_dim)`, `query/bias` `(num_heads, key_dim)`, the same for
/// `key` and `value` (`value_dim`), then `attention_output/kernel` `(num_heads, value_dim, out)`
/// and `attention_output/bias` `(out,)`; without `use_bias`, no biases.
/// \code
/// auto x = Input({16, 32});
/// auto y = call(std::make_shared<MultiHeadAttention>(4, 8), {x, x});  // self-attention
/// auto image = Input({8, 8, 32});  // attention along each row's 8 columns
/// auto rows = call(std::make_shared<MultiHeadAttention>(
///                      4, 8, MultiHeadAttentionOptions{.attention_axes = {2}}),
///                  {image, image});
/// \endcode
class MultiHeadAttention : public detail::LayerBase, public keras::detail::CallArguments {
 public:
  /// Keras's masks: the query's, value's and key's masks join into the attention mask (a masked
  /// query attends to nothing, a masked value or key step is not attended to), and the output
  /// has the query's mask.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  bool reads_masks() const noexcept override { return true; }
  LOADSTAR_DECL MultiHeadAttention(std::size_t num_heads, std::size_t key_dim,
                                   MultiHeadAttentionOptions options = {});

  std::string class_name() const override { return "MultiHeadAttention"; }
  std::size_t num_heads() const noexcept { return heads_; }
  std::size_t key_dim() const noexcept { return key_dim_; }
  std::size_t value_dim() const noexcept { return value_dim_; }
  const MultiHeadAttentionOptions& options() const noexcept { return options_; }

  /// With `return_attention_scores`: the output, then the attention scores.
  std::size_t output_count() const noexcept override {
    return options_.return_attention_scores ? 2 : 1;
  }
  LOADSTAR_DECL std::vector<Shape> extra_output_shapes(
      std::span<const Shape> input_shapes) const override;
  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Steps of unknown length (a text model's), the features known.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  /// `value`, `key` when the layer was called with one, and `attention_mask` with
  /// `options().attention_mask`; all three before the first call (what a config may give).
  std::vector<std::string> tensor_arguments() const override {
    if (!built()) return {"value", "key", "attention_mask"};
    std::vector<std::string> names{"value"};
    if (has_key_) names.emplace_back("key");
    if (options_.attention_mask) names.emplace_back("attention_mask");
    return names;
  }
  /// An `attention_mask` tensor in a config's call makes the call's last input the mask.
  void tensor_arguments_given(const std::vector<std::string>& names) override {
    options_.attention_mask =
        std::find(names.begin(), names.end(), "attention_mask") != names.end();
  }
  LOADSTAR_DECL nlohmann::json call_kwargs() const override;
  LOADSTAR_DECL void apply_call_kwargs(const nlohmann::json& kwargs,
                                       const std::string& where) override;

  /// The layer described by a Keras config (the registry's factory).
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The index of projection `p`'s kernel (0 query, 1 key, 2 value, 3 output); its bias follows.
  std::size_t kernel_index(std::size_t p) const noexcept { return p * (options_.use_bias ? 2 : 1); }
  /// `out = x * kernel + bias` of projection `p`, the kernel seen as `(rows of x's features,
  /// columns)`.
  LOADSTAR_DECL void project(Backend& backend, std::size_t p, const Tensor<float>& x,
                             const Tensor<float>& out);
  /// The projections and the attention of a call into the scratch buffers (`attended_` holds the
  /// heads' results before the output projection).
  LOADSTAR_DECL void attend(std::span<const Tensor<float>> inputs, const CallContext& ctx);
  LOADSTAR_DECL detail::AttentionCall attention_call(const CallContext& ctx) const;
  /// Points `call` at the host views of the query's, value's and key's masks (empty: none),
  /// the query's joining the attention mask as Keras's `_compute_attention_mask` has it.
  static void masks_of(detail::AttentionCall& call, std::span<const Tensor<float>> masks) {
    call.query_mask = masks[0].empty() ? nullptr : masks[0].data();
    call.value_mask = masks[1].empty() ? nullptr : masks[1].data();
    call.key_mask = masks[2].empty() ? nullptr : masks[2].data();
    call.attention_mask = masks[3].empty() ? nullptr : masks[3].data();
    call.query_mask_in_scores = true;
  }
  LOADSTAR_DECL detail::AttentionShape geometry(std::size_t batch) const;

  /// How a call lays its projections out for the attention core (Keras's
  /// `_build_attention_equation`): the axes not attended join the batch, the attended ones (in
  /// the order of `attention_axes`) make one steps axis. Projections `(batch, steps...,
  /// channels)` are moved by `axes` to `(batch, others..., attended..., channels)`, in which the
  /// core's probabilities `(batch * outer, heads, query_steps, value_steps)` are Keras's scores
  /// `(batch, others..., heads, query's attended..., value's attended...)`.
  struct Folding {
    std::vector<std::size_t> axes, inverse;
    /// Whether `axes` leaves every axis in place (the attended axes are the last steps, in
    /// order): the projections are used as they are.
    bool identity = true;
    /// Per sample: the product of the lengths not attended, and of the attended ones.
    std::size_t outer = 1, query_steps = 1, value_steps = 1;
    /// Keras's scores without the batch axis, and the attention mask's (the scores' without the
    /// heads).
    std::vector<std::size_t> scores, mask;
    /// Keras's default axes: every step axis, in order.
    bool default_axes = true;
    /// Where Keras's join of the inputs' masks (`_compute_attention_mask`: the query's mask
    /// `(batch, ..., T, 1)` and the value's `(batch, ..., 1, S)`) lines up with the scores: the
    /// default axes (loadstar's reading of them for several step axes), or the last step axis
    /// alone.
    bool masks_apply = true;
    /// Where Keras's causal mask `(1, T, S)` over the first step axis lines up with the scores:
    /// attention over the first step axis alone.
    bool causal_applies = true;
  };
  /// The attended step axes (0 the first step) for one sample's query `(steps..., features)`, in
  /// the order of `attention_axes`; throws `ConfigError` for an axis that is no step axis.
  LOADSTAR_DECL std::vector<std::size_t> attended_steps(const Shape& query) const;
  /// The layout of a call on one sample's query and value; throws `ShapeError` where they differ
  /// along an axis not attended (an unknown length matches any).
  LOADSTAR_DECL Folding folding(const Shape& query, const Shape& value) const;
  /// Copies `from`, a projection `(batch, steps of sample..., channels)`, into `to` in the folded
  /// layout, or (`back`) the folded `from` into `to` in the projection's layout.
  LOADSTAR_DECL void refold(Backend& backend, const Tensor<float>& from, const Tensor<float>& to,
                            const Shape& sample, bool back) const;
  /// `attention_axes` as given, for messages: `"2"`, `"3, 1"`.
  std::string axes_text() const {
    std::string given;
    for (int a : options_.attention_axes)
      given += (given.empty() ? "" : ", ") + std::to_string(a);
    return given;
  }

  std::size_t heads_;
  std::size_t key_dim_;
  std::size_t value_dim_;
  MultiHeadAttentionOptions options_;
  bool kwargs_seen_ = false;
  /// Whether the call gives a key (else the value serves as the key).
  bool has_key_ = false;
  /// The index of the key's input, and of the attention mask's.
  std::size_t key_index_of(std::size_t inputs) const noexcept {
    return inputs - (options_.attention_mask ? 1 : 0) == 3 ? 2 : 1;
  }
  std::size_t query_features_ = 0, value_features_ = 0, key_features_ = 0, out_features_ = 0;
  /// The steps of the call's query and value per sample (all of their step axes).
  std::size_t query_steps_ = 0, value_steps_ = 0;
  Folding folding_;
  detail::Scratch query_, key_, value_, attended_, probabilities_;
  detail::Scratch query_gradient_, key_gradient_, value_gradient_, attended_gradient_;
  /// The projections and their gradients in the folded layout, where it is not the identity.
  detail::Scratch folded_query_, folded_key_, folded_value_, folded_attended_;
  detail::Scratch folded_query_gradient_, folded_key_gradient_, folded_value_gradient_,
      folded_attended_gradient_;
  std::vector<Tensor<float>> staged_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

MultiHeadAttention::MultiHeadAttention(std::size_t num_heads, std::size_t key_dim,
                                       MultiHeadAttentionOptions options)
    : LayerBase(options.name),
      heads_(num_heads),
      key_dim_(key_dim),
      value_dim_(options.value_dim.value_or(key_dim)),
      options_(std::move(options)) {
  if (num_heads == 0) throw ConfigError(label() + ": num_heads must be positive");
  if (key_dim == 0) throw ConfigError(label() + ": key_dim must be positive");
  if (value_dim_ == 0) throw ConfigError(label() + ": value_dim must be positive");
  if (options_.output_shape && *options_.output_shape == 0)
    throw ConfigError(label() + ": output_shape must be positive");
  if (!(options_.dropout >= 0.0F && options_.dropout < 1.0F)) {
    throw ConfigError(label() + ": dropout must be in [0, 1) but is " +
                      std::to_string(options_.dropout));
  }
  for (const char* projection : {"query", "key", "value", "attention_output"}) {
    const std::string p(projection);
    if (options_.kernel_regularizer) set_regularizer(p + "/kernel", options_.kernel_regularizer);
    if (options_.kernel_constraint) set_constraint(p + "/kernel", options_.kernel_constraint);
    if (!options_.use_bias) continue;
    if (options_.bias_regularizer) set_regularizer(p + "/bias", options_.bias_regularizer);
    if (options_.bias_constraint) set_constraint(p + "/bias", options_.bias_constraint);
  }
}

Shape MultiHeadAttention::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  const std::size_t masks = options_.attention_mask ? 1 : 0;
  if (input_shapes.size() != 2 + masks && input_shapes.size() != 3 + masks) {
    throw ShapeError(label() + ": expects 2 inputs (query, value) or 3 (query, value, key)" +
                     (masks ? std::string(" and the attention mask") : std::string()) +
                     " but got " + std::to_string(input_shapes.size()));
  }
  has_key_ = input_shapes.size() == 3 + masks;
  const Shape& query = input_shapes[0];
  const Shape& value = input_shapes[1];
  const Shape& key = input_shapes[key_index_of(input_shapes.size())];
  for (const Shape* s : {&query, &value, &key}) {
    if (s->rank() < 2 || s->rank() != query.rank()) {
      throw ShapeError(label() +
                       ": expects query, value and key of one rank of 2 or more "
                       "(steps..., features; without the batch axis) but got " +
                       batch_str(query) + ", " + batch_str(value) + " and " + batch_str(key));
    }
  }
  for (std::size_t i = 0; i + 1 < value.rank(); ++i) {
    if (value[i] != key[i]) {
      throw ShapeError(label() + ": expects value and key alike but for their last axis but got " +
                       batch_str(value) + " and " + batch_str(key));
    }
  }
  const Folding f = folding(query, value);
  if (options_.use_causal_mask && !f.causal_applies) {
    // Keras's `_compute_causal_mask` is `(1, T, S)` over the first step axis, which
    // `_masked_softmax` lines up with the last two axes of the scores.
    throw ShapeError(label() +
                     ": use_causal_mask expects attention over the first step axis alone (inputs "
                     "(None, steps, features), or attention_axes (1)) but the query is " +
                     batch_str(query) +
                     (options_.attention_axes.empty()
                          ? std::string(" with the default attention_axes")
                          : " with attention_axes (" + axes_text() + ")"));
  }
  if (masks != 0) {
    const Shape& mask = input_shapes.back();
    const bool fits =
        mask.rank() == f.mask.size() && std::equal(f.mask.begin(), f.mask.end(), mask.begin());
    if (!fits && query.rank() == 2) {
      throw ShapeError(label() +
                       ": expects an attention mask (None, query steps, value steps) for inputs "
                       "(None, steps, features) but got the query " +
                       batch_str(query) + ", the value " + batch_str(value) + " and the mask " +
                       batch_str(mask));
    }
    if (!fits) {
      std::string expected = "(None";
      for (std::size_t d : f.mask)
        expected += d == none ? std::string(", None") : ", " + std::to_string(d);
      expected += ")";
      throw ShapeError(label() + ": expects an attention mask " + expected +
                       " (the scores' shape without the heads: the axes not attended, the "
                       "query's attended axes, the value's) for the query " +
                       batch_str(query) + " and the value " + batch_str(value) +
                       (options_.attention_axes.empty()
                            ? std::string(" with the default attention_axes")
                            : " with attention_axes (" + axes_text() + ")") +
                       " but got " + batch_str(mask));
    }
  }
  if (query[query.rank() - 1] == 0 || value[value.rank() - 1] == 0 || key[key.rank() - 1] == 0) {
    throw ShapeError(label() + ": the last axis (features) of query, value and key must have a " +
                     "known length but they are " + batch_str(query) + ", " + batch_str(value) +
                     " and " + batch_str(key));
  }
  query_features_ = query[query.rank() - 1];
  value_features_ = value[value.rank() - 1];
  key_features_ = key[key.rank() - 1];
  out_features_ = options_.output_shape.value_or(query_features_);
  query_steps_ = query.elements() / query_features_;
  value_steps_ = value.elements() / value_features_;
  const std::vector<Shape> kernels = {
      Shape{query_features_, heads_, key_dim_}, Shape{key_features_, heads_, key_dim_},
      Shape{value_features_, heads_, value_dim_}, Shape{heads_, value_dim_, out_features_}};
  const std::vector<Shape> biases = {Shape{heads_, key_dim_}, Shape{heads_, key_dim_},
                                     Shape{heads_, value_dim_}, Shape{out_features_}};
  if (!weights_.empty()) {
    for (std::size_t p = 0; p < 4; ++p) {
      if (weights_[kernel_index(p)].value.shape() != kernels[p]) {
        throw ShapeError(label() + ": " + weights_[kernel_index(p)].name + " is " +
                         weights_[kernel_index(p)].value.shape().str() + " but the inputs " +
                         batch_str(query) + ", " + batch_str(value) + " need " + kernels[p].str());
      }
    }
  } else {
    const char* names[] = {"query", "key", "value", "attention_output"};
    for (std::size_t p = 0; p < 4; ++p) {
      Tensor<float> kernel(kernels[p]);
      options_.kernel_initializer.fill(kernel, SplitMix64::mix(seed + 2 * p));
      add_weight(std::string(names[p]) + "/kernel", kernel);
      if (options_.use_bias) {
        Tensor<float> bias(biases[p]);
        options_.bias_initializer.fill(bias, SplitMix64::mix(seed + 2 * p + 1));
        add_weight(std::string(names[p]) + "/bias", bias);
      }
    }
  }
  Shape out = query;
  out[out.rank() - 1] = out_features_;
  remember(input_shapes, out);
  return out;
}

detail::AttentionCall MultiHeadAttention::attention_call(const CallContext& ctx) const {
  return {.causal = options_.use_causal_mask,
          .rate = options_.dropout,
          .training = ctx.training,
          .key = detail::attention_dropout_key(options_.seed, ctx, name())};
}

detail::AttentionShape MultiHeadAttention::geometry(std::size_t batch) const {
  return {.batch = batch * folding_.outer,
          .heads = heads_,
          .query_steps = folding_.query_steps,
          .value_steps = folding_.value_steps,
          .key_dim = key_dim_,
          .value_dim = value_dim_};
}

std::vector<std::size_t> MultiHeadAttention::attended_steps(const Shape& query) const {
  const std::size_t steps = query.rank() - 1;
  std::vector<std::size_t> attended;
  if (options_.attention_axes.empty()) {
    for (std::size_t i = 0; i < steps; ++i)
      attended.push_back(i);
    return attended;
  }
  // Keras numbers the axes of the inputs with their batch axis (rank `steps + 2`); a negative
  // axis is `(rank of the projections - 1) + axis` (`_build_attention`), which is `rank + axis`.
  const int rank = static_cast<int>(steps) + 2;
  for (int a : options_.attention_axes) {
    const int axis = a < 0 ? rank + a : a;
    const bool repeated =
        axis >= 1 && std::find(attended.begin(), attended.end(),
                               static_cast<std::size_t>(axis - 1)) != attended.end();
    if (axis < 1 || axis > rank - 2 || repeated) {
      throw ConfigError(label() + ": attention_axes (" + axes_text() +
                        ") must be distinct axes between the batch and the features of inputs " +
                        batch_str(query) + " (1 to " + std::to_string(rank - 2) + ", or " +
                        std::to_string(1 - rank) + " to -2)");
    }
    attended.push_back(static_cast<std::size_t>(axis - 1));
  }
  return attended;
}

MultiHeadAttention::Folding MultiHeadAttention::folding(const Shape& query,
                                                        const Shape& value) const {
  Folding f;
  const std::vector<std::size_t> attended = attended_steps(query);
  const std::size_t steps = query.rank() - 1;
  std::vector<std::size_t> others;
  for (std::size_t i = 0; i < steps; ++i)
    if (std::find(attended.begin(), attended.end(), i) == attended.end()) others.push_back(i);
  // Keras's `_build_attention_equation`: the scores are (batch, others in order, heads, the
  // query's attended axes, the key's), the attended axes in the order `attention_axes` gives.
  f.axes.push_back(0);
  for (std::size_t i : others) {
    f.axes.push_back(i + 1);
    f.outer *= query[i];
    f.scores.push_back(query[i]);
    if (query[i] != value[i] && query[i] != none && value[i] != none) {
      throw ShapeError(label() +
                       ": expects a query and a value of the same lengths along the axes not "
                       "attended (attention_axes (" +
                       axes_text() + ")) but got " + batch_str(query) + " and " + batch_str(value));
    }
  }
  f.mask = f.scores;
  f.scores.push_back(heads_);
  for (std::size_t i : attended) {
    f.axes.push_back(i + 1);
    f.query_steps *= query[i];
    f.scores.push_back(query[i]);
    f.mask.push_back(query[i]);
  }
  for (std::size_t i : attended) {
    f.value_steps *= value[i];
    f.scores.push_back(value[i]);
    f.mask.push_back(value[i]);
  }
  f.axes.push_back(steps + 1);
  f.inverse.resize(f.axes.size());
  for (std::size_t i = 0; i < f.axes.size(); ++i) {
    f.inverse[f.axes[i]] = i;
    f.identity = f.identity && f.axes[i] == i;
  }
  f.default_axes = others.empty() && f.identity;
  f.masks_apply = f.default_axes || (attended.size() == 1 && attended[0] + 1 == steps);
  f.causal_applies = attended.size() == 1 && attended[0] == 0;
  return f;
}

void MultiHeadAttention::refold(Backend& backend, const Tensor<float>& from,
                                const Tensor<float>& to, const Shape& sample, bool back) const {
  // The projection's shape (batch, steps..., channels) and the folded one.
  const std::size_t steps = sample.rank() - 1;
  const std::size_t channels = from.row_size();
  std::size_t positions = 1;
  std::vector<std::size_t> dims{0}, folded;
  for (std::size_t i = 0; i < steps; ++i) {
    dims.push_back(sample[i]);
    positions *= sample[i];
  }
  dims[0] = from.size() / (positions * channels);
  dims.push_back(channels);
  for (std::size_t axis : folding_.axes)
    folded.push_back(dims[axis]);
  if (back) {
    backend.permute(from.reshape(Shape(folded)), folding_.inverse, to.reshape(Shape(dims)));
  } else {
    backend.permute(from.reshape(Shape(dims)), folding_.axes, to.reshape(Shape(folded)));
  }
}

void MultiHeadAttention::project(Backend& backend, std::size_t p, const Tensor<float>& x,
                                 const Tensor<float>& out) {
  const Tensor<float>& kernel = weights_[kernel_index(p)].value;
  const std::size_t in = p == 3 ? heads_ * value_dim_ : kernel.dim(0);
  const Tensor<float> k = kernel.reshape({in, kernel.size() / in});
  const std::size_t rows = x.size() / in;
  const Tensor<float> y = out.reshape({rows, k.dim(1)});
  backend.gemm(x.reshape({rows, in}), false, k, false, y);
  if (options_.use_bias)
    backend.bias_add(y, weights_[kernel_index(p) + 1].value.reshape({k.dim(1)}));
}

Shape MultiHeadAttention::output_shape_for(std::span<const Shape> input_shapes) const {
  const Shape& value = input_shapes[1];
  const Shape& key = input_shapes[key_index_of(input_shapes.size())];
  bool same_steps = value.rank() == key.rank();
  for (std::size_t i = 0; same_steps && i + 1 < value.rank(); ++i)
    same_steps = value[i] == key[i];
  if (!same_steps) {
    throw ShapeError(label() + ": expects value and key of the same steps but got " +
                     batch_str(value) + " and " + batch_str(key));
  }
  Shape out = input_shapes[0];
  out[out.rank() - 1] = out_features_;
  return out;
}

void MultiHeadAttention::attend(std::span<const Tensor<float>> inputs, const CallContext& ctx) {
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].dim(0);
  // The steps of this batch (a text model's length changes from batch to batch).
  const Shape query_sample = inputs[0].shape().row_shape();
  const Shape value_sample = inputs[1].shape().row_shape();
  query_steps_ = query_sample.elements() / query_features_;
  value_steps_ = value_sample.elements() / value_features_;
  folding_ = folding(query_sample, value_sample);
  const bool masked = !detail::input_mask(ctx, 0).empty() || !detail::input_mask(ctx, 1).empty() ||
                      (has_key_ && !detail::input_mask(ctx, 2).empty());
  if (masked && !folding_.masks_apply) {
    throw ConfigError(label() + ": the masks of the query, value or key with attention_axes (" +
                      axes_text() + ") for inputs " + batch_str(query_sample) +
                      " are not run: Keras joins them along the last step axis, which lines up "
                      "with its scores only for the default attention_axes or the last step "
                      "axis alone; drop the mask first (mask_zero=False, no Masking layer) or "
                      "give an attention_mask");
  }
  const Tensor<float>& value = inputs[1];
  const Tensor<float>& key = inputs[key_index_of(inputs.size())];
  const std::size_t query_rows = batch * query_steps_, value_rows = batch * value_steps_;
  const Tensor<float> q = query_.get(backend, {query_rows, heads_ * key_dim_});
  const Tensor<float> k = key_.get(backend, {value_rows, heads_ * key_dim_});
  const Tensor<float> v = value_.get(backend, {value_rows, heads_ * value_dim_});
  project(backend, 0, inputs[0], q);
  project(backend, 1, key, k);
  project(backend, 2, value, v);
  // The core's layout: the axes not attended join the batch (the identity for Keras's default).
  const bool folds = !folding_.identity;
  const auto folded = [&](detail::Scratch& scratch, const Tensor<float>& x, const Shape& sample) {
    if (!folds) return x;
    const Tensor<float> y = scratch.get(backend, x.shape());
    refold(backend, x, y, sample, false);
    return y;
  };
  const Tensor<float> fq = folded(folded_query_, q, query_sample);
  const Tensor<float> fk = folded(folded_key_, k, value_sample);
  const Tensor<float> fv = folded(folded_value_, v, value_sample);
  const detail::AttentionShape s = geometry(batch);
  const Tensor<float> p = probabilities_.get(backend, {s.probabilities()});
  const Tensor<float> o = attended_.get(backend, {query_rows, heads_ * value_dim_});
  const Tensor<float> fo = folds ? folded_attended_.get(backend, o.shape()) : o;
  detail::AttentionCall call = attention_call(ctx);
  const detail::DotScore score{.scale = 1.0F / std::sqrt(static_cast<float>(key_dim_))};
  staged_ = {fq,
             fk,
             fv,
             p,
             fo,
             detail::input_mask(ctx, 0),
             detail::input_mask(ctx, 1),
             has_key_ ? detail::input_mask(ctx, 2) : Tensor<float>(),
             options_.attention_mask ? inputs.back() : Tensor<float>()};
  call.query_mask_in_scores = true;
  if (!backend.attention_forward(s, call, score.scale, staged_)) {
    backend.host_kernel(staged_, [&](std::span<const Tensor<float>> t) {
      masks_of(call, t.subspan(5));
      detail::attention_forward(s, call, score, t[0].data(), t[1].data(), t[2].data(), t[3].data(),
                                t[4].data());
    });
  }
  if (folds) refold(backend, fo, o, query_sample, true);
  // Keras's attention scores: the probabilities before dropout, (batch, others..., heads, query's
  // attended..., value's attended...) as they are held.
  if (!ctx.extra_outputs.empty()) ctx.backend.copy(p, ctx.extra_outputs[0].reshape({p.size()}));
}

void MultiHeadAttention::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                 const CallContext& ctx) {
  check_inputs(inputs);
  attend(inputs, ctx);
  const std::size_t batch = inputs[0].dim(0);
  project(ctx.backend, 3, attended_.get(ctx.backend, {batch * query_steps_, heads_ * value_dim_}),
          output);
}

void MultiHeadAttention::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                  const Tensor<float>& output_gradient,
                                  std::span<const Tensor<float>> input_gradients,
                                  const CallContext& ctx) {
  Backend& backend = ctx.backend;
  // The projections and probabilities are recomputed rather than kept from `forward`, so that a
  // shared layer stays correct; the dropout mask derives from the same key.
  attend(inputs, ctx);
  const std::size_t batch = inputs[0].dim(0);
  const detail::AttentionShape s = geometry(batch);
  const std::size_t query_rows = batch * query_steps_, value_rows = batch * value_steps_;
  // The attention core's operands, in its layout (`attend` folded them where it is not the
  // projections').
  const bool folds = !folding_.identity;
  const Shape query_sample = inputs[0].shape().row_shape();
  const Shape value_sample = inputs[1].shape().row_shape();
  const Tensor<float> q =
      (folds ? folded_query_ : query_).get(backend, {query_rows, heads_ * key_dim_});
  const Tensor<float> k =
      (folds ? folded_key_ : key_).get(backend, {value_rows, heads_ * key_dim_});
  const Tensor<float> v =
      (folds ? folded_value_ : value_).get(backend, {value_rows, heads_ * value_dim_});
  const Tensor<float> p = probabilities_.get(backend, {s.probabilities()});
  const Tensor<float> o = attended_.get(backend, {query_rows, heads_ * value_dim_});
  // An output nothing reads (when the scores are returned too) has no gradient.
  const bool read = !output_gradient.empty();
  const Tensor<float> dy =
      read ? output_gradient.reshape({query_rows, out_features_}) : Tensor<float>();
  const Tensor<float> dscores =
      ctx.extra_output_gradients.empty() || ctx.extra_output_gradients[0].empty()
          ? Tensor<float>()
          : ctx.extra_output_gradients[0].reshape({p.size()});
  const bool frozen = !weights_[0].trainable;
  const auto kernel_of = [&](std::size_t i, std::size_t in) {
    return weights_[kernel_index(i)].value.reshape(
        {in, weights_[kernel_index(i)].value.size() / in});
  };
  const auto gradients_of = [&](std::size_t i, const Tensor<float>& x, const Tensor<float>& dz) {
    if (frozen) return;
    const Tensor<float>& kernel = weights_[kernel_index(i)].gradient;
    const std::size_t in = x.row_size();
    backend.weight_gradients(x, dz, kernel.reshape({in, kernel.size() / in}),
                             options_.use_bias
                                 ? weights_[kernel_index(i) + 1].gradient.reshape({dz.row_size()})
                                 : Tensor<float>(),
                             true);
  };
  // The output projection.
  const Tensor<float> d_o = attended_gradient_.get(backend, {query_rows, heads_ * value_dim_});
  if (read) {
    gradients_of(3, o, dy);
    backend.gemm(dy, false, kernel_of(3, heads_ * value_dim_), true, d_o);
  } else {
    backend.fill(d_o, 0.0F);
  }
  // The attention.
  const Tensor<float> dq = query_gradient_.get(backend, {query_rows, heads_ * key_dim_});
  const Tensor<float> dk = key_gradient_.get(backend, {value_rows, heads_ * key_dim_});
  const Tensor<float> dv = value_gradient_.get(backend, {value_rows, heads_ * value_dim_});
  const Tensor<float> fd_o = folds ? folded_attended_gradient_.get(backend, d_o.shape()) : d_o;
  const Tensor<float> fdq = folds ? folded_query_gradient_.get(backend, dq.shape()) : dq;
  const Tensor<float> fdk = folds ? folded_key_gradient_.get(backend, dk.shape()) : dk;
  const Tensor<float> fdv = folds ? folded_value_gradient_.get(backend, dv.shape()) : dv;
  if (folds) refold(backend, d_o, fd_o, query_sample, false);
  detail::AttentionCall call = attention_call(ctx);
  const detail::DotScore score{.scale = 1.0F / std::sqrt(static_cast<float>(key_dim_))};
  staged_ = {q,
             k,
             v,
             p,
             fd_o,
             fdq,
             fdk,
             fdv,
             detail::input_mask(ctx, 0),
             detail::input_mask(ctx, 1),
             has_key_ ? detail::input_mask(ctx, 2) : Tensor<float>(),
             options_.attention_mask ? inputs.back() : Tensor<float>(),
             dscores};
  call.query_mask_in_scores = true;
  if (!backend.attention_backward(s, call, score.scale, staged_)) {
    backend.host_kernel(staged_, [&](std::span<const Tensor<float>> t) {
      masks_of(call, t.subspan(8, 4));
      for (std::size_t i = 5; i < 8; ++i)
        std::fill(t[i].data(), t[i].data() + t[i].size(), 0.0F);
      detail::attention_backward(s, call, score, t[0].data(), t[1].data(), t[2].data(), t[3].data(),
                                 t[4].data(), t[5].data(), t[6].data(), t[7].data(),
                                 t[12].empty() ? nullptr : t[12].data());
    });
  }
  if (folds) {
    refold(backend, fdq, dq, query_sample, true);
    refold(backend, fdk, dk, value_sample, true);
    refold(backend, fdv, dv, value_sample, true);
  }
  // The input projections.
  const Tensor<float>& value_input = inputs[1];
  const Tensor<float>& key_input = inputs[key_index_of(inputs.size())];
  const Tensor<float> xq = inputs[0].reshape({query_rows, query_features_});
  const Tensor<float> xv = value_input.reshape({value_rows, value_features_});
  const Tensor<float> xk = key_input.reshape({value_rows, key_features_});
  gradients_of(0, xq, dq);
  gradients_of(1, xk, dk);
  gradients_of(2, xv, dv);
  const auto wanted = [&](std::size_t i) {
    return i < input_gradients.size() && !input_gradients[i].empty();
  };
  if (wanted(0)) {
    backend.gemm(dq, false, kernel_of(0, query_features_), true,
                 input_gradients[0].reshape({query_rows, query_features_}));
  }
  if (wanted(1)) {
    const Tensor<float> dxv = input_gradients[1].reshape({value_rows, value_features_});
    backend.gemm(dv, false, kernel_of(2, value_features_), true, dxv);
    // Without a key input, the key is the value: its gradient adds to the value's.
    if (!has_key_) backend.gemm(dk, false, kernel_of(1, key_features_), true, dxv, 1.0F, 1.0F);
  }
  // The attention mask is a constant: no gradient reaches it.
  if (options_.attention_mask && wanted(inputs.size() - 1))
    backend.fill(input_gradients[inputs.size() - 1], 0.0F);
  if (has_key_ && wanted(2)) {
    backend.gemm(dk, false, kernel_of(1, key_features_), true,
                 input_gradients[2].reshape({value_rows, key_features_}));
  }
}

nlohmann::json MultiHeadAttention::get_config() const {
  auto config = base_config();
  config["num_heads"] = heads_;
  config["key_dim"] = key_dim_;
  config["value_dim"] = value_dim_;
  config["dropout"] = options_.dropout;
  config["use_bias"] = options_.use_bias;
  config["output_shape"] = options_.output_shape ? nlohmann::json::array({*options_.output_shape})
                                                 : nlohmann::json(nullptr);
  config["attention_axes"] = options_.attention_axes.empty()
                                 ? nlohmann::json(nullptr)
                                 : nlohmann::json(options_.attention_axes);
  config["kernel_initializer"] = options_.kernel_initializer.to_json();
  config["bias_initializer"] = options_.bias_initializer.to_json();
  // The projections share the layer's regularizers and constraints: the query's stand for all.
  const auto option_json = [&](const char* weight, bool regularizer) {
    const WeightOptions* o = weight_options(std::string("query/") + weight);
    if (o == nullptr) return nlohmann::json(nullptr);
    if (regularizer) return o->regularizer ? o->regularizer->to_json() : nlohmann::json(nullptr);
    return o->constraint ? o->constraint->to_json() : nlohmann::json(nullptr);
  };
  config["kernel_regularizer"] = option_json("kernel", true);
  config["bias_regularizer"] = option_json("bias", true);
  config["activity_regularizer"] = regularizer_json(nullptr);
  config["kernel_constraint"] = option_json("kernel", false);
  config["bias_constraint"] = option_json("bias", false);
  config["seed"] = options_.seed ? nlohmann::json(*options_.seed) : nlohmann::json(nullptr);
  return config;
}

nlohmann::json MultiHeadAttention::call_kwargs() const {
  nlohmann::json kwargs = nlohmann::json::object();
  if (options_.use_causal_mask) kwargs["use_causal_mask"] = true;
  if (options_.return_attention_scores) kwargs["return_attention_scores"] = true;
  return kwargs;
}

std::vector<Shape> MultiHeadAttention::extra_output_shapes(
    std::span<const Shape> input_shapes) const {
  if (!options_.return_attention_scores) return {};
  if (input_shapes.size() < 2 || input_shapes[0].rank() < 2 ||
      input_shapes[1].rank() != input_shapes[0].rank()) {
    throw ShapeError(label() +
                     ": return_attention_scores expects a query and a value of one rank of 2 or "
                     "more (steps..., features) but got " +
                     std::to_string(input_shapes.size()) + " inputs");
  }
  // Keras's scores are what its einsum gives (`_build_attention_equation`); Keras 3's symbolic
  // `compute_output_spec` announces (batch, heads, T, T) whatever the axes.
  const Folding f = folding(input_shapes[0], input_shapes[1]);
  if (f.scores.size() >= Shape::max_rank) {
    throw ShapeError(label() + ": return_attention_scores for inputs " +
                     batch_str(input_shapes[0]) + " would give scores of rank " +
                     std::to_string(f.scores.size() + 1) + ", more than loadstar's " +
                     std::to_string(Shape::max_rank));
  }
  return {Shape(f.scores)};
}

void MultiHeadAttention::apply_call_kwargs(const nlohmann::json& kwargs, const std::string& where) {
  // Keras's default: a call without use_causal_mask has none.
  detail::read_attention_kwargs(kwargs, where, false, options_.use_causal_mask, kwargs_seen_,
                                &options_.return_attention_scores, &options_.attention_mask);
}

std::shared_ptr<Layer> MultiHeadAttention::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "MultiHeadAttention");
  MultiHeadAttentionOptions options;
  options.value_dim = read.optional<std::size_t>("value_dim");
  if (options.value_dim && *options.value_dim == 0) read.fail("value_dim", "a positive integer");
  const double dropout = read.get("dropout", 0.0);
  if (!(dropout >= 0.0 && dropout < 1.0)) read.fail("dropout", "a number in [0, 1)");
  options.dropout = static_cast<float>(dropout);
  options.use_bias = read.get("use_bias", true);
  if (read.has("output_shape")) {
    const nlohmann::json& v = *read.find("output_shape");
    const auto positive = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() > 0;
    };
    if (positive(v)) {
      options.output_shape = v.get<std::size_t>();
    } else if (v.is_array() && v.size() == 1 && positive(v[0])) {
      options.output_shape = v[0].get<std::size_t>();
    } else {
      read.fail("output_shape",
                "a positive integer or a list of one (loadstar projects to one output axis)");
    }
  }
  if (read.has("attention_axes")) {
    const nlohmann::json& v = *read.find("attention_axes");
    if (keras::detail::ConfigValue<int>::fits(v)) {
      options.attention_axes = {v.get<int>()};
    } else if (keras::detail::ConfigValue<std::vector<int>>::fits(v) && !v.empty()) {
      options.attention_axes = v.get<std::vector<int>>();
    } else {
      read.fail("attention_axes", "null, an integer or a list of integers");
    }
  }
  read.expect("use_gate", false, "loadstar runs no gated attention");
  read.expect("sliding_window", nullptr, "loadstar runs no sliding-window attention");
  options.kernel_initializer =
      detail::config_initializer(read, "kernel_initializer", Initializer::glorot_uniform());
  options.bias_initializer =
      detail::config_initializer(read, "bias_initializer", Initializer::zeros());
  options.seed = read.optional<std::uint64_t>("seed");
  options.name = detail::config_name(read);
  // tf.keras 2 also records the shapes it was built for (`query_shape`, `key_shape`,
  // `value_shape`); the model's inbound nodes give them, so they are not read.
  auto layer = std::make_shared<MultiHeadAttention>(read.positive("num_heads"),
                                                    read.positive("key_dim"), std::move(options));
  detail::finish_layer(read, layer);
  // `finish_layer` reads `kernel_*` and `bias_*` as the options of weights named `kernel` and
  // `bias`: they belong to the four projections' kernels and biases.
  for (const char* weight : {"kernel", "bias"}) {
    const WeightOptions* o = layer->weight_options(weight);
    if (o == nullptr) continue;
    const auto regularizer = o->regularizer;
    const auto constraint = o->constraint;
    layer->set_regularizer(weight, nullptr);
    layer->set_constraint(weight, nullptr);
    if (std::string(weight) == "bias" && !layer->options().use_bias) continue;
    for (const char* projection : {"query/", "key/", "value/", "attention_output/"}) {
      if (regularizer) layer->set_regularizer(projection + std::string(weight), regularizer);
      if (constraint) layer->set_constraint(projection + std::string(weight), constraint);
    }
  }
  return layer;
}

}  // namespace loadstar::keras::layers
#endif
