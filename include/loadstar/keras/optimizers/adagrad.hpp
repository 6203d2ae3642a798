/// \file
/// `Adagrad`, as Keras 2.11+'s `tf.keras.optimizers.Adagrad`.
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

/// `Adagrad`'s arguments, with Keras's defaults.
struct AdagradOptions {
  LearningRate learning_rate = 0.001;
  double initial_accumulator_value = 0.1;
  double epsilon = 1e-7;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Adagrad";
};

/// Keras 2.11+'s Adagrad: `accumulator += g^2`, `w -= lr * g / sqrt(accumulator + epsilon)`
/// (the legacy optimizer and PyTorch put epsilon outside the square root; PyTorch's accumulator
/// starts at 0 and its learning rate is 0.01 by default).
/// \code
/// optimizers::Adagrad adagrad({.learning_rate = 0.01});
/// \endcode
class Adagrad : public detail::OptimizerBase {
 public:
  explicit Adagrad(const AdagradOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        initial_(options.initial_accumulator_value),
        epsilon_(options.epsilon) {}
  std::string class_name() const override { return "Adagrad"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  float slot_initial_value(std::size_t) const override { return static_cast<float>(initial_); }
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double initial_, epsilon_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Adagrad::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Adagrad");
  auto options = detail::read_optimizer_options(read, AdagradOptions{});
  options.initial_accumulator_value =
      read.get("initial_accumulator_value", options.initial_accumulator_value);
  options.epsilon = read.get("epsilon", options.epsilon);
  return std::make_unique<Adagrad>(options);
}

nlohmann::json Adagrad::get_config() const {
  auto config = OptimizerBase::get_config();
  config["initial_accumulator_value"] = initial_;
  config["epsilon"] = epsilon_;
  return config;
}

std::optional<UpdateOperands> Adagrad::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = UpdateRule::adagrad;
  p.learning_rate = lr;
  p.epsilon = static_cast<float>(epsilon_);
  return p;
}

void Adagrad::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                          float lr) {
  detail::ArrayMap accumulator = slot(index, 0);
  detail::update_rules::adagrad<detail::ArrayMath>(*update_operands(lr), w, g, accumulator);
}

}  // namespace loadstar::keras::optimizers
#endif
