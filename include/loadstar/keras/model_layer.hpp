/// \file
/// `ModelLayer`: a model used as a layer of another (Keras's nested `Sequential` or functional
/// model, the base of every transfer-learning script), and `call` of a model on a tensor.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/keras/detail/graph_plan.hpp"
#include "loadstar/keras/detail/mask_plan.hpp"
#include "loadstar/keras/detail/nested_model.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/sequential.hpp"

namespace loadstar::keras {

/// A model used as a layer of another, as Keras's `outer = Sequential([base, Dense(10)])` or
/// `y = base(x)`: its forward and backward run through the inner model's graph of layer calls,
/// with the activations and gradients in buffers of its own.
///
/// Its weights are the inner layers' weights (the same tensors), in the inner model's layer
/// order, each named `<inner layer>/<weight>` (`"dense/kernel"`, as tf.keras names the variables
/// of a nested model); the outer model's optimizer trains them. `set_trainable(false)` freezes
/// the inner layers, all of them, as Keras's `base.trainable = False` does; a frozen
/// `BatchNormalization` runs in inference mode in training too (Keras 3, and tf.keras 2 since
/// 2.1: `training and self.trainable`). Its `class_name` is the inner model's: `"Sequential"` or
/// `"Functional"`, and its config the inner model's config, as Keras writes a nested model.
///
/// Models of one input and one output are run; others are a `ConfigError`. Called twice, it is a
/// shared layer (one set of weights); `call(model, x)` and a model among a `Sequential`'s layers
/// make it, once per model.
///
/// Masks run through the inner graph as Keras runs them: a mask made inside
/// (`Embedding(mask_zero=True)`, `Masking`) reaches the inner layers that read it, the mask of
/// the outer input is the inner input's, and the mask the inner output carries is this layer's
/// output mask (`mask_flow()` is `computes` when the inner output can carry one, `ends` when
/// the inner layers use or stop the input's mask, `refused` when an inner layer would refuse
/// it).
/// \code
/// std::shared_ptr<Model> base = load_model("base.h5");
/// auto base_layer = std::make_shared<ModelLayer>(base);
/// base_layer->set_trainable(false);  // transfer learning: only the head trains
/// Sequential classifier{Input({32, 32, 3}), base_layer, Dense(10)};
///
/// std::shared_ptr<Model> other = load_model("other.keras");
/// Sequential tuned{Input({32, 32, 3}), other, Dense(10)};  // a model among the layers
/// \endcode
class ModelLayer : public Layer {
 public:
  /// What the inner graph does with masks (the class comment says which).
  MaskFlow mask_flow() const noexcept override { return flow_; }
  bool reads_masks() const noexcept override { return flow_ != MaskFlow::refused; }
  /// The mask the inner output carries after the `forward` just run (all ones without one).
  LOADSTAR_DECL void compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                                  const CallContext& ctx) override;
  /// Throws `ConfigError` for a null model, a model not built yet (a `Sequential` without an
  /// input shape), a model of several inputs or outputs, and an inner layer with an activity
  /// regularizer.
  LOADSTAR_DECL explicit ModelLayer(std::shared_ptr<Model> model);

  /// `"Sequential"` for a `Sequential`, `"Functional"` for every other model.
  LOADSTAR_DECL std::string class_name() const override;

