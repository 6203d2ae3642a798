/// \file
/// `AdamW`: Adam with decoupled weight decay, as Keras 2.11+'s `tf.keras.optimizers.AdamW`.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
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
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "AdamW";
};

/// Adam whose step first decays each weight, `w -= lr * weight_decay * w` (Keras 3's
/// `_apply_weight_decay`, applied before the gradient step with the same learning rate, which
/// every optimizer applies with its `weight_decay`): Adam with a default `weight_decay` of 0.004.
/// \code
/// optimizers::AdamW adamw({.learning_rate = 1e-3, .weight_decay = 0.01});
/// \endcode
class AdamW : public detail::AdamBase {
 public:
  explicit AdamW(const AdamWOptions& options = {})
      : AdamBase(AdamOptions{options.learning_rate, options.beta_1, options.beta_2, options.epsilon,
                             options.amsgrad, options.clipnorm, options.global_clipnorm,
                             options.clipvalue, options.weight_decay, options.use_ema,
                             options.ema_momentum, options.ema_overwrite_frequency, options.name}) {
  }
  std::string class_name() const override { return "AdamW"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> AdamW::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "AdamW");
  auto options = detail::read_optimizer_options(read, AdamWOptions{});
  // Keras 3's AdamW refuses a null weight_decay; an absent one is its default.
  if (const nlohmann::json* decay = read.find("weight_decay"); decay != nullptr && decay->is_null())
    read.fail("weight_decay", "a number (AdamW decays weights)");
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  options.epsilon = read.get("epsilon", options.epsilon);
  options.amsgrad = read.get("amsgrad", options.amsgrad);
  return std::make_unique<AdamW>(options);
}

}  // namespace loadstar::keras::optimizers
#endif
