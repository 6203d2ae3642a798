/// \file
/// `Adamax`, as Keras 3's `keras.optimizers.Adamax` (and tf.keras 2.11+'s).
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

/// `Adamax`'s arguments, with Keras's defaults.
struct AdamaxOptions {
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
  std::string name = "Adamax";
};

/// Keras's Adamax: `m += (g - m) * (1 - beta_1)`, `u = max(beta_2 * u, |g|)`,
/// `w -= lr * m / ((1 - beta_1^t) * (u + epsilon))` (PyTorch's `Adamax` adds epsilon inside the
/// maximum instead).
/// \code
/// optimizers::Adamax adamax({.learning_rate = 2e-3});
/// \endcode
class Adamax : public detail::OptimizerBase {
 public:
  explicit Adamax(const AdamaxOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        beta_1_(options.beta_1),
        beta_2_(options.beta_2),
        epsilon_(options.epsilon) {}
  std::string class_name() const override { return "Adamax"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"m", "u"}; }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double beta_1_, beta_2_, epsilon_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Adamax::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Adamax");
  auto options = detail::read_optimizer_options(read, AdamaxOptions{});
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  options.epsilon = read.get("epsilon", options.epsilon);
  return std::make_unique<Adamax>(options);
}

nlohmann::json Adamax::get_config() const {
  auto config = OptimizerBase::get_config();
  config["beta_1"] = beta_1_;
  config["beta_2"] = beta_2_;
  config["epsilon"] = epsilon_;
  return config;
}

std::optional<UpdateOperands> Adamax::update_operands(float lr) const {
  const auto step = static_cast<double>(iterations_ + 1);
  UpdateOperands p;
  p.rule = UpdateRule::adamax;
  p.learning_rate = lr;
  p.alpha = static_cast<float>(lr / (1.0 - std::pow(beta_1_, step)));
  p.one_minus_beta_1 = static_cast<float>(1.0 - beta_1_);
  p.beta_2 = static_cast<float>(beta_2_);
  p.epsilon = static_cast<float>(epsilon_);
  return p;
}

void Adamax::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                         float lr) {
  detail::ArrayMap m = slot(index, 0);
  detail::ArrayMap u = slot(index, 1);
  detail::update_rules::adamax<detail::ArrayMath>(*update_operands(lr), w, g, m, u);
}

}  // namespace loadstar::keras::optimizers
#endif
