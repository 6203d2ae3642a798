/// \file
/// `TimeDistributed`: Keras's wrapper applying one layer to every time step of its input.
#pragma once

#include "loadstar/config.hpp"

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// Keras's `TimeDistributed(layer)`: the wrapped layer applied to every step of inputs
/// `(batch, time, ...)`, with one set of weights, giving `(batch, time, ...)` of the layer's
/// output shape. The steps run as one call of the layer on `(batch * time, ...)` (a view, no
/// copy), which is what Keras's per-step calls compute for every layer whose rows are independent.
/// A `BatchNormalization` is not: Keras 3 normalises each step over its own batch, so training one
/// inside `TimeDistributed` is refused (inference, with the moving statistics, is the same).
/// Weights: the wrapped layer's (the same tensors), under their own names; its regularizers and
/// constraints apply. A mask on the input passes to the output (`MaskFlow`).
///
/// A wrapped layer that reads masks (a recurrent layer, `GlobalAveragePooling1D`,
/// `BatchNormalization`) is given the mask of each step, as Keras 3's `TimeDistributed.call`
/// passes it `mask[:, i]`: a mask `(batch, time, inner_steps)` (of `Embedding(mask_zero=True)` on
/// token ids `(batch, sentences, words)`) gives a wrapped `LSTM` the mask `(batch, words)` of
/// each sentence. A mask without the inputs' last axis alone would give the wrapped layer one it
/// does not take (Keras 3 fails there too), and is refused by name.
/// \code
/// TimeDistributed per_frame(Conv2D(16, 3));  // (batch, frames, h, w, c) -> (batch, frames, ...)
/// \endcode
class TimeDistributed : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras 3.0 to 3.15). With a wrapped layer that reads the
  /// mask of each step: the output has it where the layer passes it (a recurrent layer returning
  /// sequences), and none where the layer ends it (a recurrent layer's last output,
  /// `GlobalAveragePooling1D`: Keras 3.16's choice, since the input's mask no longer fits).
  MaskFlow mask_flow() const noexcept override {
    const MaskFlow inner = layer_->mask_flow();
    if (inner == MaskFlow::refused) return MaskFlow::refused;
    if (!layer_->reads_masks()) return MaskFlow::passes;
    return inner == MaskFlow::passes || inner == MaskFlow::ends ? inner : MaskFlow::refused;
  }
  bool reads_masks() const noexcept override { return layer_->reads_masks(); }
  /// Throws `ConfigError` for a null layer, a layer with an activity regularizer, and a layer of
  /// several inputs (a merge layer).
  LOADSTAR_DECL explicit TimeDistributed(std::shared_ptr<Layer> layer, std::string name = {});
  template <std::derived_from<Layer> L>
  explicit TimeDistributed(L layer, std::string name = {})
      : TimeDistributed(std::make_shared<L>(std::move(layer)), std::move(name)) {}

  std::string class_name() const override { return "TimeDistributed"; }
  /// The wrapped layer.
  const std::shared_ptr<Layer>& layer() const noexcept { return layer_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// A time axis of unknown length; unknown lengths in the steps if the wrapped layer takes them.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  /// Keras's config: the base keys and `layer`, the wrapped layer's `{"class_name", "config"}`.
  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// Builds the layer from its config; `make_layer` builds the wrapped layer from its
  /// `{"class_name", "config"}` (the layer registry does, with the custom objects in scope).
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(
      const nlohmann::json& config,
      const std::function<std::shared_ptr<Layer>(const nlohmann::json&)>& make_layer);

 private:
  /// Points the wrapped layer's variables at this layer's (the model moves these to its
  /// backend's memory, `set_weights` replaces them, `set_trainable` freezes them).
  LOADSTAR_DECL void share_variables();
  /// The context of the wrapped layer's call: `ctx` with the mask of every step, `(batch * time,
  /// ...)`, in `masks`. Throws `ShapeError` for a mask that does not have the inputs' rank less
  /// one.
  LOADSTAR_DECL CallContext step_context(const Tensor<float>& inputs, const CallContext& ctx,
                                         Tensor<float>& masks) const;
  /// `t` of shape `(batch, time, ...)` as `(batch * time, ...)`.
  static Tensor<float> merge_steps(const Tensor<float>& t) {
    const Shape step = t.shape().row_shape();
    return t.reshape(step.with_rows(t.shape()[0] * step[0]));
  }

  std::shared_ptr<Layer> layer_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

TimeDistributed::TimeDistributed(std::shared_ptr<Layer> layer, std::string name)
    : LayerBase(std::move(name)), layer_(std::move(layer)) {
  if (!layer_) throw ConfigError("time_distributed layer: the wrapped layer is null");
  if (layer_->activity_regularizer()) {
    throw ConfigError("time_distributed layer: the wrapped layer '" + layer_->name() +
                      "' has an activity regularizer, which loadstar does not apply per step");
  }
}

Shape TimeDistributed::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() < 2) {
    throw ShapeError(label() +
                     ": expects inputs of rank 2 or more (time, features..., without "
                     "the batch axis) but got " +
                     batch_str(in));
  }
  const Shape step = in.row_shape();
  if (keras::detail::has_unknown_axis(step) && !layer_->takes_unknown_axes()) {
    throw ShapeError(
        label() + ": the wrapped " + keras::detail::to_snake_case(layer_->class_name()) +
        " layer takes no axis of unknown length but the steps of " + batch_str(in) + " have one");
  }
  // Keras names every layer when it is made; a model names only the layers it holds.
  if (layer_->name().empty()) layer_->set_name(keras::detail::to_snake_case(layer_->class_name()));
  Shape step_out;
  if (layer_->built()) {
    if (layer_->built_input_shapes().size() != 1 || layer_->built_input_shapes()[0] != step) {
      throw ShapeError(label() + ": the wrapped layer '" + layer_->name() +
                       "' was built for other inputs than the steps of " + batch_str(in));
    }
    step_out = layer_->built_output_shape();
  } else {
    const Shape steps[] = {step};
    step_out = layer_->build(steps, seed);
    layer_->set_built({step}, step_out);
  }
  if (weights_.empty()) {
    for (const auto& w : layer_->weights())
      weights_.push_back(w);
    for (const auto& options : layer_->weight_options()) {
      if (options.regularizer) set_regularizer(options.weight, options.regularizer);
      if (options.constraint) set_constraint(options.weight, options.constraint);
    }
    if (!trainable()) set_trainable(false);
  }
  const Shape out = step_out.prepend(in[0]);
  remember(input_shapes, out);
  return out;
}

