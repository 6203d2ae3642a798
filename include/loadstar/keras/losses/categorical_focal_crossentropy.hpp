/// \file
/// `CategoricalFocalCrossentropy`, as `tf.keras.losses.CategoricalFocalCrossentropy` (axis -1).
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/focal.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The categorical cross-entropy of each class scaled by `alpha * (1 - q) ** gamma`, summed over
/// the last axis, as Keras's `categorical_focal_crossentropy`: `q` is the row divided by its sum
/// (the softmax of the row with `from_logits`), clipped to `[epsilon, 1 - epsilon]` (no gradient
/// where it was clipped). Label smoothing: `y * (1 - s) + s / classes`. Host only on every
/// backend.
/// \code
/// losses::CategoricalFocalCrossentropy focal(/*alpha=*/0.25, /*gamma=*/2.0,
///                                            /*from_logits=*/true);
/// \endcode
class CategoricalFocalCrossentropy : public detail::RowLoss<CategoricalFocalCrossentropy> {
 public:
  /// Throws `ConfigError` for `gamma` below 0, or `alpha` or `label_smoothing` outside [0, 1].
  LOADSTAR_DECL explicit CategoricalFocalCrossentropy(
      double alpha = 0.25, double gamma = 2.0, bool from_logits = false,
      double label_smoothing = 0.0, Reduction reduction = Reduction::sum_over_batch_size,
      std::string name = "categorical_focal_crossentropy");

  std::string class_name() const override { return "CategoricalFocalCrossentropy"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory); throws `ConfigError` for
  /// an `axis` other than -1.
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  bool from_logits() const noexcept { return from_logits_; }

  LOADSTAR_DECL void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const;

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

 private:
  double alpha_;
  double gamma_;
  bool from_logits_;
  double label_smoothing_;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

CategoricalFocalCrossentropy::CategoricalFocalCrossentropy(double alpha, double gamma,
                                                           bool from_logits, double label_smoothing,
                                                           Reduction reduction, std::string name)
    : RowLoss(std::move(name), reduction),
      alpha_(alpha),
      gamma_(gamma),
      from_logits_(from_logits),
      label_smoothing_(label_smoothing) {
  detail::check_focal_arguments(this->name() + " (CategoricalFocalCrossentropy)", alpha, gamma,
                                label_smoothing);
}

std::unique_ptr<Loss> CategoricalFocalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "CategoricalFocalCrossentropy");
  read.expect("axis", -1, "loadstar reduces over the last axis");
  return std::make_unique<CategoricalFocalCrossentropy>(
      read.get("alpha", 0.25), read.get("gamma", 2.0), read.get("from_logits", false),
      read.get("label_smoothing", 0.0), detail::config_reduction(read),
      read.get("name", "categorical_focal_crossentropy"));
}

nlohmann::json CategoricalFocalCrossentropy::get_config() const {
  auto config = Loss::get_config();
  config["alpha"] = alpha_;
  config["gamma"] = gamma_;
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  config["axis"] = -1;
  return config;
}

void CategoricalFocalCrossentropy::check_shapes(const Tensor<float>& y_true,
                                                const Tensor<float>& y_pred) const {
  if (y_true.shape() != y_pred.shape()) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                     " does not match y_pred of shape " + y_pred.shape().str());
  }
}

double CategoricalFocalCrossentropy::row(const float* t, const float* p, std::size_t n, float* g,
                                         double scale) const {
  constexpr double eps = detail::loss_epsilon;
  const double smooth = label_smoothing_ / static_cast<double>(n);
  const double lse = from_logits_ ? detail::log_sum_exp(p, n) : 0.0;
  double total = 0;
  if (!from_logits_) {
    for (std::size_t i = 0; i < n; ++i)
      total += p[i];
  }
  const auto q_of = [&](std::size_t i) {
    return from_logits_ ? std::exp(static_cast<double>(p[i]) - lse) : p[i] / total;
  };
  // d(loss)/d(q_i) of the unclipped q (0 where q was clipped), and its sum weighted by q.
  const auto d_q = [&](std::size_t i, double q) {
    if (!(q >= eps && q <= 1.0 - eps)) return 0.0;
    const double y = t[i] * (1.0 - label_smoothing_) + smooth;
    const double miss = 1.0 - q;
    return -alpha_ * y *
           (-detail::power_derivative(miss, gamma_) * std::log(q) + std::pow(miss, gamma_) / q);
  };
  double sum = 0;
  double weighted = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double y = t[i] * (1.0 - label_smoothing_) + smooth;
    const double q = q_of(i);
    const double c = detail::clamp_double(q, eps, 1.0 - eps);
    sum -= alpha_ * std::pow(1.0 - c, gamma_) * y * std::log(c);
    if (g != nullptr) weighted += d_q(i, q) * q;
  }
  if (g != nullptr) {
    // Softmax: d/dx_i = q_i (d_i - sum_j d_j q_j); normalisation q = p / sum(p):
    // d/dp_i = (d_i - sum_j d_j q_j) / sum(p).
    for (std::size_t i = 0; i < n; ++i) {
      const double q = q_of(i);
      const double d = d_q(i, q) - weighted;
      g[i] = static_cast<float>(scale * (from_logits_ ? q * d : d / total));
    }
  }
  return sum;
}

}  // namespace loadstar::keras::losses
#endif
