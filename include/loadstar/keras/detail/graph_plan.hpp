/// \file
/// `plan_graph`: a model's graph of layer calls planned for execution: the nodes in topological
/// order, Keras's layer names, and the gradient plan (which node gradients are written, which
/// accumulated, which not needed).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/keras_layer_order.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layer.hpp"

namespace loadstar::keras::detail {

/// A planned graph: what `Model` executes.
struct GraphPlan {
  std::vector<RuntimeNode> nodes;
  std::vector<std::shared_ptr<Layer>> layers;
  std::vector<std::string> input_names, output_names, node_names;
  std::vector<std::size_t> output_nodes;
  /// Per output: whether its loss writes the output node's gradient (else accumulates).
  std::vector<bool> output_direct;
  /// Per node: whether its gradient is needed (a trainable weight at or before it).
  std::vector<bool> needs_backward;
  /// Per node: whether its `backward` writes its layer's weight gradients
  /// (`CallContext::accumulate_gradients` false): the layer `writes_gradients()` and this node
  /// is the only one of it whose `backward` runs.
  std::vector<bool> writes_gradients;
  std::vector<Variable*> trainable;
  /// The trainable variables whose gradients are set to zero before a training step: those of
  /// the layers that no node writes.
  std::vector<Variable*> zeroed;
};

/// Plans the graph from `inputs` to `outputs` of model `model`; throws `ConfigError` when an
/// output depends on an `Input` that is not among `inputs`, an input is not an `Input`, or two
/// layers share a name. Unnamed layers are named as Keras does (`dense`, `dense_1`, ...).
LOADSTAR_DECL GraphPlan plan_graph(const std::string& model, const std::vector<KerasTensor>& inputs,
                                   const std::vector<KerasTensor>& outputs);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

GraphPlan plan_graph(const std::string& model, const std::vector<KerasTensor>& inputs,
                     const std::vector<KerasTensor>& outputs) {
  GraphPlan plan;
  auto& output_direct_ = plan.output_direct;
  if (inputs.empty()) throw ConfigError("model '" + model + "': has no inputs");
  if (outputs.empty()) throw ConfigError("model '" + model + "': has no outputs");
  // Every node the outputs depend on, in creation order (a topological order).
  std::map<std::uint64_t, std::shared_ptr<GraphNode>> reached;
  std::vector<std::shared_ptr<GraphNode>> stack;
  for (const auto& o : outputs)
    stack.push_back(o.node());
  for (const auto& i : inputs)
    stack.push_back(i.node());
  std::set<const GraphNode*> declared;
  for (const auto& i : inputs) {
    if (!i.is_input()) {
      throw ConfigError("model '" + model + "': inputs must come from Input() but one is the " +
                        "output of layer '" + i.layer()->name() + "'");
    }
    declared.insert(i.node().get());
  }
  while (!stack.empty()) {
    auto node = stack.back();
    stack.pop_back();
    if (!reached.emplace(node->id, node).second) continue;
    if (node->primary) {
      // A later output of a call: the call is planned with its first output.
      stack.push_back(node->primary);
      continue;
    }
    if (!node->layer && !declared.contains(node.get())) {
      throw ConfigError("model '" + model + "': an output depends on an Input" +
                        (node->input_name.empty() ? "" : " '" + node->input_name + "'") +
                        " that is not among the model's inputs");
    }
    for (const auto& in : node->inputs)
      stack.push_back(in);
  }
  std::vector<RuntimeNode> nodes;
  std::unordered_map<const GraphNode*, std::size_t> index;
  // Inputs first, in the order given, then the layer calls in creation order.
  for (const auto& i : inputs) {
    if (index.contains(i.node().get())) {
      throw ConfigError("model '" + model + "': the same Input is listed twice");
    }
    index[i.node().get()] = nodes.size();
    RuntimeNode node;
    node.shape = node.declared = i.shape();
    nodes.push_back(std::move(node));
  }
  for (const auto& [id, graph_node] : reached) {
    if (!graph_node->layer) continue;
    if (graph_node->primary) {
      // Planned after its first output, with the call's other outputs.
      index[graph_node.get()] = index.at(graph_node->primary.get()) + graph_node->output_index;
      continue;
    }
    const std::size_t k = nodes.size();
    index[graph_node.get()] = k;
    RuntimeNode node;
    node.layer = graph_node->layer;
    node.shape = node.declared = graph_node->shape;
    for (const auto& in : graph_node->inputs)
      node.inputs.push_back(index.at(in.get()));
    const Layer& layer = *node.layer;
    if (layer.output_count() > 1 && layer.activity_regularizer()) {
      throw ConfigError("model '" + model + "': " + layer_label(layer) + " has " +
                        std::to_string(layer.output_count()) +
                        " outputs and an activity_regularizer, which loadstar does not combine");
    }
    nodes.push_back(std::move(node));
    // Every output of a call has a node, read or not: the layer writes them all.
    const std::vector<Shape> extra = layer.extra_output_shapes(layer.built_input_shapes());
    for (std::size_t i = 0; i < extra.size(); ++i) {
      RuntimeNode sibling;
      sibling.layer = graph_node->layer;
      sibling.shape = sibling.declared = extra[i];
      sibling.primary = k;
      sibling.output_index = i + 1;
      nodes[k].extras.push_back(nodes.size());
      nodes.push_back(std::move(sibling));
    }
  }
  // Layer names: Keras's snake_case class name, then _1, _2, ... unique in the model.
  std::vector<std::shared_ptr<Layer>> layers;
  std::set<const Layer*> seen;
  for (const auto& node : nodes) {
    if (node.layer && seen.insert(node.layer.get()).second) layers.push_back(node.layer);
  }
  std::set<std::string> used;
  for (const auto& layer : layers) {
    if (layer->name().empty()) continue;
    if (!used.insert(layer->name()).second) {
      throw ConfigError("model '" + model + "': the name '" + layer->name() +
                        "' is used by two layers; layer names must be unique");
    }
  }
  std::map<std::string, std::size_t> counts;
  for (const auto& layer : layers) {
    if (!layer->name().empty()) continue;
    const std::string base = to_snake_case(layer->class_name());
    std::string candidate = base;
    std::size_t& n = counts[base];
    while (used.contains(candidate))
      candidate = base + "_" + std::to_string(++n);
    used.insert(candidate);
    layer->set_name(candidate);
  }
  // Listed (and their weights ordered) as Keras lists them; named above in call order, as Keras
  // names layers when they are made.
  layers.clear();
  for (const GraphNode* node : keras_layer_order(inputs, outputs)) {
    if (node->layer) layers.push_back(node->layer);
  }
  std::vector<std::string> input_names;
  std::size_t unnamed = 0;
  for (const auto& i : inputs) {
    input_names.push_back(i.input_name().empty() ? "input_" + std::to_string(++unnamed)
                                                 : i.input_name());
  }
  std::vector<std::size_t> output_nodes;
  std::vector<std::string> output_names;
  for (const auto& o : outputs) {
    output_nodes.push_back(index.at(o.node().get()));
    std::string name = o.is_input() ? input_names[index.at(o.node().get())] : o.layer()->name();
    // Several outputs of one layer: `lstm`, `lstm_1`, ... (tf.keras's unique output names).
    std::string unique = name;
    for (std::size_t n = 1;
         std::find(output_names.begin(), output_names.end(), unique) != output_names.end(); ++n)
      unique = name + "_" + std::to_string(n);
    output_names.push_back(std::move(unique));
  }
  // A node's gradient is needed when its layer or a layer before it has trainable weights:
  // Dense right after Flatten after an input computes no gradient for its input.
  std::vector<bool> needed(nodes.size(), false);
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (!nodes[k].layer) continue;
    for (const auto& w : nodes[k].layer->weights())
      needed[k] = needed[k] || w.trainable;
    for (const std::size_t p : nodes[k].inputs)
      needed[k] = needed[k] || needed[p];
    if (nodes[k].primary != RuntimeNode::no_primary) needed[k] = needed[nodes[k].primary];
  }
  // Gradient plan: contributions in backward order are the losses, then the consumers in
  // reverse topological order; the first writes the producer's gradient, later ones add.
  std::vector<bool> written(nodes.size(), false);
  output_direct_.assign(outputs.size(), false);
  for (std::size_t o = 0; o < output_nodes.size(); ++o) {
    if (!written[output_nodes[o]]) output_direct_[o] = true;
    written[output_nodes[o]] = true;
  }
  for (std::size_t k = nodes.size(); k-- > 0;) {
    auto& node = nodes[k];
    node.targets.resize(node.inputs.size());
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      const std::size_t p = node.inputs[j];
      if (!nodes[p].layer || !needed[p]) {
        node.targets[j] = GradientTarget::none;
      } else if (!written[p]) {
        node.targets[j] = GradientTarget::direct;
        written[p] = true;
      } else {
        node.targets[j] = GradientTarget::accumulate;
      }
    }
    node.gradient_written = written[k];
    node.input_values.resize(node.inputs.size());
    node.input_gradients.resize(node.inputs.size());
    node.scratch_full.resize(node.inputs.size());
  }
  std::vector<std::string> node_names(nodes.size());
  for (std::size_t k = 0; k < nodes.size(); ++k)
    node_names[k] = nodes[k].layer ? nodes[k].layer->name() : input_names[k];
  // A layer that can write its gradients does so when a single node computes them; a shared
  // layer adds its calls' gradients into zeroed ones.
  std::unordered_map<const Layer*, std::size_t> backward_calls;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    if (nodes[k].runs() && needed[k]) ++backward_calls[nodes[k].layer.get()];
  }
  const auto writes = [&](const Layer& layer) {
    return layer.writes_gradients() && backward_calls[&layer] == 1;
  };
  plan.writes_gradients.assign(nodes.size(), false);
  for (std::size_t k = 0; k < nodes.size(); ++k)
    plan.writes_gradients[k] = nodes[k].runs() && needed[k] && writes(*nodes[k].layer);
  std::vector<Variable*> trainable;
  for (const auto& layer : layers) {
    for (auto& w : layer->weights()) {
      if (!w.trainable) continue;
      trainable.push_back(&w);
      if (!writes(*layer)) plan.zeroed.push_back(&w);
    }
  }
  plan.needs_backward = std::move(needed);
  plan.nodes = std::move(nodes);
  plan.layers = std::move(layers);
  plan.input_names = std::move(input_names);
  plan.output_nodes = std::move(output_nodes);
  plan.output_names = std::move(output_names);
  plan.node_names = std::move(node_names);
  plan.trainable = std::move(trainable);
  return plan;
}

}  // namespace loadstar::keras::detail
#endif
