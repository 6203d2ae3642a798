/// \file
/// `ModelLayer`: a model used as a layer of another (Keras's nested `Sequential` or functional
/// model, the base of every transfer-learning script), and `call` of a model on a tensor.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
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
/// A model of several inputs takes them in the order of its `inputs()`, as Keras's
/// `y = model([a, b])`; a model of several outputs returns them all (`output_count()`), as
/// `a, b = model(x)`, through `call_outputs`. Called twice, it is a shared layer (one set of
/// weights); `call(model, x)` and a model among a `Sequential`'s layers make it, once per model.
///
/// Masks run through the inner graph as Keras runs them: a mask made inside
/// (`Embedding(mask_zero=True)`, `Masking`) reaches the inner layers that read it, the mask of
/// the outer input is the inner input's, and the mask the inner output carries is this layer's
/// output mask (`mask_flow()` is `computes` when the inner output can carry one, `ends` when
/// the inner layers use or stop the input's mask, `refused` when an inner layer would refuse
/// it, `joins` when the inputs' masks reach the inner output changed: a mask then, unless no
/// input has one). Several inputs give their masks to their inner inputs, each one as it comes;
/// the mask of the first output is that of the later outputs that carry the same one (a sequence
/// and its recurrent states: the states carry none), and a later output that would carry another
/// is refused by name (a mask made inside when the model is made a layer, a given one when it
/// comes).
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
  /// How many outputs, from the first, carry the first output's mask.
  std::size_t masked_outputs() const noexcept override { return masked_outputs_; }
  /// Throws `ConfigError` for a null model, a model not built yet (a `Sequential` without an
  /// input shape), an inner layer with an activity regularizer, and a later output that would
  /// carry another mask than the first (see the class comment).
  LOADSTAR_DECL explicit ModelLayer(std::shared_ptr<Model> model);

  /// `"Sequential"` for a `Sequential`, `"Functional"` for every other model.
  LOADSTAR_DECL std::string class_name() const override;

  /// The inner model.
  const std::shared_ptr<Model>& model() const noexcept { return model_; }

  /// The inner model's outputs.
  std::size_t output_count() const noexcept override { return outputs_.size(); }
  /// The shapes of the inner model's outputs after the first, for inputs of the given shapes.
  LOADSTAR_DECL std::vector<Shape> extra_output_shapes(
      std::span<const Shape> input_shapes) const override;
  /// Whether the inner model has axes of unknown length (a text model's `Input(shape=(None,))`):
  /// the inner shapes are then settled for each batch's inputs, as the model settles them.
  bool takes_unknown_axes() const noexcept override { return unknown_; }
  /// The first output's shape for inputs of the given (known) shapes.
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

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
  /// Plans the inner masks with the inputs whose bits `given` sets carrying masks given from
  /// outside (quietly unless `warn`); throws the plan's `ConfigError`.
  LOADSTAR_DECL detail::MaskPlan plan_masks(std::uint64_t given, bool warn) const;
  /// Throws `ConfigError` naming an output after `masked_outputs()` to which `plan` gives a mask.
  LOADSTAR_DECL void check_later_outputs(const detail::MaskPlan& plan) const;

  /// The inner masks of one combination of masked inputs (bit `i` of `given`: input `i`).
  struct Masks {
    std::uint64_t given = 0;
    detail::MaskPlan plan;
  };
  struct Run {
    const float* key = nullptr;
    std::size_t capacity = 0;   // the most rows seen
    std::vector<Shape> shapes;  // the sample shapes of the inputs the nodes are settled for
    std::vector<detail::RuntimeNode> nodes;
    // The inner masks of each combination seen, with this call's buffers.
    std::vector<Masks> masks;
  };
  /// The buffers of one call on `inputs` on `backend` (the inner shapes settled for theirs),
  /// found by the call's output buffer.
  LOADSTAR_DECL Run& run_for(const Tensor<float>& output, std::span<const Tensor<float>> inputs,
                             Backend& backend);
  /// The shapes of the inner nodes for inputs of the given shapes (the declared ones for the
  /// declared inputs); throws `ShapeError` naming an inner layer whose output does not fit.
  LOADSTAR_DECL std::vector<Shape> node_shapes(std::span<const Shape> input_shapes) const;
  /// Points the input nodes at `inputs` and the outputs written in place at the call's
  /// tensors, and every node's input and extra-output views at its producers.
  LOADSTAR_DECL void bind(Run& run, std::span<const Tensor<float>> inputs,
                          const Tensor<float>& output, const CallContext& ctx) const;
  /// The bits of the inputs that `ctx.input_masks` gives masks.
  LOADSTAR_DECL static std::uint64_t given_masks(const CallContext& ctx) noexcept;
  /// The masks of `run` for this call (the inputs' given masks copied into the inner inputs'),
  /// sized for `rows` rows; throws the inner refusal for a given mask.
  LOADSTAR_DECL detail::MaskPlan& masks_for(Run& run, std::size_t rows, const CallContext& ctx);
  /// The outer tensor of output `o` of a call: `first` for the first, else the context's.
  static Tensor<float> outer(std::size_t o, const Tensor<float>& first,
                             std::span<const Tensor<float>> extras) {
    if (o == 0) return first;
    return o - 1 < extras.size() ? extras[o - 1] : Tensor<float>();
  }

  std::shared_ptr<Model> model_;
  detail::GraphPlan plan_;
  std::size_t inputs_ = 1;
  bool unknown_ = false;              // an inner node has an axis of unknown length
  std::vector<std::size_t> outputs_;  // the inner output nodes, in the model's order
  // Per output: whether the outer output tensor is the node's value buffer (its first listing
  // of a layer node; else its value is copied there), and whether the outer gradient writes the
  // node's gradient (its first listing; else it is added).
  std::vector<bool> bound_, direct_;
  std::vector<bool> bound_node_;  // per node: whether its value is an outer output tensor
  std::vector<bool> written_;     // per node: whether a gradient is written into it
  // The inner masks planned per combination of given masks, the first with none (the masks made
  // inside); `refusal_` is the plan's error with every input masked, when an inner layer refuses
  // such a mask.
  std::vector<Masks> mask_plans_;
  std::string refusal_;
  MaskFlow flow_ = MaskFlow::refused;
  std::size_t masked_outputs_ = 1;
  const detail::MaskPlan* last_masks_ = nullptr;  // the masks of the last forward
  std::vector<Variable*> inner_;  // the inner layers' variables, in `weights_` order
  std::vector<Run> runs_;
  std::vector<bool> needed_;  // backward's per-node need, kept to allocate nothing per step
};

