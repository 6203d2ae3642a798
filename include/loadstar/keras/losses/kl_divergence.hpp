/// \file
/// `KLDivergence`: `sum(y_true * log(y_true / y_pred), axis=-1)`, as `tf.keras.losses`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The Kullback-Leibler divergence over the last axis, with both arguments clipped to
/// `[epsilon, 1]` as Keras does (the gradient is 0 where `y_pred` was clipped).
/// \code
/// losses::KLDivergence kld;
/// \endcode
class KLDivergence : public detail::RowLoss<KLDivergence> {
 public:
  explicit KLDivergence(Reduction reduction = Reduction::sum_over_batch_size,
                        std::string name = "kl_divergence")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "KLDivergence"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::kl_divergence;
    return spec;
  }
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> KLDivergence::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "KLDivergence");
  return std::make_unique<KLDivergence>(detail::config_reduction(read),
                                        read.get("name", "kl_divergence"));
}

double KLDivergence::row(const float* t, const float* p, std::size_t n, float* g,
                         double scale) const {
  return detail::kl_divergence_row(t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
