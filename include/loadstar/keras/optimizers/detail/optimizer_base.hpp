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
  template <class X, class Y>
  static auto max(const X& x, const Y& y) {
    return x.max(y);
  }
};

/// The options every optimizer takes, as Keras 2.11+'s `Optimizer.__init__`.
struct Clipping {
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
};

/// The base of the optimizers: `Derived` lists its slot names (`slot_names()`) and updates one
/// variable in `update_step(std::size_t index, ArrayMap value, const ArrayMap& gradient,
/// float learning_rate)`, reading its slots with `slot(index, k)`.
///
/// Clipping follows Keras 2.11+'s `Optimizer._clip_gradients`: `clipnorm` (each gradient scaled
/// to at most that L2 norm) if set, else `global_clipnorm` (all gradients scaled together), else
/// `clipvalue` (element-wise). Clipped gradients go to scratch buffers made on the first step, so
/// the caller's gradients are left untouched.
class OptimizerBase : public Optimizer {
 public:
  LOADSTAR_DECL OptimizerBase(std::string name, optimizers::LearningRate learning_rate,
                              Clipping clipping);

  LOADSTAR_DECL void apply_gradients(std::span<Variable*> variables) override;

  LOADSTAR_DECL void set_backend(std::shared_ptr<Backend> backend) override;

  double learning_rate() const override { return learning_rate_.at(iterations_); }
  void set_learning_rate(double learning_rate) override { learning_rate_ = learning_rate; }
  std::span<Variable> variables() noexcept override { return slots_; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  /// The names of the slots each trainable variable gets, in creation order.
  virtual std::vector<std::string> slot_names() const = 0;
  /// The initial value of slot `k`.
  virtual float slot_initial_value(std::size_t) const { return 0.0f; }
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
    return step;
  }

  /// The most slots a variable has.
  static constexpr std::size_t max_slots = VariableSlots::max_slots;

  /// Slot `k` of trainable variable `index` (the one `update_step` is updating): a host view,
  /// valid during `update_step` only.
  LOADSTAR_DECL ArrayMap slot([[maybe_unused]] std::size_t index, std::size_t k);

 public:
  /// Creates the slot variables of the trainable `variables` (Keras's `optimizer.build(var_list)`)
  /// before the first step, so that slots read from a checkpoint have somewhere to go
  /// (`variables()` lists them). The first `apply_gradients` builds the optimizer when this was not
  /// called; either way the slots and the steps are the same. A second call does nothing when
  /// given as many trainable variables, and throws `ConfigError` otherwise.
  LOADSTAR_DECL void build(std::span<Variable*> variables) override;

  bool built() const noexcept override { return built_; }

 private:
  // Keras 2.11+ names a slot `<slot>/<variable>` (`add_variable_from_reference`): "m/kernel".
  LOADSTAR_DECL void build(Backend& backend, std::span<Variable*> variables);