  /// The inner model.
  const std::shared_ptr<Model>& model() const noexcept { return model_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  /// The inner model's config (`model_get_config(model)["config"]`) with this layer's `name`
  /// and `trainable`.
  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// Freezes or unfreezes every inner layer too (Keras's `Model.trainable` setter).
  LOADSTAR_DECL void set_trainable(bool trainable) override;
  /// Resets the inner layers' states (Keras's `Model.reset_states`).
  void reset_states() override {
    for (const auto& layer : plan_.layers)
      layer->reset_states();
  }
  /// A nested model's inner stateful layers are not checkpointed: refused there by name.
  std::vector<Tensor<float>> carried_states() const override {
    for (const auto& layer : plan_.layers) {
      if (!layer->carried_states().empty()) {
        throw ConfigError(label() + ": layer '" + layer->name() +
                          "' carries states from batch to batch, which loadstar does not "
                          "checkpoint inside a model used as a layer; call it in the outer model");
      }
    }
    return {};
  }

 private:
  /// `label()` of the built-in layers: `"functional model layer 'base'"`.
  LOADSTAR_DECL std::string label() const;
  /// Points the inner layers' variables at this layer's tensors (the outer model moves them to
  /// its backend's memory, and `set_weights` may replace them).
  LOADSTAR_DECL void share_variables();
  /// The context of inner node `k`: a frozen `BatchNormalization` normalizes with its moving
  /// statistics.
  LOADSTAR_DECL CallContext inner_context(const CallContext& ctx, const Layer& layer) const;

  struct Run {
    const float* key = nullptr;
    std::size_t capacity = 0;
    std::vector<detail::RuntimeNode> nodes;
    // The inner masks without and with a mask given to the input, with this call's buffers.
    detail::MaskPlan own, given;
  };
  /// The buffers of one call for `rows` rows on `backend`, found by the call's output buffer.
  LOADSTAR_DECL Run& run_for(const Tensor<float>& output, std::size_t rows, Backend& backend);
  /// The masks of `run` for this call (`given` when the outer input has a mask, copied into the
  /// inner input's), sized for `rows` rows; throws the inner refusal for a given mask.
  LOADSTAR_DECL detail::MaskPlan& masks_for(Run& run, std::size_t rows, const CallContext& ctx);

  std::shared_ptr<Model> model_;
  detail::GraphPlan plan_;
  // The inner masks planned once: `own_masks_` those made inside, `given_masks_` with the input's
  // too (unless an inner layer refuses it: `refusal_`).
  detail::MaskPlan own_masks_, given_masks_;
  std::string refusal_;
  MaskFlow flow_ = MaskFlow::refused;
  bool warned_given_ = false;
  const detail::MaskPlan* last_masks_ = nullptr;  // the masks of the last forward
  std::vector<Variable*> inner_;  // the inner layers' variables, in `weights_` order
  std::vector<Run> runs_;
  std::vector<bool> needed_;  // backward's per-node need, kept to allocate nothing per step
};

/// Keras's `y = model(x)`: calls `model` on `input` as a layer (a `ModelLayer`); throws what the
/// `ModelLayer` constructor and `call` throw.
/// \code
/// auto image = Input({28, 28});
/// auto features = call(base, image);  // base: a std::shared_ptr<Model>
/// Model classifier(image, call(Dense(10), features));
/// \endcode
LOADSTAR_DECL KerasTensor call(const std::shared_ptr<Model>& model, const KerasTensor& input);

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

ModelLayer::ModelLayer(std::shared_ptr<Model> model) : model_(std::move(model)) {
  if (!model_) throw ConfigError("model layer: the model is null");
  set_name(model_->name());
  const std::string kind =
      dynamic_cast<const Sequential*>(model_.get()) != nullptr ? "sequential" : "functional";
  if (model_->inputs().empty()) {
    throw ConfigError(kind + " model '" + model_->name() +
                      "': used as a layer, it must be built (give it an Input first) but it "
                      "has no input shape yet");
  }
  if (model_->inputs().size() != 1 || model_->outputs().size() != 1) {
    const auto count = [](std::size_t n, const char* what) {
      return std::to_string(n) + " " + what + (n == 1 ? "" : "s");
    };
    throw ConfigError(kind + " model '" + model_->name() +
                      "': loadstar runs a model of one input and one output as a layer but it "
                      "has " +
                      count(model_->inputs().size(), "input") + " and " +
                      count(model_->outputs().size(), "output"));
  }
  plan_ = detail::plan_graph(model_->name(), model_->inputs(), model_->outputs());
  for (const auto& layer : plan_.layers) {
    if (layer->output_count() > 1) {
      throw ConfigError(kind + " model '" + model_->name() + "': layer '" + layer->name() +
                        "' returns " + std::to_string(layer->output_count()) +
                        " outputs, which loadstar does not run inside a model used as a layer; "
                        "call the model's layers in the outer model instead");
    }
    if (layer->activity_regularizer()) {
      throw ConfigError(kind + " model '" + model_->name() + "': layer '" + layer->name() +
                        "' has an activity_regularizer, which loadstar does not apply inside a "
                        "model used as a layer");
    }
    // A nested model layer's variables are named already (tf.keras keeps the innermost layer's
    // scope alone: "dense/kernel:0").
    const std::string prefix = detail::nested_model(*layer) != nullptr ? "" : layer->name() + "/";
    for (auto& w : layer->weights()) {
      inner_.push_back(&w);
      weights_.push_back(Variable{prefix + w.name, w.value, w.gradient, w.trainable});
    }
    // The outer model applies the regularizers and constraints of this layer's weights.
    for (const auto& options : layer->weight_options()) {
      if (options.regularizer) set_regularizer(prefix + options.weight, options.regularizer);
      if (options.constraint) set_constraint(prefix + options.weight, options.constraint);
    }
  }
  // Gradient plan of the inner graph: every node may need its gradient, the input's included
  // (it is the outer call's input gradient); the output's is the outer call's, copied.
  std::vector<bool> written(plan_.nodes.size(), false);
  written[plan_.output_nodes.front()] = true;
  for (std::size_t k = plan_.nodes.size(); k-- > 0;) {
    auto& node = plan_.nodes[k];
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const std::size_t p = node.inputs[j];
      node.targets[j] =
          written[p] ? detail::GradientTarget::accumulate : detail::GradientTarget::direct;
      written[p] = true;
    }
  }
  needed_.assign(plan_.nodes.size(), false);
  // The masks: those made inside, and with the input's mask given too (quietly: the warnings of
  // a mask that stops inside come when one is given).
  const std::size_t out = plan_.output_nodes.front();
  own_masks_.plan(model_->name(), plan_.nodes);
  bool takes_given = true;
  try {
    const std::size_t input = 0;
    given_masks_.plan(model_->name(), plan_.nodes, std::span(&input, 1), true);
  } catch (const ConfigError& e) {
    takes_given = false;
    refusal_ = e.what();
  }
  // A mask made inside that reaches the output: computed (all ones when the inner output has
  // none this time). The input's mask reaching the output unchanged: passed on, as the outer
  // model passes it. Otherwise, the input's mask ends inside (used or stopped there), or is
  // refused there.
  const auto no_mask = detail::MaskPlan::no_mask;
  const std::size_t given_out = takes_given ? given_masks_.slot_of(out) : no_mask;
  const bool same_steps = detail::without_last_axis(plan_.nodes[out].shape) ==
                          detail::without_last_axis(plan_.nodes.front().shape);
  if (own_masks_.slot_of(out) != no_mask) {
    flow_ = MaskFlow::computes;
  } else if (given_out != no_mask && given_out == given_masks_.slot_of(0) && same_steps) {
    flow_ = MaskFlow::passes;
  } else if (given_out != no_mask) {
    flow_ = MaskFlow::computes;
  } else {
    flow_ = takes_given ? MaskFlow::ends : MaskFlow::refused;
  }
}

