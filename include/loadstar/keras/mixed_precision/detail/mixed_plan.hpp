/// \file
/// Mixed precision in a model's step: which values are rounded to a half-precision compute dtype
/// and where, planned from the layers' dtype policies and applied at the layer boundaries
/// (keras/model/steps.hpp) through the backend's one rounding kernel, `Backend::round_to`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/mixed_precision/policy.hpp"

namespace loadstar::keras::detail {

/// Where a step rounds, as Keras holds the values of a layer with a half-precision compute dtype
/// (keras/src/layers/layer.py `__call__` and dtype_policies/dtype_policy.py `convert_input`):
///
/// - its floating inputs are cast to the compute dtype (not for layers with `autocast = False`:
///   `Embedding`, `LayerNormalization`, `GroupNormalization`);
/// - its variables are read cast to the compute dtype (not `BatchNormalization`'s, whose
///   variables have `autocast=False`, nor those of the layers above); the float32 values are kept
///   and put back before the optimizer updates them, so variables stay float32;
/// - its output is in the compute dtype, and so is the gradient flowing into it, and the
///   gradients of its variables before they are cast back to float32.
///
/// The arithmetic in between is float32's, as a GPU's half-precision GEMM accumulates in float32.
/// Regularization penalties are computed from the weights as the layers use them.
/// Under `"float16"` / `"bfloat16"` policies the variables themselves are rounded after each
/// update. A value rounded once serves every layer that reads it, so a value read by layers that
/// would cast it differently is refused.
class MixedPrecisionPlan {
 public:
  /// Plans (again, when the layers or their policies changed since) for the model's nodes;
  /// allocates nothing when nothing changed. Throws `ConfigError` naming the model (`model_name`)
  /// and the layers for a value that layers of different compute dtypes read.
  LOADSTAR_DECL void update(Backend& backend, std::span<const std::shared_ptr<Layer>> layers,
                            std::span<const RuntimeNode> nodes, const std::string& model_name);

  /// Whether anything is rounded.
  bool active() const noexcept { return active_; }

  /// Rounds the input nodes read by half-precision layers, and the weights as the layers use
  /// them (keeping the float32 values for `restore_weights`).
  LOADSTAR_DECL void round_inputs_and_weights(Backend& backend, std::span<const RuntimeNode> nodes);
  /// Puts the float32 values of the weights back (nothing when none were rounded).
  LOADSTAR_DECL void restore_weights(Backend& backend) noexcept;
  /// Rounds the output of node `k` after its layer's forward.
  void round_value(Backend& backend, std::size_t k, const RuntimeNode& node) const {
    if (active_ && value_dtype_[k] != DType::float32) backend.round_to(node.value, value_dtype_[k]);
  }
  /// Rounds the gradient flowing into node `k` before its layer's backward.
  void round_gradient(Backend& backend, std::size_t k, const RuntimeNode& node) const {
    if (active_ && value_dtype_[k] != DType::float32 && !node.gradient.empty())
      backend.round_to(node.gradient, value_dtype_[k]);
  }
  /// Rounds the gradients of the weights of node `k`'s layer after its backward.
  LOADSTAR_DECL void round_weight_gradients(Backend& backend, std::size_t k,
                                            const RuntimeNode& node) const;
  /// The dtype node `k`'s layer multiplies in (`Backend::set_product_dtype`): its compute dtype
  /// where it casts its inputs and variables to it, else `float32`.
  DType product_dtype(std::size_t k) const noexcept {
    return active_ ? weight_dtype_[k] : DType::float32;
  }
  /// Rounds the variables of the layers whose variable dtype is half precision (after an update).
  LOADSTAR_DECL void round_variables(Backend& backend) const;

 private:
  struct Rounded {
    Layer* layer;
    DType dtype;
    bool keep_float32;  // a mixed policy: the float32 values are kept and restored
    std::vector<Tensor<float>> masters;
  };

