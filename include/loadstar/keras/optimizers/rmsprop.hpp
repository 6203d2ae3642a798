/// \file
/// `RMSprop`, as Keras 2.11+'s `tf.keras.optimizers.RMSprop`.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/optimizers/detail/optimizer_base.hpp"
#include "loadstar/keras/optimizers/detail/optimizer_config.hpp"

namespace loadstar::keras::optimizers {

/// `RMSprop`'s arguments, with Keras's defaults.
struct RMSpropOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "RMSprop";
};

/// Keras's RMSprop: `velocity = rho * velocity + (1 - rho) * g^2`; centered, also
/// `average_gradient = rho * average_gradient + (1 - rho) * g` and the denominator
/// `velocity - average_gradient^2 + epsilon`, else `velocity + epsilon`;
/// `increment = lr * g / sqrt(denominator)`; with momentum `momentum_slot = momentum *
/// momentum_slot + increment` and `w -= momentum_slot`, else `w -= increment`. Epsilon sits inside
/// the square root (PyTorch's RMSprop adds it outside, with alpha 0.99 and eps 1e-8 by default).
/// \code
/// optimizers::RMSprop rmsprop({.learning_rate = 1e-3, .centered = true});
/// \endcode
class RMSprop : public detail::OptimizerBase {
 public:
  explicit RMSprop(const RMSpropOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        rho_(options.rho),
        momentum_(options.momentum),
        epsilon_(options.epsilon),
        centered_(options.centered) {}
  std::string class_name() const override { return "RMSprop"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  LOADSTAR_DECL std::vector<std::string> slot_names() const override;
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double rho_, momentum_, epsilon_;
  bool centered_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> RMSprop::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "RMSprop");
  auto options = detail::read_optimizer_options(read, RMSpropOptions{});
  options.rho = read.get("rho", options.rho);
  options.momentum = read.get("momentum", options.momentum);
  options.epsilon = read.get("epsilon", options.epsilon);
  options.centered = read.get("centered", options.centered);
  return std::make_unique<RMSprop>(options);
}

nlohmann::json RMSprop::get_config() const {
  auto config = OptimizerBase::get_config();
  config["rho"] = rho_;
  config["momentum"] = momentum_;
  config["epsilon"] = epsilon_;
  config["centered"] = centered_;
  return config;
}

std::vector<std::string> RMSprop::slot_names() const {
  std::vector<std::string> names{"velocity"};
  if (momentum_ > 0) names.emplace_back("momentum");
  if (centered_) names.emplace_back("average_gradient");
  return names;
}

std::optional<UpdateOperands> RMSprop::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = UpdateRule::rmsprop;
  p.learning_rate = lr;
  p.rho = static_cast<float>(rho_);
  p.momentum = momentum_ > 0 ? static_cast<float>(momentum_) : 0.0F;
  p.epsilon = static_cast<float>(epsilon_);
  p.centered = centered_;
  return p;
}

void RMSprop::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                          float lr) {
  const UpdateOperands p = *update_operands(lr);
  // The slots after `velocity`: `momentum` with momentum, then `average_gradient` when centered;
  // the rule does not touch the one it is not given (here `velocity` again).
  detail::ArrayMap velocity = slot(index, 0);
  detail::ArrayMap momentum = p.momentum > 0 ? slot(index, 1) : velocity;
  detail::ArrayMap average = centered_ ? slot(index, p.momentum > 0 ? 2 : 1) : velocity;
  detail::update_rules::rmsprop<detail::ArrayMath>(p, w, g, velocity, momentum, average);
}

}  // namespace loadstar::keras::optimizers
#endif
