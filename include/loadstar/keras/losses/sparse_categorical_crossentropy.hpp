/// \file
/// `SparseCategoricalCrossentropy`, as `tf.keras.losses.SparseCategoricalCrossentropy`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "loadstar/error.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::losses {

/// The cross-entropy of integer labels (held as float, shape `(n,)` or `(n, 1)`) against the last
/// axis of `y_pred`.
///
/// With probabilities, Keras's `backend.sparse_categorical_crossentropy`: `p` is clipped to
/// `[epsilon, 1 - epsilon]` and its log taken as logits, so the loss is
/// `-log(c_y) + log(sum(c))` with `c` the clipped row. With logits, TensorFlow's
/// `sparse_softmax_cross_entropy_with_logits`. A label outside `[0, classes)` is a `ConfigError`.
/// \code
/// losses::SparseCategoricalCrossentropy loss(/*from_logits=*/true);
/// Tensor<float> labels({2}, {3, 0}), logits({2, 10}), gradient({2, 10});
/// float value = loss.compute(labels, logits, nullptr, gradient);
/// \endcode
class SparseCategoricalCrossentropy : public detail::RowLoss<SparseCategoricalCrossentropy> {
 public:
  explicit SparseCategoricalCrossentropy(bool from_logits = false,
                                         Reduction reduction = Reduction::sum_over_batch_size,
                                         std::string name = "sparse_categorical_crossentropy")
      : RowLoss(std::move(name), reduction), from_logits_(from_logits) {}

  std::string class_name() const override { return "SparseCategoricalCrossentropy"; }

  /// The loss described by a Keras config (`Registry<Loss>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Loss> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  bool from_logits() const noexcept { return from_logits_; }

  std::size_t true_size(std::size_t) const noexcept { return 1; }

  LOADSTAR_DECL void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const;

  void prepare(const Tensor<float>& y_true) const { check_labels(y_true, classes_hint_); }

  std::optional<RowLossSpec> device_spec() const {
    RowLossSpec spec;
    spec.kind = RowLossKind::sparse_categorical_crossentropy;
    spec.from_logits = from_logits_;
    return spec;
  }
  /// The `ConfigError` of `check_labels` for label `bad.value` at row `bad.position`.
  [[noreturn]] LOADSTAR_DECL void report_bad_label(const BadIndex& bad, std::size_t classes) const;

  using RowLoss::compute;

  LOADSTAR_DECL Deferred<double> compute_deferred(Backend& backend, const Tensor<float>& y_true,
                                                  const Tensor<float>& y_pred,
                                                  const Tensor<float>* sample_weight,
                                                  const Tensor<float>& gradient) override;

  LOADSTAR_DECL double row(const float* t, const float* p, std::size_t n, float* g,
                           double scale) const;

 private:
  LOADSTAR_DECL void check_labels(const Tensor<float>& y_true, std::size_t classes) const;

  bool from_logits_;
  std::size_t classes_hint_ = 0;
};

}  // namespace loadstar::keras::losses

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::losses {

std::unique_ptr<Loss> SparseCategoricalCrossentropy::from_config(const nlohmann::json& config) {
  const auto read = detail::loss_config(config, "SparseCategoricalCrossentropy");
  read.expect("ignore_class", nullptr, "loadstar ignores no class");
  read.expect("axis", -1, "loadstar reduces over the last axis");
  return std::make_unique<SparseCategoricalCrossentropy>(
      read.get("from_logits", false), detail::config_reduction(read),
      read.get("name", "sparse_categorical_crossentropy"));
}

nlohmann::json SparseCategoricalCrossentropy::get_config() const {
  auto config = Loss::get_config();
  config["from_logits"] = from_logits_;
  config["ignore_class"] = nullptr;
  return config;
}

void SparseCategoricalCrossentropy::check_shapes(const Tensor<float>& y_true,
                                                 const Tensor<float>& y_pred) const {
  const Shape expected = detail::without_last_axis(y_pred.shape());
  if (y_pred.rank() >= 2 && y_true.shape() == y_pred.shape() &&
      y_pred.shape()[y_pred.rank() - 1] > 1) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                     " looks one-hot (the shape of y_pred); this loss takes one class index " +
                     "per row, of shape " + expected.str() +
                     ": use categorical_crossentropy for one-hot labels");
  }
  if (y_pred.rank() < 2 || !detail::shapes_fit(y_true.shape(), expected)) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                     " does not match y_pred of shape " + y_pred.shape().str() +
                     " (expected one class index per row of shape " + expected.str() + ")");
  }
}

Deferred<double> SparseCategoricalCrossentropy::compute_deferred(Backend& backend,
                                                                 const Tensor<float>& y_true,
                                                                 const Tensor<float>& y_pred,
                                                                 const Tensor<float>* sample_weight,
                                                                 const Tensor<float>& gradient) {
  classes_hint_ = detail::last_axis(y_pred);
  return RowLoss::compute_deferred(backend, y_true, y_pred, sample_weight, gradient);
}

double SparseCategoricalCrossentropy::row(const float* t, const float* p, std::size_t n, float* g,
                                          double scale) const {
  return detail::sparse_crossentropy_row(from_logits_, t, p, n, g, scale);
}

void SparseCategoricalCrossentropy::check_labels(const Tensor<float>& y_true,
                                                 std::size_t classes) const {
  for (std::size_t i = 0; i < y_true.size(); ++i) {
    const double v = y_true.data()[i];
    if (!(v >= 0 && v < static_cast<double>(classes)))
      report_bad_label({i, y_true.data()[i]}, classes);
  }
}

void SparseCategoricalCrossentropy::report_bad_label(const BadIndex& bad,
                                                     std::size_t classes) const {
  throw ConfigError(name() + ": label " + detail::format_value(bad.value) + " at row " +
                    std::to_string(bad.position) + " is outside [0, " + std::to_string(classes) +
                    ")");
}

}  // namespace loadstar::keras::losses
#endif
