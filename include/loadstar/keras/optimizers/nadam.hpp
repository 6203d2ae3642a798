/// \file
/// `Nadam`, as Keras 3's `keras.optimizers.Nadam` (and tf.keras 2.11+'s).
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/optimizers/detail/optimizer_base.hpp"
#include "loadstar/keras/optimizers/detail/optimizer_config.hpp"

namespace loadstar::keras::optimizers {

/// `Nadam`'s arguments, with Keras's defaults.
struct NadamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Nadam";
};

/// Keras's Nadam: Adam's moments `m`, `v` with Nesterov momentum through the momentum cache
/// `u_t = beta_1 * (1 - 0.5 * 0.96^t)` and its running product (`update_rules::nadam`). The
/// product is a function of the step, so it is recomputed from `iterations()` (a checkpoint holds
/// the step) rather than kept as a variable. PyTorch's `NAdam` is the same with
/// `momentum_decay=1`, not its default 0.004.
/// \code
/// optimizers::Nadam nadam({.learning_rate = 2e-3});
/// \endcode
class Nadam : public detail::OptimizerBase {
 public:
  explicit Nadam(const NadamOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        beta_1_(options.beta_1),
        beta_2_(options.beta_2),
        epsilon_(options.epsilon) {}
  std::string class_name() const override { return "Nadam"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"m", "v"}; }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double beta_1_, beta_2_, epsilon_;
  // The product of the momentum cache up to `u_product_step_` (1 at step 0), kept so that a step
  // multiplies one factor; recomputed when the step jumps (`set_iterations`).
  mutable double u_product_ = 1.0;
  mutable std::int64_t u_product_step_ = 0;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Nadam::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Nadam");
  auto options = detail::read_optimizer_options(read, NadamOptions{});
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  options.epsilon = read.get("epsilon", options.epsilon);
  return std::make_unique<Nadam>(options);
}

nlohmann::json Nadam::get_config() const {
  auto config = OptimizerBase::get_config();
  config["beta_1"] = beta_1_;
  config["beta_2"] = beta_2_;
  config["epsilon"] = epsilon_;
  return config;
}

std::optional<UpdateOperands> Nadam::update_operands(float lr) const {
  const auto u = [&](std::int64_t step) {
    return beta_1_ * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(step)));
  };
  const std::int64_t t = iterations_ + 1;
  if (u_product_step_ > t) {
    u_product_ = 1.0;
    u_product_step_ = 0;
  }
  for (; u_product_step_ < t; ++u_product_step_)
    u_product_ *= u(u_product_step_ + 1);
  const double u_t = u(t), u_next = u(t + 1);
  UpdateOperands p;
  p.rule = UpdateRule::nadam;
  p.learning_rate = lr;
  p.one_minus_beta_1 = static_cast<float>(1.0 - beta_1_);
  p.one_minus_beta_2 = static_cast<float>(1.0 - beta_2_);
  p.momentum_coefficient = static_cast<float>(u_next / (1.0 - u_product_ * u_next));
  p.gradient_coefficient = static_cast<float>((1.0 - u_t) / (1.0 - u_product_));
  p.velocity_correction = static_cast<float>(1.0 - std::pow(beta_2_, static_cast<double>(t)));
  p.epsilon = static_cast<float>(epsilon_);
  return p;
}

void Nadam::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                        float lr) {
  detail::ArrayMap m = slot(index, 0);
  detail::ArrayMap v = slot(index, 1);
  detail::update_rules::nadam<detail::ArrayMath>(*update_operands(lr), w, g, m, v);
}

}  // namespace loadstar::keras::optimizers
#endif