Shape TimeDistributed::output_shape_for(std::span<const Shape> input_shapes) const {
  const Shape step = input_shapes[0].row_shape();
  if (step == layer_->built_input_shapes()[0])
    return layer_->built_output_shape().prepend(input_shapes[0][0]);
  const Shape steps[] = {step};
  return layer_->output_shape_for(steps).prepend(input_shapes[0][0]);
}

void TimeDistributed::share_variables() {
  auto inner = layer_->weights();
  for (std::size_t i = 0; i < inner.size(); ++i) {
    if (inner[i].value.data() != weights_[i].value.data()) inner[i].value = weights_[i].value;
    if (inner[i].gradient.data() != weights_[i].gradient.data())
      inner[i].gradient = weights_[i].gradient;
    inner[i].trainable = weights_[i].trainable;
  }
}

void TimeDistributed::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const CallContext& ctx) {
  check_inputs(inputs);
  if (ctx.training && layer_->class_name() == "BatchNormalization") {
    throw ConfigError(label() +
                      ": training a wrapped BatchNormalization is not supported (Keras 3 "
                      "normalises each time step over its own batch; inference is)");
  }
  share_variables();
  const Tensor<float> steps[] = {merge_steps(inputs[0])};
  Tensor<float> masks;
  layer_->forward(steps, merge_steps(output), step_context(inputs[0], ctx, masks));
}

CallContext TimeDistributed::step_context(const Tensor<float>& inputs, const CallContext& ctx,
                                          Tensor<float>& masks) const {
  CallContext inner = ctx;
  inner.input_masks = {};
  const Tensor<float> mask = detail::input_mask(ctx, 0);
  if (mask.empty()) return inner;
  // Keras 3 hands the wrapped layer mask[:, i], which a layer reading masks takes only as a mask
  // of its own inputs' shape without their last axis (an LSTM's backend.rnn transposes it as
  // (batch, steps), GlobalAveragePooling1D expands its axis 2).
  if (mask.rank() + 1 != inputs.rank()) {
    std::vector<std::size_t> step_dims{mask.dim(0)};
    for (std::size_t i = 2; i < mask.rank(); ++i)
      step_dims.push_back(mask.dim(i));
    const Shape step_mask(step_dims);
    throw ShapeError(label() + ": the wrapped " +
                     keras::detail::to_snake_case(layer_->class_name()) +
                     " layer reads a mask of its inputs' shape without the last axis, but the "
                     "mask " +
                     mask.shape().str() + " of inputs " + inputs.shape().str() +
                     " gives each step one of shape " + step_mask.str() +
                     " (Keras 3's mask[:, i]), which it cannot take");
  }
  masks = merge_steps(mask);
  inner.input_masks = std::span<const Tensor<float>>(&masks, 1);
  return inner;
}

void TimeDistributed::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                               const Tensor<float>& output_gradient,
                               std::span<const Tensor<float>> input_gradients,
                               const CallContext& ctx) {
  share_variables();
  const Tensor<float> steps[] = {merge_steps(inputs[0])};
  const bool dx = !input_gradients.empty() && !input_gradients[0].empty();
  const Tensor<float> step_gradients[] = {dx ? merge_steps(input_gradients[0]) : Tensor<float>()};
  Tensor<float> masks;
  layer_->backward(steps, merge_steps(output), merge_steps(output_gradient), step_gradients,
                   step_context(inputs[0], ctx, masks));
}

nlohmann::json TimeDistributed::get_config() const {
  auto config = base_config();
  config["layer"] = {{"class_name", layer_->class_name()}, {"config", layer_->get_config()}};
  return config;
}

std::shared_ptr<Layer> TimeDistributed::from_config(
    const nlohmann::json& config,
    const std::function<std::shared_ptr<Layer>(const nlohmann::json&)>& make_layer) {
  const auto read = detail::layer_config(config, "TimeDistributed");
  const nlohmann::json* inner = read.find("layer");
  if (inner == nullptr || !inner->is_object() || !inner->contains("class_name")) {
    read.fail("layer", "the wrapped layer's {\"class_name\", \"config\"}");
  }
  auto layer = read.nested("layer", [&] { return make_layer(*inner); });
  return detail::finish_layer(
      read, std::make_shared<TimeDistributed>(std::move(layer), detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