/// Keras's `y = model(x)`: calls `model` on `input` as a layer (a `ModelLayer`); throws what the
/// `ModelLayer` constructor and `call` throw (a model of several outputs among them: call it with
/// `call_outputs`).
/// \code
/// auto image = Input({28, 28});
/// auto features = call(base, image);  // base: a std::shared_ptr<Model>
/// Model classifier(image, call(Dense(10), features));
/// \endcode
LOADSTAR_DECL KerasTensor call(const std::shared_ptr<Model>& model, const KerasTensor& input);
/// Keras's `y = model([a, b])`: a model of several inputs, given in the order of its `inputs()`.
LOADSTAR_DECL KerasTensor call(const std::shared_ptr<Model>& model,
                               const std::vector<KerasTensor>& inputs);
/// Keras's `a, b = model(x)`: every output of a model of several outputs.
/// \code
/// auto tokens = Input({20});
/// auto outputs = call_outputs(encoder, {tokens});  // encoder: Model(x, {sequence, state})
/// auto logits = call(Dense(2), outputs[1]);
/// \endcode
LOADSTAR_DECL std::vector<KerasTensor> call_outputs(const std::shared_ptr<Model>& model,
                                                    const std::vector<KerasTensor>& inputs);

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
  if (!model_->text_inputs().empty()) {
    const auto& text = model_->text_inputs().front();
    throw ConfigError(kind + " model '" + model_->name() + "': used as a layer, its input '" +
                      model_->input_names()[text.input] + "' takes strings (TextVectorization '" +
                      text.layer.options().name +
                      "'), which loadstar reads only at the outer model's inputs");
  }
  plan_ = detail::plan_graph(model_->name(), model_->inputs(), model_->outputs());
  inputs_ = model_->inputs().size();
  outputs_ = plan_.output_nodes;
  for (const auto& node : plan_.nodes)
    unknown_ = unknown_ || detail::has_unknown_axis(node.declared);
  for (const auto& layer : plan_.layers) {
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
  // The outputs: the first listing of a layer's output is written by the inner layer straight
  // into the outer call's tensor; an inner input, or a node listed again, is copied there.
  auto& nodes = plan_.nodes;
  const std::size_t count = outputs_.size();
  bound_.assign(count, false);
  direct_.assign(count, false);
  written_.assign(nodes.size(), false);
  for (std::size_t o = 0; o < count; ++o) {
    const std::size_t k = outputs_[o];
    const bool first =
        std::find(outputs_.begin(), outputs_.begin() + static_cast<std::ptrdiff_t>(o), k) ==
        outputs_.begin() + static_cast<std::ptrdiff_t>(o);
    bound_[o] = first && nodes[k].layer != nullptr;
    direct_[o] = first;
    written_[k] = true;
  }
  bound_node_.assign(nodes.size(), false);
  for (std::size_t o = 0; o < count; ++o)
    if (bound_[o]) bound_node_[outputs_[o]] = true;
  // Gradient plan of the inner graph: the outer gradients come first, then the consumers in
  // reverse order; the first contribution to a node's gradient writes it, later ones add. Every
  // node may need its gradient, the inputs' included (they are the outer call's input
  // gradients).
  for (std::size_t k = nodes.size(); k-- > 0;) {
    auto& node = nodes[k];
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const std::size_t p = node.inputs[j];
      node.targets[j] =
          written_[p] ? detail::GradientTarget::accumulate : detail::GradientTarget::direct;
      written_[p] = true;
    }
    node.gradient_written = written_[k];
  }
  needed_.assign(nodes.size(), false);
  // The masks made inside, and with every input's mask given too (quietly: the warnings of a
  // mask that stops inside come when one is given).
  if (inputs_ > 64) {
    refusal_ = "it has " + std::to_string(inputs_) +
               " inputs, and loadstar gives masks to a model of at most 64";
  }
  mask_plans_.push_back({0, plan_masks(0, true)});
  detail::MaskPlan every;
  bool takes_given = refusal_.empty();
  if (takes_given) {
    try {
      every =
          plan_masks(inputs_ == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << inputs_) - 1, false);
    } catch (const ConfigError& e) {
      takes_given = false;
      refusal_ = e.what();
    }
  }
  const detail::MaskPlan& own = mask_plans_.front().plan;
  // A mask made inside that reaches the first output: computed (all ones when the inner output
  // has none this time). The first input's mask reaching it unchanged: passed on, as the outer
  // model passes it. The inputs' masks reaching it otherwise: joined into the output's (there is
  // none unless an input has one). Else, the inputs' masks end inside (used or stopped there),
  // or are refused there.
  const auto no_mask = detail::MaskPlan::no_mask;
  const std::size_t out = outputs_.front();
  const std::size_t given_out = takes_given ? every.slot_of(out) : no_mask;
  const bool same_steps =
      detail::without_last_axis(nodes[out].shape) == detail::without_last_axis(nodes.front().shape);
  if (own.slot_of(out) != no_mask) {
    flow_ = MaskFlow::computes;
  } else if (given_out != no_mask && given_out == every.slot_of(0) && same_steps) {
    flow_ = MaskFlow::passes;
  } else if (given_out != no_mask) {
    flow_ = MaskFlow::joins;
  } else {
    flow_ = takes_given ? MaskFlow::ends : MaskFlow::refused;
  }
  // The later outputs that carry the first's mask (those carrying it with every input masked
  // and with none); a later one that carries another mask made inside is refused here, one that
  // carries a given mask when one is given (`masks_for`).
  masked_outputs_ = 1;
  while (masked_outputs_ < count && own.slot_of(outputs_[masked_outputs_]) == own.slot_of(out) &&
         (!takes_given || every.slot_of(outputs_[masked_outputs_]) == given_out))
    ++masked_outputs_;
  check_later_outputs(own);
}

