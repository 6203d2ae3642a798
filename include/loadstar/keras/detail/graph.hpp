/// \file
/// The symbolic graph behind `KerasTensor`: one node per `Input` or layer call.
#pragma once

#include "loadstar/config.hpp"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loadstar/keras/layer.hpp"
#include "loadstar/random.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras::detail {

/// One symbolic tensor: an `Input` (no layer) or the output of one call of `layer` on `inputs`.
struct GraphNode {
  std::shared_ptr<Layer> layer;
  std::vector<std::shared_ptr<GraphNode>> inputs;
  /// The shape of one sample (without the batch axis).
  Shape shape;
  /// The name given to an `Input` (empty: the model names it `input_1`, `input_2`, ...).
  std::string input_name;
  /// Creation order: a topological order of every graph built in this process.
  std::uint64_t id = 0;
  /// Which output of the call this is (Keras's `tensor_index`): 0, or for the later outputs of a
  /// layer with several (`Layer::output_count`), their index, with `primary` the node of output
  /// 0, which holds the call's inputs (this node's `inputs` are empty).
  std::size_t output_index = 0;
  std::shared_ptr<GraphNode> primary;
};

/// The node that holds the call `node` is an output of: `node` itself, or its `primary`.
inline const GraphNode* call_node(const GraphNode* node) noexcept {
  return node->primary ? node->primary.get() : node;
}

LOADSTAR_DECL std::uint64_t next_node_id();

using loadstar::splitmix64;

/// The global seed of `set_random_seed` and the number of seeds drawn from it since.
struct SeedState {
  std::mutex mutex;
  std::uint64_t seed = 0;
  std::uint64_t drawn = 0;
};

LOADSTAR_DECL SeedState& seed_state();

/// The next seed for a layer's initializers: a pure function of the global seed and the number
/// of layers built since `set_random_seed`, as Keras's seeded initializers are.
LOADSTAR_DECL std::uint64_t next_seed();

/// The global seed (for shuffling and dropout when no other seed is given).
LOADSTAR_DECL std::uint64_t global_seed();

/// Keras's `to_snake_case` of a class name: `Dense` -> `dense`, `MaxPooling2D` ->
/// `max_pooling2d`, `BatchNormalization` -> `batch_normalization` (keras/utils/generic_utils.py:
/// `(.)([A-Z][a-z]+)` -> `\1_\2`, then `([a-z])([A-Z])` -> `\1_\2`, lower-cased).
LOADSTAR_DECL std::string to_snake_case(const std::string& name);

/// How messages name a layer: `"dense layer 'fc1'"`.
inline std::string layer_label(const Layer& layer) {
  return to_snake_case(layer.class_name()) + " layer '" + layer.name() + "'";
}

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::uint64_t next_node_id() {
  static std::uint64_t counter = 0;
  static std::mutex mutex;
  const std::lock_guard lock(mutex);
  return ++counter;
}

SeedState& seed_state() {
  static SeedState state;
  return state;
}

std::uint64_t next_seed() {
  auto& state = seed_state();
  const std::lock_guard lock(state.mutex);
  return splitmix64(state.seed * 0x100000001B3ULL + ++state.drawn);
}

std::uint64_t global_seed() {
  auto& state = seed_state();
  const std::lock_guard lock(state.mutex);
  return state.seed;
}

std::string to_snake_case(const std::string& name) {
  const auto upper = [](char c) { return std::isupper(static_cast<unsigned char>(c)) != 0; };
  const auto lower = [](char c) { return std::islower(static_cast<unsigned char>(c)) != 0; };
  std::string first;
  for (std::size_t i = 0; i < name.size(); ++i) {
    if (i > 0 && upper(name[i]) && i + 1 < name.size() && lower(name[i + 1])) first += '_';
    first += name[i];
  }
  std::string second;
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (i > 0 && upper(first[i]) && lower(first[i - 1])) second += '_';
    second += static_cast<char>(std::tolower(static_cast<unsigned char>(first[i])));
  }
  return second;
}

}  // namespace loadstar::keras::detail
#endif
