/// \file
/// `Adadelta`, as Keras 2.11+'s `tf.keras.optimizers.Adadelta`.
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

/// `Adadelta`'s arguments, with Keras's defaults.
struct AdadeltaOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.95;
  double epsilon = 1e-7;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Adadelta";
};

/// Keras's Adadelta: `accumulated_grad = rho * accumulated_grad + (1 - rho) * g^2`,
/// `delta = -sqrt(accumulated_delta_var + epsilon) * g / sqrt(accumulated_grad + epsilon)`,
/// `accumulated_delta_var = rho * accumulated_delta_var + (1 - rho) * delta^2`, `w += lr * delta`
/// (PyTorch's defaults differ: lr 1.0, rho 0.9, eps 1e-6).
/// \code
/// optimizers::Adadelta adadelta({.learning_rate = 1.0});
/// \endcode
class Adadelta : public detail::OptimizerBase {
 public:
  explicit Adadelta(const AdadeltaOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        rho_(options.rho),
        epsilon_(options.epsilon) {}
  std::string class_name() const override { return "Adadelta"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override {
    return {"accumulated_grad", "accumulated_delta_var"};
  }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double rho_, epsilon_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Adadelta::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Adadelta");
  auto options = detail::read_optimizer_options(read, AdadeltaOptions{});
  options.rho = read.get("rho", options.rho);
  options.epsilon = read.get("epsilon", options.epsilon);
  return std::make_unique<Adadelta>(options);
}

nlohmann::json Adadelta::get_config() const {
  auto config = OptimizerBase::get_config();
  config["rho"] = rho_;
  config["epsilon"] = epsilon_;
  return config;
}

std::optional<UpdateOperands> Adadelta::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = UpdateRule::adadelta;
  p.learning_rate = lr;
  p.rho = static_cast<float>(rho_);
  p.epsilon = static_cast<float>(epsilon_);
  return p;
}

void Adadelta::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                           float lr) {
  detail::ArrayMap accumulated_grad = slot(index, 0);
  detail::ArrayMap accumulated_delta = slot(index, 1);
  detail::update_rules::adadelta<detail::ArrayMath>(*update_operands(lr), w, g, accumulated_grad,
                                                    accumulated_delta);
}

}  // namespace loadstar::keras::optimizers
#endif