void ModelLayer::check_later_outputs(const detail::MaskPlan& plan) const {
  const auto mask_of = [&](std::size_t o) {
    const std::size_t maker = plan.maker_node(outputs_[o]);
    return plan_.nodes[maker].layer
               ? "the mask made by " + detail::layer_label(*plan_.nodes[maker].layer)
               : "the mask given to its input '" + plan_.input_names[maker] + "'";
  };
  for (std::size_t o = masked_outputs_; o < outputs_.size(); ++o) {
    if (plan.slot_of(outputs_[o]) == detail::MaskPlan::no_mask) continue;
    throw ConfigError(
        (class_name() == "Sequential" ? "sequential" : "functional") + std::string(" model '") +
        model_->name() + "': output " + std::to_string(o) + " ('" + plan_.output_names[o] +
        "') carries " + mask_of(o) +
        ", which is not its first output's; used as a layer, a model's later outputs carry the "
        "first one's mask or none");
  }
}

detail::MaskPlan ModelLayer::plan_masks(std::uint64_t given, bool warn) const {
  std::vector<std::size_t> masked;
  for (std::size_t i = 0; i < inputs_ && i < 64; ++i)
    if (((given >> i) & 1U) != 0) masked.push_back(i);
  detail::MaskPlan plan;
  plan.plan(model_->name(), plan_.nodes, masked, !warn);
  return plan;
}