std::string ModelLayer::class_name() const {
  return dynamic_cast<const Sequential*>(model_.get()) != nullptr ? "Sequential" : "Functional";
}

std::string ModelLayer::label() const {
  return (class_name() == "Sequential" ? "sequential" : "functional") +
         std::string(" model layer '") + name() + "'";
}

Shape ModelLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  const Shape& expected = plan_.nodes.front().shape;
  if (input_shapes.size() != 1 || input_shapes[0] != expected) {
    std::string found;
    for (const auto& s : input_shapes)
      found += (found.empty() ? "" : ", ") + s.str();
    throw ShapeError(
        label() + ": expects one input of shape " + expected.str() + " but got " +
        (input_shapes.size() == 1 ? "" : std::to_string(input_shapes.size()) + " inputs: ") +
        (found.empty() ? "none" : found));
  }
  return plan_.nodes[plan_.output_nodes.front()].shape;
}

void ModelLayer::share_variables() {
  for (std::size_t i = 0; i < inner_.size(); ++i) {
    Variable& inner = *inner_[i];
    const Variable& outer = weights_[i];
    if (inner.value.data() != outer.value.data()) inner.value = outer.value;
    if (inner.gradient.data() != outer.gradient.data()) inner.gradient = outer.gradient;
  }
}

