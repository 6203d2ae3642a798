/// \file
/// `SGD`: gradient descent with optional (Nesterov) momentum, as `tf.keras.optimizers.SGD`.
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

/// `SGD`'s arguments, with Keras's defaults.
struct SGDOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0.0;
  bool nesterov = false;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "SGD";
};

/// Keras's SGD: without momentum `w -= lr * g`; with momentum, a slot `"momentum"` per variable,
/// `velocity = momentum * velocity - lr * g`, then `w += velocity`, or with Nesterov
/// `w += momentum * velocity - lr * g`.
/// \code
/// optimizers::SGD sgd({.learning_rate = 0.1, .momentum = 0.9, .nesterov = true});
/// sgd.apply_gradients(variables);
/// \endcode
class SGD : public detail::OptimizerBase {
 public:
  LOADSTAR_DECL explicit SGD(SGDOptions options = {});
  std::string class_name() const override { return "SGD"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  // Slots exist only with momentum, as Keras's legacy SGD (the 2.11+ one names them "m").
  LOADSTAR_DECL std::vector<std::string> slot_names() const override;
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

 private:
  double momentum_;
  bool nesterov_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

SGD::SGD(SGDOptions options)
    : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
      momentum_(options.momentum),
      nesterov_(options.nesterov) {
  if (momentum_ < 0 || momentum_ > 1) {
    throw ConfigError(name() + ": momentum must be in [0, 1] but is " + std::to_string(momentum_));
  }
}

std::unique_ptr<Optimizer> SGD::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "SGD");
  auto options = detail::read_optimizer_options(read, SGDOptions{});
  options.momentum = read.get("momentum", options.momentum);
  options.nesterov = read.get("nesterov", options.nesterov);
  return std::make_unique<SGD>(options);
}

nlohmann::json SGD::get_config() const {
  auto config = OptimizerBase::get_config();
  config["momentum"] = momentum_;
  config["nesterov"] = nesterov_;
  return config;
}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ == 0) return {};
  return {"momentum"};
}

std::optional<UpdateOperands> SGD::update_operands(float lr) const {
  UpdateOperands p;
  p.rule = momentum_ == 0 ? UpdateRule::sgd : UpdateRule::sgd_momentum;
  p.learning_rate = lr;
  p.momentum = static_cast<float>(momentum_);
  p.nesterov = nesterov_;
  return p;
}

void SGD::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g, float lr) {
  const UpdateOperands p = *update_operands(lr);
  if (p.rule == UpdateRule::sgd) {
    detail::update_rules::sgd<detail::ArrayMath>(p, w, g);
    return;
  }
  detail::ArrayMap velocity = slot(index, 0);
  detail::update_rules::sgd_momentum<detail::ArrayMath>(p, w, g, velocity);
}

}  // namespace loadstar::keras::optimizers
#endif
