/// \file
/// What `SimpleRNN`, `LSTM`, `GRU` and `Bidirectional` share: the options, the Keras config keys,
/// and `RecurrentCore`, one direction of a recurrent layer over a fixed number of timesteps.
///
/// The forward pass turns the batch `(batch, timesteps, features)` time-major once (reversed for
/// `go_backwards`), computes the input projection of every timestep as one GEMM
/// `(timesteps * batch, features) x (features, k * units)`, then per step one GEMM with the
/// recurrent kernel and the gate arithmetic of keras/detail/recurrent_formulas.hpp. It keeps the
/// hidden states of every step (and the LSTM carries, the GRU recurrent projections) for the
/// backward pass (backpropagation through time), which computes the weights' gradients as one
/// GEMM each over all timesteps.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "loadstar/keras/detail/recurrent_formulas.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The options of `SimpleRNN`, `LSTM` and `GRU` after `units`, with Keras's defaults
/// (`recurrent_activation`, `unit_forget_bias` and `reset_after` apply to the cells that have
/// them).
struct RecurrentOptions {
  std::string activation = "tanh";
  std::string recurrent_activation = "sigmoid";
  bool use_bias = true;
  /// LSTM: the forget gate's bias starts at 1 (Jozefowicz et al.), the rest from
  /// `bias_initializer`.
  bool unit_forget_bias = true;
  /// GRU: the reset gate applies after the recurrent product (Keras 2/3's default and cuDNN's),
  /// with separate input and recurrent biases `(2, 3 * units)`; `false` is Keras 1's GRU.
  bool reset_after = true;
  /// The whole sequence `(batch, timesteps, units)` rather than the last output `(batch, units)`.
  bool return_sequences = false;
  /// The call returns the final states too (Keras's list `[output, h]`, `[output, h, c]` for an
  /// LSTM, each `(batch, units)`): call the layer with `call_outputs`. The last state is that of
  /// the last unmasked step.
  bool return_state = false;
  /// Processes the sequence from its end and returns the outputs in that order (Keras).
  bool go_backwards = false;
  /// Each batch starts from the final states of the batch before (sample `i` from sample `i`'s),
  /// in training, evaluation and prediction alike, until `reset_states()` (Keras's `stateful`;
  /// every batch must have the same number of samples). Gradients stop at the batch's start, as
  /// Keras's truncated backpropagation through time; given initial states take precedence.
  bool stateful = false;
  /// With a mask on the input: a masked step's output is 0 rather than the previous step's
  /// (Keras's `zero_output_for_mask`, which `Bidirectional` sets when it returns sequences).
  bool zero_output_for_mask = false;
  /// Keras's `dropout` (of the inputs) and `recurrent_dropout` (of the state fed to the
  /// recurrent kernel), in `[0, 1)`, and their `seed`. In training each call draws its masks once
  /// and uses them at every step (Keras's `DropoutRNNCell`): a kept value is scaled by
  /// `1 / (1 - rate)`; the carried states themselves are not dropped. Outside training they do
  /// nothing. The masks derive from `(seed or the step's seed, the step, the layer's name)`.
  double dropout = 0.0;
  double recurrent_dropout = 0.0;
  std::optional<std::uint64_t> seed = std::nullopt;
  /// Keras's `implementation` of an LSTM or GRU cell: the same computation, except for dropout's
  /// masks, which are one per gate with 1 and one for all gates with 2. A `recurrent_dropout`
  /// makes it 1, as in Keras.
  int implementation = 2;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer recurrent_initializer = Initializer::orthogonal();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

namespace detail {

/// The cell of a recurrent layer: its gate count `k` is 1, 4 or 3.
enum class CellKind { simple_rnn, lstm, gru };

/// One direction of a recurrent layer: builds its weights (Keras's `kernel` `(features, k *
/// units)`, `recurrent_kernel` `(units, k * units)`, `bias` `(k * units)` or `(2, 3 * units)` for
/// a `reset_after` GRU) and runs the forward and backward passes on weights it is given, so that
/// `Bidirectional` runs two of them on its own weights.
class RecurrentCore {
 public:
  LOADSTAR_DECL RecurrentCore(CellKind kind, std::size_t units, RecurrentOptions options,
                              std::string label);

  CellKind kind() const noexcept { return kind_; }
  std::size_t units() const noexcept { return units_; }
  std::size_t gates() const noexcept {
    return kind_ == CellKind::lstm ? 4 : kind_ == CellKind::gru ? 3 : 1;
  }
  /// The number of states: 2 for an LSTM (`h`, `c`), else 1 (`h`).
  std::size_t state_count() const noexcept { return kind_ == CellKind::lstm ? 2 : 1; }
  /// Throws `ShapeError` unless `shapes` are the initial states of a call (Keras's
  /// `initial_state`): none, or `state_count()` of shape `(units)`.
  LOADSTAR_DECL void check_initial_states(std::span<const Shape> shapes) const;
  const RecurrentOptions& options() const noexcept { return options_; }
  /// The output shape (without the batch axis) for inputs `(timesteps, features)`; throws
  /// `ShapeError` for another rank.
  LOADSTAR_DECL Shape output_shape(const Shape& input) const;
  /// The initial weights for `features` input features, in Keras's order.
  LOADSTAR_DECL std::vector<Tensor<float>> initial_weights(std::size_t features,
                                                           std::uint64_t seed) const;
  /// Throws `ShapeError` unless `weights` fit inputs of `features` features.
  LOADSTAR_DECL void check_weights(std::span<const Variable> weights, std::size_t features) const;

  /// `output` from `x` `(batch, timesteps, features)` with `weights` (kernel, recurrent kernel
  /// and bias when used). With a `mask` `(batch, timesteps)` (empty: none), a masked step keeps
  /// the state of the step before it and outputs it (or 0 with `zero_output_for_mask`), as
  /// Keras's `backend.rnn` does. The states start from `initial` (`(batch, units)` each, `h` then
  /// an LSTM's `c`; zeros when empty), and the final ones are written to `final_states` when
  /// given.
  LOADSTAR_DECL void forward(Backend& backend, std::span<const Variable> weights,
                             const Tensor<float>& x, const Tensor<float>& output,
                             const Tensor<float>& mask = {},
                             std::span<const Tensor<float>> initial = {},
                             std::span<const Tensor<float>> final_states = {});
  /// Backpropagation through time of the `forward` that computed `output` from `x`, `mask` and
  /// `initial` (run again first when the last forward had another input: a shared layer): adds
  /// the weights' gradients (unless frozen) and writes `dx` (skipped when empty). An empty
  /// `output_gradient`, or entry of `final_state_gradients`, is zero; the gradients of the
  /// initial states are written to `initial_gradients` (an empty entry is skipped).
  LOADSTAR_DECL void backward(Backend& backend, std::span<const Variable> weights,
                              const Tensor<float>& x, const Tensor<float>& output,
                              const Tensor<float>& output_gradient, const Tensor<float>& dx,
                              const Tensor<float>& mask = {},
                              std::span<const Tensor<float>> initial = {},
                              std::span<const Tensor<float>> initial_gradients = {},
                              std::span<const Tensor<float>> final_state_gradients = {});

  /// The Keras config keys of the cell's options (`units`, `activation`, ...).
  LOADSTAR_DECL void write_config(nlohmann::json& config) const;

