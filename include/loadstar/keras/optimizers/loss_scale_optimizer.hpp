/// \file
/// `LossScaleOptimizer`: Keras 3's dynamic loss scaling around another optimizer, for
/// `"mixed_float16"` training.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/keras/variable.hpp"

namespace loadstar::keras::detail {
/// An optimizer from its Keras config through `Registry<Optimizer>` (defined with the registry's
/// defaults in keras/optimizers.hpp).
LOADSTAR_DECL std::unique_ptr<Optimizer> optimizer_from_json(const nlohmann::json& value);
}  // namespace loadstar::keras::detail

namespace loadstar::keras::optimizers {

/// Dynamic loss scaling, as Keras 3's `LossScaleOptimizer`: a training step multiplies the
/// gradient of the loss by `loss_scale()` before the backward pass (so that small float16
/// gradients do not flush to zero) and divides the weights' gradients by it afterwards; then
///
/// - when a gradient is not finite (an overflow in float16), the step is skipped (the wrapped
///   optimizer neither updates nor counts an iteration) and the scale halves;
/// - otherwise the wrapped optimizer steps, and after `dynamic_growth_steps` finite steps in a
///   row the scale doubles.
///
/// `compile` wraps the optimizer in one automatically for a model made under the
/// `"mixed_float16"` policy, as Keras 3 does. The scale and the count of finite steps are saved
/// with the optimizer's state (`.keras`: `step_counter` and `dynamic_scale` before the wrapped
/// optimizer's variables, as Keras 3 lists them; `.h5`: `good_steps` and `current_loss_scale`
/// after them), so that training resumes exactly. `apply_gradients` takes the gradients already
/// divided by the scale (the model divides them).
///
/// On a device backend the check runs on the device (`Backend::all_finite`) and the wrapped
/// optimizer's fused step reads its outcome there (`apply_gradients_if`), so that the whole step
/// stays one CUDA graph; the scale, the counter and the iterations follow when the outcome is
/// read back, by `settle()`, which the model's training step calls at its end (it waits for the
/// step). A wrapped optimizer without a fused step, or with `use_ema`, is stepped after the
/// outcome is read at once, as on the CPU.
/// \code
/// model.compile({.optimizer = std::make_shared<LossScaleOptimizer>(std::make_shared<Adam>()),
///                .loss = "mse"});
/// \endcode
class LossScaleOptimizer final : public Optimizer {
 public:
  /// Throws `ConfigError` for a null optimizer, a wrapped `LossScaleOptimizer`, a scale that is
  /// not a positive finite number or fewer than one growth step.
  LOADSTAR_DECL explicit LossScaleOptimizer(std::shared_ptr<Optimizer> inner_optimizer,
                                            double initial_scale = 32768.0,
                                            std::int64_t dynamic_growth_steps = 2000,
                                            std::string name = "loss_scale_optimizer");

  std::string class_name() const override { return "LossScaleOptimizer"; }

  /// Skips the step and halves the scale when a trainable gradient is not finite; otherwise
  /// steps the wrapped optimizer and counts a finite step (doubling the scale after
  /// `dynamic_growth_steps` of them).
  LOADSTAR_DECL void apply_gradients(std::span<Variable*> variables) override;
  /// Reads the outcome of the last step checked on the device, if not read yet, and counts it:
  /// the wrapped optimizer's iteration and a finite step, or the halved scale.
  LOADSTAR_DECL void settle() override;

  double learning_rate() const override { return inner_->learning_rate(); }
  void set_learning_rate(double learning_rate) override {
    inner_->set_learning_rate(learning_rate);
  }
  void set_backend(std::shared_ptr<Backend> backend) override {
    inner_->set_backend(backend);
    Optimizer::set_backend(std::move(backend));
  }
  /// The wrapped optimizer's iterations (Keras's `LossScaleOptimizer.iterations`).
  void set_iterations(std::int64_t iterations) noexcept override {
    inner_->set_iterations(iterations);
    iterations_ = iterations;
  }
  /// The wrapped optimizer's slots.
  std::span<Variable> variables() noexcept override { return inner_->variables(); }
  void build(std::span<Variable*> variables) override { inner_->build(variables); }
  bool built() const noexcept override { return inner_->built(); }
  void finalize_variable_values(std::span<Variable*> variables) override {
    inner_->finalize_variable_values(variables);
  }

  /// The current scale (Keras's `dynamic_scale`).
  float loss_scale() const noexcept override { return scale_; }
  /// The finite steps since the scale last changed (Keras's `step_counter`).
  std::int64_t step_counter() const noexcept { return counter_; }
  /// Restores the scale and the counter (from a checkpoint), after `settle()`.
  LOADSTAR_DECL void set_state(float scale, std::int64_t step_counter);

  double initial_scale() const noexcept { return initial_scale_; }
  std::int64_t dynamic_growth_steps() const noexcept { return growth_steps_; }
  /// The wrapped optimizer.
  Optimizer& inner_optimizer() const noexcept { return *inner_; }
  Optimizer* wrapped_optimizer() const noexcept override { return inner_.get(); }

  /// Keras 3's config: `{"name", "inner_optimizer": {"module", "class_name", "config",
  /// "registered_name"}, "initial_scale", "dynamic_growth_steps"}`.
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Reads Keras 3's config (and tf.keras 2.x's, whose `"dynamic": true` is the only kind
  /// supported): the inner optimizer through the optimizer registry.
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);