ModelLayer::Run& ModelLayer::run_for(const Tensor<float>& output, std::size_t rows,
                                     Backend& backend) {
  Run* run = nullptr;
  for (auto& r : runs_)
    if (r.key == output.data()) run = &r;
  if (run == nullptr) {
    // A new call, or the outer model allocated for a larger batch: the buffers kept for smaller
    // batches belong to outer buffers that are gone (every call of a step has the same rows).
    std::erase_if(runs_, [rows](const Run& r) { return r.capacity < rows; });
    runs_.push_back({output.data(), 0, plan_.nodes, own_masks_, given_masks_});
    run = &runs_.back();
  }
  auto& nodes = run->nodes;
  const std::size_t out = plan_.output_nodes.front();
  if (rows > run->capacity ||
      (nodes.size() > 1 && nodes[out].gradient_full.device() != backend.device())) {
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      auto& node = nodes[k];
      if (node.layer && k != out) node.value_full = backend.allocate(node.shape.prepend(rows));
      if (node.layer) node.gradient_full = backend.allocate(node.shape.prepend(rows));
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        if (node.targets[j] == detail::GradientTarget::accumulate)
          node.scratch_full[j] = backend.allocate(nodes[node.inputs[j]].shape.prepend(rows));
      }
    }
    run->capacity = rows;
  }
  for (std::size_t k = 1; k < nodes.size(); ++k) {
    auto& node = nodes[k];
    if (k != out) node.value = node.value_full.slice_rows(0, rows);
    node.gradient = node.gradient_full.slice_rows(0, rows);
  }
  return *run;
}

detail::MaskPlan& ModelLayer::masks_for(Run& run, std::size_t rows, const CallContext& ctx) {
  const Tensor<float> given = ctx.input_masks.empty() ? Tensor<float>() : ctx.input_masks[0];
  if (!given.empty() && !refusal_.empty()) throw ConfigError(label() + ": " + refusal_);
  if (!given.empty() && !warned_given_) {
    // Keras's warnings for a mask that stops inside, once a mask comes.
    detail::MaskPlan warnings;
    const std::size_t input = 0;
    warnings.plan(model_->name(), plan_.nodes, std::span(&input, 1));
    warned_given_ = true;
  }
  detail::MaskPlan& masks = given.empty() ? run.own : run.given;
  if (masks.empty()) return masks;
  masks.reserve(ctx.backend, run.nodes, rows);
  masks.set_rows(run.nodes, rows);
  if (!given.empty()) ctx.backend.copy(given, masks.mask_of(0));
  return masks;
}

void ModelLayer::compute_mask(std::span<const Tensor<float>>, const Tensor<float>& mask,
                              const CallContext& ctx) {
  const Tensor<float> inner =
      last_masks_ == nullptr ? Tensor<float>() : last_masks_->mask_of(plan_.output_nodes.front());
  if (inner.empty()) {
    ctx.backend.fill(mask, 1.0F);
  } else {
    ctx.backend.copy(inner, mask);
  }
}

CallContext ModelLayer::inner_context(const CallContext& ctx, const Layer& layer) const {
  CallContext inner = ctx;
  inner.relu_fusion = nullptr;
  inner.accumulate_gradients = true;
  if (!layer.trainable() && layer.class_name() == "BatchNormalization") inner.training = false;
  return inner;
}

void ModelLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                         const CallContext& ctx) {
  share_variables();
  const std::size_t rows = inputs[0].dim(0);
  Run& run = run_for(output, rows, ctx.backend);
  auto& nodes = run.nodes;
  const std::size_t out = plan_.output_nodes.front();
  detail::MaskPlan& masks = masks_for(run, rows, ctx);
  last_masks_ = &masks;
  nodes.front().value = inputs[0];
  nodes[out].value = output;
  if (out == 0) {
    ctx.backend.copy(inputs[0], output);
    return;
  }
  for (auto& node : nodes) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j)
      node.input_values[j] = nodes[node.inputs[j]].value;
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    auto& node = nodes[k];
    if (!node.layer) continue;
    CallContext inner = inner_context(ctx, *node.layer);
    inner.input_masks =
        node.layer->reads_masks() ? masks.inputs(k) : std::span<const Tensor<float>>();
    node.layer->forward(node.input_values, node.value, inner);
    if (!masks.empty()) masks.after_forward(ctx.backend, nodes, k, inner);
  }
}