  /// Whether dropout draws a mask per gate (Keras's implementation 1, which `recurrent_dropout`
  /// implies) rather than one for all gates.
  bool dropout_per_gate() const noexcept {
    return options_.implementation == 1 || options_.recurrent_dropout > 0.0;
  }
  /// The dropout of the next `forward` and of the `backward` of it: in training, masks drawn
  /// from `key` (`recurrent_dropout_key`); `std::nullopt`, none.
  void set_dropout(std::optional<std::uint64_t> key) noexcept { dropout_key_ = key; }

 private:
  /// A kernel of this cell's sizes and activations (keras/detail/recurrent_kernels.hpp).
  keras::detail::RecurrentKernel cell_kernel(keras::detail::RecurrentOp op) const noexcept {
    keras::detail::RecurrentKernel k;
    k.op = op;
    k.activations = activations_;
    k.batch = batch_;
    k.steps = steps_;
    k.units = units_;
    k.width = gates() * units_;
    k.reset_after = options_.reset_after;
    return k;
  }
  /// Rows `[step * batch, (step + 1) * batch)` of a time-major buffer.
  Tensor<float> step_rows(const Tensor<float>& t, std::size_t step) const {
    return t.slice_rows(step * batch_, (step + 1) * batch_);
  }

  CellKind kind_;
  std::size_t units_;
  RecurrentOptions options_;
  std::string label_;
  keras::detail::RecurrentActivations activations_;
  std::size_t batch_ = 0, steps_ = 0, features_ = 0;
  /// Zeroes the rows of `t`, time-major `(count * batch, width)` for the steps from `first`,
  /// that are masked at their step (`mask_`).
  LOADSTAR_DECL void zero_masked_rows(Backend& backend, const Tensor<float>& t, std::size_t first,
                                      std::size_t count);

  /// Draws the dropout masks of a forward pass (when `dropout_key_` is set and a rate is not 0):
  /// `input_masks_` masks `(batch, features)` in `input_mask_` (1, or one per gate) and
  /// `state_masks_` masks `(batch, units)` in `state_mask_` (one per gate), each value 0 or
  /// `1 / (1 - rate)`.
  LOADSTAR_DECL void draw_dropout_masks(Backend& backend);
  /// The column blocks of `matrix` `(rows, count * units)` for `count` mask groups (a kernel, or
  /// the gradient of a product): `matrix` itself for one, else each gate's `(rows, units)`
  /// copied into `into`.
  LOADSTAR_DECL std::vector<Tensor<float>> gate_blocks(Backend& backend,
                                                       const Tensor<float>& matrix,
                                                       std::size_t count, Scratch& into);
  /// `dropped[m]` (rows `m * n` on) = `v` `(n, d)` times mask `m` of `masks` `(count * batch, d)`
  /// (row `r` of `v` takes row `r % batch` of the mask).
  LOADSTAR_DECL void apply_masks(Backend& backend, const Tensor<float>& v,
                                 const Tensor<float>& masks, std::size_t count,
                                 const Tensor<float>& dropped) const;
  /// `out` `(n, width)` = (or += when `accumulate`) the product of each group's dropped values
  /// `dropped` `(count * n, d)` with its block of `blocks`: block `g` of the columns from group
  /// `g` (all of them for one group).
  LOADSTAR_DECL void grouped_product(Backend& backend, const Tensor<float>& dropped,
                                     std::span<const Tensor<float>> blocks,
                                     const Tensor<float>& out, bool accumulate);
  /// The adjoints of `grouped_product` for the values: `dv` `(n, d)` = (or += when `accumulate`)
  /// the sum over groups of `(dz's block g) blocks[g]^T` times mask `g`.
  LOADSTAR_DECL void grouped_input_gradient(Backend& backend, const Tensor<float>& dz,
                                            std::span<const Tensor<float>> blocks,
                                            const Tensor<float>& masks, const Tensor<float>& dv,
                                            bool accumulate);
  /// And for the weights: `dw` `(d, width)` += `dropped[g]^T (dz's block g)` in block `g`, and
  /// `dbias` (when not empty) += the column sums of `dz`.
  LOADSTAR_DECL void grouped_weight_gradients(Backend& backend, const Tensor<float>& dropped,
                                              const Tensor<float>& dz, std::size_t count,
                                              const Tensor<float>& dw, const Tensor<float>& dbias);

  std::optional<std::uint64_t> dropout_key_;
  std::size_t input_masks_ = 0, state_masks_ = 0;
  Scratch input_mask_, state_mask_, dropped_x_, dropped_hidden_, kernel_blocks_, recurrent_blocks_,
      group_parts_, group_sum_, group_gradients_, group_weights_;

  /// The input of the last forward pass, whose intermediate values the scratch holds, and
  /// whether it had a mask (then in `mask_`, time-major in processing order).
  const float* last_input_ = nullptr;
  const float* last_initial_ = nullptr;
  bool masked_ = false;
  Scratch mask_, saved_hidden_, saved_carry_;
  // Kept from the forward pass for the backward pass, time-major.
  Scratch x_, projection_, hidden_, carry_, recurrent_, reset_hidden_, reset_projection_;
  // The backward pass's.
  Scratch output_gradient_, projection_gradient_, recurrent_gradient_, reset_gradient_,
      hidden_gradient_, carry_gradient_, reset_hidden_gradient_, x_gradient_;
};

/// `(batch, steps, width)` to time-major `(steps * batch, width)`, the steps reversed when
/// `reverse`; or back with `to_batch_major`.
LOADSTAR_DECL void transpose_time(Backend& backend, const Tensor<float>& from,
                                  const Tensor<float>& to, std::size_t batch, std::size_t steps,
                                  bool reverse, bool to_batch_major);

/// The key of a recurrent layer's dropout masks in one step: from `(seed or ctx.seed, ctx.step,
/// name)`, as `Dropout`'s, so that the forward and backward passes of a step (and a resumed run)
/// draw the same masks. `Bidirectional` keys its directions by `name/forward` and
/// `name/backward`.
inline std::uint64_t recurrent_dropout_key(std::optional<std::uint64_t> seed,
                                           const CallContext& ctx, std::string_view name) {
  return SplitMix64::mix(SplitMix64::mix(seed.value_or(ctx.seed)) ^
                         SplitMix64::mix(ctx.step + 0x632BE59BD9B4E019ULL) ^ stable_hash(name));
}

/// Reads the options of a recurrent layer's Keras config and refuses what loadstar does not run
/// (`stateful`, `dropout`, `return_state`, ...), each by its key.
LOADSTAR_DECL RecurrentOptions recurrent_options(const ConfigReader& read, CellKind kind);

/// The Keras class of a cell kind (`"LSTM"`).
inline const char* cell_class_name(CellKind kind) noexcept {
  return kind == CellKind::lstm ? "LSTM" : kind == CellKind::gru ? "GRU" : "SimpleRNN";
}

/// The weight names of a cell within its layer (tf.keras: `lstm_cell/kernel`).
inline std::array<std::string, 3> cell_weight_names(CellKind kind) {
  const std::string cell = kind == CellKind::lstm  ? "lstm_cell"
                           : kind == CellKind::gru ? "gru_cell"
                                                   : "simple_rnn_cell";
  return {cell + "/kernel", cell + "/recurrent_kernel", cell + "/bias"};
}

/// A `SimpleRNN`, `LSTM` or `GRU` layer: one `RecurrentCore` on the layer's weights.
class RecurrentLayer : public LayerBase {
 public:
  LOADSTAR_DECL RecurrentLayer(CellKind kind, std::size_t units, RecurrentOptions options);

