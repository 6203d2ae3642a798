/// \file
/// `StackedRNN`: Keras's `RNN` of `StackedRNNCells` (`RNN([LSTMCell(8), GRUCell(4)])`), the
/// cells run one after the other at every step.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/recurrent.hpp"

namespace loadstar::keras::layers {

/// The cell of a recurrent layer: `CellKind::simple_rnn`, `lstm` or `gru`.
using detail::CellKind;

/// One cell of a `StackedRNN`: its kind (`SimpleRNNCell`, `LSTMCell` or `GRUCell`), units and
/// options (activations, initializers, `dropout`, ...; `options.name` is the cell's name, Keras's
/// `lstm_cell`, `lstm_cell_1`, ... when empty). The sequence's options (`return_sequences`,
/// `go_backwards`, `stateful`, ...) are the RNN's: a cell's must keep their defaults.
struct StackedCell {
  detail::CellKind kind = detail::CellKind::lstm;
  std::size_t units = 0;
  RecurrentOptions options = {};
};

/// The options of the `RNN` around the cells, with Keras's defaults.
struct StackedRNNOptions {
  /// Every step's output of the last cell `(batch, timesteps, units)`, rather than the last.
  bool return_sequences = false;
  /// Also every cell's final states, in cell order (`h`, and an LSTM cell's `c`), as the call's
  /// later outputs: Keras's `output, *states` flattened (`call_outputs`).
  bool return_state = false;
  /// The sequence runs from its end, and the outputs stay in that order (Keras).
  bool go_backwards = false;
  /// Each batch starts from the final states of the batch before (every cell's), until
  /// `reset_states()`, as `LSTM(stateful=True)`.
  bool stateful = false;
  /// With a mask: a masked step's output is 0 rather than the output of the step before.
  bool zero_output_for_mask = false;
  /// The `StackedRNNCells`' name, the scope of the cells' weight names.
  std::string cells_name = "stacked_rnn_cells";
  std::string name = {};
};

/// Keras's `RNN(StackedRNNCells([...]))` over inputs `(batch, timesteps, features)`: at every step
/// the first cell reads the input and each later cell the output of the cell before; the layer's
/// output is the last cell's. A masked step keeps every cell's states (Keras's `backend.rnn`). Each
/// cell's dropout draws its own masks, keyed by `name/cell_name`. Its weights are the cells',
/// in order, as Keras keeps them (`stacked_rnn_cells/lstm_cell/kernel`, ...; in `.keras` files
/// `layers/rnn/cell/cells/lstm_cell/vars`). Keras's `return_state` and `initial_state` give and
/// take every cell's states, in Keras's nested lists flattened in cell order: `call(stack, {x, h1,
/// c1, h2})` starts an LSTM cell and a GRU cell from those states.
/// \code
/// StackedRNN stack({{.kind = detail::CellKind::lstm, .units = 8},
///                   {.kind = detail::CellKind::gru, .units = 4}});
/// \endcode
class StackedRNN : public detail::LayerBase {
 public:
  LOADSTAR_DECL explicit StackedRNN(std::vector<StackedCell> cells, StackedRNNOptions options = {});

  std::string class_name() const override { return "RNN"; }
  const StackedRNNOptions& options() const noexcept { return options_; }
  std::size_t cell_count() const noexcept { return cells_.size(); }
  const StackedCell& cell(std::size_t i) const { return cells_.at(i); }

  /// Timesteps of unknown length, settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;
  /// The output, and with `return_state` every cell's final states.
  std::size_t output_count() const noexcept override {
    return 1 + (options_.return_state ? state_total() : 0);
  }
  /// `(units)` of each cell's states, with `return_state`.
  LOADSTAR_DECL std::vector<Shape> extra_output_shapes(
      std::span<const Shape> input_shapes) const override;
  MaskFlow mask_flow() const noexcept override {
    return options_.return_sequences ? MaskFlow::passes : MaskFlow::ends;
  }
  bool reads_masks() const noexcept override { return true; }

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
  /// With `stateful`, once a batch has run: every cell's final states, in order (`h`, and an
  /// LSTM cell's `c`).
  std::vector<Tensor<float>> carried_states() const override {
    if (!carried_) return {};
    return carried_views_;
  }
  LOADSTAR_DECL void restore_carried_states(Backend& backend,
                                            std::span<const Tensor<float>> states) override;

