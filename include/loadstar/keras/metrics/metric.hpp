/// \file
/// `Metric`: the base of Keras's metrics, running means (or counts) reset every epoch.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/keras/backend/backend.hpp"
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
  virtual void update_state(Backend& backend, const Tensor<float>& y_true,
                            const Tensor<float>& y_pred, const Tensor<float>* sample_weight) {
    const bool weighted = sample_weight != nullptr;
    static const Tensor<float> none;
    const Tensor<float>& weight = weighted ? *sample_weight : none;
    backend.on_host({y_true, y_pred, weight}, [&](std::span<const Tensor<float>> t) {
      update_state(t[0], t[1], weighted ? &t[2] : nullptr);
    });
  }
  /// The value so far.
  virtual double result() const = 0;
  /// Forgets every batch.
  virtual void reset_state() = 0;

  virtual nlohmann::json get_config() const { return {{"name", name_}}; }

  /// The name logs use (`"accuracy"`, `"val_accuracy"` for validation).
  const std::string& name() const noexcept { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

 private:
  std::string name_;
};

}  // namespace loadstar::keras