  /// Keras's class: `LSTM`, `GRU`, `SimpleRNN`, or `RNN` for the layer an `RNN` with one cell
  /// (`LSTMCell`, ...) of a file describes.
  std::string class_name() const override {
    return cell_name_.empty() ? cell_class_name(core_.kind()) : "RNN";
  }
  CellKind kind() const noexcept { return core_.kind(); }
  /// Makes this Keras's `RNN(cell)` with the cell named `cell_name` (`lstm_cell`): the same
  /// computation and weights, written back as Keras writes an `RNN` (its `cell` config apart).
  void set_cell_form(std::string cell_name) { cell_name_ = std::move(cell_name); }
  std::size_t units() const noexcept { return core_.units(); }
  const RecurrentOptions& options() const noexcept { return core_.options(); }

  /// Timesteps of unknown length (a text model's), settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return core_.output_shape(input_shapes[0]);
  }
  /// A masked step keeps the state of the step before it; the output has the input's mask when
  /// it returns sequences (Keras 3.0 to 3.15, and tf.keras), none otherwise.
  MaskFlow mask_flow() const noexcept override {
    return core_.options().return_sequences ? MaskFlow::passes : MaskFlow::ends;
  }
  bool reads_masks() const noexcept override { return true; }
  /// With `return_state`: the output, then the final states (`h`, and an LSTM's `c`).
  std::size_t output_count() const noexcept override {
    return core_.options().return_state ? 1 + core_.state_count() : 1;
  }
  std::vector<Shape> extra_output_shapes(std::span<const Shape> /*inputs*/) const override {
    if (!core_.options().return_state) return {};
    return std::vector<Shape>(core_.state_count(), Shape{core_.units()});
  }
  /// Inputs: the sequence, then optionally the initial states (Keras's `initial_state`: `h`, and
  /// an LSTM's `c`, each `(units)`).
  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;
  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// With `stateful`: the next batch starts from zeros.
  void reset_states() override { carried_ = false; }
  /// With `stateful`, once a batch has run: the final states it carries to the next.
  std::vector<Tensor<float>> carried_states() const override {
    if (!carried_) return {};
    return {carried_views_.begin(),
            carried_views_.begin() + static_cast<std::ptrdiff_t>(core_.state_count())};
  }
  LOADSTAR_DECL void restore_carried_states(Backend& backend,
                                            std::span<const Tensor<float>> states) override;

 private:
  /// The initial states of this call: those given as inputs, else (stateful) the states carried
  /// from the batch before, copied to `start_` by the forward pass, or zeros; none for a layer
  /// without either.
  LOADSTAR_DECL std::span<const Tensor<float>> initial_states(std::span<const Tensor<float>> inputs,
                                                              Backend& backend, bool forward);
  /// The key of this call's dropout masks in training, else none.
  std::optional<std::uint64_t> dropout_key(const CallContext& ctx) const {
    if (!ctx.training) return std::nullopt;
    return recurrent_dropout_key(core_.options().seed, ctx, name());
  }

  RecurrentCore core_;
  /// The cell's name when this is an `RNN(cell)`; empty for `LSTM`, `GRU` and `SimpleRNN`.
  std::string cell_name_;
  // `stateful`: the final states of the last batch (`carried_` once there are any, for
  // `carried_batch_` samples), and the copy this batch started from.
  bool carried_ = false;
  std::size_t carried_batch_ = 0;
  std::array<Scratch, 2> carried_states_, start_;
  std::array<Tensor<float>, 2> start_views_, carried_views_;
};

/// Keras's `RNN` of one cell (`SimpleRNNCell`, `LSTMCell`, `GRUCell`), as a saved file describes
/// it: the recurrent layer of that cell, which writes itself back as an `RNN`.
/// `StackedRNNCells` and other cells are refused by name.
LOADSTAR_DECL std::shared_ptr<Layer> rnn_from_config(const nlohmann::json& config);

/// The layer `L` (`LSTM`, ...) of cell `kind` that a Keras config describes.
template <class L>
std::shared_ptr<Layer> recurrent_from_config(const nlohmann::json& config, CellKind kind) {
  const auto read = layer_config(config, cell_class_name(kind));
  const std::size_t units = read.positive("units");
  if constexpr (std::is_same_v<L, RecurrentLayer>) {
    return finish_layer(
        read, std::make_shared<RecurrentLayer>(kind, units, recurrent_options(read, kind)));
  } else {
    return finish_layer(read, std::make_shared<L>(units, recurrent_options(read, kind)));
  }
}

}  // namespace detail
}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

RecurrentCore::RecurrentCore(CellKind kind, std::size_t units, RecurrentOptions options,
                             std::string label)
    : kind_(kind), units_(units), options_(std::move(options)), label_(std::move(label)) {
  if (units == 0) throw ConfigError(label_ + ": units must be positive");
  for (auto [key, rate] : {std::pair{"dropout", options_.dropout},
                           std::pair{"recurrent_dropout", options_.recurrent_dropout}}) {
    if (!(rate >= 0.0 && rate < 1.0)) {
      throw ConfigError(label_ + ": " + key + " must be in [0, 1) but is " +
                        nlohmann::json(rate).dump());
    }
  }
  activations_.activation = activation_from_name(options_.activation);
  activations_.recurrent = activation_from_name(options_.recurrent_activation);
  for (const auto& [key, value] : {std::pair{"activation", activations_.activation},
                                   std::pair{"recurrent_activation", activations_.recurrent}}) {
    if (value == keras::Activation::softmax) {
      throw ConfigError(label_ + ": " + key + " must act element by element but is 'softmax'");
    }
  }
}

Shape RecurrentCore::output_shape(const Shape& in) const {
  if (in.rank() != 2 || in[1] == 0) {
    throw ShapeError(label_ +
                     ": expects inputs (batch, timesteps, features) with a known number of "
                     "features but got " +
                     keras::detail::batch_shape_str(in));
  }
  return options_.return_sequences ? Shape{in[0], units_} : Shape{units_};
}

std::vector<Tensor<float>> RecurrentCore::initial_weights(std::size_t features,
                                                          std::uint64_t seed) const {
  const std::size_t width = gates() * units_;
  std::vector<Tensor<float>> out;
  out.emplace_back(Shape{features, width});
  options_.kernel_initializer.fill(out[0], seed);
  out.emplace_back(Shape{units_, width});
  options_.recurrent_initializer.fill(out[1], SplitMix64::mix(seed + 1));
  if (!options_.use_bias) return out;
  const bool two_biases = kind_ == CellKind::gru && options_.reset_after;
  out.emplace_back(two_biases ? Shape{2, width} : Shape{width});
  options_.bias_initializer.fill(out[2], SplitMix64::mix(seed + 2));
  if (kind_ == CellKind::lstm && options_.unit_forget_bias) {
    // keras LSTMCell.build: concatenate(bias_initializer(units), ones(units),
    // bias_initializer(2 * units)).
    for (std::size_t j = 0; j < units_; ++j)
      out[2].data()[units_ + j] = 1.0F;
  }
  return out;
}

void RecurrentCore::check_weights(std::span<const Variable> weights, std::size_t features) const {
  if (weights[0].value.dim(0) != features) {
    throw ShapeError(label_ + ": kernel is " + weights[0].value.shape().str() +
                     " but the input has " + std::to_string(features) + " features");
  }
}

void transpose_time(Backend& backend, const Tensor<float>& from, const Tensor<float>& to,
                    std::size_t batch, std::size_t steps, bool reverse, bool to_batch_major) {
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::sequence_order;
  k.batch = batch;
  k.steps = steps;
  k.width = from.size() / (batch * steps);
  k.reverse = reverse;
  k.to_batch_major = to_batch_major;
  const Tensor<float> tensors[] = {from, to};
  backend.recurrent_kernel(k, tensors, to.size());
}

