/// \file
/// `Layer`: the base of every Keras layer, with one compute hook for each direction.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/deferred.hpp"
#include "loadstar/keras/detail/fusion_role.hpp"
#include "loadstar/keras/mixed_precision/policy.hpp"
#include "loadstar/keras/variable.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// An axis of unknown length in a sample shape, Keras's `None`: `Input({none})` takes sequences of
/// any length, settled per batch (`Input(shape=(None,))` in Keras). Written as `null` in model
/// files and printed as `None`. A length of 0 is this, never an empty axis.
inline constexpr std::size_t none = 0;

class Backend;
class Constraint;
class Regularizer;

namespace detail {
/// The fused operations a training step's call takes part in (keras/detail/relu_fusion.hpp).
struct ReluFusionCall;
}  // namespace detail

/// What a layer needs to know about the call it is part of.
struct CallContext {
  /// The kernels the layer computes with (GEMM, convolution, elementwise, reductions).
  Backend& backend;
  /// `true` in `fit` and `train_on_batch`: `Dropout` drops and `BatchNormalization` uses the
  /// batch's statistics and updates its moving ones.
  bool training = false;
  /// Randomness of this call (dropout masks) derives from (seed, step) and the layer, never from
  /// a thread or the time, so that runs are reproducible.
  std::uint64_t seed = 0;
  std::uint64_t step = 0;
  /// `backward` adds the weights' gradients into `Variable::gradient` (`true`), or may write
  /// them, ignoring what the gradients held (`false`: given only to a layer whose
  /// `writes_gradients()` is `true`, in the one call of a step that computes its gradients).
  bool accumulate_gradients = true;
  /// In a training step, the fused operations this call takes part in, or null: the model's plan
  /// (keras/detail/relu_fusion.hpp), read by the built-in layers whose `fusion_role` asks for it.
  const detail::ReluFusionCall* relu_fusion = nullptr;
  /// The masks of the call's inputs (Keras's `_keras_mask`), given to a layer whose
  /// `reads_masks()` is `true`: per input, `(batch, ...)` of 1 (a step that counts) and 0 (a
  /// masked step), the input's shape without its last axis; empty for an input without a mask.
  std::span<const Tensor<float>> input_masks = {};
  /// For a layer with several outputs (`output_count() > 1`): its outputs after the first, `(batch,
  /// ...)` in the shapes of `extra_output_shapes`, which `forward` writes and `backward` reads.
  std::span<const Tensor<float>> extra_outputs = {};
  /// In `backward`, the gradients of the loss with respect to `extra_outputs`; an entry with no
  /// elements is an output nothing reads, whose gradient is zero (as is `output_gradient` then,
  /// for a layer with several outputs whose first nothing reads).
  std::span<const Tensor<float>> extra_output_gradients = {};
  /// Where a layer leaves a check of its inputs that a device is still running (`Embedding`'s of
  /// its indices), or null: the model reads them with the step's losses (or, predicting, when the
  /// step ends), and each throws what it found wrong. A layer given none waits for its check.
  std::vector<Deferred<bool>>* deferred_checks = nullptr;
};

/// What becomes of the masks of a layer's inputs (Keras's `supports_masking` and
/// `compute_mask`): a mask made by `Masking` or `Embedding(mask_zero=True)` marks the steps of a
/// sequence to skip, and flows along the graph to the layers that use it.
enum class MaskFlow {
  /// The layer does not support masking (Keras 3's default): a mask on its input stops there, and
  /// the model warns once, naming the layer, as Keras does.
  stops,
  /// The layer uses the mask (`reads_masks()`) and its output has none (`GlobalAveragePooling1D`,
  /// a recurrent layer returning its last output).
  ends,
  /// The output has the first input's mask (element-wise layers, `Dense`, `Dropout`, a recurrent
  /// layer returning sequences).
  passes,
  /// The output's mask is the step-wise OR of the inputs' masks, and there is none unless every
  /// input has one (Keras 3's merge layers, and `Concatenate` along the last axis).
  any_of,
  /// The layer makes the output's mask from its inputs in `compute_mask` (`Masking`, `Embedding`
  /// with `mask_zero`).
  computes,
  /// The output's mask joins the inputs' masks along the axis the layer joins its inputs (Keras
  /// 3's `Concatenate` along another axis than the last), an unmasked input's steps all
  /// counting, or is made from them otherwise (a nested model whose inner layers change them);
  /// there is none unless an input has one. The layer writes it in `compute_mask`, which then
  /// finds the inputs' masks in `ctx.input_masks`.
  joins,
  /// The layer would use a mask in a way loadstar does not run: a masked input is refused with a
  /// `ConfigError` naming the layer.
  refused,
};

