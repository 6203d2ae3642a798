/// \file
/// The masks of a model's graph (Keras's `_keras_mask`): which node's output carries which mask,
/// planned once per graph from each layer's `MaskFlow`, the buffers that hold them, and the one
/// place a step computes them (model/steps.hpp).
///
/// A mask is made by a layer whose flow is `computes` (`Masking`, `Embedding(mask_zero=True)`)
/// and follows the graph through the layers that pass it; a merge of masked inputs makes a new
/// one. Each mask lives in a slot: a buffer `(batch, ...)` of 1 and 0, the shape of its node's
/// output without the last axis, shared by every node that carries it.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::detail {

/// A model's masks.
class MaskPlan {
 public:
  static constexpr std::size_t no_mask = std::numeric_limits<std::size_t>::max();

  /// Follows the masks through `nodes` (topological order). Warns once per layer call, naming it,
  /// where a mask stops at a layer that does not support masking (as Keras 3 warns; not when
  /// `quiet`), and throws `ConfigError` naming the layer and the mask's maker where a masked
  /// input reaches a layer whose flow is `refused`. The input nodes in `masked_inputs` carry a
  /// mask of their own, which the caller writes (`mask_of`) before a step: a model used as a
  /// layer gives its inner graph the mask of its input.
  LOADSTAR_DECL void plan(const std::string& model, std::span<const RuntimeNode> nodes,
                          std::span<const std::size_t> masked_inputs = {}, bool quiet = false);

  /// Whether the graph has any mask.
  bool empty() const noexcept { return slots_.empty(); }
  /// The slot of node `k`'s mask, or `no_mask`.
  std::size_t slot_of(std::size_t k) const noexcept {
    return k < node_slot_.size() ? node_slot_[k] : no_mask;
  }
  /// The current batch's mask of node `k` (an empty tensor without one).
  Tensor<float> mask_of(std::size_t k) const {
    const std::size_t slot = slot_of(k);
    return slot == no_mask ? Tensor<float>() : slots_[slot].view;
  }
  /// The node that made the mask of node `k` (an input node for a given mask); `no_mask` without
  /// one.
  std::size_t maker_node(std::size_t k) const noexcept {
    const std::size_t slot = slot_of(k);
    return slot == no_mask ? no_mask : slots_[slot].node;
  }
  /// The layer that made the mask of node `k` (`"embedding 'tokens'"`); empty without one.
  LOADSTAR_DECL std::string maker_of(std::span<const RuntimeNode> nodes, std::size_t k) const;

  /// Sizes every slot for `rows` samples of the nodes' current shapes (a model with axes of
  /// unknown length calls it for each batch's); returns whether a buffer was replaced, so that
  /// the views must be set again.
  LOADSTAR_DECL bool reserve(Backend& backend, std::span<const RuntimeNode> nodes,
                             std::size_t rows);
  /// Points the views at the first `rows` samples, and each node's input masks at them.
  LOADSTAR_DECL void set_rows(std::span<const RuntimeNode> nodes, std::size_t rows);

  /// The masks of node `k`'s inputs (empty tensors where an input has none), for its call's
  /// `CallContext::input_masks`.
  std::span<const Tensor<float>> inputs(std::size_t k) const noexcept {
    return k < node_inputs_.size() ? std::span<const Tensor<float>>(node_inputs_[k])
                                   : std::span<const Tensor<float>>();
  }

  /// After node `k`'s forward: computes the mask the node makes, if any (its layer's
  /// `compute_mask`, also for a join of masks, or the OR of its inputs' masks for a merge).
  LOADSTAR_DECL void after_forward(Backend& backend, std::span<const RuntimeNode> nodes,
                                   std::size_t k, const CallContext& ctx);