void ModelLayer::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const Tensor<float>& output_gradient,
                          std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  share_variables();
  Backend& backend = ctx.backend;
  const std::size_t rows = inputs[0].dim(0);
  Run& run = run_for(output, rows, backend);
  auto& nodes = run.nodes;
  const std::size_t out = plan_.output_nodes.front();
  const Tensor<float> dx = input_gradients.empty() ? Tensor<float>() : input_gradients[0];
  if (out == 0) {
    if (!dx.empty()) backend.copy(output_gradient, dx);
    return;
  }
  // A node's gradient is needed when it has trainable weights, a node before it does, or it
  // leads back to the input whose gradient the outer call asks for.
  needed_[0] = !dx.empty();
  for (std::size_t k = 1; k < nodes.size(); ++k) {
    bool need = false;
    for (const auto& w : nodes[k].layer->weights())
      need = need || w.trainable;
    for (const std::size_t p : nodes[k].inputs)
      need = need || needed_[p];
    needed_[k] = need;
  }
  nodes.front().gradient = dx;
  nodes[out].gradient = nodes[out].gradient_full.slice_rows(0, rows);
  backend.copy(output_gradient, nodes[out].gradient);
  for (auto& node : nodes) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const std::size_t p = node.inputs[j];
      if (!needed_[p]) {
        node.input_gradients[j] = Tensor<float>();
      } else if (node.targets[j] == detail::GradientTarget::direct) {
        node.input_gradients[j] = nodes[p].gradient;
      } else {
        node.input_gradients[j] = node.scratch_full[j].slice_rows(0, rows);
      }
    }
  }
  // The masks of this call's forward (its buffers still hold them).
  const bool given = !ctx.input_masks.empty() && !ctx.input_masks[0].empty();
  const detail::MaskPlan& masks = given ? run.given : run.own;
  for (std::size_t k = nodes.size(); k-- > 1;) {
    auto& node = nodes[k];
    if (!needed_[k]) continue;
    CallContext inner = inner_context(ctx, *node.layer);
    inner.input_masks =
        node.layer->reads_masks() ? masks.inputs(k) : std::span<const Tensor<float>>();
    node.layer->backward(node.input_values, node.value, node.gradient, node.input_gradients, inner);
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (node.targets[j] == detail::GradientTarget::accumulate && !node.input_gradients[j].empty())
        backend.axpy(1.0F, node.input_gradients[j], nodes[node.inputs[j]].gradient);
    }
  }
}

nlohmann::json ModelLayer::get_config() const {
  nlohmann::json config = model_get_config(*model_)["config"];
  config["name"] = name();
  config["trainable"] = trainable();
  return config;
}

void ModelLayer::set_trainable(bool trainable) {
  Layer::set_trainable(trainable);
  for (const auto& layer : plan_.layers)
    layer->set_trainable(trainable);
  for (std::size_t i = 0; i < inner_.size(); ++i)
    weights_[i].trainable = inner_[i]->trainable;
}

KerasTensor call(const std::shared_ptr<Model>& model, const KerasTensor& input) {
  return call(LayerArg(detail::model_as_layer(model)), input);
}

}  // namespace loadstar::keras

namespace loadstar::keras::detail {

const Model* nested_model(const Layer& layer) noexcept {
  const auto* nested = dynamic_cast<const ModelLayer*>(&layer);
  return nested != nullptr ? nested->model().get() : nullptr;
}

std::shared_ptr<Layer> model_as_layer(const std::shared_ptr<Model>& model) {
  static std::mutex mutex;
  static std::map<const Model*, std::weak_ptr<ModelLayer>> layers;
  const std::lock_guard lock(mutex);
  std::erase_if(layers, [](const auto& entry) { return entry.second.expired(); });
  std::shared_ptr<ModelLayer> layer;
  if (const auto it = layers.find(model.get()); it != layers.end()) layer = it->second.lock();
  if (!layer || layer->model() != model) {
    layer = std::make_shared<ModelLayer>(model);
    layers[model.get()] = layer;
  }
  return layer;
}

std::shared_ptr<Layer> model_layer_from_config(const std::string& class_name,
                                               const nlohmann::json& config) {
  std::shared_ptr<Model> model =
      model_from_config(nlohmann::json{{"class_name", class_name}, {"config", config}});
  auto layer = std::make_shared<ModelLayer>(std::move(model));
  if (config.is_object() && config.contains("trainable") && config["trainable"].is_boolean() &&
      !config["trainable"].get<bool>())
    layer->set_trainable(false);
  return layer;
}

}  // namespace loadstar::keras::detail
#endif