void RecurrentCore::zero_masked_rows(Backend& backend, const Tensor<float>& t, std::size_t first,
                                     std::size_t count) {
  const Tensor<float> tensors[] = {
      mask_.get(backend, {steps_, batch_}).slice_rows(first, first + count), t};
  keras::detail::RecurrentKernel k = cell_kernel(keras::detail::RecurrentOp::zero_masked);
  k.width = t.size() / (count * batch_);
  backend.recurrent_kernel(k, tensors, t.size());
}

void RecurrentCore::forward(Backend& backend, std::span<const Variable> weights,
                            const Tensor<float>& x, const Tensor<float>& output,
                            const Tensor<float>& mask, std::span<const Tensor<float>> initial,
                            std::span<const Tensor<float>> final_states) {
  last_input_ = x.data();
  last_initial_ = initial.empty() ? nullptr : initial[0].data();
  batch_ = x.dim(0);
  steps_ = x.dim(1);
  features_ = x.dim(2);
  masked_ = !mask.empty();
  if (masked_) {
    if (mask.size() != batch_ * steps_) {
      throw ShapeError(label_ + ": takes a mask (batch, timesteps) " + Shape{batch_, steps_}.str() +
                       " but got one of shape " + mask.shape().str());
    }
    // Time-major (the kernels test a mask's values against 0).
    transpose_time(backend, mask, mask_.get(backend, {steps_, batch_}), batch_, steps_,
                   options_.go_backwards, false);
  }
  const std::size_t u = units_, width = gates() * u, rows = steps_ * batch_;
  const Tensor<float>& kernel = weights[0].value;
  const Tensor<float>& recurrent = weights[1].value;
  const bool bias = options_.use_bias;
  const bool two_biases = kind_ == CellKind::gru && options_.reset_after;
  const Tensor<float> x_tm = x_.get(backend, {rows, features_});
  transpose_time(backend, x, x_tm, batch_, steps_, options_.go_backwards, false);
  draw_dropout_masks(backend);
  // The input projection of every timestep at once (of the dropped inputs in training with
  // dropout: one GEMM per mask).
  const Tensor<float> projection = projection_.get(backend, {rows, width});
  if (input_masks_ == 0) {
    backend.gemm(x_tm, false, kernel, false, projection);
  } else {
    const Tensor<float> dropped = dropped_x_.get(backend, {input_masks_ * rows, features_});
    apply_masks(backend, x_tm, input_mask_.get(backend, {input_masks_ * batch_, features_}),
                input_masks_, dropped);
    const auto blocks = gate_blocks(backend, kernel, input_masks_, kernel_blocks_);
    grouped_product(backend, dropped, blocks, projection, false);
  }
  if (bias) {
    backend.bias_add(projection, two_biases ? weights[2].value.slice_rows(0, 1).reshape({width})
                                            : weights[2].value);
  }
  const Tensor<float> hidden = hidden_.get(backend, {rows + batch_, u});
  // Keras's initial_state, or zeros.
  const auto start = [&](const Tensor<float>& states, std::size_t i) {
    if (i < initial.size()) {
      backend.copy(initial[i], step_rows(states, 0));
    } else {
      backend.fill(step_rows(states, 0), 0.0F);
    }
  };
  start(hidden, 0);
  Tensor<float> carry, recurrent_projection, reset_hidden, reset_projection;
  if (kind_ == CellKind::lstm) {
    carry = carry_.get(backend, {rows + batch_, u});
    start(carry, 1);
  }
  if (kind_ == CellKind::gru) {
    recurrent_projection = recurrent_.get(backend, {rows, width});
    if (!options_.reset_after) {
      reset_hidden = reset_hidden_.get(backend, {rows, u});
      reset_projection = reset_projection_.get(backend, {rows, width});
    }
  }
  const std::size_t batch = batch_;
  // With recurrent_dropout, each gate's product of the recurrent kernel takes the state times its
  // own mask (kept in `dropped_hidden_` for the weights' gradients).
  std::vector<Tensor<float>> recurrent_blocks;
  Tensor<float> state_masks, dropped_hidden;
  if (state_masks_ > 0) {
    recurrent_blocks = gate_blocks(backend, recurrent, state_masks_, recurrent_blocks_);
    state_masks = state_mask_.get(backend, {state_masks_ * batch_, u});
    dropped_hidden = dropped_hidden_.get(backend, {state_masks_ * rows, u});
  }
  const auto recurrent_product = [&](const Tensor<float>& h_prev, std::size_t s,
                                     const Tensor<float>& out, bool accumulate) {
    if (state_masks_ == 0) {
      backend.gemm(h_prev, false, recurrent, false, out, 1.0F, accumulate ? 1.0F : 0.0F);
      return;
    }
    const Tensor<float> step_dropped = group_parts_.get(backend, {state_masks_ * batch_, u});
    apply_masks(backend, h_prev, state_masks, state_masks_, step_dropped);
    // Kept for the backward pass, time-major per gate.
    for (std::size_t g = 0; g < state_masks_; ++g) {
      backend.copy(step_dropped.slice_rows(g * batch_, (g + 1) * batch_),
                   dropped_hidden.slice_rows(g * rows + s * batch_, g * rows + (s + 1) * batch_));
    }
    grouped_product(backend, step_dropped, recurrent_blocks, out, accumulate);
  };
  for (std::size_t s = 0; s < steps_; ++s) {
    const Tensor<float> h_prev = step_rows(hidden, s), h = step_rows(hidden, s + 1);
    const Tensor<float> z = step_rows(projection, s);
    if (kind_ == CellKind::simple_rnn) {
      recurrent_product(h_prev, s, z, true);
      // keras/detail/recurrent_formulas.hpp's simple_rnn_value: the activation of `z`.
      backend.activation_forward(activations_.activation, z, h);
    } else if (kind_ == CellKind::lstm) {
      recurrent_product(h_prev, s, z, true);
      const Tensor<float> tensors[] = {z, step_rows(carry, s), step_rows(carry, s + 1), h};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::lstm_forward), tensors,
                               batch * u);
    } else {
      const Tensor<float> rp = step_rows(recurrent_projection, s);
      recurrent_product(h_prev, s, rp, false);
      if (bias && options_.reset_after)
        backend.bias_add(rp, weights[2].value.slice_rows(1, 2).reshape({width}));
      Tensor<float> rq;
      if (!options_.reset_after) {
        // (r * h) U_h, with recurrent_dropout (r * h * the candidate's mask) U_h.
        const Tensor<float> q = step_rows(reset_hidden, s);
        const Tensor<float> candidate_mask =
            state_masks_ > 0 ? state_masks.slice_rows(2 * batch_, 3 * batch_) : Tensor<float>();
        const Tensor<float> tensors[] = {z, rp, h_prev, q, candidate_mask};
        backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::gru_reset_hidden), tensors,
                                 batch * u);
        rq = step_rows(reset_projection, s);
        backend.gemm(q, false, recurrent, false, rq);
      }
      const Tensor<float> tensors[] = {z, rp, options_.reset_after ? rp : rq, h_prev, h};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::gru_forward), tensors,
                               batch * u);
    }
    if (masked_) {
      // Keras: a masked step keeps the states of the step before it.
      const bool lstm = kind_ == CellKind::lstm;
      const Tensor<float> tensors[] = {mask_.get(backend, {steps_, batch_}).slice_rows(s, s + 1),
                                       h_prev, h, lstm ? step_rows(carry, s) : Tensor<float>(),
                                       lstm ? step_rows(carry, s + 1) : Tensor<float>()};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::keep_masked), tensors,
                               batch * u);
    }
  }
  if (options_.return_sequences) {
    transpose_time(backend, hidden.slice_rows(batch_, rows + batch_), output, batch_, steps_, false,
                   true);
    if (masked_ && options_.zero_output_for_mask) {
      const Tensor<float> tensors[] = {mask_.get(backend, {steps_, batch_}), output};
      keras::detail::RecurrentKernel k = cell_kernel(keras::detail::RecurrentOp::zero_masked);
      k.width = u;
      k.batch_major = true;
      backend.recurrent_kernel(k, tensors, output.size());
    }
  } else {
    backend.copy(step_rows(hidden, steps_), output);
    if (masked_ && options_.zero_output_for_mask) zero_masked_rows(backend, output, steps_ - 1, 1);
  }
  // The final states: those after the last unmasked step.
  if (!final_states.empty()) backend.copy(step_rows(hidden, steps_), final_states[0]);
  if (final_states.size() > 1) backend.copy(step_rows(carry, steps_), final_states[1]);
}