  std::vector<const Layer*> signature_layers_;
  std::vector<mixed_precision::Policy> signature_policies_;
  std::vector<DType> value_dtype_;   // per node: the dtype its value (and gradient) is held in
  std::vector<DType> weight_dtype_;  // per node: the dtype its layer's weights are used in
  std::vector<std::size_t> rounded_inputs_;
  std::vector<Rounded> weights_;
  bool active_ = false;
  bool weights_rounded_ = false;
};

/// Keras's `autocast`: whether a layer of class `class_name` casts its inputs and its variables
/// to its compute dtype (`Embedding`, `LayerNormalization` and `GroupNormalization` do neither).
inline bool autocasts(const std::string& class_name) {
  return class_name != "Embedding" && class_name != "LayerNormalization" &&
         class_name != "GroupNormalization";
}

/// Whether a layer of class `class_name` uses its variables cast to its compute dtype
/// (`BatchNormalization`'s variables are not autocast).
inline bool casts_variables(const std::string& class_name) {
  return autocasts(class_name) && class_name != "BatchNormalization";
}

/// Restores the weights when a step leaves, normally or by an exception.
class RestoreWeights {
 public:
  RestoreWeights(MixedPrecisionPlan& plan, Backend& backend) : plan_(plan), backend_(backend) {}
  RestoreWeights(const RestoreWeights&) = delete;
  RestoreWeights& operator=(const RestoreWeights&) = delete;
  ~RestoreWeights() { plan_.restore_weights(backend_); }

