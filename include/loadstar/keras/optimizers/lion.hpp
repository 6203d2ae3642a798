/// \file
/// `Lion`, as Keras 3's `keras.optimizers.Lion` (and tf.keras 2.11+'s).
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

/// `Lion`'s arguments, with Keras's defaults.
struct LionOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.99;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Lion";
};

/// Keras's Lion: `w -= lr * sign(beta_1 * m + (1 - beta_1) * g)`, then
/// `m = beta_2 * m + (1 - beta_2) * g`. Throws `ConfigError` unless `beta_1` is in (0, 1].
/// \code
/// optimizers::Lion lion({.learning_rate = 1e-4});
/// \endcode
class Lion : public detail::OptimizerBase {
 public:
  LOADSTAR_DECL explicit Lion(const LionOptions& options = {});
  std::string class_name() const override { return "Lion"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"m"}; }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double beta_1_, beta_2_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

Lion::Lion(const LionOptions& options)
    : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
      beta_1_(options.beta_1),
      beta_2_(options.beta_2) {
  // Keras: with beta_1 outside (0, 1] the optimizer degenerates to SignSGD.
  if (!(beta_1_ > 0 && beta_1_ <= 1)) {
    throw ConfigError(name() + ": beta_1 must be in (0, 1] but is " + std::to_string(beta_1_));
  }
}

std::unique_ptr<Optimizer> Lion::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Lion");
  auto options = detail::read_optimizer_options(read, LionOptions{});
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  return std::make_unique<Lion>(options);
}

nlohmann::json Lion::get_config() const {
  auto config = OptimizerBase::get_config();
  config["beta_1"] = beta_1_;
  config["beta_2"] = beta_2_;
  return config;
}

std::optional<UpdateOperands> Lion::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = UpdateRule::lion;
  p.learning_rate = lr;
  p.beta_1 = static_cast<float>(beta_1_);
  p.beta_2 = static_cast<float>(beta_2_);
  return p;
}

void Lion::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g, float lr) {
  detail::ArrayMap m = slot(index, 0);
  detail::update_rules::lion<detail::ArrayMath>(*update_operands(lr), w, g, m);
}

}  // namespace loadstar::keras::optimizers
#endif