  /// An `RNN` config whose `cell` is a `StackedRNNCells` (the registry's factory dispatches here).
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The number of states of every cell together (an LSTM cell's 2, the others' 1).
  std::size_t state_total() const noexcept {
    std::size_t n = 0;
    for (const auto& c : cells_)
      n += c.kind == detail::CellKind::lstm ? 2 : 1;
    return n;
  }
  /// Cell `i`'s weights: kernel, recurrent kernel, and bias when it uses one.
  std::span<const Variable> cell_weights(std::size_t i) const {
    return std::span<const Variable>(weights_).subspan(first_weight_[i],
                                                       first_weight_[i + 1] - first_weight_[i]);
  }
  /// Cell `i`'s input mask: the layer's for the first; the later cells read the outputs in
  /// processing order, so with `go_backwards` the mask reversed along time.
  LOADSTAR_DECL Tensor<float> cell_mask(const CallContext& ctx, std::size_t i);
  /// With `stateful`, sizes the carried and starting states for `batch` samples, and (in the
  /// forward pass) copies the carried ones, or zeros, to the start.
  LOADSTAR_DECL void prepare_states(Backend& backend, std::size_t batch, bool forward);
  /// Cell `i`'s dropout in this call: keyed by `name/cell_name` in training, none otherwise.
  void set_cell_dropout(const CallContext& ctx, std::size_t i) {
    cores_[i].set_dropout(
        ctx.training ? std::optional(detail::recurrent_dropout_key(
                           cells_[i].options.seed, ctx, name() + "/" + cells_[i].options.name))
                     : std::nullopt);
  }
  /// Runs the cells from `initial` (the given initial states, else `start_views_`), writing
  /// their final states into `final_states` (the call's extra outputs with `return_state`, else
  /// `carried_views_`).
  LOADSTAR_DECL void run(const CallContext& ctx, const Tensor<float>& x,
                         const Tensor<float>& output, std::span<const Tensor<float>> initial,
                         std::span<const Tensor<float>> final_states);
  /// The initial states of a call: its inputs after the sequence, else the stateful start.
  std::span<const Tensor<float>> initial_of(std::span<const Tensor<float>> inputs) const {
    return inputs.size() > 1 ? inputs.subspan(1) : std::span<const Tensor<float>>(start_views_);
  }

  std::vector<StackedCell> cells_;
  StackedRNNOptions options_;
  std::vector<detail::RecurrentCore> cores_;
  std::vector<std::size_t> first_weight_, first_state_;
  /// The outputs of the cells before the last, and their gradients.
  std::vector<detail::Scratch> outputs_, gradients_;
  detail::Scratch reversed_mask_;
  const float* last_input_ = nullptr;
  // `stateful`: the final states of the last batch, and the copy this batch started from.
  bool carried_ = false;
  std::size_t carried_batch_ = 0;
  std::vector<detail::Scratch> carried_states_, start_;
  std::vector<Tensor<float>> carried_views_, start_views_;
};

namespace detail {
/// Keras's `RNN` from its config: of one cell (`rnn_from_config`) or of `StackedRNNCells`.
LOADSTAR_DECL std::shared_ptr<Layer> any_rnn_from_config(const nlohmann::json& config);
}  // namespace detail

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

StackedRNN::StackedRNN(std::vector<StackedCell> cells, StackedRNNOptions options)
    : LayerBase(options.name), cells_(std::move(cells)), options_(std::move(options)) {
  if (cells_.empty()) throw ConfigError(label() + ": StackedRNNCells needs at least one cell");
  std::vector<std::string> taken;
  for (std::size_t i = 0; i < cells_.size(); ++i) {
    StackedCell& c = cells_[i];
    const RecurrentOptions& o = c.options;
    if (o.return_sequences || o.return_state || o.go_backwards || o.stateful ||
        o.zero_output_for_mask) {
      throw ConfigError(label() + ": cell " + std::to_string(i) +
                        " sets return_sequences, return_state, go_backwards, stateful or "
                        "zero_output_for_mask, which are options of the RNN around the cells");
    }
    if (c.options.name.empty()) {
      // Keras's automatic names: lstm_cell, lstm_cell_1, ...
      const std::string base =
          keras::detail::to_snake_case(detail::cell_class_name(c.kind)) + "_cell";
      std::string name = base;
      for (std::size_t n = 1; std::find(taken.begin(), taken.end(), name) != taken.end(); ++n)
        name = base + "_" + std::to_string(n);
      c.options.name = name;
    }
    if (std::find(taken.begin(), taken.end(), c.options.name) != taken.end())
      throw ConfigError(label() + ": two cells are named '" + c.options.name + "'");
    taken.push_back(c.options.name);
    cores_.emplace_back(c.kind, c.units, c.options, label());
  }
}

Shape StackedRNN::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out = cores_.front().output_shape(input_shapes[0]);
  for (std::size_t i = 1; i < cores_.size(); ++i)
    out = cores_[i].output_shape(Shape{input_shapes[0][0], cells_[i - 1].units});
  return out;
}

