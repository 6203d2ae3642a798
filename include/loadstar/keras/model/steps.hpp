/// \file
/// `Model`'s steps: `train_step`, `test_step`, `predict_step` and `fit` on a `DataIterator`, and
/// their internals (forward, losses, backward and metric updates of one batch), defined out of the
/// class (Taskflow style) so that model.hpp keeps the declaration and each concern has its
/// own file. Included by model.hpp; do not include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::forward(bool training, std::uint64_t seed) {
  detail::ReluFusionCall fusion;
  CallContext ctx{backend(), training, seed,
                  optimizer_ ? static_cast<std::uint64_t>(optimizer_->iterations()) : 0};
  if (training) ctx.relu_fusion = &fusion;
  deferred_checks_.clear();
  ctx.deferred_checks = &deferred_checks_;
  mixed_.update(backend(), layers_, nodes_, name_);
  mixed_.round_inputs_and_weights(backend(), nodes_);
  detail::ProductDtypeScope products(backend());
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    auto& node = nodes_[k];
    if (!node.layer) continue;
    if (!node.runs()) {
      // A later output of a call, which its first output's node computed.
      mixed_.round_value(backend(), k, node);
      continue;
    }
    fusion = relu_fusions_.forward(k);
    ctx.input_masks =
        node.layer->reads_masks() ? masks_.inputs(k) : std::span<const Tensor<float>>();
    ctx.extra_outputs = node.extra_values;
    products.set(mixed_.product_dtype(k));
    node.layer->forward(node.input_values, node.value, ctx);
    if (!masks_.empty()) masks_.after_forward(backend(), nodes_, k, ctx);
    mixed_.round_value(backend(), k, node);
  }
}

LOADSTAR_DECL void Model::weigh_masked_outputs() {
  const std::size_t n = output_nodes_.size();
  mask_loss_weights_.resize(n);
  mask_weights_.resize(n);
  masked_sample_weights_.resize(n);
  mask_weights_full_.resize(3 * n);
  for (std::size_t o = 0; o < n; ++o) {
    const Tensor<float> mask = masks_.mask_of(output_nodes_[o]);
    if (mask.empty()) {
      mask_loss_weights_[o] = mask_weights_[o] = masked_sample_weights_[o] = Tensor<float>();
      continue;
    }
    // Buffers of the most elements so far, viewed in this batch's shape: a step allocates
    // nothing once the longest batch was seen.
    Tensor<float>* views[] = {&mask_loss_weights_[o], &mask_weights_[o],
                              &masked_sample_weights_[o]};
    for (std::size_t i = 0; i < 3; ++i) {
      Tensor<float>& full = mask_weights_full_[3 * o + i];
      if (full.size() < mask.size() || full.device() != mask.device())
        full = backend().allocate({mask.size()});
      *views[i] = full.slice_rows(0, mask.size()).reshape(mask.shape());
    }
    // Keras 3's apply_mask: a loss reduced over the batch (sum_over_batch_size) weighs each
    // unmasked value total / valid, so that it becomes the mean of those values; `sum` and `none`,
    // and the metrics, weigh it 1. Sample weights multiply in, per row.
    const bool mean = losses_[o]->reduction() == Reduction::sum_over_batch_size;
    const bool weighted = has_weights_;
    const Tensor<float> tensors[] = {mask, weighted ? weights_ : Tensor<float>(),
                                     mask_loss_weights_[o], mask_weights_[o],
                                     masked_sample_weights_[o]};
    backend().host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
      const std::size_t total = t[0].size(), per_row = total / t[0].rows();
      double valid = 0;
      for (std::size_t i = 0; i < total; ++i)
        valid += t[0].data()[i] != 0.0F ? 1.0 : 0.0;
      const double scale = !mean ? 1.0 : valid == 0 ? 0.0 : static_cast<double>(total) / valid;
      for (std::size_t i = 0; i < total; ++i) {
        const float m = t[0].data()[i] != 0.0F ? 1.0F : 0.0F;
        const float w = weighted ? t[1].data()[i / per_row] : 1.0F;
        t[2].data()[i] = static_cast<float>(m * scale) * w;
        t[3].data()[i] = m;
        t[4].data()[i] = m * w;
      }
    });
  }
}

