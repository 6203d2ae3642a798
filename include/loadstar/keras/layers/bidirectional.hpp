/// \file
/// `Bidirectional`: Keras's wrapper running a recurrent layer forward and backward in time.
#pragma once

#include "loadstar/config.hpp"

#include <string>

#include "loadstar/keras/layers/detail/recurrent.hpp"

namespace loadstar::keras::layers {

/// How `Bidirectional` merges its two directions (Keras's `merge_mode`).
/// `none` is Keras's `merge_mode=None`: the two directions' outputs are returned apart (the call
/// has two outputs: call the layer with `call_outputs`).
enum class MergeMode { concat, sum, mul, ave, none };
// The recurrent kernels' merge (keras/detail/recurrent_kernels.hpp) numbers the modes alike.
static_assert(
    static_cast<int>(MergeMode::concat) ==
        static_cast<int>(keras::detail::RecurrentMerge::concat) &&
    static_cast<int>(MergeMode::sum) == static_cast<int>(keras::detail::RecurrentMerge::sum) &&
    static_cast<int>(MergeMode::mul) == static_cast<int>(keras::detail::RecurrentMerge::mul) &&
    static_cast<int>(MergeMode::ave) == static_cast<int>(keras::detail::RecurrentMerge::ave) &&
    static_cast<int>(MergeMode::none) == static_cast<int>(keras::detail::RecurrentMerge::none));

/// Keras's `Bidirectional`: the wrapped `SimpleRNN`, `LSTM` or `GRU` over the sequence, and a
/// copy of it with `go_backwards` flipped (or the `backward_layer` given); with
/// `return_sequences` the backward outputs are put back in time order before they are merged.
/// Weights: the forward layer's, then the backward layer's.
/// \code
/// Bidirectional both(LSTM(32, {.return_sequences = true}));
/// \endcode
class Bidirectional : public detail::LayerBase {
 public:
  /// Throws `ConfigError` unless both layers are recurrent layers of the same output size with
  /// opposite `go_backwards` and the same `return_sequences`.
  LOADSTAR_DECL explicit Bidirectional(const detail::RecurrentLayer& layer,
                                       MergeMode merge_mode = MergeMode::concat,
                                       std::string name = {});
  LOADSTAR_DECL Bidirectional(const detail::RecurrentLayer& layer,
                              const detail::RecurrentLayer& backward_layer, MergeMode merge_mode,
                              std::string name = {});

