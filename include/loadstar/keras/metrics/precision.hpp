/// \file
/// `Precision`: `tp / (tp + fp)` at a threshold, as `tf.keras.metrics.Precision`.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/metrics/detail/confusion.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The weighted precision of `y_pred > threshold` against labels that are not 0; 0 while no
/// prediction was positive.
/// \code
/// metrics::Precision precision;
/// precision.update_state(labels, probabilities, nullptr);
/// \endcode
class Precision : public Metric {
 public:
  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit Precision(double threshold = 0.5, std::string name = "precision")
      : Metric(std::move(name)), threshold_(threshold), counts_({threshold}) {}
  std::string class_name() const override { return "Precision"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                    const Tensor<float>* sample_weight) override {
    counts_.update(name(), y_true, y_pred, sample_weight);
  }
  LOADSTAR_DECL double result() const override;
  void reset_state() override { counts_.reset(); }
  nlohmann::json get_state() const override { return counts_.state(); }
  void set_state(const nlohmann::json& state) override { counts_.restore(name(), state); }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<Precision>(*this); }

 private:
  double threshold_;
  detail::ConfusionCounts counts_;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> Precision::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "Precision");
  read.expect("top_k", nullptr, "loadstar thresholds every prediction");
  read.expect("class_id", nullptr, "loadstar counts every class");
  return std::make_unique<Precision>(detail::config_threshold(read), read.get("name", "precision"));
}

nlohmann::json Precision::get_config() const {
  auto config = Metric::get_config();
  config["thresholds"] = threshold_;
  config["top_k"] = nullptr;
  config["class_id"] = nullptr;
  return config;
}

double Precision::result() const {
  const double tp = counts_.true_positives(0);
  return detail::divide_no_nan(tp, tp + counts_.false_positives(0));
}

}  // namespace loadstar::keras::metrics
#endif