void RecurrentCore::backward(Backend& backend, std::span<const Variable> weights,
                             const Tensor<float>& x, const Tensor<float>& output,
                             const Tensor<float>& output_gradient, const Tensor<float>& dx,
                             const Tensor<float>& mask, std::span<const Tensor<float>> initial,
                             std::span<const Tensor<float>> initial_gradients,
                             std::span<const Tensor<float>> final_state_gradients) {
  if (x.data() != last_input_ || x.dim(0) != batch_ || masked_ != !mask.empty() ||
      (initial.empty() ? nullptr : initial[0].data()) != last_initial_)
    forward(backend, weights, x, output, mask, initial);
  const std::size_t u = units_, width = gates() * u, rows = steps_ * batch_, batch = batch_;
  const Tensor<float>& kernel = weights[0].value;
  const Tensor<float>& recurrent = weights[1].value;
  const bool two_biases = kind_ == CellKind::gru && options_.reset_after;
  const bool after = options_.reset_after;
  const Tensor<float> hidden = hidden_.get(backend, {rows + batch_, u});
  const Tensor<float> projection = projection_.get(backend, {rows, width});
  Tensor<float> dh_out;
  // An output nothing reads (of a layer returning its states) has no gradient.
  const bool output_read = !output_gradient.empty();
  if (options_.return_sequences && output_read) {
    dh_out = output_gradient_.get(backend, {rows, u});
    transpose_time(backend, output_gradient, dh_out, batch_, steps_, false, false);
    // The outputs of masked steps are constants.
    if (masked_ && options_.zero_output_for_mask) zero_masked_rows(backend, dh_out, 0, steps_);
  }
  const Tensor<float> dprojection = projection_gradient_.get(backend, {rows, width});
  // A SimpleRNN's or LSTM's recurrent product adds into the same pre-activations as the input
  // projection: both take the same gradient.
  Tensor<float> drecurrent = dprojection;
  Tensor<float> carry, dcarry, recurrent_projection, reset_hidden, reset_projection, dreset;
  Tensor<float> dq;
  // The state gradients start from those of the final states (returned by `return_state`).
  const auto final_gradient = [&](const Tensor<float>& into, std::size_t i) {
    if (i < final_state_gradients.size() && !final_state_gradients[i].empty()) {
      backend.copy(final_state_gradients[i], into);
    } else {
      backend.fill(into, 0.0F);
    }
  };
  if (kind_ == CellKind::lstm) {
    carry = carry_.get(backend, {rows + batch_, u});
    dcarry = carry_gradient_.get(backend, {batch_, u});
    final_gradient(dcarry, 1);
  }
  if (kind_ == CellKind::gru) {
    drecurrent = recurrent_gradient_.get(backend, {rows, width});
    recurrent_projection = recurrent_.get(backend, {rows, width});
    if (!after) {
      reset_hidden = reset_hidden_.get(backend, {rows, u});
      reset_projection = reset_projection_.get(backend, {rows, width});
      dreset = reset_gradient_.get(backend, {rows, width});
      dq = reset_hidden_gradient_.get(backend, {batch_, u});
    }
  }
  const Tensor<float> dh = hidden_gradient_.get(backend, {batch_, u});
  final_gradient(dh, 0);
  // recurrent_dropout: the state's gradient through each gate's product takes its mask.
  std::vector<Tensor<float>> recurrent_blocks;
  Tensor<float> state_masks;
  if (state_masks_ > 0) {
    recurrent_blocks = gate_blocks(backend, recurrent, state_masks_, recurrent_blocks_);
    state_masks = state_mask_.get(backend, {state_masks_ * batch_, u});
  }
  const auto state_gradient = [&](const Tensor<float>& dz, bool accumulate) {
    if (state_masks_ == 0) {
      backend.gemm(dz, false, recurrent, true, dh, 1.0F, accumulate ? 1.0F : 0.0F);
    } else {
      grouped_input_gradient(backend, dz, recurrent_blocks, state_masks, dh, accumulate);
    }
  };
  for (std::size_t s = steps_; s-- > 0;) {
    // The gradient of this step's output: the recurrent share carried from the step after, plus
    // the layer output's.
    if (output_read && options_.return_sequences) {
      backend.add(dh, step_rows(dh_out, s), dh);
    } else if (output_read && s + 1 == steps_) {
      if (masked_ && options_.zero_output_for_mask) {
        // A masked last step's output is a constant; its state's gradient still flows.
        const Tensor<float> last = output_gradient_.get(backend, {batch_, u});
        backend.copy(output_gradient, last);
        zero_masked_rows(backend, last, s, 1);
        backend.add(dh, last, dh);
      } else {
        backend.add(dh, output_gradient, dh);
      }
    }
    Tensor<float> saved_h, saved_c;
    if (masked_) {
      // A masked step passes the gradients of its states to the step before it unchanged.
      saved_h = saved_hidden_.get(backend, {batch_, u});
      backend.copy(dh, saved_h);
      if (kind_ == CellKind::lstm) {
        saved_c = saved_carry_.get(backend, {batch_, u});
        backend.copy(dcarry, saved_c);
      }
    }
    const Tensor<float> h_prev = step_rows(hidden, s);
    const Tensor<float> z = step_rows(projection, s), dz = step_rows(dprojection, s);
    if (kind_ == CellKind::simple_rnn) {
      // simple_rnn_gradient: the activation's gradient at `z`.
      backend.activation_backward(activations_.activation, z, step_rows(hidden, s + 1), dh, dz);
      state_gradient(dz, false);
    } else if (kind_ == CellKind::lstm) {
      const Tensor<float> tensors[] = {z, step_rows(carry, s), step_rows(carry, s + 1), dh, dcarry,
                                       dz};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::lstm_backward), tensors,
                               batch * u);
      state_gradient(dz, false);
    } else {
      const Tensor<float> rp = step_rows(recurrent_projection, s);
      const Tensor<float> drp = step_rows(drecurrent, s);
      const Tensor<float> rq = after ? rp : step_rows(reset_projection, s);
      const Tensor<float> drq = after ? Tensor<float>() : step_rows(dreset, s);
      const Tensor<float> tensors[] = {z, rp, rq, h_prev, dh, dz, drp, drq};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::gru_backward), tensors,
                               batch * u);
      if (!after) {
        backend.gemm(drq, false, recurrent, true, dq);
        // The gradient of (r * h), before the candidate's recurrent dropout mask when it has one.
        const Tensor<float> reset_tensors[] = {
            z,
            rp,
            h_prev,
            dq,
            dz,
            drp,
            dh,
            state_masks_ > 0 ? state_masks.slice_rows(2 * batch_, 3 * batch_) : Tensor<float>()};
        backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::gru_backward_reset),
                                 reset_tensors, batch * u);
      }
      state_gradient(drp, true);
    }
    if (masked_) {
      // t: the mask, the saved and the current state gradient, dz, the LSTM's saved and current
      // carry gradient, the GRU's recurrent and (reset before) reset projection gradients.
      const bool gru = kind_ == CellKind::gru;
      const Tensor<float> tensors[] = {mask_.get(backend, {steps_, batch_}).slice_rows(s, s + 1),
                                       saved_h,
                                       dh,
                                       dz,
                                       saved_c,
                                       dcarry,
                                       gru ? step_rows(drecurrent, s) : Tensor<float>(),
                                       gru && !after ? step_rows(dreset, s) : Tensor<float>()};
      backend.recurrent_kernel(cell_kernel(keras::detail::RecurrentOp::masked_backward), tensors,
                               batch * width);
    }
  }
  // What remains is the gradient of the states before the first step: the initial states'.
  if (!initial_gradients.empty() && !initial_gradients[0].empty())
    backend.copy(dh, initial_gradients[0]);
  if (initial_gradients.size() > 1 && !initial_gradients[1].empty())
    backend.copy(dcarry, initial_gradients[1]);
  const Tensor<float> x_tm = x_.get(backend, {rows, features_});
  // With dropout, the products took the dropped inputs and states.
  const Tensor<float> dropped_x =
      input_masks_ > 0 ? dropped_x_.get(backend, {input_masks_ * rows, features_}) : x_tm;
  if (weights[0].trainable) {
    const Tensor<float> no_bias;
    const Tensor<float>& dbias = options_.use_bias ? weights[2].gradient : no_bias;
    const Tensor<float> input_bias = two_biases ? dbias.slice_rows(0, 1).reshape({width}) : dbias;
    const Tensor<float> recurrent_bias =
        two_biases ? dbias.slice_rows(1, 2).reshape({width}) : no_bias;
    if (input_masks_ > 1) {
      grouped_weight_gradients(backend, dropped_x, dprojection, input_masks_, weights[0].gradient,
                               input_bias);
    } else {
      backend.weight_gradients(dropped_x, dprojection, weights[0].gradient, input_bias, true);
    }
    if (state_masks_ > 0) {
      grouped_weight_gradients(backend, dropped_hidden_.get(backend, {state_masks_ * rows, u}),
                               drecurrent, state_masks_, weights[1].gradient, recurrent_bias);
    } else {
      backend.weight_gradients(hidden.slice_rows(0, rows), drecurrent, weights[1].gradient,
                               recurrent_bias, true);
    }
    if (kind_ == CellKind::gru && !after)
      backend.gemm(reset_hidden, true, dreset, false, weights[1].gradient, 1.0F, 1.0F);
  }
  if (dx.empty()) return;
  const Tensor<float> dx_tm = x_gradient_.get(backend, {rows, features_});
  if (input_masks_ == 0) {
    backend.gemm(dprojection, false, kernel, true, dx_tm);
  } else {
    grouped_input_gradient(
        backend, dprojection, gate_blocks(backend, kernel, input_masks_, kernel_blocks_),
        input_mask_.get(backend, {input_masks_ * batch_, features_}), dx_tm, false);
  }
  transpose_time(backend, dx_tm, dx, batch_, steps_, options_.go_backwards, true);
}

