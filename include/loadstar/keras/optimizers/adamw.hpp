/// \file
/// `AdamW`: Adam with decoupled weight decay, as Keras 2.11+'s `tf.keras.optimizers.AdamW`.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <optional>
#include <string>

#include "loadstar/keras/optimizers/adam.hpp"

namespace loadstar::keras::optimizers {

/// `AdamW`'s arguments, with Keras's defaults.
struct AdamWOptions {
  LearningRate learning_rate = 0.001;
  double weight_decay = 0.004;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::string name = "AdamW";
};

/// Adam whose step first decays each weight, `w -= lr * weight_decay * w` (Keras 2.11+'s
/// `Optimizer._apply_weight_decay`, applied before the gradient step with the same learning rate).
/// \code
/// optimizers::AdamW adamw({.learning_rate = 1e-3, .weight_decay = 0.01});
/// \endcode
class AdamW : public detail::AdamBase {
 public:
  explicit AdamW(const AdamWOptions& options = {})
      : AdamBase(AdamOptions{options.learning_rate, options.beta_1, options.beta_2, options.epsilon,
                             options.amsgrad, options.clipnorm, options.global_clipnorm,
                             options.clipvalue, options.name},
                 options.weight_decay) {}
  std::string class_name() const override { return "AdamW"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> AdamW::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "AdamW");
  auto options = detail::read_optimizer_options(read, AdamWOptions{});
  options.weight_decay = read.get("weight_decay", options.weight_decay);
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  options.epsilon = read.get("epsilon", options.epsilon);
  options.amsgrad = read.get("amsgrad", options.amsgrad);
  return std::make_unique<AdamW>(options);
}

nlohmann::json AdamW::get_config() const {
  auto config = AdamBase::get_config();
  config["weight_decay"] = weight_decay_;
  return config;
}

}  // namespace loadstar::keras::optimizers
#endif
