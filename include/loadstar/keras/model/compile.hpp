/// \file
/// `Model`'s compilation: `compile`, the optimizer and backend it sets, and the losses, loss
/// weights and metric objects it resolves, defined out of the class (Taskflow style) so that
/// model.hpp keeps the declaration and each concern has its own file. Included by model.hpp; do not
/// include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::resolve_losses() {
  const auto& spec = options_.loss;
  const std::size_t n = output_nodes_.size();
  if (spec.empty()) throw ConfigError("model '" + name_ + "': compile needs a loss");
  auto make = [&](const LossArg& arg) {
    if (arg.object()) return arg.object();
    return std::shared_ptr<Loss>(get_loss(arg.name()));
  };
  losses_.clear();
  if (!spec.map().empty()) {
    for (const auto& [key, arg] : spec.map()) {
      if (std::find(output_names_.begin(), output_names_.end(), key) == output_names_.end()) {
        throw ConfigError("model '" + name_ + "': the loss map names '" + key +
                          "', which is not an output (outputs: " + joined(output_names_) + ")");
      }
    }
    for (const auto& output : output_names_) {
      auto found = spec.map().find(output);
      if (found == spec.map().end()) {
        throw ConfigError("model '" + name_ + "': the loss map has no loss for output '" + output +
                          "'");
      }
      losses_.push_back(make(found->second));
    }
  } else if (spec.single()) {
    for (std::size_t o = 0; o < n; ++o)
      losses_.push_back(make(spec.list().front()));
  } else {
    if (spec.list().size() != n) {
      throw ConfigError("model '" + name_ + "': has " + std::to_string(n) + " outputs but " +
                        std::to_string(spec.list().size()) + " losses were given");
    }
    for (const auto& arg : spec.list())
      losses_.push_back(make(arg));
  }
  loss_weights_ = options_.loss_weights;
  if (loss_weights_.empty()) loss_weights_.assign(n, 1.0);
  if (loss_weights_.size() != n) {
    throw ConfigError("model '" + name_ + "': has " + std::to_string(n) + " outputs but " +
                      std::to_string(loss_weights_.size()) + " loss weights were given");
  }
  for (const auto& metric : options_.metrics) {
    if (metric.object() && n > 1) {
      throw ConfigError("model '" + name_ + "': a metric object can measure one output but " +
                        "the model has " + std::to_string(n) + "; give metrics by name");
    }
  }
  for (const auto& metric : options_.weighted_metrics) {
    if (metric.object() && n > 1) {
      throw ConfigError("model '" + name_ + "': a metric object can measure one output but " +
                        "the model has " + std::to_string(n) + "; give metrics by name");
    }
  }
  training_ = {};
  evaluation_ = {};
}

LOADSTAR_DECL std::string Model::joined(const std::vector<std::string>& names) {
  return loadstar::detail::join(names, ", ", "'");
}

LOADSTAR_DECL void Model::create_metrics() {
  const std::size_t n = output_nodes_.size();
  auto make = [&](const MetricArg& arg, std::size_t o, bool evaluation) {
    if (const auto object = arg.object()) return evaluation ? object->clone() : object;
    return std::shared_ptr<Metric>(
        get_metric(arg.name(), losses_[o]->class_name(), targets_[o].shape(), outputs_[o].shape()));
  };
  for (const bool evaluation : {false, true}) {
    RunningMetrics& running = evaluation ? evaluation_ : training_;
    running.metrics.assign(n, {});
    running.weighted.assign(n, {});
    std::set<std::string> names;
    auto add = [&](std::vector<std::shared_ptr<Metric>>& to, std::shared_ptr<Metric> metric) {
      if (!names.insert(metric->name()).second) {
        throw ConfigError("model '" + name_ + "': two metrics are named '" + metric->name() +
                          "'; give one of them another name");
      }
      to.push_back(std::move(metric));
    };
    for (std::size_t o = 0; o < n; ++o) {
      for (const auto& arg : options_.metrics) {
        auto metric = make(arg, o, evaluation);
        if (n > 1) metric->set_name(output_names_[o] + "_" + metric->name());
        add(running.metrics[o], std::move(metric));
      }
      for (const auto& arg : options_.weighted_metrics) {
        auto metric = make(arg, o, evaluation);
        if (n > 1) {
          const bool taken = names.contains(output_names_[o] + "_" + metric->name());
          metric->set_name(output_names_[o] + (taken ? "_weighted_" : "_") + metric->name());
        } else if (names.contains(metric->name())) {
          metric->set_name("weighted_" + metric->name());
        }
        add(running.weighted[o], std::move(metric));
      }
    }
    running.set_created();
  }
}