std::string ModelLayer::class_name() const {
  return dynamic_cast<const Sequential*>(model_.get()) != nullptr ? "Sequential" : "Functional";
}

std::string ModelLayer::label() const {
  return (class_name() == "Sequential" ? "sequential" : "functional") +
         std::string(" model layer '") + name() + "'";
}

Shape ModelLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  // The inner inputs' shapes, or (where the inner model has unknown lengths) known lengths in
  // their place.
  bool fits = input_shapes.size() == inputs_;
  bool declared = fits;
  std::string expected;
  for (std::size_t i = 0; i < inputs_; ++i) {
    const Shape& shape = plan_.nodes[i].declared;
    expected += (i == 0 ? "" : ", ") + detail::sample_shape_str(shape);
    if (!fits) continue;
    declared = declared && input_shapes[i] == shape;
    fits = input_shapes[i] == shape || detail::fits_declared(shape, input_shapes[i]);
  }
  if (!fits) {
    std::string found;
    for (const auto& s : input_shapes)
      found += (found.empty() ? "" : ", ") + detail::sample_shape_str(s);
    const auto count = [](std::size_t n) {
      return n == 1 ? std::string("one input") : std::to_string(n) + " inputs";
    };
    throw ShapeError(label() + ": expects " + count(inputs_) + " of shape" +
                     (inputs_ == 1 ? " " : "s ") + expected + " but got " +
                     (input_shapes.size() == inputs_ ? "" : count(input_shapes.size()) + ": ") +
                     (found.empty() ? "none" : found));
  }
  return declared ? plan_.nodes[outputs_.front()].declared : output_shape_for(input_shapes);
}

std::vector<Shape> ModelLayer::node_shapes(std::span<const Shape> input_shapes) const {
  const auto& nodes = plan_.nodes;
  std::vector<Shape> shapes(nodes.size());
  bool declared = input_shapes.size() == inputs_;
  for (std::size_t i = 0; i < inputs_ && declared; ++i)
    declared = input_shapes[i] == nodes[i].declared;
  if (declared) {
    for (std::size_t k = 0; k < nodes.size(); ++k)
      shapes[k] = nodes[k].declared;
    return shapes;
  }
  std::vector<Shape> in;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const auto& node = nodes[k];
    if (!node.layer) {
      shapes[k] = input_shapes[k];
      continue;
    }
    const auto& first = node.runs() ? node : nodes[node.primary];
    in.clear();
    for (const std::size_t p : first.inputs)
      in.push_back(shapes[p]);
    if (!node.runs()) {
      shapes[k] = node.layer->extra_output_shapes(in).at(node.output_index - 1);
    } else {
      shapes[k] =
          in == node.layer->built_input_shapes() ? node.declared : node.layer->output_shape_for(in);
    }
    if (!detail::fits_declared(node.declared, shapes[k])) {
      throw ShapeError(label() + ": " + detail::layer_label(*node.layer) +
                       " computes samples of shape " + shapes[k].str() +
                       " for these inputs, which do not fit its output shape " +
                       detail::sample_shape_str(node.declared));
    }
  }
  return shapes;
}