std::vector<Shape> StackedRNN::extra_output_shapes(std::span<const Shape>) const {
  std::vector<Shape> shapes;
  if (!options_.return_state) return shapes;
  for (const auto& c : cells_) {
    for (std::size_t k = 0; k < (c.kind == detail::CellKind::lstm ? 2U : 1U); ++k)
      shapes.push_back(Shape{c.units});
  }
  return shapes;
}

Shape StackedRNN::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  const std::size_t states = state_total();
  if (input_shapes.size() != 1 && input_shapes.size() != 1 + states) {
    throw ShapeError(label() +
                     ": takes the sequence, and optionally every cell's initial states (" +
                     std::to_string(states) + " in cell order), but got " +
                     std::to_string(input_shapes.size()) + " inputs");
  }
  if (input_shapes.size() > 1 && options_.stateful) {
    throw ConfigError(label() +
                      ": is stateful and was given initial states; a stateful RNN "
                      "starts from the states it carries");
  }
  // Each cell runs the whole sequence: all but the last return every step's output.
  cores_.clear();
  first_state_.assign(1, 0);
  const std::size_t last = cells_.size() - 1;
  for (std::size_t i = 0; i < cells_.size(); ++i) {
    RecurrentOptions o = cells_[i].options;
    o.return_sequences = i < last || options_.return_sequences;
    o.go_backwards = i == 0 && options_.go_backwards;
    o.zero_output_for_mask = i == last && options_.zero_output_for_mask;
    cores_.emplace_back(cells_[i].kind, cells_[i].units, o,
                        label() + " (cell '" + cells_[i].options.name + "')");
    first_state_.push_back(first_state_.back() + cores_.back().state_count());
  }
  for (std::size_t i = 0; i + 1 < input_shapes.size(); ++i) {
    std::size_t cell = 0;
    while (first_state_[cell + 1] <= i)
      ++cell;
    if (input_shapes[i + 1] != Shape{cells_[cell].units}) {
      throw ShapeError(label() + ": initial state " + std::to_string(i) + " (of cell '" +
                       cells_[cell].options.name + "') must be " +
                       batch_str(Shape{cells_[cell].units}) + " but is " +
                       batch_str(input_shapes[i + 1]));
    }
  }
  const Shape out = output_shape_for(input_shapes);
  if (weights_.empty()) {
    first_weight_.assign(1, 0);
    for (std::size_t i = 0; i < cores_.size(); ++i) {
      const std::size_t features = i == 0 ? input_shapes[0][1] : cells_[i - 1].units;
      const auto names = detail::cell_weight_names(cells_[i].kind);
      auto values = cores_[i].initial_weights(features, SplitMix64::mix(seed + 31 * i));
      for (std::size_t k = 0; k < values.size(); ++k) {
        // tf.keras's names: stacked_rnn_cells/lstm_cell/kernel.
        const std::string suffix = names[k].substr(names[k].find('/'));
        add_weight(options_.cells_name + "/" + cells_[i].options.name + suffix, values[k]);
      }
      first_weight_.push_back(weights_.size());
    }
  } else {
    for (std::size_t i = 0; i < cores_.size(); ++i)
      cores_[i].check_weights(cell_weights(i), i == 0 ? input_shapes[0][1] : cells_[i - 1].units);
  }
  outputs_.resize(cores_.size());
  gradients_.resize(cores_.size());
  carried_states_.resize(first_state_.back());
  start_.resize(first_state_.back());
  remember(input_shapes, out);
  return out;
}

