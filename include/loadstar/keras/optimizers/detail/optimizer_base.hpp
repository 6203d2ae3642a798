/// \file
/// What every optimizer shares: slot variables, clipping, the learning rate, one step.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <regex>
#include <span>
#include <string>
#include <vector>

#include "loadstar/detail/eigen.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/optimizers/detail/clip_formulas.hpp"
#include "loadstar/keras/optimizers/detail/update_rules.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/keras/optimizers/schedules.hpp"
#include "loadstar/keras/variable.hpp"

namespace loadstar::keras::detail {

/// An unaligned array view of a tensor (gradients may be views into larger buffers).
using ArrayMap = Eigen::Map<Eigen::ArrayXf>;

inline ArrayMap array_of(const Tensor<float>& t) {
  return {t.data(), static_cast<Eigen::Index>(t.size())};
}

/// The functions `update_rules` takes beside the operators, over Eigen arrays and their
/// expressions: the CPU's instantiation of the shared rules, evaluated lazily and vectorised.
struct ArrayMath {
  template <class X>
  static auto sqrt(const X& x) {
    return x.sqrt();
  }
  template <class X>
  static auto rsqrt(const X& x) {
    return x.rsqrt();
  }
  template <class X>
  static auto square(const X& x) {
    return x.square();
  }
  template <class X>
  static auto abs(const X& x) {
    return x.abs();
  }
  template <class X>
  static auto sign(const X& x) {
    return x.sign();
  }
  /// Element by element with `std::pow` (`powf`, what the device calls): Eigen's vectorised
  /// `pow` differs from it in the last bits, and GCC 12 warns inside its AVX-512 code.
  template <class X>
  static auto pow(const X& x, float exponent) {
    return x.unaryExpr([exponent](float v) { return std::pow(v, exponent); });
  }
  template <class X, class Y>
  static auto max(const X& x, const Y& y) {
    return x.max(y);
  }
  template <class X, class Y>
  static auto min(const X& x, const Y& y) {
    return x.min(y);
  }
};

/// The options every optimizer takes, as Keras 3's `BaseOptimizer.__init__`.
struct CommonOptions {
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  /// Decoupled weight decay, `w -= w * weight_decay * lr` before each step (null: none).
  std::optional<double> weight_decay = std::nullopt;
  /// A moving average of each trainable variable, `average = m * average + (1 - m) * w` after
  /// each step (`m` 0 on the first), copied into the variables every `ema_overwrite_frequency`
  /// steps and by `finalize_variable_values`.
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
};

/// The common options of an optimizer's options struct (`AdamOptions`, ...).
template <class Options>
CommonOptions common_options(const Options& options) {
  return {options.clipnorm,
          options.global_clipnorm,
          options.clipvalue,
          options.weight_decay,
          options.use_ema,
          options.ema_momentum,
          options.ema_overwrite_frequency};
}

/// The base of the optimizers: `Derived` lists its slot names (`slot_names()`) and updates one
/// variable in `update_step(std::size_t index, ArrayMap value, const ArrayMap& gradient,
/// float learning_rate)`, reading its slots with `slot(index, k)`.
///
/// Clipping follows Keras 2.11+'s `Optimizer._clip_gradients`: `clipnorm` (each gradient scaled
/// to at most that L2 norm) if set, else `global_clipnorm` (all gradients scaled together), else
/// `clipvalue` (element-wise). Clipped gradients go to scratch buffers made on the first step, so
/// the caller's gradients are left untouched. Then, as Keras 3's `_backend_apply_gradients`, the
/// weight decay (every optimizer's, `update_rules::decay_weight`), the optimizer's rule, and the
/// moving average of the weights with `use_ema`.
class OptimizerBase : public Optimizer {
 public:
  LOADSTAR_DECL OptimizerBase(std::string name, optimizers::LearningRate learning_rate,
                              CommonOptions options);