/// The base of every layer: Keras's `class_name`, a unique `name`, weights in Keras's order, and
/// the compute hooks.
///
/// The model owns the activations: it gives `forward` its inputs and an output tensor of the shape
/// `build` announced (with the batch axis in front), and gives `backward` the same tensors plus
/// the gradient of the loss with respect to the output. A layer keeps only its weights and the
/// scratch it needs between `forward` and `backward` (a dropout mask, a max-pooling argmax,
/// batch statistics), sized on the first batch and reused afterwards so that a training step
/// allocates nothing. Every computation goes through `ctx.backend`, so that another backend
/// (CUDA) adds kernels without touching the layers.
///
/// A layer is shared by every place it is called from (Keras's shared layers); create it with
/// `std::make_shared` or pass it by value to a model, which moves it into a shared pointer.
class Layer : public std::enable_shared_from_this<Layer> {
 public:
  explicit Layer(std::string name = {}) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = default;
  Layer(Layer&&) noexcept = default;
  Layer& operator=(const Layer&) = default;
  Layer& operator=(Layer&&) noexcept = default;

  /// Keras's class name (`"Dense"`): the key of the layer registry and of `model_config`.
  virtual std::string class_name() const = 0;

  /// The layer's name, unique in its model (`"dense_1"`); empty until a model names it.
  const std::string& name() const noexcept { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  /// Creates the weights for inputs of the given shapes (without the batch axis) and returns the
  /// shape of the output (without the batch axis). Throws `ShapeError` naming the layer when the
  /// shapes do not fit (`"dense layer 'fc1': expects rank-1 inputs but got (28, 28)"`).
  /// `seed` seeds the default initializers (Keras's `glorot_uniform` and friends).
  virtual Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) = 0;

  /// Whether the layer takes inputs with axes of unknown length (Keras's `None`, written
  /// `keras::none` in a sample shape): a text model's sequence axis. `false` (the default): `call`
  /// refuses such an input, naming the layer. A layer that returns `true` builds its weights
  /// without the unknown lengths (throwing `ShapeError` for an axis it needs known, as `Dense` its
  /// last), returns `none` for the output axes that follow them, computes the output shape of
  /// each batch in `output_shape_for`, and reads the lengths of each batch from its tensors.
  virtual bool takes_unknown_axes() const noexcept { return false; }

  /// Keras's `compute_output_shape` for the shapes (without the batch axis) of one batch's
  /// inputs, which are those of the build with every unknown length now known: the output's shape
  /// for them. Called only on a layer whose `takes_unknown_axes()` is `true`; the default returns
  /// the output shape of the build.
  virtual Shape output_shape_for(std::span<const Shape> /*input_shapes*/) const {
    return built_output_shape_;
  }

  /// The number of tensors a call of the layer returns: 1, or more for a layer whose Keras call
  /// returns a list (a recurrent layer with `return_state`: its output and its final states).
  /// `call_outputs` calls such a layer; `forward` writes the first output and
  /// `CallContext::extra_outputs` the others.
  virtual std::size_t output_count() const noexcept { return 1; }
  /// The shapes (without the batch axis) of the outputs after the first, for inputs of the given
  /// shapes (those of the build, or of one batch when lengths are unknown); empty for a layer with
  /// one output.
  virtual std::vector<Shape> extra_output_shapes(std::span<const Shape> /*input_shapes*/) const {
    return {};
  }

