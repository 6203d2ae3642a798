/// \file
/// `Metric`: the base of Keras's metrics, running means (or counts) reset every epoch.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The base of every metric: `update_state` accumulates a batch, `result` reads the value so far,
/// `reset_state` starts over (at the start of every epoch and every evaluation, as Keras does).
class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;
  Metric(const Metric&) = default;
  Metric(Metric&&) noexcept = default;
  Metric& operator=(const Metric&) = default;
  Metric& operator=(Metric&&) noexcept = default;

  /// Keras's class name (`"SparseCategoricalAccuracy"`).
  virtual std::string class_name() const = 0;

  /// Accumulates one batch (`y_true` as float, batch axis first; optional weight per row) of host
  /// tensors.
  virtual void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                            const Tensor<float>* sample_weight) = 0;

  /// Accumulates one batch of tensors in `backend`'s memory: the host `update_state` runs as the
  /// backend's host kernel, on host views of the tensors (exceptions propagate).
  LOADSTAR_DECL virtual void update_state(Backend& backend, const Tensor<float>& y_true,
                                          const Tensor<float>& y_pred,
                                          const Tensor<float>* sample_weight);
  /// The value so far (on a device backend, it may wait for the device).
  virtual double result() const = 0;
  /// Whether a device backend may still be computing some batch's contribution, so that reading
  /// `result()` or `get_state()` may wait for it.
  virtual bool pending() const noexcept { return false; }
  /// Whether the metric weights its values by the mask of the output it measures (Keras 3's
  /// `MeanMetricWrapper` does: each value of a masked step counts 0); a model then gives
  /// `update_state` weights per value, the mask times the sample weights.
  virtual bool applies_masks() const noexcept { return false; }
  /// Forgets every batch.
  virtual void reset_state() = 0;

  /// Keras's `get_config()`: `{"name": ..., "dtype": "float32"}` and the metric's own arguments.
  virtual nlohmann::json get_config() const { return {{"name", name_}, {"dtype", "float32"}}; }

  /// The accumulators a checkpoint keeps (sums and counts, so that states of several ranks can
  /// be merged), as JSON; null for a metric that keeps none. `set_state` gives them back.
  virtual nlohmann::json get_state() const { return nullptr; }
  virtual void set_state(const nlohmann::json& /*state*/) {}

  /// A new metric of the same kind and configuration with the same state: the model measures
  /// training and evaluation with separate objects, so a metric object given to `compile` is
  /// cloned for evaluation. Every built-in metric implements it; a user's metric that does not
  /// cannot be used with validation data or `evaluate` (`ConfigError`).
  LOADSTAR_DECL virtual std::shared_ptr<Metric> clone() const;

  /// The name logs use (`"accuracy"`, `"val_accuracy"` for validation).
  const std::string& name() const noexcept { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
};

namespace detail {

/// A reader of a metric's Keras config whose errors name the metric (`metric 'auc' (AUC)`); the
/// `dtype` must be absent or float32.
LOADSTAR_DECL ConfigReader metric_config(const nlohmann::json& config, std::string_view class_name);

}  // namespace detail
}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Metric::update_state(Backend& backend, const Tensor<float>& y_true,
                          const Tensor<float>& y_pred, const Tensor<float>* sample_weight) {
  const bool weighted = sample_weight != nullptr;
  static const Tensor<float> none;
  const Tensor<float>& weight = weighted ? *sample_weight : none;
  backend.on_host({y_true, y_pred, weight}, [&](std::span<const Tensor<float>> t) {
    update_state(t[0], t[1], weighted ? &t[2] : nullptr);
  });
}

std::shared_ptr<Metric> Metric::clone() const {
  throw ConfigError("metric '" + name_ + "' (" + class_name() +
                    "): clone() is not implemented, but the model needs a second object to " +
                    "measure evaluation separately from training; override clone()");
}

}  // namespace loadstar::keras

namespace loadstar::keras::detail {

ConfigReader metric_config(const nlohmann::json& config, std::string_view class_name) {
  auto read = ConfigReader::of(config, "metric", class_name);
  read.expect("dtype", "float32", "loadstar metrics accumulate in float32 and double");
  return read;
}

}  // namespace loadstar::keras::detail
#endif