  LOADSTAR_DECL void apply_gradients(std::span<Variable*> variables) override;
  /// The backend's fused step (`Backend::apply_optimizer_step`) with its `condition`; false where
  /// the backend has none for this optimizer, and with `use_ema`, whose averages are updated on
  /// the host.
  LOADSTAR_DECL bool apply_gradients_if(std::span<Variable*> variables,
                                        const Tensor<float>& condition) override;

  LOADSTAR_DECL void set_backend(std::shared_ptr<Backend> backend) override;

  double learning_rate() const override { return learning_rate_.at(iterations_); }
  void set_learning_rate(double learning_rate) override { learning_rate_ = learning_rate; }
  std::span<Variable> variables() noexcept override { return slots_; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL void exclude_from_weight_decay(
      std::span<const Variable* const> var_list,
      const std::vector<std::string>& var_names = {}) override;

 protected:
  /// The names of the slots each trainable variable gets, in creation order.
  virtual std::vector<std::string> slot_names() const = 0;
  /// The initial value of slot `k`.
  virtual float slot_initial_value(std::size_t) const { return 0.0f; }
  /// The shape of slot `k` of a variable of shape `variable` (the variable's own by default).
  virtual Shape slot_shape(std::size_t /*k*/, const Shape& variable) const { return variable; }
  virtual void update_step(std::size_t index, ArrayMap value, const ArrayMap& gradient,
                           float learning_rate) = 0;
  /// This step's rule and its operands for `learning_rate` at `iterations_`, the same that
  /// `update_step` applies (a built-in optimizer's `update_step` applies its rule from
  /// update_rules.hpp to them), or `std::nullopt` for an optimizer whose rule is its
  /// `update_step` alone, which then updates on the host only.
  virtual std::optional<UpdateOperands> update_operands(float /*learning_rate*/) const {
    return std::nullopt;
  }
  /// The step `Backend::apply_optimizer_step` is handed, without its clipping (filled in by
  /// `apply_gradients`): `update_operands`, when there are some.
  std::optional<OptimizerStep> device_step(float learning_rate) const {
    std::optional<UpdateOperands> operands = update_operands(learning_rate);
    if (!operands) return std::nullopt;
    OptimizerStep step;
    static_cast<UpdateOperands&>(step) = *operands;
    step.weight_decay = decay(learning_rate);
    return step;
  }
  /// Hands this step to the backend's fused step (`condition` as `OptimizerStep::condition`);
  /// false, with nothing done, where the backend or the optimizer has none.
  LOADSTAR_DECL bool device_update(std::span<Variable*> variables, float learning_rate,
                                   const Tensor<float>& condition);
  /// This step's `lr * weight_decay` (0: none), which `update_rules::decay_weight` applies.
  float decay(float learning_rate) const {
    return options_.weight_decay ? static_cast<float>(learning_rate * *options_.weight_decay)
                                 : 0.0F;
  }

  /// The most slots a variable has.
  static constexpr std::size_t max_slots = VariableSlots::max_slots;

  /// Slot `k` of trainable variable `index` (the one `update_step` is updating): a host view,
  /// valid during `update_step` only.
  LOADSTAR_DECL ArrayMap slot([[maybe_unused]] std::size_t index, std::size_t k);
  /// Slot `k` of trainable variable `index` as a tensor, for its shape: valid during
  /// `update_step` only.
  const Tensor<float>& slot_tensor([[maybe_unused]] std::size_t index, std::size_t k) const {
    LOADSTAR_ASSERT(k < current_slots_.size(), "slot_tensor: only valid inside update_step");
    return current_slots_[k];
  }

 public:
  /// Creates the slot variables of the trainable `variables` (Keras's `optimizer.build(var_list)`)
  /// before the first step, so that slots read from a checkpoint have somewhere to go
  /// (`variables()` lists them). The first `apply_gradients` builds the optimizer when this was not
  /// called; either way the slots and the steps are the same. A second call does nothing when
  /// given as many trainable variables, and throws `ConfigError` otherwise.
  LOADSTAR_DECL void build(std::span<Variable*> variables) override;

  bool built() const noexcept override { return built_; }

  /// With `use_ema`, copies the moving averages into the trainable `variables` (Keras's
  /// `finalize_variable_values`, which `fit` calls at its end); otherwise does nothing.
  LOADSTAR_DECL void finalize_variable_values(std::span<Variable*> variables) override;

 private:
  /// The moving averages' step (`use_ema`) after the rule's, and their copy into the variables
  /// every `ema_overwrite_frequency` steps; `iterations_` is still this step's index.
  LOADSTAR_DECL void update_moving_averages(std::span<Variable*> variables);
  LOADSTAR_DECL void overwrite_with_averages(std::span<Variable*> variables);
  /// Whether the weight decay applies to `variable` (`exclude_from_weight_decay`), given
  /// `pattern`, the names' regular expression (null without names).
  LOADSTAR_DECL bool decays(const Variable& variable, const std::regex* pattern) const;

  // Keras 2.11+ names a slot `<slot>/<variable>` (`add_variable_from_reference`): "m/kernel".
  LOADSTAR_DECL void build(Backend& backend, std::span<Variable*> variables);

 private:
  optimizers::LearningRate learning_rate_;
  CommonOptions options_;
  // The rule's slots, `slots_per_variable_` per trainable variable in order, then with `use_ema`
  // one moving average per trainable variable.
  std::vector<Variable> slots_;
  std::vector<Tensor<float>> scratch_, gradients_;
  std::vector<VariableSlots> device_variables_;  // reused: no allocation after the first step
  // `exclude_from_weight_decay`'s variables and names, and whether each trainable variable in
  // order is decayed (settled by `build`).
  std::vector<const Variable*> excluded_variables_;
  std::vector<std::string> excluded_names_;
  std::vector<char> decays_;
  std::span<const Tensor<float>> current_slots_;
  std::size_t slots_per_variable_ = 0;
  bool built_ = false;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

OptimizerBase::OptimizerBase(std::string name, optimizers::LearningRate learning_rate,
                             CommonOptions options)
    : Optimizer(std::move(name)), learning_rate_(std::move(learning_rate)), options_(options) {
  if (options.clipnorm && options.global_clipnorm) {
    throw ConfigError(this->name() +
                      ": at most one of clipnorm and global_clipnorm can be set "
                      "but clipnorm is " +
                      std::to_string(*options.clipnorm) + " and global_clipnorm is " +
                      std::to_string(*options.global_clipnorm));
  }
  // Keras 3 checks these only with use_ema.
  if (options.use_ema && !(options.ema_momentum >= 0 && options.ema_momentum <= 1)) {
    throw ConfigError(this->name() + ": ema_momentum must be in [0, 1] but is " +
                      std::to_string(options.ema_momentum));
  }
  if (options.use_ema && options.ema_overwrite_frequency && *options.ema_overwrite_frequency < 1) {
    throw ConfigError(this->name() +
                      ": ema_overwrite_frequency must be at least 1 or null but is " +
                      std::to_string(*options.ema_overwrite_frequency));
  }
}

bool OptimizerBase::device_update(std::span<Variable*> variables, float learning_rate,
                                  const Tensor<float>& condition) {
  const bool by_norm = options_.clipnorm && *options_.clipnorm > 0;
  const bool by_global = !by_norm && options_.global_clipnorm && *options_.global_clipnorm > 0;
  const bool by_value = !by_norm && !by_global && options_.clipvalue && *options_.clipvalue > 0;
  std::optional<OptimizerStep> step = device_step(learning_rate);
  if (!step) return false;
  step->condition = condition;
  if (by_norm) {
    step->clipping = GradientClipping::by_norm;
    step->clip_threshold = *options_.clipnorm;
  } else if (by_global) {
    step->clipping = GradientClipping::by_global_norm;
    step->clip_threshold = *options_.global_clipnorm;
  } else if (by_value) {
    step->clipping = GradientClipping::by_value;
    step->clip_threshold = *options_.clipvalue;
  }
  device_variables_.resize(scratch_.size());
  std::size_t trainable = 0;
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    LOADSTAR_ASSERT(trainable < device_variables_.size(), "apply_gradients: variables changed");
    VariableSlots& d = device_variables_[trainable];
    d.value = v->value;
    d.gradient = v->gradient;
    d.decay = decays_[trainable] != 0;
    for (std::size_t k = 0; k < VariableSlots::max_slots; ++k)
      d.slots[k] = k < slots_per_variable_ ? slots_[trainable * slots_per_variable_ + k].value
                                           : Tensor<float>();
    ++trainable;
  }
  LOADSTAR_ASSERT(trainable == device_variables_.size(), "apply_gradients: variables changed");
  // The CPU backend declines (false): its step is the host code, bit for bit as before.
  return backend().apply_optimizer_step(*step, device_variables_);
}

bool OptimizerBase::apply_gradients_if(std::span<Variable*> variables,
                                       const Tensor<float>& condition) {
  if (options_.use_ema) return false;
  if (!built_) build(backend(), variables);
  return device_update(variables, static_cast<float>(learning_rate_.at(iterations_)), condition);
}

void OptimizerBase::apply_gradients(std::span<Variable*> variables) {
  Backend& backend = this->backend();
  if (!built_) build(backend, variables);
  const auto learning_rate = static_cast<float>(learning_rate_.at(iterations_));
  float scale = 1.0f;
  const bool by_norm = options_.clipnorm && *options_.clipnorm > 0;
  const bool by_global = !by_norm && options_.global_clipnorm && *options_.global_clipnorm > 0;
  const bool by_value = !by_norm && !by_global && options_.clipvalue && *options_.clipvalue > 0;
  // The backend's fused step over every variable at once when it has one (a device backend);
  // otherwise one host kernel per variable below.
  if (device_update(variables, learning_rate, Tensor<float>())) {
    update_moving_averages(variables);
    ++iterations_;
    return;
  }
  if (by_global) {
    gradients_.clear();  // keeps its capacity: no allocation after the first step
    for (Variable* v : variables)
      if (v->trainable) gradients_.push_back(v->gradient);
    double squares = 0;
    backend.host_kernel(gradients_, [&](std::span<const Tensor<float>> gradients) {
      for (const auto& gradient : gradients)
        squares += array_of(gradient).cast<double>().square().sum();
    });
    scale = clip_scale(squares, *options_.global_clipnorm);
  }
  UpdateOperands decay_operands;
  std::size_t index = 0;
  // Per variable: its value, gradient, clipping scratch and slots, as one host kernel.
  std::array<Tensor<float>, 3 + max_slots> tensors;
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    tensors[0] = v->value;
    tensors[1] = v->gradient;
    tensors[2] = scratch_[index];
    for (std::size_t k = 0; k < slots_per_variable_; ++k)
      tensors[3 + k] = slots_[index * slots_per_variable_ + k].value;
    backend.host_kernel(
        std::span<const Tensor<float>>(tensors.data(), 3 + slots_per_variable_),
        [&](std::span<const Tensor<float>> t) {
          current_slots_ = t.subspan(3);
          ArrayMap value = array_of(t[0]);
          ArrayMap gradient = array_of(t[1]);
          decay_operands.weight_decay = decays_[index] != 0 ? decay(learning_rate) : 0.0F;
          update_rules::decay_weight<ArrayMath>(decay_operands, value);
          if (by_norm) {
            scale = clip_scale(gradient.cast<double>().square().sum(), *options_.clipnorm);
          }
          if (by_norm || by_global || by_value) {
            ArrayMap clipped = array_of(t[2]);
            if (by_value) {
              const auto c = static_cast<float>(*options_.clipvalue);
              clipped = gradient.max(-c).min(c);  // clip_to_value, a block at a time
            } else {
              clipped = gradient * scale;
            }
            update_step(index, value, clipped, learning_rate);
          } else {
            update_step(index, value, gradient, learning_rate);
          }
          current_slots_ = {};
        });
    ++index;
  }
  update_moving_averages(variables);
  ++iterations_;
}

void OptimizerBase::update_moving_averages(std::span<Variable*> variables) {
  if (!options_.use_ema) return;
  // Keras 3's `_update_model_variables_moving_average`: the momentum is 0 on the first step, so
  // that the average starts at the weights.
  const auto momentum = static_cast<float>(iterations_ == 0 ? 0.0 : options_.ema_momentum);
  const std::size_t averages = slots_per_variable_ * scratch_.size();
  std::size_t index = 0;
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    backend().on_host({v->value, slots_[averages + index].value},
                      [&](std::span<const Tensor<float>> t) {
                        ArrayMap average = array_of(t[1]);
                        average = momentum * average + (1.0F - momentum) * array_of(t[0]);
                      });
    ++index;
  }
  if (options_.ema_overwrite_frequency &&
      (iterations_ + 1) % *options_.ema_overwrite_frequency == 0)
    overwrite_with_averages(variables);
}

