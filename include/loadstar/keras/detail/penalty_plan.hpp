/// \file
/// The training step's regularization penalties and weight constraints: which weights and layer
/// outputs carry a penalty, which variables a constraint, planned once per graph, and the one
/// place both backends add the penalties to the loss and their gradients (model/steps.hpp).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/constraints/constraint.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/regularizers/regularizer.hpp"

namespace loadstar::keras::detail {

/// A model's penalties (Keras's `model.losses`: each weight regularizer's penalty of its
/// variable, and each activity regularizer's penalty of its layer call's output divided by the
/// batch size) and constraints (Keras 3's `optimizer.apply` projects each trainable variable
/// with a constraint after the update).
class PenaltyPlan {
 public:
  /// Collects the regularizers and constraints of `layers` (each once, shared layers included)
  /// and the activity regularizers of the calls in `nodes`. Throws `ConfigError` naming the
  /// layer for a regularizer or constraint of a weight the layer does not have, or one that does
  /// not apply to the weight's shape.
  LOADSTAR_DECL void plan(std::span<const std::shared_ptr<Layer>> layers,
                          std::span<const RuntimeNode> nodes);

  /// Whether the call of node `k` has an activity regularizer (its gradient then has a further
  /// term, so the backward of its layer must read the node's gradient).
  bool has_activity(std::size_t k) const noexcept {
    return k < activity_.size() && activity_[k] != nullptr;
  }

  /// The sum of the penalties of the batch in `nodes` (of `rows` rows).
  LOADSTAR_DECL double total(Backend& backend, std::span<const RuntimeNode> nodes,
                             std::size_t rows) const;
  /// Adds the gradient of node `k`'s activity penalty (divided by `rows`) to its gradient.
  LOADSTAR_DECL void add_activity_gradient(Backend& backend, const RuntimeNode& node, std::size_t k,
                                           std::size_t rows) const;
  /// Adds the gradients of the weight penalties to the trainable variables' gradients.
  LOADSTAR_DECL void add_weight_gradients(Backend& backend) const;
  /// Projects every trainable variable that has a constraint.
  LOADSTAR_DECL void apply_constraints(Backend& backend) const;

 private:
  struct Penalised {
    Variable* variable;
    std::shared_ptr<Regularizer> regularizer;
  };
  struct Constrained {
    Variable* variable;
    std::shared_ptr<Constraint> constraint;
  };
  std::vector<Penalised> weights_;
  std::vector<Constrained> constraints_;
  std::vector<std::shared_ptr<Regularizer>> activity_;  // per node, null where none
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
#include "loadstar/keras/detail/graph.hpp"

namespace loadstar::keras::detail {

void PenaltyPlan::plan(std::span<const std::shared_ptr<Layer>> layers,
                       std::span<const RuntimeNode> nodes) {
  weights_.clear();
  constraints_.clear();
  activity_.assign(nodes.size(), nullptr);
  for (const auto& layer : layers) {
    const std::string label = layer_label(*layer);
    for (const auto& options : layer->weight_options()) {
      if (!options.regularizer && !options.constraint) continue;
      Variable* variable = nullptr;
      std::string names;
      for (auto& w : layer->weights()) {
        if (w.name == options.weight) variable = &w;
        names += (names.empty() ? "'" : ", '") + w.name + "'";
      }
      const std::string what = options.regularizer ? "regularizer" : "constraint";
      if (variable == nullptr) {
        throw ConfigError(label + ": has a " + what + " for weight '" + options.weight +
                          "' but its weights are " + (names.empty() ? "none" : names));
      }
      if (options.regularizer) {
        options.regularizer->check_shape(variable->value.shape(),
                                         label + ": " + options.weight + "_regularizer");
        weights_.push_back({variable, options.regularizer});
      }
      if (options.constraint) {
        options.constraint->check_shape(variable->value.shape(),
                                        label + ": " + options.weight + "_constraint");
        constraints_.push_back({variable, options.constraint});
      }
    }
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const auto& layer = nodes[k].layer;
    if (!layer || !layer->activity_regularizer()) continue;
    std::vector<std::size_t> dims{2};  // a batch of two rows: the activity has a batch axis
    dims.insert(dims.end(), nodes[k].shape.begin(), nodes[k].shape.end());
    layer->activity_regularizer()->check_shape(Shape(dims), to_snake_case(layer->class_name()) +
                                                                " layer '" + layer->name() +
                                                                "': activity_regularizer");
    activity_[k] = layer->activity_regularizer();
  }
}

double PenaltyPlan::total(Backend& backend, std::span<const RuntimeNode> nodes,
                          std::size_t rows) const {
  double sum = 0.0;
  for (const auto& w : weights_)
    sum += w.regularizer->penalty_on(backend, w.variable->value);
  // Keras 3 divides an activity penalty by the batch size (divide_no_nan: 0 for no rows).
  for (std::size_t k = 0; k < activity_.size() && rows > 0; ++k)
    if (activity_[k]) sum += activity_[k]->penalty_on(backend, nodes[k].value) / double(rows);
  return sum;
}

void PenaltyPlan::add_activity_gradient(Backend& backend, const RuntimeNode& node, std::size_t k,
                                        std::size_t rows) const {
  if (!has_activity(k) || rows == 0 || node.gradient.empty()) return;
  activity_[k]->add_gradient_on(backend, node.value, 1.0 / double(rows), node.gradient);
}

void PenaltyPlan::add_weight_gradients(Backend& backend) const {
  for (const auto& w : weights_) {
    if (!w.variable->trainable || w.variable->gradient.empty()) continue;
    w.regularizer->add_gradient_on(backend, w.variable->value, 1.0, w.variable->gradient);
  }
}

void PenaltyPlan::apply_constraints(Backend& backend) const {
  for (const auto& c : constraints_)
    if (c.variable->trainable) c.constraint->apply_on(backend, c.variable->value);
}

}  // namespace loadstar::keras::detail
#endif