  /// Computes `output` (batch axis first) from `inputs`.
  virtual void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                       const CallContext& ctx) = 0;

  /// Given the gradient of the loss with respect to `output`, writes the gradients with respect
  /// to the inputs into `input_gradients` (an entry with no elements is not needed and is skipped)
  /// and adds the gradients of the weights into their `Variable::gradient` (the model zeroes them
  /// before each step, so a layer called twice accumulates both calls). A layer whose
  /// `writes_gradients()` is `true` writes them instead when `ctx.accumulate_gradients` is
  /// `false`.
  virtual void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                        const Tensor<float>& output_gradient,
                        std::span<const Tensor<float>> input_gradients, const CallContext& ctx) = 0;

  /// Whether `backward` writes every weight's gradient (the previous contents ignored) when
  /// `ctx.accumulate_gradients` is `false`. A model then neither zeroes those gradients before a
  /// step nor has them added to: a layer called once per step writes them in its one `backward`
  /// (as a model's first contribution to an activation's gradient writes it), which saves a
  /// kernel per weight and lets a device fuse the bias gradient into the kernel gradient's
  /// matrix product. `false` (the default, and the choice of a layer that scatters into its
  /// gradients, as `Embedding`): the model zeroes them before each step and the layer adds.
  virtual bool writes_gradients() const noexcept { return false; }
  /// The parts this layer can play in a training step's fused operations (`detail::FusionRole`:
  /// a built-in `Dense`, convolution or max pooling layer); `none`, the default, for every other
  /// layer. A further fused pattern belongs in the backend's step recorder, not in more queries
  /// here.
  virtual detail::FusionRole fusion_role() const noexcept { return detail::FusionRole::none; }

  /// What becomes of the masks of the layer's inputs (`MaskFlow`); `stops` by default, as a Keras
  /// layer that does not set `supports_masking`.
  virtual MaskFlow mask_flow() const noexcept { return MaskFlow::stops; }
  /// How many of the layer's outputs, from the first, carry the mask `mask_flow` gives the first
  /// (1 by default; a later output has none, as a recurrent layer's states). `Bidirectional` with
  /// `merge_mode` None masks both directions' outputs, as Keras does.
  virtual std::size_t masked_outputs() const noexcept { return 1; }
  /// Whether `forward` and `backward` read `ctx.input_masks` (a recurrent layer skips the masked
  /// steps, `GlobalAveragePooling1D` averages the others).
  virtual bool reads_masks() const noexcept { return false; }
  /// For `MaskFlow::computes` and `MaskFlow::joins`: writes the output's mask `(batch, ...)` (the
  /// output's shape without its last axis; 1 for a step that counts, 0 for a masked one) from the
  /// inputs of the `forward` just run (and, for `joins`, their masks in `ctx.input_masks`).
  virtual void compute_mask(std::span<const Tensor<float>> /*inputs*/,
                            const Tensor<float>& /*mask*/, const CallContext& /*ctx*/) {}

  /// Keras's `layer.reset_states()`: a stateful layer (a recurrent layer with `stateful`) forgets
  /// the states it carries from batch to batch, and starts the next from zeros; nothing for the
  /// others.
  virtual void reset_states() {}
  /// The states a stateful layer carries to its next batch (views of its buffers in the memory of
  /// the backend that computed them: `h`, then an LSTM's `c`, each `(batch, units)`); empty when
  /// it carries none. A checkpoint keeps them so that a resumed run continues exactly.
  virtual std::vector<Tensor<float>> carried_states() const { return {}; }
  /// Sets the states `carried_states()` returned (in `backend`'s memory, copied with it); empty
  /// carries none, as after `reset_states()`. Throws `ShapeError` naming the layer for states of
  /// other shapes, and for any given to a layer that carries none.
  virtual void restore_carried_states(Backend& /*backend*/, std::span<const Tensor<float>> states) {
    if (!states.empty()) {
      throw ShapeError(class_name() + " layer '" + name() +
                       "': carries no states from batch to batch but was given " +
                       std::to_string(states.size()));
    }
  }

  /// The weights in Keras's order (trainable first, as `layer.weights` lists them).
  std::span<Variable> weights() noexcept { return weights_; }
  std::span<const Variable> weights() const noexcept { return weights_; }

  /// Keras's `get_config()` of the layer (the `config` of its `model_config` entry).
  virtual nlohmann::json get_config() const { return {{"name", name_}, {"trainable", trainable_}}; }

  /// Whether the layer was built: its weights exist for the input shapes it was built for.
  /// `call` builds a layer on its first call and records this; a layer called again (a shared
  /// layer) is checked against these shapes instead of being built twice (Keras's `built` and
  /// `_build_shapes_dict`, kept on the layer).
  bool built() const noexcept { return built_; }
  /// The shapes (without the batch axis) the layer was built for; empty until built.
  const std::vector<Shape>& built_input_shapes() const noexcept { return built_input_shapes_; }
  /// The output shape (without the batch axis) of the build.
  const Shape& built_output_shape() const noexcept { return built_output_shape_; }
  /// Records a build for `input_shapes` giving `output_shape` (`call` does this after `build`).
  LOADSTAR_DECL void set_built(std::vector<Shape> input_shapes, Shape output_shape);

  /// Keras's `layer.trainable`: `false` freezes the weights (they become non-trainable, so that
  /// optimizers skip them), those created later included. A layer owning layers freezes them too.
  bool trainable() const noexcept { return trainable_; }
  LOADSTAR_DECL virtual void set_trainable(bool trainable);

  /// Keras's `layer.dtype_policy`: the dtype the layer computes in and that of its variables; the
  /// global policy when the layer was made (`mixed_precision::global_policy()`), unless set.
  const mixed_precision::Policy& dtype_policy() const noexcept { return dtype_policy_; }
  /// Sets the policy (Keras's `dtype` argument of every layer), before the model is made.
  void set_dtype_policy(const mixed_precision::Policy& policy) noexcept { dtype_policy_ = policy; }

  /// The number of scalars in the weights.
  LOADSTAR_DECL std::size_t count_params() const noexcept;

  /// Keras's `activity_regularizer`: a penalty on the layer's output, divided by the batch size
  /// and added to the loss as Keras 3's `Layer.__call__` adds it (null: none).
  const std::shared_ptr<Regularizer>& activity_regularizer() const noexcept {
    return activity_regularizer_;
  }
  void set_activity_regularizer(std::shared_ptr<Regularizer> regularizer) {
    activity_regularizer_ = std::move(regularizer);
  }

  /// A weight's regularizer and constraint (Keras's `kernel_regularizer`, `kernel_constraint`,
  /// ... of the weight named `weight`, `"kernel"`).
  struct WeightOptions {
    std::string weight;
    std::shared_ptr<Regularizer> regularizer;
    std::shared_ptr<Constraint> constraint;
  };
  /// Sets the regularizer of the weight named `weight` (`"kernel"`, `"bias"`, `"gamma"`,
  /// `"embeddings"`, ...); null removes it. The model adds its penalty to the loss, and refuses
  /// a name the built layer has no weight of. Set before the model is made.
  LOADSTAR_DECL void set_regularizer(const std::string& weight,
                                     std::shared_ptr<Regularizer> regularizer);
  /// Sets the constraint of the weight named `weight`, applied after each optimizer step; null
  /// removes it.
  LOADSTAR_DECL void set_constraint(const std::string& weight,
                                    std::shared_ptr<Constraint> constraint);
  /// The weights' regularizers and constraints, in the order they were first set.
  std::span<const WeightOptions> weight_options() const noexcept { return weight_options_; }
  /// The options of `weight`, or null.
  LOADSTAR_DECL const WeightOptions* weight_options(std::string_view weight) const noexcept;

 protected:
  /// Adds a weight (in Keras's order) with a zero gradient of the same shape when trainable.
  LOADSTAR_DECL Variable& add_weight(std::string name, Tensor<float> value, bool trainable = true);

  std::vector<Variable> weights_;

 private:
  LOADSTAR_DECL WeightOptions& options_of(const std::string& weight);

  std::shared_ptr<Regularizer> activity_regularizer_;
  std::vector<WeightOptions> weight_options_;
  std::string name_;
  bool trainable_ = true;
  bool built_ = false;
  mixed_precision::Policy dtype_policy_ = mixed_precision::global_policy();
  std::vector<Shape> built_input_shapes_;
  Shape built_output_shape_;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Layer::set_built(std::vector<Shape> input_shapes, Shape output_shape) {
  built_input_shapes_ = std::move(input_shapes);
  built_output_shape_ = std::move(output_shape);
  built_ = true;
}