  std::string class_name() const override { return "Bidirectional"; }
  MergeMode merge_mode() const noexcept { return merge_mode_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Timesteps of unknown length (a text model's), settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;
  /// Both directions skip masked steps (their masked outputs 0 when returning sequences, as
  /// Keras's `Bidirectional` sets `zero_output_for_mask`); the output has the input's mask when
  /// it returns sequences.
  MaskFlow mask_flow() const noexcept override {
    return forward_.options().return_sequences ? MaskFlow::passes : MaskFlow::ends;
  }
  bool reads_masks() const noexcept override { return true; }
  /// With the wrapped layer's `return_state`: the merged output, then the forward direction's
  /// final states, then the backward direction's (Keras's order).
  /// With `MergeMode::none`, both directions' outputs have the input's mask (Keras).
  std::size_t masked_outputs() const noexcept override {
    return merge_mode_ == MergeMode::none ? 2 : 1;
  }
  /// With `MergeMode::none`, the two directions' outputs come first, apart.
  std::size_t output_count() const noexcept override {
    const std::size_t outputs = merge_mode_ == MergeMode::none ? 2 : 1;
    return forward_.options().return_state
               ? outputs + forward_.state_count() + backward_.state_count()
               : outputs;
  }
  std::vector<Shape> extra_output_shapes(std::span<const Shape> inputs) const override {
    std::vector<Shape> out;
    if (merge_mode_ == MergeMode::none) out.push_back(backward_.output_shape(inputs[0]));
    if (!forward_.options().return_state) return out;
    out.insert(out.end(), forward_.state_count(), Shape{forward_.units()});
    out.insert(out.end(), backward_.state_count(), Shape{backward_.units()});
    return out;
  }
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The merge of the directions' outputs, or its adjoint (`op`), for `batch` samples of `steps`
  /// steps (1 when they return no sequences).
  keras::detail::RecurrentKernel merge_kernel(keras::detail::RecurrentOp op, std::size_t batch,
                                              std::size_t steps) const noexcept {
    keras::detail::RecurrentKernel k;
    k.op = op;
    k.merge = static_cast<keras::detail::RecurrentMerge>(merge_mode_);
    k.batch = batch;
    k.steps = steps;
    k.units = forward_.units();
    k.second_units = backward_.units();
    return k;
  }
  /// The config of a direction's layer as Keras writes it (`forward_lstm`, `backward_lstm`).
  LOADSTAR_DECL nlohmann::json direction_config(const detail::RecurrentCore& core,
                                                const std::string& prefix) const;
  /// Each direction's dropout in this call: keyed by `name/forward` and `name/backward` in
  /// training, none otherwise.
  void set_dropout(const CallContext& ctx) {
    for (auto* core : {&forward_, &backward_}) {
      core->set_dropout(ctx.training ? std::optional(detail::recurrent_dropout_key(
                                           core->options().seed, ctx,
                                           name() + (core == &forward_ ? "/forward" : "/backward")))
                                     : std::nullopt);
    }
  }
  std::span<const Variable> direction_weights(std::size_t direction) const {
    const std::size_t n = weights_.size() / 2;
    return std::span<const Variable>(weights_).subspan(direction * n, n);
  }

  detail::RecurrentCore forward_, backward_;
  MergeMode merge_mode_;
  bool custom_backward_ = false;
  detail::Scratch forward_output_, backward_output_, forward_gradient_, backward_gradient_,
      input_gradient_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

namespace detail {
/// A direction's options: Keras's `Bidirectional` sets `zero_output_for_mask` to
/// `return_sequences` in both.
inline RecurrentOptions direction_options(RecurrentOptions options) {
  options.zero_output_for_mask = options.return_sequences;
  return options;
}

/// Keras's name of a merge mode; `null` for `none`.
inline nlohmann::json merge_mode_name(MergeMode mode) {
  return mode == MergeMode::concat ? nlohmann::json("concat")
         : mode == MergeMode::sum  ? nlohmann::json("sum")
         : mode == MergeMode::mul  ? nlohmann::json("mul")
         : mode == MergeMode::ave  ? nlohmann::json("ave")
                                   : nlohmann::json(nullptr);
}
}  // namespace detail

Bidirectional::Bidirectional(const detail::RecurrentLayer& layer, MergeMode merge_mode,
                             std::string name)
    : Bidirectional(layer, layer, merge_mode, std::move(name)) {
  custom_backward_ = false;
  RecurrentOptions options = backward_.options();
  options.go_backwards = !options.go_backwards;
  backward_ = detail::RecurrentCore(backward_.kind(), backward_.units(), options, label());
}

Bidirectional::Bidirectional(const detail::RecurrentLayer& layer,
                             const detail::RecurrentLayer& backward_layer, MergeMode merge_mode,
                             std::string name)
    : LayerBase(std::move(name)),
      forward_(layer.kind(), layer.units(), detail::direction_options(layer.options()),
               "bidirectional layer"),
      backward_(backward_layer.kind(), backward_layer.units(),
                detail::direction_options(backward_layer.options()), "bidirectional layer"),
      merge_mode_(merge_mode),
      custom_backward_(true) {
  if (layer.options().stateful || backward_layer.options().stateful) {
    throw ConfigError(label() +
                      ": wraps a stateful layer, which loadstar's Bidirectional does not carry "
                      "from batch to batch; wrap the layer without stateful");
  }
  if (layer.options().return_state != backward_layer.options().return_state) {
    throw ConfigError(label() + ": backward_layer must have the forward layer's return_state");
  }
  if (&layer != &backward_layer) {
    if (backward_layer.options().go_backwards == layer.options().go_backwards) {
      throw ConfigError(label() + ": backward_layer must have go_backwards " +
                        (layer.options().go_backwards ? "false" : "true") +
                        " (the opposite of the forward layer's)");
    }
    if (backward_layer.options().return_sequences != layer.options().return_sequences ||
        (merge_mode != MergeMode::concat && merge_mode != MergeMode::none &&
         backward_layer.units() != layer.units())) {
      throw ConfigError(label() +
                        ": backward_layer must have the forward layer's "
                        "return_sequences and output size");
    }
  }
}

Shape Bidirectional::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  if (input_shapes.empty()) expect_inputs(input_shapes, 1);
  const std::string prefix = label();
  forward_ = detail::RecurrentCore(forward_.kind(), forward_.units(), forward_.options(),
                                   prefix + " (forward)");
  backward_ = detail::RecurrentCore(backward_.kind(), backward_.units(), backward_.options(),
                                    prefix + " (backward)");
  // Keras's initial_state: the forward direction's states, then the backward one's.
  const std::size_t sf = forward_.state_count(), sb = backward_.state_count();
  if (input_shapes.size() > 1) {
    if (input_shapes.size() != 1 + sf + sb) {
      throw ShapeError(label() + ": takes the sequence and " + std::to_string(sf + sb) +
                       " initial states (initial_state: the forward direction's, then the "
                       "backward one's) but got " +
                       std::to_string(input_shapes.size() - 1) + " after the sequence");
    }
    forward_.check_initial_states(input_shapes.subspan(1, sf));
    backward_.check_initial_states(input_shapes.subspan(1 + sf, sb));
  }
  Shape out = forward_.output_shape(input_shapes[0]);
  const Shape back = backward_.output_shape(input_shapes[0]);
  if (merge_mode_ == MergeMode::concat) out[out.rank() - 1] += back[back.rank() - 1];
  const std::size_t features = input_shapes[0][1];
  if (!weights_.empty()) {
    forward_.check_weights(direction_weights(0), features);
    backward_.check_weights(direction_weights(1), features);
  } else {
    for (std::size_t direction = 0; direction < 2; ++direction) {
      const detail::RecurrentCore& core = direction == 0 ? forward_ : backward_;
      const auto names = detail::cell_weight_names(core.kind());
      const std::string scope = std::string(direction == 0 ? "forward_" : "backward_") +
                                keras::detail::to_snake_case(cell_class_name(core.kind())) + "/";
      auto values = core.initial_weights(features, SplitMix64::mix(seed + 17 * direction));
      for (std::size_t i = 0; i < values.size(); ++i)
        add_weight(scope + names[i], values[i]);
    }
  }
  remember(input_shapes, out);
  return out;
}

Shape Bidirectional::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out = forward_.output_shape(input_shapes[0]);
  const Shape back = backward_.output_shape(input_shapes[0]);
  if (merge_mode_ == MergeMode::concat) out[out.rank() - 1] += back[back.rank() - 1];
  return out;
}

void Bidirectional::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                            const CallContext& ctx) {
  check_inputs(inputs);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].dim(0);
  const Shape forward_shape = forward_.output_shape(inputs[0].shape().row_shape());
  const Shape backward_shape = backward_.output_shape(inputs[0].shape().row_shape());
  const Tensor<float> yf = forward_output_.get(backend, forward_shape.prepend(batch));
  const Tensor<float> yb = backward_output_.get(backend, backward_shape.prepend(batch));
  const Tensor<float> mask = detail::input_mask(ctx);
  set_dropout(ctx);
  const std::size_t sf = forward_.state_count();
  const auto initial = [&](std::size_t direction) {
    if (inputs.size() == 1) return std::span<const Tensor<float>>();
    return direction == 0 ? inputs.subspan(1, sf) : inputs.subspan(1 + sf);
  };
  // The extra outputs: the backward direction's output (merge_mode None), then the states.
  const bool separate = merge_mode_ == MergeMode::none;
  const std::size_t first_state = separate ? 1 : 0;
  const auto states = [&](std::size_t direction) {
    if (ctx.extra_outputs.size() <= first_state) return std::span<const Tensor<float>>();
    const auto all = ctx.extra_outputs.subspan(first_state);
    return direction == 0 ? all.subspan(0, sf) : all.subspan(sf);
  };
  forward_.forward(backend, direction_weights(0), inputs[0], yf, mask, initial(0), states(0));
  backward_.forward(backend, direction_weights(1), inputs[0], yb, mask, initial(1), states(1));
  // The backward direction's outputs come in its processing order: Keras reverses them back
  // along time when it returns sequences (and a go_backwards forward layer's stay as they are).
  const bool sequences = forward_.options().return_sequences;
  const std::size_t steps = sequences ? inputs[0].dim(1) : 1;
  const Tensor<float> tensors[] = {yf, yb, output,
                                   separate ? ctx.extra_outputs[0] : Tensor<float>()};
  const keras::detail::RecurrentKernel k =
      merge_kernel(keras::detail::RecurrentOp::bidirectional_merge, batch, steps);
  backend.recurrent_kernel(k, tensors, batch * steps * keras::detail::recurrent_row_length(k));
}

