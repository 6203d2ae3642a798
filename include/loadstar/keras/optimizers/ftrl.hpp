/// \file
/// `Ftrl`, as Keras 3's `keras.optimizers.Ftrl` (and tf.keras 2.11+'s).
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

/// `Ftrl`'s arguments, with Keras's defaults.
struct FtrlOptions {
  LearningRate learning_rate = 0.001;
  double learning_rate_power = -0.5;
  double initial_accumulator_value = 0.1;
  double l1_regularization_strength = 0.0;
  double l2_regularization_strength = 0.0;
  double l2_shrinkage_regularization_strength = 0.0;
  double beta = 0.0;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Ftrl";
};

/// Keras's FTRL-Proximal: slots `accumulator` (starting at `initial_accumulator_value`) and
/// `linear`, updated by `update_rules::ftrl`, with L1, L2 and L2-shrinkage regularization and
/// `beta` added to the L2 strength as `beta / (2 lr)`. Throws `ConfigError` for a positive
/// `learning_rate_power` or a negative accumulator value or strength.
/// \code
/// optimizers::Ftrl ftrl({.learning_rate = 0.05, .l1_regularization_strength = 0.01});
/// \endcode
class Ftrl : public detail::OptimizerBase {
 public:
  LOADSTAR_DECL explicit Ftrl(const FtrlOptions& options = {});
  std::string class_name() const override { return "Ftrl"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"accumulator", "linear"}; }
  float slot_initial_value(std::size_t k) const override {
    return k == 0 ? static_cast<float>(settings_.initial_accumulator_value) : 0.0F;
  }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  FtrlOptions settings_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

Ftrl::Ftrl(const FtrlOptions& options)
    : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
      settings_(options) {
  const auto non_negative = [&](const char* key, double value) {
    if (!(value >= 0)) {
      throw ConfigError(name() + ": " + key + " must be positive or zero but is " +
                        std::to_string(value));
    }
  };
  non_negative("initial_accumulator_value", options.initial_accumulator_value);
  if (!(options.learning_rate_power <= 0)) {
    throw ConfigError(name() + ": learning_rate_power must be negative or zero but is " +
                      std::to_string(options.learning_rate_power));
  }
  non_negative("l1_regularization_strength", options.l1_regularization_strength);
  non_negative("l2_regularization_strength", options.l2_regularization_strength);
  non_negative("l2_shrinkage_regularization_strength",
               options.l2_shrinkage_regularization_strength);
}

std::unique_ptr<Optimizer> Ftrl::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Ftrl");
  auto options = detail::read_optimizer_options(read, FtrlOptions{});
  options.learning_rate_power = read.get("learning_rate_power", options.learning_rate_power);
  options.initial_accumulator_value =
      read.get("initial_accumulator_value", options.initial_accumulator_value);
  options.l1_regularization_strength =
      read.get("l1_regularization_strength", options.l1_regularization_strength);
  options.l2_regularization_strength =
      read.get("l2_regularization_strength", options.l2_regularization_strength);
  options.l2_shrinkage_regularization_strength = read.get(
      "l2_shrinkage_regularization_strength", options.l2_shrinkage_regularization_strength);
  options.beta = read.get("beta", options.beta);
  return std::make_unique<Ftrl>(options);
}

nlohmann::json Ftrl::get_config() const {
  auto config = OptimizerBase::get_config();
  config["learning_rate_power"] = settings_.learning_rate_power;
  config["initial_accumulator_value"] = settings_.initial_accumulator_value;
  config["l1_regularization_strength"] = settings_.l1_regularization_strength;
  config["l2_regularization_strength"] = settings_.l2_regularization_strength;
  config["l2_shrinkage_regularization_strength"] = settings_.l2_shrinkage_regularization_strength;
  config["beta"] = settings_.beta;
  return config;
}

std::optional<UpdateOperands> Ftrl::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = UpdateRule::ftrl;
  p.learning_rate = lr;
  p.accumulator_power = static_cast<float>(-settings_.learning_rate_power);
  p.l1 = static_cast<float>(settings_.l1_regularization_strength);
  p.twice_l2 = static_cast<float>(2.0 * (settings_.l2_regularization_strength +
                                         settings_.beta / (2.0 * static_cast<double>(lr))));
  p.twice_l2_shrinkage = static_cast<float>(2.0 * settings_.l2_shrinkage_regularization_strength);
  return p;
}

void Ftrl::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g, float lr) {
  detail::ArrayMap accumulator = slot(index, 0);
  detail::ArrayMap linear = slot(index, 1);
  detail::update_rules::ftrl<detail::ArrayMath>(*update_operands(lr), w, g, accumulator, linear);
}

}  // namespace loadstar::keras::optimizers
#endif
