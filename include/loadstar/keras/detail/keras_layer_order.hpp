/// \file
/// `keras_layer_order`: the order in which Keras lists a functional model's layers (its
/// `model.layers`, the `layers` of its config, the layer groups of its files).
#pragma once

#include "loadstar/config.hpp"

#include <vector>

#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/input.hpp"

namespace loadstar::keras::detail {

/// The inputs and layers of the graph from `inputs` to `outputs` in Keras's order, one entry
/// each: an input's node, or a layer's first node met. Keras walks the graph depth first from each
/// output in turn, numbering a layer when it first meets it, then gives every node a depth (0 at
/// the outputs, one more than its deepest consumer, a shared layer its deepest call's) and lists
/// the layers by decreasing depth, those of one depth by their number; an input no output depends
/// on comes last (tf-keras `functional._map_graph_network` and `_build_map`, Keras 3
/// `ops/function.py` `map_graph` and `_build_map`). So a file loadstar writes lists its layers as
/// the Keras that loads it will.
LOADSTAR_DECL std::vector<const GraphNode*> keras_layer_order(
    const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>

namespace loadstar::keras::detail {

std::vector<const GraphNode*> keras_layer_order(const std::vector<KerasTensor>& inputs,
                                                const std::vector<KerasTensor>& outputs) {
  // A layer's key is the layer; an input's (Keras's InputLayer, one node) its node.
  const auto key_of = [](const GraphNode* node) -> const void* {
    return node->layer ? static_cast<const void*>(node->layer.get())
                       : static_cast<const void*>(node);
  };
  std::unordered_map<const void*, std::int64_t> index;
  std::unordered_map<const void*, const GraphNode*> first_node;
  std::vector<const GraphNode*> post_order;  // Keras's nodes_in_decreasing_depth
  std::set<const GraphNode*> finished;
  // Depth first, iteratively: (node, next input to visit).
  std::vector<std::pair<const GraphNode*, std::size_t>> stack;
  for (const auto& output : outputs) {
    stack.emplace_back(call_node(output.node().get()), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == 0) {
        if (finished.contains(node)) {
          stack.pop_back();
          continue;
        }
        const void* key = key_of(node);
        if (!index.contains(key)) {
          index.emplace(key, static_cast<std::int64_t>(index.size()));
          first_node.emplace(key, node);
        }
      }
      if (next < node->inputs.size()) {
        const GraphNode* input = call_node(node->inputs[next++].get());
        if (!finished.contains(input)) stack.emplace_back(input, 0);
        continue;
      }
      finished.insert(node);
      post_order.push_back(node);
      stack.pop_back();
    }
  }
  std::unordered_map<const GraphNode*, std::size_t> node_depth;
  std::unordered_map<const void*, std::size_t> layer_depth;
  std::vector<const void*> keys;  // in the order Keras's dict `layers_depths` gets them
  for (auto it = post_order.rbegin(); it != post_order.rend(); ++it) {
    const GraphNode* node = *it;
    const void* key = key_of(node);
    std::size_t depth = node_depth[node];
    const auto previous = layer_depth.find(key);
    if (previous != layer_depth.end()) {
      depth = std::max(depth, previous->second);
      previous->second = depth;
    } else {
      layer_depth.emplace(key, depth);
      keys.push_back(key);
    }
    node_depth[node] = depth;
    for (const auto& parent : node->inputs) {
      std::size_t& d = node_depth[call_node(parent.get())];
      d = std::max(d, depth + 1);
    }
  }
  for (const auto& input : inputs) {
    const GraphNode* node = input.node().get();
    const void* key = key_of(node);
    if (layer_depth.contains(key)) continue;
    layer_depth.emplace(key, 0);
    index[key] = -1;
    first_node.emplace(key, node);
    keys.push_back(key);
  }
  std::map<std::size_t, std::vector<const void*>, std::greater<>> by_depth;
  for (const void* key : keys)
    by_depth[layer_depth.at(key)].push_back(key);
  std::vector<const GraphNode*> out;
  for (auto& [depth, list] : by_depth) {
    std::stable_sort(list.begin(), list.end(),
                     [&](const void* a, const void* b) { return index.at(a) < index.at(b); });
    for (const void* key : list)
      out.push_back(first_node.at(key));
  }
  return out;
}

}  // namespace loadstar::keras::detail
#endif