void Bidirectional::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                             const Tensor<float>& output_gradient,
                             std::span<const Tensor<float>> input_gradients,
                             const CallContext& ctx) {
  Backend& backend = ctx.backend;
  set_dropout(ctx);
  const std::size_t batch = inputs[0].dim(0);
  const Shape forward_shape = forward_.output_shape(inputs[0].shape().row_shape());
  const Shape backward_shape = backward_.output_shape(inputs[0].shape().row_shape());
  const Tensor<float> yf = forward_output_.get(backend, forward_shape.prepend(batch));
  const Tensor<float> yb = backward_output_.get(backend, backward_shape.prepend(batch));
  // An output nothing reads (of a layer returning several) has no gradient: the merged output,
  // or with merge_mode None either direction's.
  const bool separate = merge_mode_ == MergeMode::none;
  const std::size_t first_state = separate ? 1 : 0;
  const Tensor<float> backward_output_gradient = separate && !ctx.extra_output_gradients.empty()
                                                     ? ctx.extra_output_gradients[0]
                                                     : Tensor<float>();
  const bool read_forward = !output_gradient.empty();
  const bool read_backward = separate ? !backward_output_gradient.empty() : read_forward;
  const bool read = read_forward || read_backward;
  const Tensor<float> dyf =
      read_forward ? forward_gradient_.get(backend, forward_shape.prepend(batch)) : Tensor<float>();
  const Tensor<float> dyb = read_backward
                                ? backward_gradient_.get(backend, backward_shape.prepend(batch))
                                : Tensor<float>();
  const bool sequences = forward_.options().return_sequences;
  const std::size_t steps = sequences ? inputs[0].dim(1) : 1;
  const Tensor<float> tensors[] = {yf, yb, output_gradient, dyf, dyb, backward_output_gradient};
  if (read) {
    const keras::detail::RecurrentKernel k =
        merge_kernel(keras::detail::RecurrentOp::bidirectional_split, batch, steps);
    backend.recurrent_kernel(k, tensors, batch * steps * keras::detail::recurrent_row_length(k));
  }
  const bool dx = !input_gradients.empty() && !input_gradients[0].empty();
  const Tensor<float> dx_backward =
      dx ? input_gradient_.get(backend, inputs[0].shape()) : Tensor<float>();
  const Tensor<float> mask = detail::input_mask(ctx);
  const std::size_t sf = forward_.state_count();
  // Per direction: its initial states and their gradients, and its final states' gradients.
  const auto part = [&](std::span<const Tensor<float>> all, std::size_t direction) {
    if (all.empty()) return all;
    return direction == 0 ? all.subspan(0, sf) : all.subspan(sf);
  };
  const auto state_gradients = ctx.extra_output_gradients.size() > first_state
                                   ? ctx.extra_output_gradients.subspan(first_state)
                                   : std::span<const Tensor<float>>();
  const auto initial = inputs.subspan(1);
  const auto initial_gradients =
      input_gradients.size() > 1 ? input_gradients.subspan(1) : std::span<const Tensor<float>>();
  forward_.backward(backend, direction_weights(0), inputs[0], yf, dyf,
                    dx ? input_gradients[0] : Tensor<float>(), mask, part(initial, 0),
                    part(initial_gradients, 0), part(state_gradients, 0));
  backward_.backward(backend, direction_weights(1), inputs[0], yb, dyb, dx_backward, mask,
                     part(initial, 1), part(initial_gradients, 1), part(state_gradients, 1));
  if (dx) backend.add(input_gradients[0], dx_backward, input_gradients[0]);
}

