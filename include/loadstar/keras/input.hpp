/// \file
/// `Input` and `KerasTensor`: the symbolic tensors a functional `Model` is built from, and `call`,
/// which applies a layer to them.
#pragma once

#include "loadstar/config.hpp"

#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/detail/strings.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/shape_text.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras {

/// Seeds every random choice of the executor that is not given its own seed, as Keras's
/// `tf.keras.utils.set_random_seed`: the initial weights of the layers built afterwards (drawn
/// in build order), the shuffling of `fit` and dropout. The same seed, the same model code and the
/// same thread count give bitwise-identical weights.
/// \code
/// keras::set_random_seed(42);
/// Sequential model{Input({784}), Dense(10)};  // the same initial weights in every run
/// \endcode
LOADSTAR_DECL void set_random_seed(std::uint64_t seed);

/// A symbolic tensor: the output of an `Input` or of a layer called on symbolic tensors, with the
/// shape of one sample (no batch axis). A `Model` is built from the `KerasTensor`s of its inputs
/// and outputs.
/// \code
/// KerasTensor image = Input({28, 28}, "image");
/// KerasTensor x = call(Flatten(), image);       // shape (784,)
/// KerasTensor logits = call(Dense(10), x);      // shape (10,)
/// \endcode
class KerasTensor {
 public:
  /// The shape of one sample, without the batch axis.
  const Shape& shape() const noexcept { return node_->shape; }
  /// The layer that produced this tensor (`nullptr` for an `Input`).
  const std::shared_ptr<Layer>& layer() const noexcept { return node_->layer; }
  /// Whether this is an `Input`.
  bool is_input() const noexcept { return node_->layer == nullptr; }
  /// The name given to the `Input` (empty for layer outputs and unnamed inputs).
  const std::string& input_name() const noexcept { return node_->input_name; }

  /// The graph node (for the model).
  const std::shared_ptr<detail::GraphNode>& node() const noexcept { return node_; }

  explicit KerasTensor(std::shared_ptr<detail::GraphNode> node) : node_(std::move(node)) {}

 private:
  std::shared_ptr<detail::GraphNode> node_;
};

/// Keras's `keras.Input(shape, name=...)`: a symbolic input of the given sample shape (without
/// the batch axis). Unnamed inputs are named `input_1`, `input_2`, ... by their model. An axis
/// of length `none` takes any length, settled per batch (Keras's `None`).
/// \code
/// auto image = Input({28, 28}, "image");
/// auto tokens = Input({none}, "tokens");  // sequences of any length
/// \endcode
LOADSTAR_DECL KerasTensor Input(const Shape& shape, std::string name = {});

/// A layer handed to `call`, `Sequential` or `Model`: a `std::shared_ptr` to one (shared with the
/// caller) or any layer by value (moved into a new shared pointer).
class LayerArg {
 public:
  template <std::derived_from<Layer> L>
  LayerArg(std::shared_ptr<L> layer) : layer_(std::move(layer)) {}  // NOLINT: implicit on purpose
  template <std::derived_from<Layer> L>
  requires(!std::is_reference_v<L>) LayerArg(L&& layer)  // NOLINT: implicit on purpose
      : layer_(std::make_shared<std::remove_cvref_t<L>>(std::forward<L>(layer))) {}
  template <std::derived_from<Layer> L>
  LayerArg(const L& layer)  // NOLINT: implicit on purpose
      : layer_(std::make_shared<L>(layer)) {}

  const std::shared_ptr<Layer>& get() const noexcept { return layer_; }

 private:
  std::shared_ptr<Layer> layer_;
};

/// Calls `layer` on symbolic inputs, as Keras's `layer([a, b])`: builds the layer for the inputs'
/// shapes on its first call (its weights are created here, seeded by `set_random_seed`) and
/// returns the symbolic output. A layer called again (a shared layer) keeps its weights and must
/// get inputs of the shapes it was built for; throws `ShapeError` naming the layer otherwise, and
/// whatever the layer's `build` throws for shapes it does not accept.
/// \code
/// auto a = Input({16}), b = Input({16});
/// auto shared = std::make_shared<Dense>(8);
/// auto ya = call(shared, a), yb = call(shared, b);  // one kernel, two calls
/// \endcode
LOADSTAR_DECL KerasTensor call(const LayerArg& layer_arg, const std::vector<KerasTensor>& inputs);

/// `call` on one symbolic input.
inline KerasTensor call(const LayerArg& layer, const KerasTensor& input) {
  return call(layer, std::vector<KerasTensor>{input});
}

/// `call` for a layer whose Keras call returns a list (`Layer::output_count() > 1`): every output,
/// as Keras's `outputs, h, c = LSTM(8, return_state=True)(x)`. `call` refuses such a layer, so
/// that no output is dropped unseen; on a layer with one output, this returns that one.
/// \code
/// auto x = Input({none, 16});
/// auto states = call_outputs(LSTM(8, {.return_state = true}), x);  // output, h, c
/// auto decoded = call(LSTM(8, {.return_sequences = true}), {x, states[1], states[2]});
/// \endcode
LOADSTAR_DECL std::vector<KerasTensor> call_outputs(const LayerArg& layer_arg,
                                                    const std::vector<KerasTensor>& inputs);