void OptimizerBase::overwrite_with_averages(std::span<Variable*> variables) {
  const std::size_t averages = slots_per_variable_ * scratch_.size();
  std::size_t index = 0;
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    backend().on_host({v->value, slots_[averages + index].value},
                      [](std::span<const Tensor<float>> t) { array_of(t[0]) = array_of(t[1]); });
    ++index;
  }
}

void OptimizerBase::finalize_variable_values(std::span<Variable*> variables) {
  if (!options_.use_ema || !built_) return;
  std::size_t trainable = 0;
  for (const Variable* v : variables)
    trainable += v->trainable ? 1 : 0;
  if (trainable != scratch_.size()) {
    throw ConfigError(name() + ": holds the moving averages of " + std::to_string(scratch_.size()) +
                      " trainable variables but is given " + std::to_string(trainable));
  }
  overwrite_with_averages(variables);
}

void OptimizerBase::set_backend(std::shared_ptr<Backend> backend) {
  // Slots made on another backend's memory move through the host.
  Backend& from = this->backend();
  Optimizer::set_backend(std::move(backend));
  Backend& to = this->backend();
  if (from.device() == to.device()) return;
  for (auto& slot : slots_)
    slot.value = to.from_host(from.to_host(slot.value));
  for (auto& scratch : scratch_)
    if (!scratch.empty()) scratch = to.allocate(scratch.shape());
}