Shape ModelLayer::output_shape_for(std::span<const Shape> input_shapes) const {
  return node_shapes(input_shapes)[outputs_.front()];
}

std::vector<Shape> ModelLayer::extra_output_shapes(std::span<const Shape> input_shapes) const {
  std::vector<Shape> shapes;
  if (outputs_.size() < 2) return shapes;
  const std::vector<Shape> all = node_shapes(input_shapes);
  for (std::size_t o = 1; o < outputs_.size(); ++o)
    shapes.push_back(all[outputs_[o]]);
  return shapes;
}

void ModelLayer::share_variables() {
  for (std::size_t i = 0; i < inner_.size(); ++i) {
    Variable& inner = *inner_[i];
    const Variable& outer = weights_[i];
    if (inner.value.data() != outer.value.data()) inner.value = outer.value;
    if (inner.gradient.data() != outer.gradient.data()) inner.gradient = outer.gradient;
  }
}

ModelLayer::Run& ModelLayer::run_for(const Tensor<float>& output,
                                     std::span<const Tensor<float>> inputs, Backend& backend) {
  const std::size_t rows = inputs[0].dim(0);
  Run* run = nullptr;
  for (auto& r : runs_)
    if (r.key == output.data()) run = &r;
  if (run == nullptr) {
    // A new call, or the outer model allocated for a larger batch: the buffers kept for smaller
    // batches belong to outer buffers that are gone (every call of a step has the same rows).
    std::erase_if(runs_, [rows](const Run& r) { return r.capacity < rows; });
    runs_.push_back({output.data(), 0, {}, plan_.nodes, {}});
    run = &runs_.back();
    for (std::size_t i = 0; i < inputs_; ++i)
      run->shapes.push_back(plan_.nodes[i].shape);
  }
  auto& nodes = run->nodes;
  if (unknown_) {
    // The inner shapes of this batch's lengths, settled when they change.
    bool same = true;
    for (std::size_t i = 0; i < inputs_; ++i)
      same = same && inputs[i].shape().row_shape() == run->shapes[i];
    if (!same) {
      for (std::size_t i = 0; i < inputs_; ++i)
        run->shapes[i] = inputs[i].shape().row_shape();
      const std::vector<Shape> shapes = node_shapes(run->shapes);
      for (std::size_t k = 0; k < nodes.size(); ++k)
        nodes[k].shape = shapes[k];
    }
  }
  // Buffers of the most elements so far, viewed in this batch's shapes: a call allocates nothing
  // once the largest batch was seen.
  const auto view = [&](Tensor<float>& full, const Shape& sample) {
    const std::size_t need = std::max<std::size_t>(rows * sample.elements(), 1);
    if (full.empty() || full.size() < need || full.device() != backend.device())
      full = backend.allocate({need});
    return full.reshape({full.size()})
        .slice_rows(0, rows * sample.elements())
        .reshape(sample.prepend(rows));
  };
  for (std::size_t k = inputs_; k < nodes.size(); ++k) {
    auto& node = nodes[k];
    if (!bound_node_[k]) node.value = view(node.value_full, node.shape);
    node.gradient = view(node.gradient_full, node.shape);
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      node.input_gradients[j] = node.targets[j] == detail::GradientTarget::accumulate
                                    ? view(node.scratch_full[j], nodes[node.inputs[j]].shape)
                                    : Tensor<float>();
    }
  }
  run->capacity = std::max(run->capacity, rows);
  return *run;
}

