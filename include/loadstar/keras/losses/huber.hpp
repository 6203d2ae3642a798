/// \file
/// `Huber`: quadratic within `delta`, linear beyond, as `tf.keras.losses.Huber`.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// `0.5 * e^2` where `|e| <= delta`, `delta * |e| - 0.5 * delta^2` elsewhere, averaged over the
/// last axis (`e = y_pred - y_true`).
/// \code
/// losses::Huber huber(2.0);
/// \endcode
class Huber : public detail::RowLoss<Huber> {
 public:
  explicit Huber(double delta = 1.0, Reduction reduction = Reduction::sum_over_batch_size,
                 std::string name = "huber_loss")
      : RowLoss(std::move(name), reduction), delta_(delta) {}

  std::string class_name() const override { return "Huber"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::huber;
    spec.delta = delta_;
    return spec;
  }

 private:
  double delta_;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> Huber::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "Huber");
  return std::make_unique<Huber>(read.get("delta", 1.0), detail::config_reduction(read),
                                 read.get("name", "huber_loss"));
}

nlohmann::json Huber::get_config() const {
  auto config = Loss::get_config();
  config["delta"] = delta_;
  return config;
}

double Huber::row(const float* t, const float* p, std::size_t n, float* g, double scale) const {
  return detail::huber_row(delta_, t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
