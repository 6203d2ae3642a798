/// \file
/// `BinaryCrossentropy`, as `tf.keras.losses.BinaryCrossentropy`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The binary cross-entropy averaged over the last axis.
///
/// With probabilities, Keras's `backend.binary_crossentropy`: `p` is clipped to
/// `[epsilon, 1 - epsilon]` and the loss is `-(y log(p + epsilon) + (1 - y) log(1 - p + epsilon))`
/// (no gradient where `p` was clipped). With logits, TensorFlow's
/// `sigmoid_cross_entropy_with_logits`. Label smoothing moves labels towards 0.5.
/// \code
/// losses::BinaryCrossentropy bce(/*from_logits=*/true, /*label_smoothing=*/0.1);
/// \endcode
class BinaryCrossentropy : public detail::RowLoss<BinaryCrossentropy> {
 public:
  explicit BinaryCrossentropy(bool from_logits = false, double label_smoothing = 0.0,
                              Reduction reduction = Reduction::sum_over_batch_size,
                              std::string name = "binary_crossentropy")
      : RowLoss(std::move(name), reduction),
        from_logits_(from_logits),
        label_smoothing_(label_smoothing) {}

  std::string class_name() const override { return "BinaryCrossentropy"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  bool from_logits() const noexcept { return from_logits_; }

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::binary_crossentropy;
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

std::unique_ptr<Loss> BinaryCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "BinaryCrossentropy");
  read.expect("axis", -1, "loadstar reduces over the last axis");
  return std::make_unique<BinaryCrossentropy>(
      read.get("from_logits", false), read.get("label_smoothing", 0.0),
      detail::config_reduction(read), read.get("name", "binary_crossentropy"));
}

nlohmann::json BinaryCrossentropy::get_config() const {
  auto config = Loss::get_config();
  config["from_logits"] = from_logits_;
  config["label_smoothing"] = label_smoothing_;
  config["axis"] = -1;
  return config;
}

double BinaryCrossentropy::row(const float* t, const float* p, std::size_t n, float* g,
                               double scale) const {
  return detail::binary_crossentropy_row(from_logits_, label_smoothing_, t, p, n, g, scale);
}

}  // namespace loadstar::keras::losses
#endif
