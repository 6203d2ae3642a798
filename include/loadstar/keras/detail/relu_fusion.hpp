/// \file
/// The training step's fused ReLU gradients: which pairs of layers carry one layer's ReLU
/// gradient through the next layer's backward (`ReluFusionPlan`), and what each pair shares
/// between its calls (`ReluGradientFusion`). Internal to the model and the built-in layers.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/fusion_role.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// A layer with a ReLU whose output only the next layer takes, its ReLU gradient carried by that
/// layer's backward where the backend fuses them. Two kinds (`FusionRole`):
/// - a `Dense` layer with a ReLU and a bias before a `Dense` layer (`masked_relu` before
///   `through_masked_relu`): the ReLU layer's forward records a mask
///   (`Backend::dense_forward_relu_mask`), and the next layer's backward writes the ReLU layer's
///   pre-activation and bias gradients (`Backend::dense_input_gradient_relu`);
/// - a convolution with a ReLU before max pooling (`relu_output` before `through_relu_output`,
///   `from_output`): the pooling's backward reads the ReLU from its own input, the convolution's
///   output, and writes the pre-activation gradient (`Backend::max_pool_backward_relu`).
struct ReluGradientFusion {
  /// The second kind: the next layer applies the ReLU from the ReLU layer's output.
  bool from_output = false;
  /// The backend's record of this step's ReLU (the first kind), made and reused by the backend.
  std::unique_ptr<Backend::ReluMask> mask;
  /// The ReLU layer's bias gradient, written by the next layer's backward.
  Tensor<float> bias_gradient;
  /// This step's forward wrote `mask`.
  bool mask_written = false;
  /// The next layer's backward wrote the ReLU layer's pre-activation gradient (into its output
  /// gradient), and for the first kind `bias_gradient`.
  bool gradient_written = false;
};

/// The fusions one call takes part in (`CallContext::relu_fusion`): the one whose ReLU layer it
/// is (`output`), and in a backward the one whose ReLU layer's output is its input (`input`).
struct ReluFusionCall {
  ReluGradientFusion* output = nullptr;
  ReluGradientFusion* input = nullptr;
};

/// The fusion whose ReLU layer `ctx`'s call is, or null.
inline ReluGradientFusion* fused_output(const CallContext& ctx) noexcept {
  return ctx.relu_fusion != nullptr ? ctx.relu_fusion->output : nullptr;
}
/// In a backward, the fusion whose ReLU layer's output is `ctx`'s call's input, or null.
inline ReluGradientFusion* fused_input(const CallContext& ctx) noexcept {
  return ctx.relu_fusion != nullptr ? ctx.relu_fusion->input : nullptr;
}

/// A model's `ReluGradientFusion` pairs and, per node, the pair it is the ReLU layer of or the
/// next layer of.
class ReluFusionPlan {
 public:
  /// Finds the pairs: a node whose one input is the output of a node that writes its gradients
  /// (`writes_gradients`) and has no other consumer and no loss, where the first layer is
  /// `through_masked_relu` and the second `masked_relu`, or the first `through_relu_output` and
  /// the second `relu_output`.
  LOADSTAR_DECL void plan(std::span<const RuntimeNode> nodes,
                          std::span<const std::size_t> output_nodes,
                          const std::vector<bool>& writes_gradients);

  /// The fusions of node `k`'s forward in a training step (its ReLU layer's only).
  ReluFusionCall forward(std::size_t k) noexcept { return {pair(output_, k), nullptr}; }
  /// The fusions of node `k`'s backward.
  ReluFusionCall backward(std::size_t k) noexcept { return {pair(output_, k), pair(input_, k)}; }

 private:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);

  ReluGradientFusion* pair(const std::vector<std::size_t>& of, std::size_t k) noexcept {
    return of[k] != none ? &fusions_[of[k]] : nullptr;
  }

  std::vector<ReluGradientFusion> fusions_;
  std::vector<std::size_t> output_, input_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void ReluFusionPlan::plan(std::span<const RuntimeNode> nodes,
                          std::span<const std::size_t> output_nodes,
                          const std::vector<bool>& writes_gradients) {
  fusions_.clear();
  output_.assign(nodes.size(), none);
  input_.assign(nodes.size(), none);
  std::vector<std::size_t> consumers(nodes.size(), 0);
  for (const auto& node : nodes)
    for (const std::size_t p : node.inputs)
      ++consumers[p];
  for (const std::size_t o : output_nodes)
    ++consumers[o];  // its loss
  for (std::size_t k = 0; k < nodes.size(); ++k)
    if (nodes[k].layer && nodes[k].layer->activity_regularizer()) ++consumers[k];  // its penalty
  std::vector<bool> from_output;
  for (std::size_t k = 0; k < nodes.size(); ++k) {
    const auto& node = nodes[k];
    if (!node.layer || node.inputs.size() != 1) continue;
    const std::size_t p = node.inputs[0];
    const auto& producer = nodes[p];
    if (!producer.layer || consumers[p] != 1 || node.targets[0] != GradientTarget::direct ||
        !writes_gradients[p])
      continue;
    const FusionRole consumer_role = node.layer->fusion_role();
    const FusionRole producer_role = producer.layer->fusion_role();
    const bool masked = has_role(consumer_role, FusionRole::through_masked_relu) &&
                        has_role(producer_role, FusionRole::masked_relu);
    const bool read = has_role(consumer_role, FusionRole::through_relu_output) &&
                      has_role(producer_role, FusionRole::relu_output);
    if (!masked && !read) continue;
    output_[p] = input_[k] = from_output.size();
    from_output.push_back(!masked);
  }
  fusions_.resize(from_output.size());  // sized once: the calls hold pointers into it
  for (std::size_t pair = 0; pair < from_output.size(); ++pair)
    fusions_[pair].from_output = from_output[pair];
}

}  // namespace loadstar::keras::detail
#endif