 private:
  MixedPrecisionPlan& plan_;
  Backend& backend_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void MixedPrecisionPlan::update(Backend& backend, std::span<const std::shared_ptr<Layer>> layers,
                                std::span<const RuntimeNode> nodes, const std::string& model_name) {
  bool same = signature_layers_.size() == nodes.size() + layers.size();
  for (std::size_t k = 0; same && k < nodes.size(); ++k) {
    const Layer* layer = nodes[k].layer.get();
    same = signature_layers_[k] == layer &&
           (layer == nullptr || signature_policies_[k] == layer->dtype_policy());
  }
  for (std::size_t i = 0; same && i < layers.size(); ++i) {
    same = signature_layers_[nodes.size() + i] == layers[i].get() &&
           signature_policies_[nodes.size() + i] == layers[i]->dtype_policy();
  }
  if (same) return;
  restore_weights(backend);
  signature_layers_.clear();
  signature_policies_.clear();
  for (const auto& node : nodes) {
    signature_layers_.push_back(node.layer.get());
    signature_policies_.push_back(node.layer ? node.layer->dtype_policy()
                                             : mixed_precision::Policy());
  }
  for (const auto& layer : layers) {
    signature_layers_.push_back(layer.get());
    signature_policies_.push_back(layer->dtype_policy());
  }
  const std::size_t n = nodes.size();
  value_dtype_.assign(n, DType::float32);
  weight_dtype_.assign(n, DType::float32);
  rounded_inputs_.clear();
  weights_.clear();
  active_ = false;
  const auto compute = [](const Layer& layer) { return layer.dtype_policy().compute_dtype(); };
  const auto label = [&](std::size_t k) {
    return nodes[k].layer ? "layer '" + nodes[k].layer->name() + "'" : "input " + std::to_string(k);
  };
  // What each node's readers cast it to: float32 for a reader that keeps it as it is.
  for (std::size_t k = 0; k < n; ++k) {
    const DType own = nodes[k].layer ? compute(*nodes[k].layer) : DType::float32;
    std::vector<std::pair<std::size_t, DType>> readers;
    for (std::size_t j = 0; j < n; ++j) {
      for (std::size_t input : nodes[j].inputs) {
        if (input != k) continue;
        const Layer& reader = *nodes[j].layer;
        const bool casts = autocasts(reader.class_name()) && compute(reader) != DType::float32;
        readers.emplace_back(j, casts ? compute(reader) : DType::float32);
      }
    }
    const auto refuse = [&](DType first, std::size_t j, DType second) {
      throw ConfigError("model '" + model_name + "': the output of " + label(k) +
                        " is read by layers that cast it to different dtypes (" +
                        std::string(dtype_name(first)) + " and " + std::string(dtype_name(second)) +
                        " in layer '" + nodes[j].layer->name() +
                        "'); loadstar rounds a value once: give these layers one policy");
    };
    DType held = own;
    for (const auto& [j, wanted] : readers) {
      if (wanted == DType::float32 || wanted == held) continue;
      if (held != DType::float32) refuse(held, j, wanted);
      held = wanted;
    }
    if (held != own) {
      // A float32 value cast by its readers: every reader must cast it alike.
      for (const auto& [j, wanted] : readers)
        if (wanted != held) refuse(held, j, wanted);
      if (!nodes[k].layer) rounded_inputs_.push_back(k);
    }
    value_dtype_[k] = held;
    if (nodes[k].layer && casts_variables(nodes[k].layer->class_name()))
      weight_dtype_[k] = compute(*nodes[k].layer);
    if (held != DType::float32 || weight_dtype_[k] != DType::float32) active_ = true;
  }
  for (const auto& layer : layers) {
    const mixed_precision::Policy& policy = layer->dtype_policy();
    const bool used_half = casts_variables(layer->class_name()) && policy.is_half();
    if (!used_half && policy.variable_dtype() == DType::float32) continue;
    const DType dtype = policy.variable_dtype() != DType::float32 ? policy.variable_dtype()
                                                                  : policy.compute_dtype();
    weights_.push_back({layer.get(), dtype, policy.variable_dtype() == DType::float32, {}});
    active_ = true;
  }
}

void MixedPrecisionPlan::round_inputs_and_weights(Backend& backend,
                                                  std::span<const RuntimeNode> nodes) {
  if (!active_) return;
  for (std::size_t k : rounded_inputs_)
    backend.round_to(nodes[k].value, value_dtype_[k]);
  for (auto& rounded : weights_) {
    auto weights = rounded.layer->weights();
    if (rounded.keep_float32) rounded.masters.resize(weights.size());
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const Tensor<float>& value = weights[i].value;
      if (value.empty()) continue;
      if (rounded.keep_float32) {
        Tensor<float>& master = rounded.masters[i];
        if (master.shape() != value.shape() || master.device() != value.device())
          master = backend.allocate(value.shape());
        backend.copy(value, master);
      }
      backend.round_to(value, rounded.dtype);
    }
  }
  weights_rounded_ = true;
}

void MixedPrecisionPlan::restore_weights(Backend& backend) noexcept {
  if (!weights_rounded_) return;
  weights_rounded_ = false;
  try {
    for (auto& rounded : weights_) {
      if (!rounded.keep_float32) continue;
      auto weights = rounded.layer->weights();
      for (std::size_t i = 0; i < weights.size() && i < rounded.masters.size(); ++i) {
        if (!weights[i].value.empty() && !rounded.masters[i].empty())
          backend.copy(rounded.masters[i], weights[i].value);
      }
    }
  } catch (...) {
    // A failing device reports its error at the next call.
  }
}

void MixedPrecisionPlan::round_weight_gradients(Backend& backend, std::size_t k,
                                                const RuntimeNode& node) const {
  if (!active_ || weight_dtype_[k] == DType::float32) return;
  for (const Variable& w : node.layer->weights()) {
    if (w.trainable && !w.gradient.empty()) backend.round_to(w.gradient, weight_dtype_[k]);
  }
}

void MixedPrecisionPlan::round_variables(Backend& backend) const {
  for (const auto& rounded : weights_) {
    if (rounded.keep_float32) continue;
    for (const Variable& w : rounded.layer->weights())
      if (!w.value.empty()) backend.round_to(w.value, rounded.dtype);
  }
}

}  // namespace loadstar::keras::detail
#endif
