/// \file
/// `Model`'s step internals: forward, losses, backward and metric updates of one batch, defined out
/// of the class (Taskflow style) so that model.hpp keeps the declaration and each concern has its
/// own file. Included by model.hpp; do not include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::forward(bool training, std::uint64_t seed) {
  CallContext ctx{backend(), training, seed,
                  optimizer_ ? static_cast<std::uint64_t>(optimizer_->iterations()) : 0};
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    auto& node = nodes_[k];
    if (!node.layer) continue;
    ctx.fused_output =
        training && fused_output_[k] != no_fusion ? &relu_fusions_[fused_output_[k]] : nullptr;
    node.layer->forward(node.input_values, node.value, ctx);
  }
}

LOADSTAR_DECL Deferred<double> Model::compute_losses(bool gradients) {
  output_losses_.resize(output_nodes_.size());
  const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
  bool known = true;
  for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
    auto& node = nodes_[output_nodes_[o]];
    Tensor<float> gradient;
    if (gradients && node.layer) {
      gradient = output_direct_[o] ? node.gradient : loss_scratch_full_[o].slice_rows(0, rows_);
    }
    output_losses_[o] =
        losses_[o]->compute_deferred(backend(), targets_[o], outputs_[o], weights, gradient);
    known = known && output_losses_[o].ready();
    const auto weight = static_cast<float>(loss_weights_[o]);
    if (gradients && node.layer) {
      if (weight != 1.0F) backend().scale(gradient, weight);
      if (!output_direct_[o]) backend().axpy(1.0F, gradient, node.gradient);
    }
  }
  const auto sum = [](std::span<const Deferred<double>> values, std::span<const double> weights) {
    double total = 0.0;
    for (std::size_t o = 0; o < values.size(); ++o)
      total += weights[o] * values[o].get();
    return total;
  };
  if (known) return sum(output_losses_, loss_weights_);
  // A device may still be computing a loss: the total is added when it is read.
  return Deferred<double>(std::function<double()>(
      [sum, values = output_losses_, weights = loss_weights_] { return sum(values, weights); }));
}

LOADSTAR_DECL void Model::backward(std::uint64_t seed) {
  CallContext ctx{backend(), true, seed, static_cast<std::uint64_t>(optimizer_->iterations())};
  for (std::size_t k = nodes_.size(); k-- > 0;) {
    auto& node = nodes_[k];
    if (!node.layer || !needs_backward_[k]) continue;
    ctx.accumulate_gradients = !writes_gradients_[k];
    ctx.fused_output = fused_output_[k] != no_fusion ? &relu_fusions_[fused_output_[k]] : nullptr;
    ctx.fused_input = fused_input_[k] != no_fusion ? &relu_fusions_[fused_input_[k]] : nullptr;
    node.layer->backward(node.input_values, node.value, node.gradient, node.input_gradients, ctx);
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (node.targets[j] == detail::GradientTarget::accumulate) {
        backend().axpy(1.0F, node.input_gradients[j], nodes_[node.inputs[j]].gradient);
      }
    }
  }
}

LOADSTAR_DECL void Model::update_metrics(RunningMetrics& running, const Deferred<double>& total) {
  if (!running.created()) create_metrics();
  const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
  running.update(backend(), total, output_losses_, rows_, targets_, outputs_, weights);
}

LOADSTAR_DECL std::uint64_t Model::shuffle_seed(const FitOptions& options) {
  return options.seed ? *options.seed : detail::global_seed();
}

}  // namespace loadstar::keras