void ModelLayer::bind(Run& run, std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) const {
  auto& nodes = run.nodes;
  for (std::size_t i = 0; i < inputs_; ++i)
    nodes[i].value = inputs[i];
  for (std::size_t o = 0; o < outputs_.size(); ++o)
    if (bound_[o]) nodes[outputs_[o]].value = outer(o, output, ctx.extra_outputs);
  for (auto& node : nodes) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j)
      node.input_values[j] = nodes[node.inputs[j]].value;
    node.extra_values.resize(node.extras.size());
    for (std::size_t e = 0; e < node.extras.size(); ++e)
      node.extra_values[e] = nodes[node.extras[e]].value;
  }
}

std::uint64_t ModelLayer::given_masks(const CallContext& ctx) noexcept {
  std::uint64_t given = 0;
  for (std::size_t i = 0; i < ctx.input_masks.size() && i < 64; ++i)
    if (!ctx.input_masks[i].empty()) given |= std::uint64_t{1} << i;
  return given;
}

detail::MaskPlan& ModelLayer::masks_for(Run& run, std::size_t rows, const CallContext& ctx) {
  const std::uint64_t given = given_masks(ctx);
  if (given != 0 && !refusal_.empty()) throw ConfigError(label() + ": " + refusal_);
  auto found = std::find_if(run.masks.begin(), run.masks.end(),
                            [given](const Masks& m) { return m.given == given; });
  if (found == run.masks.end()) {
    // The first call with these inputs masked: planned once (with Keras's warnings for a mask
    // that stops inside), and copied for this call's buffers.
    auto plan = std::find_if(mask_plans_.begin(), mask_plans_.end(),
                             [given](const Masks& m) { return m.given == given; });
    if (plan == mask_plans_.end()) {
      detail::MaskPlan planned = plan_masks(given, true);
      check_later_outputs(planned);
      mask_plans_.push_back({given, std::move(planned)});
      plan = std::prev(mask_plans_.end());
    }
    run.masks.push_back(*plan);
    found = std::prev(run.masks.end());
  }
  detail::MaskPlan& masks = found->plan;
  if (masks.empty()) return masks;
  masks.reserve(ctx.backend, run.nodes, rows);
  masks.set_rows(run.nodes, rows);
  for (std::size_t i = 0; i < inputs_ && i < ctx.input_masks.size(); ++i)
    if (!ctx.input_masks[i].empty()) ctx.backend.copy(ctx.input_masks[i], masks.mask_of(i));
  return masks;
}

void ModelLayer::compute_mask(std::span<const Tensor<float>>, const Tensor<float>& mask,
                              const CallContext& ctx) {
  const Tensor<float> inner =
      last_masks_ == nullptr ? Tensor<float>() : last_masks_->mask_of(outputs_.front());
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
  inner.extra_outputs = {};
  inner.extra_output_gradients = {};
  if (!layer.trainable() && layer.class_name() == "BatchNormalization") inner.training = false;
  return inner;
}

void ModelLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                         const CallContext& ctx) {
  share_variables();
  const std::size_t rows = inputs[0].dim(0);
  Run& run = run_for(output, inputs, ctx.backend);
  auto& nodes = run.nodes;
  detail::MaskPlan& masks = masks_for(run, rows, ctx);
  last_masks_ = &masks;
  bind(run, inputs, output, ctx);
  for (std::size_t k = inputs_; k < nodes.size(); ++k) {
    auto& node = nodes[k];
    if (!node.runs()) continue;  // a later output of a call, which its first output's computed
    CallContext inner = inner_context(ctx, *node.layer);
    inner.input_masks =
        node.layer->reads_masks() ? masks.inputs(k) : std::span<const Tensor<float>>();
    inner.extra_outputs = node.extra_values;
    node.layer->forward(node.input_values, node.value, inner);
    if (!masks.empty()) masks.after_forward(ctx.backend, nodes, k, inner);
  }
  for (std::size_t o = 0; o < outputs_.size(); ++o)
    if (!bound_[o]) ctx.backend.copy(nodes[outputs_[o]].value, outer(o, output, ctx.extra_outputs));
}