 private:
  std::shared_ptr<Optimizer> inner_;
  double initial_scale_;
  std::int64_t growth_steps_;
  /// Counts a step whose gradients were `finite` (the wrapped optimizer has stepped) or not.
  LOADSTAR_DECL void count_step(bool finite) noexcept;

  float scale_;
  std::int64_t counter_ = 0;
  Tensor<float> flag_;                     // the device's outcome of the check
  std::optional<Deferred<bool>> pending_;  // a step checked on the device, not yet counted
  std::vector<Tensor<float>> gradients_;   // the trainable gradients, without allocating
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

LossScaleOptimizer::LossScaleOptimizer(std::shared_ptr<Optimizer> inner_optimizer,
                                       double initial_scale, std::int64_t dynamic_growth_steps,
                                       std::string name)
    : Optimizer(std::move(name)),
      inner_(std::move(inner_optimizer)),
      initial_scale_(initial_scale),
      growth_steps_(dynamic_growth_steps),
      scale_(static_cast<float>(initial_scale)) {
  const std::string label = "loss scale optimizer '" + this->name() + "'";
  if (!inner_) throw ConfigError(label + ": the inner optimizer is null");
  if (dynamic_cast<LossScaleOptimizer*>(inner_.get()) != nullptr) {
    throw ConfigError(label + ": the inner optimizer '" + inner_->name() +
                      "' is already a LossScaleOptimizer");
  }
  if (!(initial_scale > 0.0) || !std::isfinite(static_cast<float>(initial_scale))) {
    throw ConfigError(label + ": initial_scale must be a positive finite number but is " +
                      std::to_string(initial_scale));
  }
  if (dynamic_growth_steps < 1) {
    throw ConfigError(label + ": dynamic_growth_steps must be at least 1 but is " +
                      std::to_string(dynamic_growth_steps));
  }
  iterations_ = inner_->iterations();
}

void LossScaleOptimizer::apply_gradients(std::span<Variable*> variables) {
  settle();
  // Keras's check_finite: every gradient of every trainable variable.
  gradients_.clear();  // keeps its capacity
  for (Variable* v : variables)
    if (v->trainable && !v->gradient.empty()) gradients_.push_back(v->gradient);
  Backend& backend = this->backend();
  if (flag_.empty() || flag_.device() != backend.device()) flag_ = backend.allocate({1});
  Deferred<bool> finite = backend.all_finite(gradients_, flag_);
  // On a device: the wrapped step reads the flag there, and `settle` counts the outcome.
  if (!finite.ready() && inner_->apply_gradients_if(variables, flag_)) {
    pending_ = std::move(finite);
    return;
  }
  const bool stepped = finite.get();
  if (stepped) {
    inner_->apply_gradients(variables);
    iterations_ = inner_->iterations();
  }
  count_step(stepped);
}

void LossScaleOptimizer::settle() {
  if (pending_) {
    const bool stepped = pending_->get();
    pending_.reset();
    if (stepped) {
      inner_->set_iterations(inner_->iterations() + 1);
      iterations_ = inner_->iterations();
    }
    count_step(stepped);
  }
  inner_->settle();
}

void LossScaleOptimizer::count_step(bool finite) noexcept {
  if (!finite) {
    counter_ = 0;
    scale_ *= 0.5F;
  } else if (counter_ == growth_steps_ - 1) {
    counter_ = 0;
    scale_ *= 2.0F;
  } else {
    ++counter_;
  }
}

void LossScaleOptimizer::set_state(float scale, std::int64_t step_counter) {
  settle();
  if (!(scale > 0.0F) || !std::isfinite(scale) || step_counter < 0) {
    throw ConfigError("loss scale optimizer '" + name() +
                      "': the saved scale must be positive and finite and the step counter "
                      "non-negative but they are " +
                      std::to_string(scale) + " and " + std::to_string(step_counter));
  }
  scale_ = scale;
  counter_ = step_counter;
}

nlohmann::json LossScaleOptimizer::get_config() const {
  return {{"name", name()},
          {"inner_optimizer",
           {{"module", "keras.optimizers"},
            {"class_name", inner_->class_name()},
            {"config", inner_->get_config()},
            {"registered_name", nullptr}}},
          {"initial_scale", initial_scale_},
          {"dynamic_growth_steps", growth_steps_}};
}

std::unique_ptr<Optimizer> LossScaleOptimizer::from_config(const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "optimizer", "LossScaleOptimizer");
  if (!read.has("inner_optimizer")) read.fail("inner_optimizer", "an optimizer config");
  read.expect("dynamic", true, "Keras 3 supports dynamic loss scaling only");
  // Keras 3 refuses the base optimizer's options here: they belong to the inner optimizer.
  for (const char* key :
       {"weight_decay", "clipnorm", "global_clipnorm", "clipvalue", "ema_overwrite_frequency",
        "loss_scale_factor", "gradient_accumulation_steps"})
    read.expect(key, nullptr, "set it on the inner_optimizer");
  read.expect("use_ema", false, "set it on the inner_optimizer");
  std::shared_ptr<Optimizer> inner = read.nested("inner_optimizer", [&] {
    return std::shared_ptr<Optimizer>(
        keras::detail::optimizer_from_json(*read.find("inner_optimizer")));
  });
  return std::make_unique<LossScaleOptimizer>(std::move(inner), read.get("initial_scale", 32768.0),
                                              read.get<std::int64_t>("dynamic_growth_steps", 2000),
                                              read.get("name", "loss_scale_optimizer"));
}

}  // namespace loadstar::keras::optimizers
#endif