void Layer::set_trainable(bool trainable) {
  trainable_ = trainable;
  for (auto& w : weights_)
    w.trainable = trainable && !w.gradient.empty();
}

std::size_t Layer::count_params() const noexcept {
  std::size_t n = 0;
  for (const auto& w : weights_)
    n += w.value.size();
  return n;
}

Layer::WeightOptions& Layer::options_of(const std::string& weight) {
  for (auto& options : weight_options_)
    if (options.weight == weight) return options;
  weight_options_.push_back({weight, nullptr, nullptr});
  return weight_options_.back();
}

void Layer::set_regularizer(const std::string& weight, std::shared_ptr<Regularizer> regularizer) {
  options_of(weight).regularizer = std::move(regularizer);
}

void Layer::set_constraint(const std::string& weight, std::shared_ptr<Constraint> constraint) {
  options_of(weight).constraint = std::move(constraint);
}

const Layer::WeightOptions* Layer::weight_options(std::string_view weight) const noexcept {
  for (const auto& options : weight_options_)
    if (options.weight == weight) return &options;
  return nullptr;
}

Variable& Layer::add_weight(std::string name, Tensor<float> value, bool trainable) {
  Tensor<float> gradient = trainable ? Tensor<float>(value.shape()) : Tensor<float>();
  weights_.push_back(
      Variable{std::move(name), std::move(value), std::move(gradient), trainable && trainable_});
  return weights_.back();
}

}  // namespace loadstar::keras
#endif