Tensor<float> StackedRNN::cell_mask(const CallContext& ctx, std::size_t i) {
  const Tensor<float> mask = detail::input_mask(ctx);
  if (i == 0 || mask.empty() || !options_.go_backwards) return mask;
  const std::size_t batch = mask.dim(0), steps = mask.size() / batch;
  const Tensor<float> reversed = reversed_mask_.get(ctx.backend, {batch, steps});
  if (i == 1) {
    const Tensor<float> tensors[] = {mask, reversed};
    keras::detail::RecurrentKernel k;
    k.op = keras::detail::RecurrentOp::reverse_steps;
    k.steps = steps;
    k.width = 1;
    ctx.backend.recurrent_kernel(k, tensors, reversed.size());
  }
  return reversed;
}

void StackedRNN::prepare_states(Backend& backend, std::size_t batch, bool forward) {
  if (!options_.stateful) {
    carried_views_.clear();
    start_views_.clear();
    return;
  }
  if (forward && carried_ && batch != carried_batch_) {
    throw ShapeError(label() + ": is stateful and carries the states of batches of " +
                     std::to_string(carried_batch_) + " samples, but got a batch of " +
                     std::to_string(batch) +
                     "; give every batch the same number of samples, or call reset_states() "
                     "first");
  }
  carried_views_.clear();
  start_views_.clear();
  for (std::size_t i = 0; i < cores_.size(); ++i) {
    for (std::size_t k = first_state_[i]; k < first_state_[i + 1]; ++k) {
      const Shape shape{batch, cells_[i].units};
      carried_views_.push_back(carried_states_[k].get(backend, shape));
      start_views_.push_back(start_[k].get(backend, shape));
      if (!forward) continue;
      if (carried_) {
        backend.copy(carried_views_.back(), start_views_.back());
      } else {
        backend.fill(start_views_.back(), 0.0F);
      }
    }
  }
}

void StackedRNN::run(const CallContext& ctx, const Tensor<float>& x, const Tensor<float>& output,
                     std::span<const Tensor<float>> initial,
                     std::span<const Tensor<float>> final_states) {
  Backend& backend = ctx.backend;
  const std::size_t batch = x.dim(0), steps = x.dim(1), last = cores_.size() - 1;
  Tensor<float> input = x;
  for (std::size_t i = 0; i < cores_.size(); ++i) {
    const Tensor<float> y =
        i == last ? output : outputs_[i].get(backend, {batch, steps, cells_[i].units});
    set_cell_dropout(ctx, i);
    const auto cell_states = [&](std::span<const Tensor<float>> all) {
      return all.empty() ? all : all.subspan(first_state_[i], cores_[i].state_count());
    };
    cores_[i].forward(backend, cell_weights(i), input, y, cell_mask(ctx, i), cell_states(initial),
                      cell_states(final_states));
    input = y;
  }
  last_input_ = x.data();
}

void StackedRNN::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                         const CallContext& ctx) {
  check_inputs(inputs);
  prepare_states(ctx.backend, inputs[0].dim(0), true);
  const std::span<const Tensor<float>> finals =
      options_.return_state ? ctx.extra_outputs : std::span<const Tensor<float>>(carried_views_);
  run(ctx, inputs[0], output, initial_of(inputs), finals);
  if (options_.stateful && options_.return_state) {
    for (std::size_t k = 0; k < carried_views_.size(); ++k)
      ctx.backend.copy(ctx.extra_outputs[k], carried_views_[k]);
  }
  if (options_.stateful) {
    carried_ = true;
    carried_batch_ = inputs[0].dim(0);
  }
}

