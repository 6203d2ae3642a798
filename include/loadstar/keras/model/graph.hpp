/// \file
/// `Model`'s graph: the planned graph installed (`set_graph`), `get_layer`, and the checks that the
/// model is built and compiled, defined out of the class (Taskflow style) so that model.hpp keeps
/// the declaration and each concern has its own file. Included by model.hpp; do not include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::plan(const std::vector<KerasTensor>& inputs,
                               const std::vector<KerasTensor>& outputs) {
  detail::GraphPlan plan = detail::plan_graph(name_, inputs, outputs);
  needs_backward_ = std::move(plan.needs_backward);
  writes_gradients_ = std::move(plan.writes_gradients);
  nodes_ = std::move(plan.nodes);
  layers_ = std::move(plan.layers);
  input_names_ = std::move(plan.input_names);
  output_nodes_ = std::move(plan.output_nodes);
  output_names_ = std::move(plan.output_names);
  node_names_ = std::move(plan.node_names);
  trainable_ = std::move(plan.trainable);
  zeroed_ = std::move(plan.zeroed);
  output_direct_ = std::move(plan.output_direct);
  outputs_.assign(output_nodes_.size(), {});
  targets_.assign(output_nodes_.size(), {});
  targets_full_.assign(output_nodes_.size(), {});
  loss_scratch_full_.assign(output_nodes_.size(), {});
  unknown_axes_ = std::any_of(nodes_.begin(), nodes_.end(), [](const detail::RuntimeNode& node) {
    return detail::has_unknown_axis(node.declared);
  });
  bound_.clear();
  bound_key_ = 0;
  relu_fusions_.plan(nodes_, output_nodes_, writes_gradients_);
  penalties_.plan(layers_, nodes_);
  masks_.plan(name_, nodes_);
}

LOADSTAR_DECL bool Model::is_chain() const {
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    if (nodes_[k].inputs.size() > 1 || !nodes_[k].extras.empty()) return false;
    if (nodes_[k].layer && nodes_[k].inputs.front() + 1 != k) return false;
  }
  return input_names_.size() == 1 && output_nodes_.size() == 1 &&
         output_nodes_.front() + 1 == nodes_.size();
}

LOADSTAR_DECL std::string Model::grouped(std::size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

LOADSTAR_DECL void Model::require_compiled(std::string_view what) const {
  if (!compiled_) {
    throw ConfigError("model '" + name_ + "': must be compiled before " + std::string(what) +
                      "; call compile(optimizer, loss) first");
  }
}

LOADSTAR_DECL void Model::require_built(std::string_view what) const {
  if (!built()) {
    throw ConfigError("model '" + name_ + "': has not been built yet, so " + std::string(what) +
                      " cannot run; give it an Input first or call fit with data");
  }
}

LOADSTAR_DECL std::shared_ptr<Layer> Model::get_layer(std::string_view name) const {
  for (const auto& layer : layers_) {
    if (layer->name() == name) return layer;
  }
  throw ConfigError("model '" + name_ + "': no layer named '" + std::string(name) + "'");
}

LOADSTAR_DECL void Model::set_graph(std::vector<KerasTensor> inputs,
                                    std::vector<KerasTensor> outputs) {
  plan(inputs, outputs);
  graph_inputs_ = std::move(inputs);
  graph_outputs_ = std::move(outputs);
  capacity_ = 0;
  rows_ = 0;
  training_ = {};
  evaluation_ = {};
  if (compiled_) resolve_losses();
}

}  // namespace loadstar::keras