LOADSTAR_DECL Deferred<double> Model::compute_losses(bool gradients) {
  output_losses_.resize(output_nodes_.size());
  const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
  if (!masks_.empty()) weigh_masked_outputs();
  bool known = true;
  for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
    auto& node = nodes_[output_nodes_[o]];
    Tensor<float> gradient;
    if (gradients && node.layer) {
      gradient = output_direct_[o] ? node.gradient : loss_scratch_full_[o].slice_rows(0, rows_);
    }
    const bool masked = o < mask_loss_weights_.size() && !mask_loss_weights_[o].empty();
    output_losses_[o] = losses_[o]->compute_deferred(
        backend(), targets_[o], outputs_[o], masked ? &mask_loss_weights_[o] : weights, gradient);
    if (!deferred_checks_.empty()) {
      // The layers' checks a device still runs (an index outside an Embedding) throw first.
      output_losses_[o] = Deferred<double>(
          std::function<double()>([loss = output_losses_[o], checks = deferred_checks_] {
            for (const auto& check : checks)
              check.get();
            return loss.get();
          }));
    }
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
  // Keras's model.losses (regularization penalties) join the loss of training and of
  // evaluation alike (Keras 3's compute_loss, called by train_step and test_step).
  const double penalty = penalties_.total(backend(), nodes_, rows_);
  if (known) return sum(output_losses_, loss_weights_) + penalty;
  // A device may still be computing a loss: the total is added when it is read.
  return Deferred<double>(
      std::function<double()>([sum, penalty, values = output_losses_, weights = loss_weights_] {
        return sum(values, weights) + penalty;
      }));
}

LOADSTAR_DECL void Model::scale_loss_gradients() {
  const float scale = optimizer_->loss_scale();
  if (scale == 1.0F) return;
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    if (penalties_.has_activity(k)) {
      throw ConfigError("model '" + name_ + "': layer '" + nodes_[k].layer->name() +
                        "' has an activity regularizer, which loadstar does not combine with " +
                        "loss scaling (LossScaleOptimizer)");
    }
  }
  // The gradient of the scaled loss: each output node's once (an output listed twice shares it),
  // in one call, which a device reads the scale of when the step runs (the scale changes from
  // step to step; the step's graph does not).
  scaled_.clear();  // keeps its capacity: no allocation after the first step
  for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
    const std::size_t k = output_nodes_[o];
    if (!nodes_[k].layer ||
        std::find(output_nodes_.begin(), output_nodes_.begin() + static_cast<std::ptrdiff_t>(o),
                  k) != output_nodes_.begin() + static_cast<std::ptrdiff_t>(o))
      continue;
    scaled_.push_back(nodes_[k].gradient);
  }
  backend().scale_many(scaled_, scale);
}

LOADSTAR_DECL void Model::backward(std::uint64_t seed) {
  detail::ReluFusionCall fusion;
  CallContext ctx{backend(), true, seed, static_cast<std::uint64_t>(optimizer_->iterations())};
  ctx.relu_fusion = &fusion;
  detail::ProductDtypeScope products(backend());
  for (std::size_t k = nodes_.size(); k-- > 0;) {
    auto& node = nodes_[k];
    if (!node.layer || !needs_backward_[k]) continue;
    if (!node.runs()) {
      // A later output of a call: its gradient goes to the call's first output's node.
      if (node.gradient_written) mixed_.round_gradient(backend(), k, node);
      continue;
    }
    ctx.accumulate_gradients = !writes_gradients_[k];
    penalties_.add_activity_gradient(backend(), node, k, rows_);
    fusion = relu_fusions_.backward(k);
    mixed_.round_gradient(backend(), k, node);
    ctx.input_masks =
        node.layer->reads_masks() ? masks_.inputs(k) : std::span<const Tensor<float>>();
    ctx.extra_outputs = node.extra_values;
    ctx.extra_output_gradients = node.extra_gradients;
    products.set(mixed_.product_dtype(k));
    node.layer->backward(node.input_values, node.value,
                         node.gradient_written ? node.gradient : Tensor<float>(),
                         node.input_gradients, ctx);
    mixed_.round_weight_gradients(backend(), k, node);
    for (std::size_t j = 0; j < node.inputs.size(); ++j) {
      if (node.targets[j] == detail::GradientTarget::accumulate) {
        backend().axpy(1.0F, node.input_gradients[j], nodes_[node.inputs[j]].gradient);
      }
    }
  }
  // Loss scaling (LossScaleOptimizer): the weights' gradients divided by the scale the loss's
  // gradient was multiplied by, before the penalties' gradients, which Keras scales and unscales
  // alike, join them.
  if (const float scale = optimizer_->loss_scale(); scale != 1.0F) {
    scaled_.clear();
    for (Variable* v : trainable_)
      if (!v->gradient.empty()) scaled_.push_back(v->gradient);
    backend().scale_many(scaled_, 1.0F / scale);
  }
  // After every layer's backward: a layer that writes its gradients ignores what they held.
  penalties_.add_weight_gradients(backend());
}