nlohmann::json Bidirectional::direction_config(const detail::RecurrentCore& core,
                                               const std::string& prefix) const {
  nlohmann::json config = {
      {"name", prefix + keras::detail::to_snake_case(cell_class_name(core.kind()))},
      {"trainable", trainable()},
      {"dtype", "float32"}};
  core.write_config(config);
  return {{"class_name", cell_class_name(core.kind())}, {"config", config}};
}

nlohmann::json Bidirectional::get_config() const {
  auto config = base_config();
  config["layer"] = direction_config(forward_, "");
  config["merge_mode"] = detail::merge_mode_name(merge_mode_);
  if (custom_backward_) config["backward_layer"] = direction_config(backward_, "backward_");
  return config;
}

std::shared_ptr<Layer> Bidirectional::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Bidirectional");
  // The wrapped layers, read here rather than through the layer registry (which lists this
  // layer): `{"class_name": "LSTM", "config": {...}}`.
  const auto recurrent = [&](const char* key) {
    const nlohmann::json& j = *read.find(key);
    const std::string class_name =
        j.is_object() && j.contains("class_name") && j["class_name"].is_string()
            ? j["class_name"].get<std::string>()
            : std::string();
    if (class_name != "SimpleRNN" && class_name != "LSTM" && class_name != "GRU")
      read.fail(key, "a SimpleRNN, LSTM or GRU layer");
    const detail::CellKind kind = class_name == "LSTM"  ? detail::CellKind::lstm
                                  : class_name == "GRU" ? detail::CellKind::gru
                                                        : detail::CellKind::simple_rnn;
    return read.nested(key, [&] {
      const nlohmann::json inner = j.contains("config") ? j["config"] : nlohmann::json::object();
      return std::static_pointer_cast<detail::RecurrentLayer>(
          detail::recurrent_from_config<detail::RecurrentLayer>(inner, kind));
    });
  };
  if (!read.has("layer")) read.fail("layer", "the wrapped recurrent layer");
  const auto layer = recurrent("layer");
  const nlohmann::json* mode = read.find("merge_mode");
  MergeMode merge = MergeMode::concat;
  const std::string name =
      mode != nullptr && mode->is_null() ? std::string() : read.get("merge_mode", "concat");
  if (mode != nullptr && mode->is_null()) {
    merge = MergeMode::none;  // Keras's None: the two directions' outputs apart
  } else if (name == "sum") {
    merge = MergeMode::sum;
  } else if (name == "mul") {
    merge = MergeMode::mul;
  } else if (name == "ave") {
    merge = MergeMode::ave;
  } else if (name != "concat") {
    read.fail("merge_mode", "\"concat\", \"sum\", \"mul\", \"ave\" or null");
  }
  const nlohmann::json* backward = read.find("backward_layer");
  if (backward == nullptr || backward->is_null()) {
    return detail::finish_layer(
        read, std::make_shared<Bidirectional>(*layer, merge, detail::config_name(read)));
  }
  const auto backward_layer = recurrent("backward_layer");
  return detail::finish_layer(read, std::make_shared<Bidirectional>(*layer, *backward_layer, merge,
                                                                    detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