void RecurrentCore::draw_dropout_masks(Backend& backend) {
  input_masks_ = 0;
  state_masks_ = 0;
  if (!dropout_key_) return;
  if (options_.dropout > 0.0) input_masks_ = dropout_per_gate() ? gates() : 1;
  if (options_.recurrent_dropout > 0.0) state_masks_ = gates();
  // Mask `m` of the inputs draws from stream `m + 1` of the key, of the state from `m + 9`.
  const auto draw = [&](const Tensor<float>& masks, std::size_t count, std::size_t first_stream,
                        double rate) {
    keras::detail::RecurrentKernel k;
    k.op = keras::detail::RecurrentOp::dropout_masks;
    k.count = count;
    k.each = masks.size() / count;
    k.first_stream = first_stream;
    k.rate = rate;
    const Tensor<float> tensors[] = {masks};
    backend.recurrent_kernel(k, tensors, masks.size(), *dropout_key_);
  };
  if (input_masks_ > 0) {
    draw(input_mask_.get(backend, {input_masks_ * batch_, features_}), input_masks_, 1,
         options_.dropout);
  }
  if (state_masks_ > 0) {
    draw(state_mask_.get(backend, {state_masks_ * batch_, units_}), state_masks_, 9,
         options_.recurrent_dropout);
  }
}

std::vector<Tensor<float>> RecurrentCore::gate_blocks(Backend& backend, const Tensor<float>& matrix,
                                                      std::size_t count, Scratch& into) {
  if (count == 1) return {matrix};
  const std::size_t rows = matrix.dim(0);
  const Tensor<float> all = into.get(backend, {count * rows, units_});
  std::vector<Tensor<float>> blocks;
  for (std::size_t g = 0; g < count; ++g)
    blocks.push_back(all.slice_rows(g * rows, (g + 1) * rows));
  const std::vector<std::size_t> extents(count, units_);
  backend.split(matrix, 1, extents, blocks);
  return blocks;
}

void RecurrentCore::apply_masks(Backend& backend, const Tensor<float>& v,
                                const Tensor<float>& masks, std::size_t count,
                                const Tensor<float>& dropped) const {
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::apply_masks;
  k.rows = v.dim(0);
  k.width = v.size() / k.rows;
  k.batch = batch_;
  const Tensor<float> tensors[] = {v, masks, dropped};
  backend.recurrent_kernel(k, tensors, count * v.size());
}

void RecurrentCore::grouped_product(Backend& backend, const Tensor<float>& dropped,
                                    std::span<const Tensor<float>> blocks, const Tensor<float>& out,
                                    bool accumulate) {
  const std::size_t count = blocks.size(), n = out.dim(0);
  if (count == 1) {
    backend.gemm(dropped, false, blocks[0], false, out, 1.0F, accumulate ? 1.0F : 0.0F);
    return;
  }
  const Tensor<float> parts = group_sum_.get(backend, {count * n, units_});
  std::vector<Tensor<float>> views;
  for (std::size_t g = 0; g < count; ++g) {
    views.push_back(parts.slice_rows(g * n, (g + 1) * n));
    backend.gemm(dropped.slice_rows(g * n, (g + 1) * n), false, blocks[g], false, views.back());
  }
  if (!accumulate) {
    backend.concatenate(views, 1, out);
    return;
  }
  const Tensor<float> joined = group_gradients_.get(backend, out.shape());
  backend.concatenate(views, 1, joined);
  backend.add(out, joined, out);
}