nlohmann::json OptimizerBase::get_config() const {
  nlohmann::json config = {{"name", name()}, {"learning_rate", learning_rate_.get_config()}};
  config["clipnorm"] = options_.clipnorm ? nlohmann::json(*options_.clipnorm) : nullptr;
  config["global_clipnorm"] =
      options_.global_clipnorm ? nlohmann::json(*options_.global_clipnorm) : nullptr;
  config["clipvalue"] = options_.clipvalue ? nlohmann::json(*options_.clipvalue) : nullptr;
  config["weight_decay"] = options_.weight_decay ? nlohmann::json(*options_.weight_decay) : nullptr;
  config["use_ema"] = options_.use_ema;
  config["ema_momentum"] = options_.ema_momentum;
  config["ema_overwrite_frequency"] = options_.ema_overwrite_frequency
                                          ? nlohmann::json(*options_.ema_overwrite_frequency)
                                          : nullptr;
  // The rest of Keras 3's base config (and tf.keras 2.11+'s), so that Keras reads it back.
  config["loss_scale_factor"] = nullptr;
  config["gradient_accumulation_steps"] = nullptr;
  config["jit_compile"] = false;
  config["is_legacy_optimizer"] = false;
  return config;
}

// `var_names` as one pattern, as Keras's `re.compile("|".join(set(var_names)))`.
inline std::regex excluded_pattern(const std::string& optimizer,
                                   const std::vector<std::string>& names) {
  std::string joined;
  for (const std::string& name : names)
    joined += (joined.empty() ? "(?:" : "|(?:") + name + ")";
  try {
    return std::regex(joined, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw ConfigError(optimizer +
                      ": exclude_from_weight_decay: expected var_names to be regular "
                      "expressions but found '" +
                      joined + "' (" + e.what() + ")");
  }
}

void OptimizerBase::exclude_from_weight_decay(std::span<const Variable* const> var_list,
                                              const std::vector<std::string>& var_names) {
  if (built_) {
    throw ConfigError(name() +
                      ": exclude_from_weight_decay: expected to be called before the "
                      "optimizer is built but it is built (for " +
                      std::to_string(scratch_.size()) + " trainable variables)");
  }
  if (!var_names.empty()) static_cast<void>(excluded_pattern(name(), var_names));
  excluded_variables_.assign(var_list.begin(), var_list.end());
  excluded_names_ = var_names;
}

bool OptimizerBase::decays(const Variable& variable, const std::regex* pattern) const {
  if (std::find(excluded_variables_.begin(), excluded_variables_.end(), &variable) !=
      excluded_variables_.end())
    return false;
  return pattern == nullptr || !std::regex_search(variable.name, *pattern);
}

ArrayMap OptimizerBase::slot([[maybe_unused]] std::size_t index, std::size_t k) {
  LOADSTAR_ASSERT(k < current_slots_.size(), "slot: only valid inside update_step");
  return array_of(current_slots_[k]);
}

void OptimizerBase::build(std::span<Variable*> variables) {
  if (built_) {
    std::size_t trainable = 0;
    for (const Variable* v : variables)
      trainable += v->trainable ? 1 : 0;
    if (trainable != scratch_.size()) {
      throw ConfigError(name() + ": was built for " + std::to_string(scratch_.size()) +
                        " trainable variables but is given " + std::to_string(trainable));
    }
    return;
  }
  build(this->backend(), variables);
}

void OptimizerBase::build(Backend& backend, std::span<Variable*> variables) {
  const std::vector<std::string> names = slot_names();
  LOADSTAR_ASSERT(names.size() <= max_slots, "too many slots per variable");
  const std::optional<std::regex> pattern =
      excluded_names_.empty() ? std::nullopt
                              : std::optional(excluded_pattern(name(), excluded_names_));
  slots_per_variable_ = names.size();
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    if (v->gradient.size() != v->value.size()) {
      throw ShapeError(name() + ": variable '" + v->name + "' has shape " + v->value.shape().str() +
                       " but its gradient has shape " + v->gradient.shape().str());
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tensor<float> slot = backend.allocate(slot_shape(k, v->value.shape()));
      if (const float initial = slot_initial_value(k); initial != 0.0F) backend.fill(slot, initial);
      slots_.push_back(Variable{names[k] + "/" + v->name, slot, Tensor<float>(), false});
    }
    scratch_.push_back(options_.clipnorm || options_.global_clipnorm || options_.clipvalue
                           ? backend.allocate(v->value.shape())
                           : Tensor<float>());
    decays_.push_back(decays(*v, pattern ? &*pattern : nullptr) ? 1 : 0);
  }
  if (options_.use_ema) {
    for (Variable* v : variables) {
      if (!v->trainable) continue;
      slots_.push_back(Variable{"average/" + v->name, backend.allocate(v->value.shape()),
                                Tensor<float>(), false});
    }
  }
  built_ = true;
}

}  // namespace loadstar::keras::detail
#endif