 private:
  struct Slot {
    std::size_t node;                  // the node that makes the mask
    MaskFlow flow;                     // computes, joins or any_of
    std::vector<std::size_t> sources;  // any_of: the slots combined
    Tensor<float> full, view;
  };
  std::vector<Slot> slots_;
  std::vector<std::size_t> node_slot_;
  std::vector<std::vector<Tensor<float>>> node_inputs_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
#include <algorithm>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/warnings.hpp"

namespace loadstar::keras::detail {

void MaskPlan::plan(const std::string& model, std::span<const RuntimeNode> nodes,
                    std::span<const std::size_t> masked_inputs, bool quiet) {
  slots_.clear();
  node_slot_.assign(nodes.size(), no_mask);
  node_inputs_.assign(nodes.size(), {});
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const RuntimeNode& node = nodes[k];
    if (!node.layer) {
      if (std::find(masked_inputs.begin(), masked_inputs.end(), k) != masked_inputs.end()) {
        node_slot_[k] = slots_.size();
        slots_.push_back({k, MaskFlow::computes, {}, {}, {}});
      }
      continue;
    }
    if (!node.runs()) {
      // A later output of a call: the first output's mask where the layer says so (both
      // directions of a Bidirectional with merge_mode None), else none (recurrent states).
      if (node.output_index < node.layer->masked_outputs())
        node_slot_[k] = node_slot_[node.primary];
      continue;
    }
    const MaskFlow flow = node.layer->mask_flow();
    if (flow == MaskFlow::computes) {
      node_slot_[k] = slots_.size();
      slots_.push_back({k, flow, {}, {}, {}});
      continue;
    }
    std::vector<std::size_t> masked;  // the slots of the masked inputs
    std::size_t first = 0;            // the first masked input
    for (const std::size_t p : node.inputs) {
      if (node_slot_[p] == no_mask) continue;
      if (masked.empty()) first = p;
      masked.push_back(node_slot_[p]);
    }
    if (masked.empty()) continue;
    switch (flow) {
      case MaskFlow::stops:
        if (quiet) break;
        warn("model '" + model + "': " + layer_label(*node.layer) +
             " was passed an input with a mask attached to it (made by " + maker_of(nodes, first) +
             "), but does not support masking, so the mask stops there: the layers after it do "
             "not see it (as Keras 3 does)");
        break;
      case MaskFlow::refused:
        throw ConfigError("model '" + model + "': " + layer_label(*node.layer) +
                          " takes an input with a mask attached to it (made by " +
                          maker_of(nodes, first) +
                          "), which loadstar does not apply in this layer; drop the mask first "
                          "(mask_zero=False, no Masking layer) or end it before this layer");
      case MaskFlow::ends:
        break;
      case MaskFlow::passes:
        node_slot_[k] = node_slot_[node.inputs[0]];
        break;
      case MaskFlow::any_of: {
        if (masked.size() < node.inputs.size()) break;  // an unmasked input: every step counts
        std::sort(masked.begin(), masked.end());
        masked.erase(std::unique(masked.begin(), masked.end()), masked.end());
        if (masked.size() == 1) {
          node_slot_[k] = masked.front();
        } else {
          node_slot_[k] = slots_.size();
          slots_.push_back({k, flow, masked, {}, {}});
        }
        break;
      }
      case MaskFlow::joins:
        node_slot_[k] = slots_.size();
        slots_.push_back({k, flow, {}, {}, {}});
        break;
      case MaskFlow::computes:
        break;
    }
  }
}

std::string MaskPlan::maker_of(std::span<const RuntimeNode> nodes, std::size_t k) const {
  const std::size_t slot = slot_of(k);
  if (slot == no_mask) return {};
  const auto& maker = nodes[slots_[slot].node].layer;
  return maker ? layer_label(*maker) : "the mask given to the model's input";
}

bool MaskPlan::reserve(Backend& backend, std::span<const RuntimeNode> nodes, std::size_t rows) {
  bool grown = false;
  for (auto& slot : slots_) {
    const std::size_t need =
        std::max<std::size_t>(rows * without_last_axis(nodes[slot.node].shape).elements(), 1);
    if (!slot.full.empty() && slot.full.size() >= need && slot.full.device() == backend.device())
      continue;
    slot.full = backend.allocate({need});
    grown = true;
  }
  return grown;
}

void MaskPlan::set_rows(std::span<const RuntimeNode> nodes, std::size_t rows) {
  for (auto& slot : slots_) {
    const Shape sample = without_last_axis(nodes[slot.node].shape);
    slot.view = slot.full.reshape({slot.full.size()})
                    .slice_rows(0, rows * sample.elements())
                    .reshape(sample.prepend(rows));
  }
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    auto& masks = node_inputs_[k];
    masks.assign(nodes[k].inputs.size(), Tensor<float>());
    for (std::size_t j = 0; j < masks.size(); ++j) {
      const std::size_t slot = node_slot_[nodes[k].inputs[j]];
      if (slot != no_mask) masks[j] = slots_[slot].view;
    }
  }
}

void MaskPlan::after_forward(Backend& backend, std::span<const RuntimeNode> nodes, std::size_t k,
                             const CallContext& ctx) {
  const std::size_t s = node_slot_[k];
  if (s == no_mask || slots_[s].node != k) return;
  Slot& slot = slots_[s];
  const RuntimeNode& node = nodes[k];
  if (slot.flow == MaskFlow::computes) {
    node.layer->compute_mask(node.input_values, slot.view, ctx);
    return;
  }
  if (slot.flow == MaskFlow::joins) {
    CallContext joined = ctx;
    joined.input_masks = inputs(k);
    node.layer->compute_mask(node.input_values, slot.view, joined);
    return;
  }
  std::vector<Tensor<float>> tensors{slot.view};
  for (const std::size_t source : slot.sources) {
    if (slots_[source].view.size() != slot.view.size()) {
      throw ShapeError(layer_label(*node.layer) + ": merges masks of shapes " +
                       slots_[source].view.shape().str() + " and " + slot.view.shape().str() +
                       ", which must be the same");
    }
    tensors.push_back(slots_[source].view);
  }
  backend.host_kernel(tensors, [](std::span<const Tensor<float>> t) {
    float* out = t[0].data();
    std::fill(out, out + t[0].size(), 0.0F);
    for (std::size_t i = 1; i < t.size(); ++i) {
      const float* in = t[i].data();
      for (std::size_t e = 0; e < t[0].size(); ++e)
        out[e] = std::max(out[e], in[e]);
    }
  });
}

}  // namespace loadstar::keras::detail
#endif
