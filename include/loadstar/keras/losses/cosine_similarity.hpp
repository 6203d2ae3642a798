/// \file
/// `CosineSimilarity`: `-sum(l2_normalize(y_true) * l2_normalize(y_pred), axis=-1)`, as
/// `keras.losses.CosineSimilarity`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The negated cosine similarity of each last-axis row (-1 where the rows point the same way);
/// a row is normalized as `tf.math.l2_normalize` does, `x / sqrt(maximum(sum(x^2), 1e-12))`.
/// Keras's `axis` is the last one (-1); another is refused.
/// \code
/// losses::CosineSimilarity loss;
/// \endcode
class CosineSimilarity : public detail::RowLoss<CosineSimilarity> {
 public:
  explicit CosineSimilarity(Reduction reduction = Reduction::sum_over_batch_size,
                            std::string name = "cosine_similarity")
      : RowLoss(std::move(name), reduction) {}

  std::string class_name() const override { return "CosineSimilarity"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory); throws `ConfigError` for
  /// an `axis` other than -1.
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> CosineSimilarity::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "CosineSimilarity");
  read.expect("axis", -1, "the similarity is computed over the last axis");
  return std::make_unique<CosineSimilarity>(detail::config_reduction(read),
                                            read.get("name", "cosine_similarity"));
}

nlohmann::json CosineSimilarity::get_config() const {
  auto config = Loss::get_config();
  config["axis"] = -1;
  return config;
}

double CosineSimilarity::row(const float* t, const float* p, std::size_t n, float* g,
                             double scale) const {
  double tt = 0, pp = 0, tp = 0;
  for (std::size_t i = 0; i < n; ++i) {
    tt += static_cast<double>(t[i]) * t[i];
    pp += static_cast<double>(p[i]) * p[i];
    tp += static_cast<double>(t[i]) * p[i];
  }
  const double tn = std::sqrt(std::max(tt, 1e-12)), pn = std::sqrt(std::max(pp, 1e-12));
  const double cosine = tp / (tn * pn);
  if (g != nullptr) {
    // d(-cos)/dp_i = -(t_i / tn - cos * p_i / pn) / pn, where the norm is not clamped.
    const bool clamped = pp <= 1e-12;
    for (std::size_t i = 0; i < n; ++i) {
      const double d = t[i] / tn - (clamped ? 0.0 : cosine * p[i] / pn);
      g[i] = static_cast<float>(-scale * d / pn);
    }
  }
  return -cosine;
}

}  // namespace loadstar::keras::losses
#endif