 private:
  optimizers::LearningRate learning_rate_;
  Clipping clipping_;
  std::vector<Variable> slots_;
  std::vector<Tensor<float>> scratch_, gradients_;
  std::vector<VariableSlots> device_variables_;  // reused: no allocation after the first step
  std::span<const Tensor<float>> current_slots_;
  std::size_t slots_per_variable_ = 0;
  bool built_ = false;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

OptimizerBase::OptimizerBase(std::string name, optimizers::LearningRate learning_rate,
                             Clipping clipping)
    : Optimizer(std::move(name)), learning_rate_(std::move(learning_rate)), clipping_(clipping) {
  if (clipping.clipnorm && clipping.global_clipnorm) {
    throw ConfigError(this->name() +
                      ": at most one of clipnorm and global_clipnorm can be set "
                      "but clipnorm is " +
                      std::to_string(*clipping.clipnorm) + " and global_clipnorm is " +
                      std::to_string(*clipping.global_clipnorm));
  }
}

void OptimizerBase::apply_gradients(std::span<Variable*> variables) {
  Backend& backend = this->backend();
  if (!built_) build(backend, variables);
  const auto learning_rate = static_cast<float>(learning_rate_.at(iterations_));
  float scale = 1.0f;
  const bool by_norm = clipping_.clipnorm && *clipping_.clipnorm > 0;
  const bool by_global = !by_norm && clipping_.global_clipnorm && *clipping_.global_clipnorm > 0;
  const bool by_value = !by_norm && !by_global && clipping_.clipvalue && *clipping_.clipvalue > 0;
  // The backend's fused step over every variable at once when it has one (a device backend);
  // otherwise one host kernel per variable below.
  if (std::optional<OptimizerStep> step = device_step(learning_rate)) {
    if (by_norm) {
      step->clipping = GradientClipping::by_norm;
      step->clip_threshold = *clipping_.clipnorm;
    } else if (by_global) {
      step->clipping = GradientClipping::by_global_norm;
      step->clip_threshold = *clipping_.global_clipnorm;
    } else if (by_value) {
      step->clipping = GradientClipping::by_value;
      step->clip_threshold = *clipping_.clipvalue;
    }
    device_variables_.resize(scratch_.size());
    std::size_t trainable = 0;
    for (Variable* v : variables) {
      if (!v->trainable) continue;
      LOADSTAR_ASSERT(trainable < device_variables_.size(), "apply_gradients: variables changed");
      VariableSlots& d = device_variables_[trainable];
      d.value = v->value;
      d.gradient = v->gradient;
      for (std::size_t k = 0; k < VariableSlots::max_slots; ++k)
        d.slots[k] = k < slots_per_variable_ ? slots_[trainable * slots_per_variable_ + k].value
                                             : Tensor<float>();
      ++trainable;
    }
    LOADSTAR_ASSERT(trainable == device_variables_.size(), "apply_gradients: variables changed");
    // The CPU backend declines (false): its step is the host code below, bit for bit as before.
    if (backend.apply_optimizer_step(*step, device_variables_)) {
      ++iterations_;
      return;
    }
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
    scale = clip_scale(squares, *clipping_.global_clipnorm);
  }
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
          if (by_norm) {
            scale = clip_scale(gradient.cast<double>().square().sum(), *clipping_.clipnorm);
          }
          if (by_norm || by_global || by_value) {
            ArrayMap clipped = array_of(t[2]);
            if (by_value) {
              const auto c = static_cast<float>(*clipping_.clipvalue);
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
  ++iterations_;
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
  config["clipnorm"] = clipping_.clipnorm ? nlohmann::json(*clipping_.clipnorm) : nullptr;
  config["global_clipnorm"] =
      clipping_.global_clipnorm ? nlohmann::json(*clipping_.global_clipnorm) : nullptr;
  config["clipvalue"] = clipping_.clipvalue ? nlohmann::json(*clipping_.clipvalue) : nullptr;
  // The rest of Keras 2.11+'s base config, so that Keras reads the config back.
  config["weight_decay"] = nullptr;
  config["use_ema"] = false;
  config["ema_momentum"] = 0.99;
  config["ema_overwrite_frequency"] = nullptr;
  config["jit_compile"] = false;
  config["is_legacy_optimizer"] = false;
  return config;
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
  slots_per_variable_ = names.size();
  for (Variable* v : variables) {
    if (!v->trainable) continue;
    if (v->gradient.size() != v->value.size()) {
      throw ShapeError(name() + ": variable '" + v->name + "' has shape " + v->value.shape().str() +
                       " but its gradient has shape " + v->gradient.shape().str());
    }
    for (std::size_t k = 0; k < names.size(); ++k) {
      Tensor<float> slot = backend.allocate(v->value.shape());
      if (const float initial = slot_initial_value(k); initial != 0.0F) backend.fill(slot, initial);
      slots_.push_back(Variable{names[k] + "/" + v->name, slot, Tensor<float>(), false});
    }
    scratch_.push_back(clipping_.clipnorm || clipping_.global_clipnorm || clipping_.clipvalue
                           ? backend.allocate(v->value.shape())
                           : Tensor<float>());
  }
  built_ = true;
}

}  // namespace loadstar::keras::detail
#endif
