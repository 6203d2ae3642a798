/// \file
/// `Optimizer`: the base of Keras's optimizers, with learning-rate schedules and clipping.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/variable.hpp"

namespace loadstar::keras {

/// The base of every optimizer.
///
/// `apply_gradients` updates every trainable variable from its `gradient` (after the clipping
/// the optimizer was configured with: `clipnorm` per variable, `global_clipnorm`, `clipvalue`),
/// with the learning rate of the current step (a constant or a schedule of `iterations()`), then
/// counts one iteration. Slot variables (Adam's `m` and `v`) are created on the first call, in
/// the order of the variables, and are listed by `variables()` for checkpoints, Keras-named
/// (`"m"`, `"v"`, with the variable they belong to). A step allocates nothing after the first.
/// Slots live in the memory of the optimizer's backend (`set_backend`; the model sets its own at
/// `compile`), which also runs the updates; without one, the one-thread CPU backend.
class Optimizer {
 public:
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = default;
  Optimizer(Optimizer&&) noexcept = default;
  Optimizer& operator=(const Optimizer&) = default;
  Optimizer& operator=(Optimizer&&) noexcept = default;

  /// Keras's class name (`"Adam"`).
  virtual std::string class_name() const = 0;

  /// One update of `variables` from their gradients (non-trainable ones are skipped).
  virtual void apply_gradients(std::span<Variable*> variables) = 0;

  /// `apply_gradients`, made conditional on `condition` (a one-element tensor in the backend's
  /// memory that the step's own work sets before the update runs): where it holds 0 when the
  /// update runs, nothing changes. The iteration count is not advanced: the caller, which learns
  /// the outcome later, does that (`LossScaleOptimizer`). Returns false, having done nothing,
  /// where the update cannot be made conditional (the default; an optimizer whose step is not
  /// one backend kernel); the caller then decides on the host.
  virtual bool apply_gradients_if(std::span<Variable*> variables, const Tensor<float>& condition) {
    static_cast<void>(variables);
    static_cast<void>(condition);
    return false;
  }

  /// Completes the bookkeeping of the last step whose outcome its device decided
  /// (`LossScaleOptimizer`: whether its gradients were finite, read back once the step's work is
  /// queued; it may wait for the device). `Model`'s training step calls it at its end; the
  /// default passes it to the wrapped optimizer.
  virtual void settle() {
    if (Optimizer* wrapped = wrapped_optimizer()) wrapped->settle();
  }

  /// What a training step calls: `apply_gradients` for gradients of the mean loss over a batch
  /// of `rows` rows. An optimizer that combines the gradients of several batches (the
  /// data-parallel `dist::DistributedOptimizer`) weights each by its rows; a batch of 0 rows
  /// (a rank with nothing left in the last batch of an epoch) carries zero gradients.
  LOADSTAR_DECL virtual void apply_batch_gradients(std::span<Variable*> variables,
                                                   std::size_t rows);

  /// The learning rate the next step will use.
  virtual double learning_rate() const = 0;
  /// Sets a constant learning rate (what `ReduceLROnPlateau` and `LearningRateScheduler` do).
  virtual void set_learning_rate(double learning_rate) = 0;

  /// The backend whose memory holds the variables and slots, and which runs the updates; slots
  /// already made move to its memory.
  virtual void set_backend(std::shared_ptr<Backend> backend) { backend_ = std::move(backend); }

  /// The number of steps taken.
  std::int64_t iterations() const noexcept { return iterations_; }
  virtual void set_iterations(std::int64_t iterations) noexcept { iterations_ = iterations; }

  /// The slot variables, in creation order, for checkpoints.
  virtual std::span<Variable> variables() noexcept = 0;

  /// Creates the slot variables of `variables` before the first step (Keras's
  /// `optimizer.build(var_list)`), so that slots loaded from a checkpoint have somewhere to go;
  /// `apply_gradients` builds on its first call otherwise. An optimizer without slots does nothing.
  virtual void build(std::span<Variable*> variables) { static_cast<void>(variables); }
  /// Whether `build` (or a first step) created the slots.
  virtual bool built() const noexcept { return false; }

  /// Sets the final values of the trainable `variables` at the end of training (Keras's
  /// `finalize_variable_values`, which `fit` calls): with `use_ema`, their moving averages;
  /// otherwise nothing changes.
  virtual void finalize_variable_values(std::span<Variable*> variables) {
    static_cast<void>(variables);
  }

  /// Keras's `exclude_from_weight_decay(var_list, var_names)`: the weight decay skips the
  /// variables in `var_list` (the model's own, as `Model::trainable_variables()` lists them) and
  /// every variable whose name (`"kernel"`, `"bias"`, `"gamma"`) a regular expression in
  /// `var_names` finds (`std::regex_search`, ECMAScript syntax; Keras joins them with `|` for
  /// Python's `re.search`). A second call replaces the first. Throws `ConfigError` once the
  /// optimizer is built, for a pattern that is not a regular expression, and from an optimizer
  /// without weight decay; a wrapper (`LossScaleOptimizer`) passes the call to the optimizer it
  /// wraps.
  LOADSTAR_DECL virtual void exclude_from_weight_decay(
      std::span<const Variable* const> var_list, const std::vector<std::string>& var_names = {});

  /// The factor a training step multiplies the gradient of the loss by before the backward pass
  /// and divides the weights' gradients by after it (`LossScaleOptimizer`'s scale); 1 for every
  /// other optimizer.
  virtual float loss_scale() const noexcept { return 1.0F; }
  /// The optimizer this one wraps and steps (`LossScaleOptimizer`'s, the data-parallel
  /// `dist::DistributedOptimizer`'s), or null: how a file finds a wrapped optimizer's state.
  virtual Optimizer* wrapped_optimizer() const noexcept { return nullptr; }

  /// Keras's `get_config()`: `{"name", "learning_rate", "clipnorm", ...}`.
  virtual nlohmann::json get_config() const { return {{"name", name_}}; }
  const std::string& name() const noexcept { return name_; }

 protected:
  /// The backend set by `set_backend`, or the one-thread CPU backend.
  Backend& backend() const noexcept { return backend_ ? *backend_ : detail::host_backend(); }

  std::int64_t iterations_ = 0;
  std::shared_ptr<Backend> backend_;

 private:
  std::string name_;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Optimizer::apply_batch_gradients(std::span<Variable*> variables, std::size_t rows) {
  static_cast<void>(rows);
  apply_gradients(variables);
}

void Optimizer::exclude_from_weight_decay(std::span<const Variable* const> var_list,
                                          const std::vector<std::string>& var_names) {
  if (Optimizer* inner = wrapped_optimizer()) {
    inner->exclude_from_weight_decay(var_list, var_names);
    return;
  }
  throw ConfigError(name() + " (" + class_name() +
                    "): exclude_from_weight_decay: expected an optimizer with a weight_decay "
                    "option but found one without");
}

}  // namespace loadstar::keras
#endif
