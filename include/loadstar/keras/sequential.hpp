/// \file
/// `Sequential`: Keras's linear stack of layers.
#pragma once

#include "loadstar/config.hpp"

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/nested_model.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layers/input_layer.hpp"
// model.hpp ends with the saving headers, which use `Sequential`: when this header comes before
// model.hpp, they wait until `Sequential` is defined below.
#ifndef LOADSTAR_DETAIL_MODEL_HPP
#define LOADSTAR_DETAIL_DEFER_SAVING
#define LOADSTAR_DETAIL_SEQUENTIAL_DEFERS_SAVING
#endif
#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

/// What a `Sequential` stacks: a layer (by value or shared pointer), or an `Input(shape)` or
/// `InputLayer` first, which fixes the input shape.
class SequentialItem {
 public:
  SequentialItem(KerasTensor input) : input_(std::move(input)) {}  // NOLINT: implicit on purpose
  template <class L>
  requires std::constructible_from<LayerArg, L> SequentialItem(L&& layer)  // NOLINT: implicit
      : layer_(LayerArg(std::forward<L>(layer)).get()) {}
  /// A model, used as a layer (`ModelLayer`, keras/model_layer.hpp).
  template <std::derived_from<Model> M>
  SequentialItem(std::shared_ptr<M> model)  // NOLINT: implicit on purpose
      : layer_(detail::model_as_layer(std::move(model))) {}

  const std::optional<KerasTensor>& input() const noexcept { return input_; }
  const std::shared_ptr<Layer>& layer() const noexcept { return layer_; }

 private:
  std::optional<KerasTensor> input_;
  std::shared_ptr<Layer> layer_;
};

/// Keras's `Sequential`: layers applied one after the other.
///
/// The input shape comes from an `Input(shape)` or `InputLayer(shape)` given first; without one,
/// the model is built from the first batch it sees (Keras's deferred build), and `summary` and
/// `get_weights` wait until then.
/// \code
/// Sequential model{Input({28, 28}), Flatten(), Dense(128, {.activation = "relu"}), Dense(10)};
/// model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
/// model.fit(x, y, {.epochs = 5, .batch_size = 32, .validation_split = 0.1});
///
/// Sequential deferred;               // built on the first batch
/// deferred.add(Dense(10));
/// \endcode
class Sequential : public Model {
 public:
  explicit Sequential(std::string name = "sequential") : Model(std::move(name), nullptr) {
    show_inputs_in_summary_ = false;
  }

  Sequential(std::initializer_list<SequentialItem> items, std::string name = "sequential")
      : Sequential(std::move(name)) {
    for (const auto& item : items)
      add(item);
  }

  /// Appends a layer (or, first, an `Input` or `InputLayer`); throws `ConfigError` for an input
  /// after layers, and what the layer's `build` throws for the output shape of the stack.
  LOADSTAR_DECL void add(const SequentialItem& item);

  /// The layers in the order they were added, also before the model is built (`get_config`).
  const std::vector<std::shared_ptr<Layer>>& stacked_layers() const noexcept { return stack_; }

  /// Builds the model for samples of `input_shape` (Keras's `model.build((None, ...))`).
  LOADSTAR_DECL void build(const Shape& input_shape);

 protected:
  LOADSTAR_DECL void build_from_batch(const detail::ErasedBatch& batch) override;

 private:
  LOADSTAR_DECL void set_input(const KerasTensor& input);

  std::vector<std::shared_ptr<Layer>> stack_;
  std::optional<KerasTensor> input_, output_;
};

}  // namespace loadstar::keras

#ifdef LOADSTAR_DETAIL_SEQUENTIAL_DEFERS_SAVING
#undef LOADSTAR_DETAIL_SEQUENTIAL_DEFERS_SAVING
#undef LOADSTAR_DETAIL_DEFER_SAVING
#include "loadstar/keras/saving/model_config.hpp"
#include "loadstar/keras/saving/saving.hpp"
#endif

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Sequential::add(const SequentialItem& item) {
  if (item.input()) {
    set_input(*item.input());
    return;
  }
  if (auto input_layer = std::dynamic_pointer_cast<layers::InputLayer>(item.layer())) {
    set_input(Input(input_layer->shape(), input_layer->name()));
    return;
  }
  if (!item.layer()) throw ConfigError("sequential model '" + name() + "': a layer is null");
  stack_.push_back(item.layer());
  if (input_) {
    output_ = call(stack_.back(), *output_);
    set_graph({*input_}, {*output_});
  }
}

void Sequential::build(const Shape& input_shape) {
  if (input_) {
    throw ConfigError("sequential model '" + name() + "': is already built for inputs of shape " +
                      input_->shape().str());
  }
  input_ = Input(input_shape);
  output_ = input_;
  for (const auto& layer : stack_)
    output_ = call(layer, *output_);
  if (stack_.empty()) {
    throw ConfigError("sequential model '" + name() + "': has no layers to build");
  }
  set_graph({*input_}, {*output_});
}

void Sequential::build_from_batch(const detail::ErasedBatch& batch) {
  if (batch.x.size() != 1 || batch.x.front().shape.rank() == 0) {
    throw ShapeError("sequential model '" + name() + "': takes one input array with a batch " +
                     "axis but x has " + std::to_string(batch.x.size()) + " arrays");
  }
  build(batch.x.front().shape.row_shape());
}

void Sequential::set_input(const KerasTensor& input) {
  if (input_ || !stack_.empty()) {
    throw ConfigError("sequential model '" + name() +
                      "': an Input can only come first, before any layer");
  }
  if (!input.is_input()) {
    throw ConfigError("sequential model '" + name() + "': expects an Input() but got the " +
                      "output of a layer");
  }
  input_ = input;
  output_ = input;
}

}  // namespace loadstar::keras
#endif