LOADSTAR_DECL void Model::compile(const CompileOptions& options) {
  options_ = options;
  std::shared_ptr<Backend> backend =
      options.backend ? options.backend : cpu_backend(options.threads);
  if (backend_ && backend_->device() != backend->device()) {
    // Weights in the previous backend's memory come back to the host, to move to the new
    // backend's memory before the next step; the activations are allocated again there.
    for (const auto& layer : layers_) {
      for (auto& w : layer->weights()) {
        if (!w.value.is_host()) w.value = backend_->to_host(w.value);
        if (!w.gradient.is_host()) w.gradient = Tensor<float>(w.gradient.shape());
      }
    }
    capacity_ = 0;
    rows_ = 0;
  }
  backend_ = std::move(backend);
  weights_placed_ = false;
  optimizer_ = options.optimizer.object();
  if (!optimizer_) optimizer_ = std::shared_ptr<Optimizer>(get_optimizer(options.optimizer.name()));
  // Keras 3's Trainer.compile: a model made under "mixed_float16" scales its loss.
  if (options.auto_scale_loss && dtype_policy_.name() == "mixed_float16" &&
      optimizer_->loss_scale() == 1.0F &&
      dynamic_cast<optimizers::LossScaleOptimizer*>(optimizer_.get()) == nullptr) {
    optimizer_ = std::make_shared<optimizers::LossScaleOptimizer>(optimizer_, 32768.0, 2000,
                                                                  "loss_scale_optimizer");
  }
  optimizer_->set_backend(backend_);
  check_metric_names(options.metrics);
  check_metric_names(options.weighted_metrics);
  compiled_ = true;
  // As in Keras, a layer's `trainable` changed since takes effect now: the graph is planned
  // again (which variables train, which gradients a step needs).
  if (!graph_inputs_.empty()) {
    set_graph(graph_inputs_, graph_outputs_);
  } else if (built()) {
    resolve_losses();
  }
}

LOADSTAR_DECL void Model::compile(OptimizerArg optimizer, Losses loss,
                                  std::vector<MetricArg> metrics,
                                  std::vector<double> loss_weights) {
  CompileOptions options;
  options.threads = options_.threads;
  options.backend = options_.backend;
  options.optimizer = std::move(optimizer);
  options.loss = std::move(loss);
  options.metrics = std::move(metrics);
  options.loss_weights = std::move(loss_weights);
  compile(options);
}

LOADSTAR_DECL Optimizer& Model::optimizer() const {
  require_compiled("optimizer");
  return *optimizer_;
}

LOADSTAR_DECL void Model::set_optimizer(std::shared_ptr<Optimizer> optimizer) {
  require_compiled("set_optimizer");
  if (!optimizer) throw ConfigError("model '" + name_ + "': set_optimizer: the optimizer is null");
  optimizer->set_backend(backend_);
  optimizer_ = std::move(optimizer);
}

LOADSTAR_DECL std::shared_ptr<Optimizer> Model::optimizer_ptr() const {
  require_compiled("optimizer");
  return optimizer_;
}

LOADSTAR_DECL Backend& Model::backend() {
  if (!backend_) backend_ = cpu_backend(options_.threads);
  return *backend_;
}

LOADSTAR_DECL std::vector<std::string> Model::metrics_names() const {
  std::vector<std::string> names{"loss"};
  if (outputs_.size() > 1) {
    for (const auto& output : output_names_)
      names.push_back(output + "_loss");
  }
  for (auto& metric : training_.names())
    names.push_back(std::move(metric));
  return names;
}

LOADSTAR_DECL void Model::check_metric_names(const std::vector<MetricArg>& metrics) const {
  for (const auto& metric : metrics) {
    if (metric.object() || metric.name() == "accuracy" || metric.name() == "acc") continue;
    if (Registry<Metric>::instance().contains(metric.name())) continue;
    try {
      Registry<Metric>::instance().create(metric.name(), nlohmann::json::object());
    } catch (const ConfigError& e) {
      throw ConfigError("model '" + name_ + "': compile: " + e.what());
    }
  }
}

}  // namespace loadstar::keras