void ModelLayer::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const Tensor<float>& output_gradient,
                          std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  share_variables();
  Backend& backend = ctx.backend;
  Run& run = run_for(output, inputs, backend);
  bind(run, inputs, output, ctx);
  auto& nodes = run.nodes;
  // A node's gradient is needed when it has trainable weights, a node before it does, or it
  // leads back to an input whose gradient the outer call asks for.
  for (std::size_t i = 0; i < inputs_; ++i) {
    nodes[i].gradient = i < input_gradients.size() ? input_gradients[i] : Tensor<float>();
    needed_[i] = !nodes[i].gradient.empty();
  }
  for (std::size_t k = inputs_; k < nodes.size(); ++k) {
    const auto& node = nodes[k];
    if (!node.runs()) {
      needed_[k] = needed_[node.primary];
      continue;
    }
    bool need = false;
    for (const auto& w : node.layer->weights())
      need = need || w.trainable;
    for (const std::size_t p : node.inputs)
      need = need || needed_[p];
    needed_[k] = need;
  }
  // An input nothing reads has a gradient of zero.
  for (std::size_t i = 0; i < inputs_; ++i)
    if (needed_[i] && !written_[i]) backend.fill(nodes[i].gradient, 0.0F);
  // The outer gradients: the first listing of a node writes its gradient (zero for an output
  // nothing outside reads), a later one adds.
  for (std::size_t o = 0; o < outputs_.size(); ++o) {
    const Tensor<float>& gradient = nodes[outputs_[o]].gradient;
    if (gradient.empty() || !needed_[outputs_[o]]) continue;
    const Tensor<float> given = outer(o, output_gradient, ctx.extra_output_gradients);
    if (!direct_[o]) {
      if (!given.empty()) backend.axpy(1.0F, given, gradient);
    } else if (given.empty()) {
      backend.fill(gradient, 0.0F);
    } else {
      backend.copy(given, gradient);
    }
  }
  for (auto& node : nodes) {
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const std::size_t p = node.inputs[j];
      if (!needed_[p]) {
        node.input_gradients[j] = Tensor<float>();
      } else if (node.targets[j] == detail::GradientTarget::direct) {
        node.input_gradients[j] = nodes[p].gradient;
      }  // else the scratch `run_for` points it at
    }
    node.extra_gradients.resize(node.extras.size());
    for (std::size_t e = 0; e < node.extras.size(); ++e) {
      const auto& extra = nodes[node.extras[e]];
      node.extra_gradients[e] = extra.gradient_written ? extra.gradient : Tensor<float>();
    }
  }
  // The masks of this call's forward (its buffers still hold them).
  const std::uint64_t given = given_masks(ctx);
  const auto found = std::find_if(run.masks.begin(), run.masks.end(),
                                  [given](const Masks& m) { return m.given == given; });
  const detail::MaskPlan* masks = found == run.masks.end() ? nullptr : &found->plan;
  for (std::size_t k = nodes.size(); k-- > inputs_;) {
    auto& node = nodes[k];
    if (!needed_[k] || !node.runs()) continue;
    CallContext inner = inner_context(ctx, *node.layer);
    inner.input_masks = node.layer->reads_masks() && masks != nullptr
                            ? masks->inputs(k)
                            : std::span<const Tensor<float>>();
    inner.extra_outputs = node.extra_values;
    inner.extra_output_gradients = node.extra_gradients;
    node.layer->backward(node.input_values, node.value,
                         node.gradient_written ? node.gradient : Tensor<float>(),
                         node.input_gradients, inner);
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

KerasTensor call(const std::shared_ptr<Model>& model, const std::vector<KerasTensor>& inputs) {
  return call(LayerArg(detail::model_as_layer(model)), inputs);
}

std::vector<KerasTensor> call_outputs(const std::shared_ptr<Model>& model,
                                      const std::vector<KerasTensor>& inputs) {
  return call_outputs(LayerArg(detail::model_as_layer(model)), inputs);
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