void StackedRNN::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const Tensor<float>& output_gradient,
                          std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].dim(0), steps = inputs[0].dim(1), last = cores_.size() - 1;
  prepare_states(backend, batch, false);
  // The cells' outputs are those of the last forward pass: of another input (a shared layer),
  // they are computed again.
  const std::span<const Tensor<float>> initial = initial_of(inputs);
  if (inputs[0].data() != last_input_) {
    run(ctx, inputs[0], output, initial,
        options_.return_state ? ctx.extra_outputs : std::span<const Tensor<float>>(carried_views_));
  }
  // The gradients of the given initial states, and those of the returned final states (an empty
  // entry: nothing reads that state).
  const std::span<const Tensor<float>> initial_gradients =
      inputs.size() > 1 && input_gradients.size() > 1 ? input_gradients.subspan(1)
                                                      : std::span<const Tensor<float>>();
  const std::span<const Tensor<float>> final_gradients =
      options_.return_state ? ctx.extra_output_gradients : std::span<const Tensor<float>>();
  const auto cell_states = [&](std::span<const Tensor<float>> all, std::size_t i) {
    return all.empty() ? all : all.subspan(first_state_[i], cores_[i].state_count());
  };
  Tensor<float> dy = output_gradient;
  for (std::size_t i = last + 1; i-- > 0;) {
    const Tensor<float> x =
        i == 0 ? inputs[0] : outputs_[i - 1].get(backend, {batch, steps, cells_[i - 1].units});
    const Tensor<float> y =
        i == last ? output : outputs_[i].get(backend, {batch, steps, cells_[i].units});
    const Tensor<float> dx =
        i == 0 ? (input_gradients.empty() ? Tensor<float>() : input_gradients[0])
               : gradients_[i - 1].get(backend, {batch, steps, cells_[i - 1].units});
    set_cell_dropout(ctx, i);
    cores_[i].backward(backend, cell_weights(i), x, y, dy, dx, cell_mask(ctx, i),
                       cell_states(initial, i), cell_states(initial_gradients, i),
                       cell_states(final_gradients, i));
    dy = dx;
  }
}

void StackedRNN::restore_carried_states(Backend& backend, std::span<const Tensor<float>> states) {
  if (states.empty()) {
    carried_ = false;
    return;
  }
  const std::size_t batch = states[0].rank() == 2 ? states[0].dim(0) : 0;
  bool fits = options_.stateful && states.size() == first_state_.back() && batch > 0;
  for (std::size_t i = 0; fits && i < cores_.size(); ++i)
    for (std::size_t k = first_state_[i]; fits && k < first_state_[i + 1]; ++k)
      fits = states[k].shape() == Shape{batch, cells_[i].units};
  if (!fits) {
    std::string found;
    for (const auto& s : states)
      found += (found.empty() ? "" : ", ") + s.shape().str();
    throw ShapeError(label() + ": carries " +
                     (options_.stateful
                          ? std::to_string(first_state_.back()) + " states (every cell's, in order)"
                          : std::string("no states (it is not stateful)")) +
                     " but was given states of shapes " + found);
  }
  prepare_states(backend, batch, false);
  for (std::size_t k = 0; k < states.size(); ++k)
    backend.copy(states[k], carried_views_[k]);
  carried_ = true;
  carried_batch_ = batch;
}

nlohmann::json StackedRNN::get_config() const {
  auto config = base_config();
  config["return_sequences"] = options_.return_sequences;
  config["return_state"] = options_.return_state;
  config["go_backwards"] = options_.go_backwards;
  config["stateful"] = options_.stateful;
  config["unroll"] = false;
  config["time_major"] = false;
  config["zero_output_for_mask"] = options_.zero_output_for_mask;
  nlohmann::json cells = nlohmann::json::array();
  for (std::size_t i = 0; i < cells_.size(); ++i) {
    nlohmann::json cell = {
        {"name", cells_[i].options.name}, {"trainable", trainable()}, {"dtype", "float32"}};
    cores_[i].write_config(cell);
    for (const char* key : {"return_sequences", "return_state", "go_backwards", "stateful",
                            "unroll", "time_major", "zero_output_for_mask"})
      cell.erase(key);
    cells.push_back({{"class_name", std::string(detail::cell_class_name(cells_[i].kind)) + "Cell"},
                     {"config", std::move(cell)}});
  }
  config["cell"] = {{"class_name", "StackedRNNCells"},
                    {"config",
                     {{"name", options_.cells_name},
                      {"trainable", trainable()},
                      {"dtype", "float32"},
                      {"cells", std::move(cells)}}}};
  return config;
}

