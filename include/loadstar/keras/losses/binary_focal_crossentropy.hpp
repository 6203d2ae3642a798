/// \file
/// `BinaryFocalCrossentropy`, as `tf.keras.losses.BinaryFocalCrossentropy` (axis -1).
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/focal.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The binary cross-entropy scaled by the focal factor `(1 - p_t) ** gamma` (Lin et al., 2018),
/// averaged over the last axis, where `p_t = y p + (1 - y)(1 - p)` and `p` is `y_pred` or, with
/// `from_logits`, its sigmoid. The cross-entropy is `BinaryCrossentropy`'s (tf.keras's
/// `backend.binary_focal_crossentropy` takes it from the logits when `from_logits`). With
/// `apply_class_balancing` each element is also weighted by `alpha` for label 1 and `1 - alpha`
/// for label 0. Label smoothing moves labels towards 0.5 first. Host only on every backend.
/// \code
/// losses::BinaryFocalCrossentropy focal(/*apply_class_balancing=*/true, /*alpha=*/0.25,
///                                       /*gamma=*/2.0, /*from_logits=*/true);
/// \endcode
class BinaryFocalCrossentropy : public detail::RowLoss<BinaryFocalCrossentropy> {
 public:
  /// Throws `ConfigError` for `gamma` below 0, or `alpha` or `label_smoothing` outside [0, 1].
  LOADSTAR_DECL explicit BinaryFocalCrossentropy(
      bool apply_class_balancing = false, double alpha = 0.25, double gamma = 2.0,
      bool from_logits = false, double label_smoothing = 0.0,
      Reduction reduction = Reduction::sum_over_batch_size,
      std::string name = "binary_focal_crossentropy");

  std::string class_name() const override { return "BinaryFocalCrossentropy"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory); throws `ConfigError` for
  /// an `axis` other than -1.
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  bool from_logits() const noexcept { return from_logits_; }

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

 private:
  bool apply_class_balancing_;
  double alpha_;
  double gamma_;
  bool from_logits_;
  double label_smoothing_;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

BinaryFocalCrossentropy::BinaryFocalCrossentropy(bool apply_class_balancing, double alpha,
                                                 double gamma, bool from_logits,
                                                 double label_smoothing, Reduction reduction,
                                                 std::string name)
    : RowLoss(std::move(name), reduction),
      apply_class_balancing_(apply_class_balancing),
      alpha_(alpha),
      gamma_(gamma),
      from_logits_(from_logits),
      label_smoothing_(label_smoothing) {
  detail::check_focal_arguments(this->name() + " (BinaryFocalCrossentropy)", alpha, gamma,
                                label_smoothing);
}

std::unique_ptr<Loss> BinaryFocalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "BinaryFocalCrossentropy");
  read.expect("axis", -1, "loadstar reduces over the last axis");
  return std::make_unique<BinaryFocalCrossentropy>(
      read.get("apply_class_balancing", false), read.get("alpha", 0.25), read.get("gamma", 2.0),
      read.get("from_logits", false), read.get("label_smoothing", 0.0),
      detail::config_reduction(read), read.get("name", "binary_focal_crossentropy"));
}

nlohmann::json BinaryFocalCrossentropy::get_config() const {
  auto config = Loss::get_config();
  config["apply_class_balancing"] = apply_class_balancing_;
  config["alpha"] = alpha_;
  config["gamma"] = gamma_;
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  config["axis"] = -1;
  return config;
}

double BinaryFocalCrossentropy::row(const float* t, const float* p, std::size_t n, float* g,
                                    double scale) const {
  constexpr double eps = detail::loss_epsilon;
  const double inverse = 1.0 / static_cast<double>(n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double y = detail::smooth_binary(t[i], label_smoothing_);
    const double x = p[i];
    // s: the probability; bce and its derivative d(bce)/dx with respect to the input.
    double s = x, bce = 0, d_bce = 0;
    if (from_logits_) {
      s = 1.0 / (1.0 + std::exp(-x));
      bce = (x < 0.0 ? 0.0 : x) - x * y + std::log1p(std::exp(-std::fabs(x)));
      d_bce = s - y;
    } else {
      const double q = detail::clamp_double(x, eps, 1.0 - eps);
      bce = -(y * std::log(q + eps) + (1.0 - y) * std::log(1.0 - q + eps));
      d_bce = x >= eps && x <= 1.0 - eps ? -y / (q + eps) + (1.0 - y) / (1.0 - q + eps) : 0.0;
    }
    // 1 - p_t = y (1 - s) + (1 - y) s, whose derivative in s is 1 - 2y.
    const double miss = y + s - 2.0 * y * s;
    const double focal = std::pow(miss, gamma_);
    const double weight = apply_class_balancing_ ? y * alpha_ + (1.0 - y) * (1.0 - alpha_) : 1.0;
    sum += weight * focal * bce;
    if (g != nullptr) {
      const double d_focal = detail::power_derivative(miss, gamma_) * (1.0 - 2.0 * y) *
                             (from_logits_ ? s * (1.0 - s) : 1.0);
      g[i] = static_cast<float>(scale * weight * (d_focal * bce + focal * d_bce) * inverse);
    }
  }
  return sum * inverse;
}

}  // namespace loadstar::keras::losses
#endif