void RecurrentCore::grouped_input_gradient(Backend& backend, const Tensor<float>& dz,
                                           std::span<const Tensor<float>> blocks,
                                           const Tensor<float>& masks, const Tensor<float>& dv,
                                           bool accumulate) {
  const std::size_t count = blocks.size(), n = dz.dim(0), d = blocks[0].dim(0);
  // Each group's share `(dz's block g) blocks[g]^T`, then their sum under the masks.
  const Tensor<float> shares = group_weights_.get(backend, {count * n, d});
  if (count == 1) {
    backend.gemm(dz, false, blocks[0], true, shares);
  } else {
    const auto views = gate_blocks(backend, dz, count, group_gradients_);
    for (std::size_t g = 0; g < count; ++g) {
      backend.gemm(views[g], false, blocks[g], true, shares.slice_rows(g * n, (g + 1) * n));
    }
  }
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::masked_group_sum;
  k.rows = n;
  k.width = d;
  k.batch = batch_;
  k.count = count;
  k.accumulate = accumulate;
  const Tensor<float> tensors[] = {shares, masks, dv};
  backend.recurrent_kernel(k, tensors, n * d);
}

void RecurrentCore::grouped_weight_gradients(Backend& backend, const Tensor<float>& dropped,
                                             const Tensor<float>& dz, std::size_t count,
                                             const Tensor<float>& dw, const Tensor<float>& dbias) {
  const std::size_t n = dz.dim(0), d = dropped.dim(1);
  const auto views = gate_blocks(backend, dz, count, group_gradients_);
  std::vector<Tensor<float>> weights;
  const Tensor<float> blocks = group_weights_.get(backend, {count * d, units_});
  for (std::size_t g = 0; g < count; ++g)
    weights.push_back(blocks.slice_rows(g * d, (g + 1) * d));
  for (std::size_t g = 0; g < count; ++g)
    backend.gemm(dropped.slice_rows(g * n, (g + 1) * n), true, views[g], false, weights[g]);
  const Tensor<float> joined = group_sum_.get(backend, dw.shape());
  backend.concatenate(weights, 1, joined);
  backend.axpy(1.0F, joined, dw);
  if (!dbias.empty()) backend.column_sums(dz, dbias, 1.0F);
}

void RecurrentCore::write_config(nlohmann::json& config) const {
  config["return_sequences"] = options_.return_sequences;
  config["return_state"] = options_.return_state;
  config["go_backwards"] = options_.go_backwards;
  config["zero_output_for_mask"] = options_.zero_output_for_mask;
  config["stateful"] = options_.stateful;
  config["unroll"] = false;
  config["time_major"] = false;
  config["units"] = units_;
  config["activation"] = options_.activation;
  if (kind_ != CellKind::simple_rnn) config["recurrent_activation"] = options_.recurrent_activation;
  config["use_bias"] = options_.use_bias;
  config["kernel_initializer"] = options_.kernel_initializer.to_json();
  config["recurrent_initializer"] = options_.recurrent_initializer.to_json();
  config["bias_initializer"] = options_.bias_initializer.to_json();
  if (kind_ == CellKind::lstm) config["unit_forget_bias"] = options_.unit_forget_bias;
  for (const char* key :
       {"kernel_regularizer", "recurrent_regularizer", "bias_regularizer", "activity_regularizer",
        "kernel_constraint", "recurrent_constraint", "bias_constraint"})
    config[key] = nullptr;
  config["dropout"] = options_.dropout;
  config["recurrent_dropout"] = options_.recurrent_dropout;
  config["seed"] = options_.seed ? nlohmann::json(*options_.seed) : nlohmann::json(nullptr);
  if (kind_ != CellKind::simple_rnn) config["implementation"] = dropout_per_gate() ? 1 : 2;
  if (kind_ == CellKind::gru) config["reset_after"] = options_.reset_after;
}

RecurrentOptions recurrent_options(const ConfigReader& read, CellKind kind) {
  read.expect("time_major", false, "loadstar's recurrent inputs are (batch, timesteps, features)");
  for (const char* key : {"recurrent_regularizer", "recurrent_constraint"})
    read.expect(key, nullptr, "loadstar has no regularizers or constraints");
  // Implementation 1 and 2 (and unroll) are the same computation in another order (Keras), but
  // for dropout's masks: per gate with 1.
  int implementation = 2;
  if (read.has("implementation")) {
    const nlohmann::json& v = *read.find("implementation");
    if (!v.is_number_integer() || (v.get<int>() != 1 && v.get<int>() != 2))
      read.fail("implementation", "1 or 2");
    implementation = v.get<int>();
  }
  read.get("unroll", false);
  if (read.has("use_cudnn")) {
    const nlohmann::json& v = *read.find("use_cudnn");
    if (!(v.is_boolean() || v == "auto")) read.fail("use_cudnn", "\"auto\", true or false");
  }
  RecurrentOptions o;
  o.activation = read.has("activation") ? config_activation(read) : "tanh";
  if (kind != CellKind::simple_rnn && read.has("recurrent_activation")) {
    o.recurrent_activation = read.nested("recurrent_activation", [&] {
      return activation_name(
          Registry<keras::Activation>::instance().create(*read.find("recurrent_activation")));
    });
  }
  o.use_bias = read.get("use_bias", true);
  if (kind == CellKind::lstm) o.unit_forget_bias = read.get("unit_forget_bias", true);
  // Keras 2 and 3 default to reset_after=True; Keras 1's GRU had no such key and reset before.
  if (kind == CellKind::gru) o.reset_after = read.get("reset_after", true);
  o.return_sequences = read.get("return_sequences", false);
  o.return_state = read.get("return_state", false);
  o.go_backwards = read.get("go_backwards", false);
  o.stateful = read.get("stateful", false);
  o.zero_output_for_mask = read.get("zero_output_for_mask", false);
  for (auto [key, rate] :
       {std::pair{"dropout", &o.dropout}, std::pair{"recurrent_dropout", &o.recurrent_dropout}}) {
    if (!read.has(key)) continue;
    const nlohmann::json& v = *read.find(key);
    if (!v.is_number() || v.get<double>() < 0.0 || v.get<double>() >= 1.0)
      read.fail(key, "a number in [0, 1)");
    *rate = v.get<double>();
  }
  o.seed = read.optional<std::uint64_t>("seed");
  o.implementation = implementation;
  o.kernel_initializer =
      config_initializer(read, "kernel_initializer", Initializer::glorot_uniform());
  o.recurrent_initializer =
      config_initializer(read, "recurrent_initializer", Initializer::orthogonal());
  o.bias_initializer = config_initializer(read, "bias_initializer", Initializer::zeros());
  o.name = config_name(read);
  return o;
}

RecurrentLayer::RecurrentLayer(CellKind kind, std::size_t units, RecurrentOptions options)
    : LayerBase(options.name),
      core_(kind, units, options,
            keras::detail::to_snake_case(cell_class_name(kind)) + " layer '" + options.name + "'") {
}

void RecurrentCore::check_initial_states(std::span<const Shape> shapes) const {
  if (shapes.empty()) return;
  const std::size_t n = state_count();
  if (shapes.size() != n) {
    throw ShapeError(label_ + ": takes the sequence and " + std::to_string(n) + " initial state" +
                     (n == 1 ? "" : "s") + " (initial_state) but got " +
                     std::to_string(shapes.size()) + " after the sequence");
  }
  for (const Shape& shape : shapes) {
    if (shape != Shape{units_}) {
      throw ShapeError(label_ + ": expects initial states of shape " +
                       keras::detail::batch_shape_str(Shape{units_}) + " but got " +
                       keras::detail::batch_shape_str(shape));
    }
  }
}

