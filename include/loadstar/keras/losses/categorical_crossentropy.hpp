/// \file
/// `CategoricalCrossentropy`, as `tf.keras.losses.CategoricalCrossentropy` (axis -1).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The cross-entropy of one-hot (or soft) labels over the last axis.
///
/// With probabilities, Keras's `backend.categorical_crossentropy`: each row is divided by its sum,
/// clipped to `[epsilon, 1 - epsilon]`, and the loss is `-sum(y log(p))`. With logits, TensorFlow's
/// `softmax_cross_entropy_with_logits`. Label smoothing: `y * (1 - s) + s / classes`.
/// \code
/// losses::CategoricalCrossentropy cce(/*from_logits=*/true);
/// float loss = cce.compute(one_hot, logits, nullptr, gradient);
/// \endcode
class CategoricalCrossentropy : public detail::RowLoss<CategoricalCrossentropy> {
 public:
  explicit CategoricalCrossentropy(bool from_logits = false, double label_smoothing = 0.0,
                                   Reduction reduction = Reduction::sum_over_batch_size,
                                   std::string name = "categorical_crossentropy")
      : RowLoss(std::move(name), reduction),
        from_logits_(from_logits),
        label_smoothing_(label_smoothing) {}

  std::string class_name() const override { return "CategoricalCrossentropy"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  bool from_logits() const noexcept { return from_logits_; }

  LOADSTAR_DECL void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const;

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::categorical_crossentropy;
    spec.from_logits = from_logits_;
    spec.label_smoothing = label_smoothing_;
    return spec;
  }

 private:
  bool from_logits_;
  double label_smoothing_;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> CategoricalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "CategoricalCrossentropy");
  read.expect("axis", -1, "loadstar reduces over the last axis");
  return std::make_unique<CategoricalCrossentropy>(
      read.get("from_logits", false), read.get("label_smoothing", 0.0),
      detail::config_reduction(read), read.get("name", "categorical_crossentropy"));
}

nlohmann::json CategoricalCrossentropy::get_config() const {
  auto config = Loss::get_config();
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  config["axis"] = -1;
  return config;
}

void CategoricalCrossentropy::check_shapes(const Tensor<float>& y_true,
                                           const Tensor<float>& y_pred) const {
  if (y_true.shape() != y_pred.shape()) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                     " does not match y_pred of shape " + y_pred.shape().str());
  }
}

double CategoricalCrossentropy::row(const float* t, const float* p, std::size_t n, float* g,
                                    double scale) const {
  return detail::crossentropy_row(from_logits_, label_smoothing_, t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
