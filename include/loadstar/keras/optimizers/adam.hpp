/// \file
/// `Adam`, as `tf.keras.optimizers.Adam` (Keras 2.11+).
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

/// `Adam`'s arguments, with Keras's defaults.
struct AdamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  bool amsgrad = false;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Adam";
};

}  // namespace loadstar::keras::optimizers

namespace loadstar::keras::detail {

/// Adam's step, shared with AdamW: Keras 2.11+'s `Adam.update_step` (the same formula as the
/// legacy `ResourceApplyAdam`), with the "epsilon hat" placement:
/// `alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`, `m += (g - m) * (1 - beta_1)`,
/// `v += (g^2 - v) * (1 - beta_2)`, (`vhat = max(vhat, v)` with amsgrad),
/// `w -= alpha * m / (sqrt(v) + epsilon)`. PyTorch's Adam puts epsilon outside the bias
/// correction of `v` instead.
class AdamBase : public OptimizerBase {
 public:
  explicit AdamBase(const optimizers::AdamOptions& options)
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        beta_1_(options.beta_1),
        beta_2_(options.beta_2),
        epsilon_(options.epsilon),
        amsgrad_(options.amsgrad) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  LOADSTAR_DECL std::vector<std::string> slot_names() const override;
  LOADSTAR_DECL void update_step(std::size_t index, ArrayMap w, const ArrayMap& g,
                                 float lr) override;
  LOADSTAR_DECL std::optional<UpdateOperands> update_operands(float lr) const override;

  double beta_1_, beta_2_, epsilon_;
  bool amsgrad_;
};

}  // namespace loadstar::keras::detail

namespace loadstar::keras::optimizers {

/// Adam with Keras's defaults and slots `"m"`, `"v"` (and `"vhat"` with amsgrad) per variable.
/// \code
/// optimizers::Adam adam({.learning_rate = 3e-4});
/// adam.apply_gradients(variables);
/// \endcode
class Adam : public detail::AdamBase {
 public:
  explicit Adam(const AdamOptions& options = {}) : AdamBase(options) {}
  std::string class_name() const override { return "Adam"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

nlohmann::json AdamBase::get_config() const {
  auto config = OptimizerBase::get_config();
  config["beta_1"] = beta_1_;
  config["beta_2"] = beta_2_;
  config["epsilon"] = epsilon_;
  config["amsgrad"] = amsgrad_;
  return config;
}

std::vector<std::string> AdamBase::slot_names() const {
  if (amsgrad_) return {"m", "v", "vhat"};
  return {"m", "v"};
}

std::optional<UpdateOperands> AdamBase::update_operands(float lr) const {
  const auto step = static_cast<double>(iterations_ + 1);
  UpdateOperands p;
  p.rule = UpdateRule::adam;
  p.learning_rate = lr;
  p.alpha = static_cast<float>(lr * std::sqrt(1.0 - std::pow(beta_2_, step)) /
                               (1.0 - std::pow(beta_1_, step)));
  p.one_minus_beta_1 = static_cast<float>(1.0 - beta_1_);
  p.one_minus_beta_2 = static_cast<float>(1.0 - beta_2_);
  p.epsilon = static_cast<float>(epsilon_);
  p.amsgrad = amsgrad_;
  return p;
}

void AdamBase::update_step(std::size_t index, ArrayMap w, const ArrayMap& g, float lr) {
  const UpdateOperands p = *update_operands(lr);
  ArrayMap m = slot(index, 0);
  ArrayMap v = slot(index, 1);
  if (amsgrad_) {
    ArrayMap v_hat = slot(index, 2);
    update_rules::adam_amsgrad<ArrayMath>(p, w, g, m, v, v_hat);
    return;
  }
  // Block by block, so that the rule's array statements read each block from cache and the step
  // reads and writes each array once (the same operations per element, so the same bits).
  constexpr Eigen::Index block = 2048;
  for (Eigen::Index i = 0; i < w.size(); i += block) {
    const Eigen::Index length = std::min(block, w.size() - i);
    auto ws = w.segment(i, length);
    auto ms = m.segment(i, length);
    auto vs = v.segment(i, length);
    const auto gs = g.segment(i, length);
    update_rules::adam<ArrayMath>(p, ws, gs, ms, vs);
  }
}

}  // namespace loadstar::keras::detail
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Adam::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Adam");
  auto options = detail::read_optimizer_options(read, AdamOptions{});
  options.beta_1 = read.get("beta_1", options.beta_1);
  options.beta_2 = read.get("beta_2", options.beta_2);
  options.epsilon = read.get("epsilon", options.epsilon);
  options.amsgrad = read.get("amsgrad", options.amsgrad);
  return std::make_unique<Adam>(options);
}

}  // namespace loadstar::keras::optimizers
#endif