Shape RecurrentLayer::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  if (input_shapes.empty()) expect_inputs(input_shapes, 1);
  core_ = RecurrentCore(core_.kind(), core_.units(), core_.options(), label());
  core_.check_initial_states(input_shapes.subspan(1));
  const Shape out = core_.output_shape(input_shapes[0]);
  const std::size_t features = input_shapes[0][1];
  if (!weights_.empty()) {
    core_.check_weights(weights_, features);
  } else {
    const auto names = cell_weight_names(core_.kind());
    auto values = core_.initial_weights(features, seed);
    for (std::size_t i = 0; i < values.size(); ++i)
      add_weight(names[i], values[i]);
  }
  remember(input_shapes, out);
  return out;
}

std::span<const Tensor<float>> RecurrentLayer::initial_states(std::span<const Tensor<float>> inputs,
                                                              Backend& backend, bool forward) {
  if (inputs.size() > 1) return inputs.subspan(1);
  if (!core_.options().stateful) return {};
  const std::size_t batch = inputs[0].dim(0), n = core_.state_count();
  if (forward && carried_ && batch != carried_batch_) {
    throw ShapeError(label() + ": is stateful and carries the states of batches of " +
                     std::to_string(carried_batch_) + " samples, but got a batch of " +
                     std::to_string(batch) +
                     "; give every batch the same number of samples, or call reset_states() "
                     "first");
  }
  for (std::size_t i = 0; i < n; ++i) {
    start_views_[i] = start_[i].get(backend, {batch, core_.units()});
    carried_views_[i] = carried_states_[i].get(backend, {batch, core_.units()});
    if (!forward) continue;
    if (carried_) {
      backend.copy(carried_views_[i], start_views_[i]);
    } else {
      backend.fill(start_views_[i], 0.0F);
    }
  }
  return {start_views_.data(), n};
}

void RecurrentLayer::restore_carried_states(Backend& backend,
                                            std::span<const Tensor<float>> states) {
  if (states.empty()) {
    carried_ = false;
    return;
  }
  const std::size_t n = core_.state_count();
  const std::size_t batch = states[0].rank() == 2 ? states[0].dim(0) : 0;
  bool fits = core_.options().stateful && states.size() == n && batch > 0;
  for (std::size_t i = 0; fits && i < n; ++i)
    fits = states[i].shape() == Shape{batch, core_.units()};
  if (!fits) {
    std::string found;
    for (const auto& s : states)
      found += (found.empty() ? "" : ", ") + s.shape().str();
    throw ShapeError(label() + ": carries " +
                     (core_.options().stateful ? std::to_string(n) + " states (batch, " +
                                                     std::to_string(core_.units()) + ")"
                                               : std::string("no states (it is not stateful)")) +
                     " but was given states of shapes " + found);
  }
  for (std::size_t i = 0; i < n; ++i) {
    carried_views_[i] = carried_states_[i].get(backend, {batch, core_.units()});
    backend.copy(states[i], carried_views_[i]);
  }
  carried_ = true;
  carried_batch_ = batch;
}

void RecurrentLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) {
  check_inputs(inputs);
  core_.set_dropout(dropout_key(ctx));
  const auto initial = initial_states(inputs, ctx.backend, true);
  if (!core_.options().stateful) {
    core_.forward(ctx.backend, weights_, inputs[0], output, input_mask(ctx), initial,
                  ctx.extra_outputs);
    return;
  }
  // The final states are kept for the next batch, and returned from there.
  const std::size_t n = core_.state_count();
  const std::span<const Tensor<float>> carried(carried_views_.data(), n);
  core_.forward(ctx.backend, weights_, inputs[0], output, input_mask(ctx), initial, carried);
  carried_ = true;
  carried_batch_ = inputs[0].dim(0);
  for (std::size_t i = 0; i < ctx.extra_outputs.size() && i < n; ++i)
    ctx.backend.copy(carried[i], ctx.extra_outputs[i]);
}

void RecurrentLayer::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) {
  core_.set_dropout(dropout_key(ctx));
  core_.backward(
      ctx.backend, weights_, inputs[0], output, output_gradient,
      input_gradients.empty() ? Tensor<float>() : input_gradients[0], input_mask(ctx),
      initial_states(inputs, ctx.backend, false),
      input_gradients.size() > 1 ? input_gradients.subspan(1) : std::span<const Tensor<float>>(),
      ctx.extra_output_gradients);
}

nlohmann::json RecurrentLayer::get_config() const {
  auto config = base_config();
  if (cell_name_.empty()) {
    core_.write_config(config);
    return config;
  }
  // Keras's RNN: its own options, and the cell's config apart (tf.keras 2 and Keras 3 alike).
  nlohmann::json cell = {{"name", cell_name_}, {"trainable", trainable()}, {"dtype", "float32"}};
  core_.write_config(cell);
  for (const char* key : {"return_sequences", "return_state", "go_backwards", "stateful", "unroll",
                          "time_major", "zero_output_for_mask"}) {
    config[key] = cell[key];
    cell.erase(key);
  }
  config["cell"] = {{"class_name", std::string(cell_class_name(core_.kind())) + "Cell"},
                    {"config", std::move(cell)}};
  return config;
}

std::shared_ptr<Layer> rnn_from_config(const nlohmann::json& config) {
  const auto read = layer_config(config, "RNN");
  const nlohmann::json* cell = read.find("cell");
  const std::string cell_class = cell != nullptr && cell->is_object() &&
                                         cell->contains("class_name") &&
                                         (*cell)["class_name"].is_string()
                                     ? (*cell)["class_name"].get<std::string>()
                                     : std::string();
  if (cell_class == "StackedRNNCells") {
    read.fail("cell",
              "one SimpleRNNCell, LSTMCell or GRUCell (loadstar does not run "
              "StackedRNNCells; stack the recurrent layers instead)");
  }
  if (cell_class != "SimpleRNNCell" && cell_class != "LSTMCell" && cell_class != "GRUCell")
    read.fail("cell", "a SimpleRNNCell, LSTMCell or GRUCell");
  const CellKind kind = cell_class == "LSTMCell"  ? CellKind::lstm
                        : cell_class == "GRUCell" ? CellKind::gru
                                                  : CellKind::simple_rnn;
  // The cell's options and the RNN's, read as one recurrent layer's config.
  nlohmann::json merged = cell->contains("config") && (*cell)["config"].is_object()
                              ? (*cell)["config"]
                              : nlohmann::json::object();
  const std::string cell_name = merged.value("name", keras::detail::to_snake_case(cell_class));
  // One policy and one trainable flag for the RNN and its cell: a cell that differs is refused.
  for (const char* key : {"trainable", "dtype"}) {
    const nlohmann::json outer = config.contains(key) ? config[key] : nlohmann::json(nullptr);
    if (merged.contains(key) && !merged[key].is_null() && !outer.is_null() &&
        merged[key] != outer) {
      read.fail("cell", std::string("a cell of the RNN's ") + key + " " + outer.dump() +
                            " (loadstar runs an RNN and its cell as one layer) but the cell has " +
                            merged[key].dump());
    }
  }
  for (const char* key : {"name", "trainable", "dtype"})
    merged.erase(key);
  for (const auto& [key, value] : config.items()) {
    if (key != "cell") merged[key] = value;
  }
  auto layer = read.nested("cell", [&] {
    return std::static_pointer_cast<RecurrentLayer>(
        recurrent_from_config<RecurrentLayer>(merged, kind));
  });
  layer->set_cell_form(cell_name);
  return layer;
}

}  // namespace loadstar::keras::layers::detail
#endif