LOADSTAR_DECL void Model::update_metrics(RunningMetrics& running, const Deferred<double>& total) {
  if (!running.created()) create_metrics();
  const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
  running.update(backend(), total, output_losses_, rows_, targets_, outputs_, weights,
                 masks_.empty() ? std::span<const Tensor<float>>() : mask_weights_,
                 masks_.empty() ? std::span<const Tensor<float>>() : masked_sample_weights_);
}

LOADSTAR_DECL DataIteratorOptions Model::data_options(const FitOptions& options) {
  return {.batch_size = options.batch_size,
          .steps_per_epoch = options.steps_per_epoch,
          .use_multiprocessing = options.use_multiprocessing,
          .adapter = {.max_queue_size = options.max_queue_size,
                      .workers = options.workers,
                      .sampler = {.shuffle = options.shuffle,
                                  .seed = options.seed ? *options.seed : detail::global_seed(),
                                  .rank = options.shard_rank,
                                  .size = options.num_shards}}};
}

LOADSTAR_DECL callbacks::History Model::fit(DataIterator& data, const FitOptions& options) {
  require_compiled("fit");
  const std::string kind = "a data iterator";
  if (options.validation_split > 0.0) {
    throw ConfigError("fit: validation_split is supported for arrays only, not for " + kind +
                      "; give validation_data instead");
  }
  if (options.sample_weight) {
    throw ConfigError("fit: sample_weight is supported for arrays only, not for " + kind +
                      "; return (x, y, w) batches instead");
  }
  std::shared_ptr<detail::BatchSource> validation;
  if (!options.validation_data.empty()) {
    validation = options.validation_data.source(
        options.validation_batch_size.value_or(options.batch_size), options.validation_steps);
  }
  return detail::run_fit(*this, data, validation.get(), options,
                         options.class_weight ? &*options.class_weight : nullptr);
}

LOADSTAR_DECL const Logs& Model::train_step(const BatchView& batch, const StepOptions& options) {
  require_compiled("train_step");
  if (batch.count == 0 && built()) {
    // A rank of a data-parallel job with no rows in this step (the last batch of an epoch
    // has fewer rows than there are ranks): zero gradients, so that the optimizer still
    // takes part in the step, and nothing to measure.
    place_weights();
    zero_gradients(trainable_);
    optimizer_->apply_batch_gradients(trainable_, 0);
    optimizer_->settle();
    penalties_.apply_constraints(backend());
    training_.fill(training_logs_, output_names_);
    return training_logs_;
  }
  prepare(batch, 0);
  const detail::ScopedFlushDenormal flush_denormal;
  load(batch, true, options.class_weight);
  detail::StepScope step(backend(), step_key(StepKind::train));
  zero_gradients(zeroed_);
  const std::uint64_t seed = options.seed ? *options.seed : detail::global_seed();
  detail::RestoreWeights restore(mixed_, backend());
  forward(true, seed);
  const Deferred<double> total = compute_losses(true);
  scale_loss_gradients();
  backward(seed);
  mixed_.restore_weights(backend());
  optimizer_->apply_batch_gradients(trainable_, rows_);
  penalties_.apply_constraints(backend());
  mixed_.round_variables(backend());
  update_metrics(training_, total);
  step.end();
  // What the device decided in the step (a loss-scaled step's finite check) counted, so that the
  // next step and anything reading the optimizer between steps see it.
  optimizer_->settle();
  fill_logs(training_, training_logs_);
  return training_logs_;
}

LOADSTAR_DECL const Logs& Model::test_step(const BatchView& batch, const StepOptions& options) {
  require_compiled("test_step");
  prepare(batch, 0);
  const detail::ScopedFlushDenormal flush_denormal;
  load(batch, true, options.class_weight);
  detail::StepScope step(backend(), step_key(StepKind::test));
  detail::RestoreWeights restore(mixed_, backend());
  forward(false, options.seed ? *options.seed : detail::global_seed());
  mixed_.restore_weights(backend());
  const Deferred<double> total = compute_losses(false);
  update_metrics(evaluation_, total);
  step.end();
  fill_logs(evaluation_, evaluation_logs_);
  return evaluation_logs_;
}

LOADSTAR_DECL const std::vector<Tensor<float>>& Model::predict_step(const BatchView& batch) {
  prepare(batch, 0);
  const detail::ScopedFlushDenormal flush_denormal;
  load(batch, false, nullptr);
  detail::StepScope step(backend(), step_key(StepKind::predict));
  detail::RestoreWeights restore(mixed_, backend());
  forward(false, detail::global_seed());
  mixed_.restore_weights(backend());
  step.end();
  // Predictions are read at once: so are the layers' checks.
  for (const auto& check : deferred_checks_)
    check.get();
  return outputs_;
}

LOADSTAR_DECL void Model::reset_metrics() {
  training_.reset();
  evaluation_.reset();
}

}  // namespace loadstar::keras