std::shared_ptr<Layer> StackedRNN::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "RNN");
  const nlohmann::json* cell = read.find("cell");
  const nlohmann::json* stack = cell != nullptr && cell->is_object() && cell->contains("config")
                                    ? &(*cell)["config"]
                                    : nullptr;
  if (stack == nullptr || !stack->is_object() || !stack->contains("cells") ||
      !(*stack)["cells"].is_array() || (*stack)["cells"].empty()) {
    read.fail("cell", "a StackedRNNCells config with a non-empty list of cells");
  }
  // One policy and one trainable flag for the RNN, the stack and its cells: a part that differs
  // is refused.
  const auto same_as_outer = [&](const nlohmann::json& part, const std::string& what) {
    for (const char* key : {"trainable", "dtype"}) {
      const nlohmann::json outer = config.contains(key) ? config[key] : nlohmann::json(nullptr);
      if (part.contains(key) && !part[key].is_null() && !outer.is_null() && part[key] != outer) {
        read.fail("cell", what + " of the RNN's " + key + " " + outer.dump() +
                              " (loadstar runs an RNN and its cells as one layer) but it has " +
                              part[key].dump());
      }
    }
  };
  same_as_outer(*stack, "a StackedRNNCells");
  if (stack->contains("reverse_state_order") && (*stack)["reverse_state_order"] != false) {
    read.fail("cell", "StackedRNNCells with reverse_state_order false (tf.keras 2's default)");
  }
  std::vector<StackedCell> cells;
  for (const auto& entry : (*stack)["cells"]) {
    const std::string cell_class =
        entry.is_object() && entry.contains("class_name") && entry["class_name"].is_string()
            ? entry["class_name"].get<std::string>()
            : std::string();
    if (cell_class != "SimpleRNNCell" && cell_class != "LSTMCell" && cell_class != "GRUCell") {
      read.fail("cell", "StackedRNNCells of SimpleRNNCell, LSTMCell or GRUCell cells but cell " +
                            std::to_string(cells.size()) + " is " + entry.dump().substr(0, 80));
    }
    const detail::CellKind kind = cell_class == "LSTMCell"  ? detail::CellKind::lstm
                                  : cell_class == "GRUCell" ? detail::CellKind::gru
                                                            : detail::CellKind::simple_rnn;
    const nlohmann::json cell_config = entry.contains("config") && entry["config"].is_object()
                                           ? entry["config"]
                                           : nlohmann::json::object();
    same_as_outer(cell_config, "a cell");
    const std::string cell_name = cell_config.value("name", std::string());
    StackedCell c{.kind = kind};
    read.nested("cell", [&] {
      const auto cell_read = detail::layer_config(cell_config, cell_class);
      c.units = cell_read.positive("units");
      c.options = detail::recurrent_options(cell_read, kind);
    });
    c.options.name = cell_name;
    cells.push_back(std::move(c));
  }
  read.expect("time_major", false, "loadstar's recurrent inputs are (batch, timesteps, features)");
  read.get("unroll", false);
  StackedRNNOptions options{.return_sequences = read.get("return_sequences", false),
                            .return_state = read.get("return_state", false),
                            .go_backwards = read.get("go_backwards", false),
                            .stateful = read.get("stateful", false),
                            .zero_output_for_mask = read.get("zero_output_for_mask", false),
                            .name = detail::config_name(read)};
  if (const auto stack_name = stack->find("name"); stack_name != stack->end() &&
                                                   stack_name->is_string() &&
                                                   !stack_name->get<std::string>().empty())
    options.cells_name = stack_name->get<std::string>();
  return detail::finish_layer(read, std::make_shared<StackedRNN>(std::move(cells), options));
}

namespace detail {
std::shared_ptr<Layer> any_rnn_from_config(const nlohmann::json& config) {
  const auto cell = config.is_object() ? config.find("cell") : config.end();
  if (config.is_object() && cell != config.end() && cell->is_object() &&
      cell->value("class_name", nlohmann::json()) == "StackedRNNCells") {
    return StackedRNN::from_config(config);
  }
  return rnn_from_config(config);
}
}  // namespace detail

}  // namespace loadstar::keras::layers
#endif