/// `call_outputs` on one symbolic input.
inline std::vector<KerasTensor> call_outputs(const LayerArg& layer, const KerasTensor& input) {
  return call_outputs(layer, std::vector<KerasTensor>{input});
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void set_random_seed(std::uint64_t seed) {
  auto& state = detail::seed_state();
  const std::lock_guard lock(state.mutex);
  state.seed = seed;
  state.drawn = 0;
}

KerasTensor Input(const Shape& shape, std::string name) {
  auto node = std::make_shared<detail::GraphNode>();
  node->shape = shape;
  node->input_name = std::move(name);
  node->id = detail::next_node_id();
  return KerasTensor(std::move(node));
}

KerasTensor call(const LayerArg& layer_arg, const std::vector<KerasTensor>& inputs) {
  const std::shared_ptr<Layer>& layer = layer_arg.get();
  if (layer != nullptr && layer->output_count() > 1) {
    throw ConfigError(detail::to_snake_case(layer->class_name()) + " layer" +
                      (layer->name().empty() ? std::string() : " '" + layer->name() + "'") +
                      ": returns " + std::to_string(layer->output_count()) +
                      " outputs; call it with call_outputs, which returns them all");
  }
  return call_outputs(layer_arg, inputs).front();
}

std::vector<KerasTensor> call_outputs(const LayerArg& layer_arg,
                                      const std::vector<KerasTensor>& inputs) {
  const std::shared_ptr<Layer>& layer = layer_arg.get();
  if (layer == nullptr) throw ConfigError("call: the layer is a null pointer");
  std::vector<Shape> shapes;
  shapes.reserve(inputs.size());
  for (const auto& input : inputs)
    shapes.push_back(input.shape());
  const std::string label = detail::to_snake_case(layer->class_name()) + " layer" +
                            (layer->name().empty() ? std::string() : " '" + layer->name() + "'");
  if (!layer->takes_unknown_axes()) {
    for (const auto& shape : shapes) {
      if (detail::has_unknown_axis(shape)) {
        throw ShapeError(label + ": takes no axis of unknown length (None) but is called on " +
                         detail::batch_shape_str(shape) + "; give the Input a fixed length");
      }
    }
  }
  Shape output;
  bool settled = false;  // an output computed for these shapes, not the build's
  // The built state lives on the layer (Keras's `layer.built`): a shared layer is built once.
  // One built for unknown lengths takes any lengths there, the rest as built.
  const auto fits_build = [&] {
    const auto& built = layer->built_input_shapes();
    if (!layer->takes_unknown_axes() || built.size() != shapes.size()) return false;
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      if (built[i].rank() != shapes[i].rank()) return false;
      for (std::size_t d = 0; d < shapes[i].rank(); ++d)
        if (built[i][d] != none && built[i][d] != shapes[i][d]) return false;
    }
    return true;
  };
  if (layer->built()) {
    if (layer->built_input_shapes() != shapes && fits_build()) {
      // Known lengths: the output computed for them; unknown ones: the build's output.
      bool known = true;
      for (const auto& shape : shapes)
        known = known && !detail::has_unknown_axis(shape);
      output = known ? layer->output_shape_for(shapes) : layer->built_output_shape();
      settled = known;
    } else if (layer->built_input_shapes() != shapes) {
      const auto str = [](const Shape& s) { return detail::sample_shape_str(s); };
      const std::string expected =
          loadstar::detail::join(layer->built_input_shapes(), ", ", "", str);
      const std::string got = loadstar::detail::join(shapes, ", ", "", str);
      throw ShapeError(label + ": was built for inputs of shape " + expected +
                       " but is called on inputs of shape " + got);
    } else {
      output = layer->built_output_shape();
    }
  } else {
    try {
      output = layer->build(shapes, detail::next_seed());
    } catch (const MemoryError& e) {
      throw MemoryError(label + ": building its weights: " + e.what());
    }
    layer->set_built(shapes, output);
  }
  auto node = std::make_shared<detail::GraphNode>();
  node->layer = layer;
  for (const auto& input : inputs)
    node->inputs.push_back(input.node());
  node->shape = output;
  node->id = detail::next_node_id();
  std::vector<KerasTensor> outputs{KerasTensor(node)};
  const std::vector<Shape> extra =
      layer->extra_output_shapes(settled ? std::span<const Shape>(shapes)
                                         : std::span<const Shape>(layer->built_input_shapes()));
  if (extra.size() + 1 != layer->output_count()) {
    throw ConfigError(label + ": returns " + std::to_string(layer->output_count()) +
                      " outputs but gives the shapes of " + std::to_string(extra.size() + 1));
  }
  for (std::size_t i = 0; i < extra.size(); ++i) {
    auto sibling = std::make_shared<detail::GraphNode>();
    sibling->layer = layer;
    sibling->shape = extra[i];
    sibling->id = detail::next_node_id();
    sibling->output_index = i + 1;
    sibling->primary = node;
    outputs.emplace_back(std::move(sibling));
  }
  return outputs;
}

}  // namespace loadstar::keras
#endif
