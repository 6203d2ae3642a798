/// \file
/// `AUC`: the area under the ROC curve at evenly spaced thresholds, as `tf.keras.metrics.AUC`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/metrics/detail/confusion.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The ROC AUC of Keras's `AUC(num_thresholds=200, curve='ROC',
/// summation_method='interpolation')`: confusion counts at `num_thresholds` thresholds
/// (`-1e-7`, `i / (num_thresholds - 1)` for `i` in `1..num_thresholds-2`, `1 + 1e-7`), then the
/// trapezoidal sum of recall over the false-positive rate.
/// \code
/// metrics::AUC auc;
/// auc.update_state(labels, probabilities, nullptr);
/// \endcode
class AUC : public Metric {
 public:
  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit AUC(std::size_t num_thresholds = 200, std::string name = "auc")
      : Metric(std::move(name)), counts_(thresholds(this->name(), num_thresholds)) {}
  std::string class_name() const override { return "AUC"; }
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
  std::shared_ptr<Metric> clone() const override { return std::make_shared<AUC>(*this); }

 private:
  LOADSTAR_DECL static std::vector<double> thresholds(const std::string& owner, std::size_t n);

  detail::ConfusionCounts counts_;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> AUC::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "AUC");
  read.expect("curve", "ROC", "loadstar computes the ROC curve");
  read.expect("summation_method", "interpolation", "loadstar sums trapezoids");
  read.expect("multi_label", false, "loadstar computes one curve");
  read.expect("thresholds", nullptr, "loadstar spaces thresholds evenly");
  read.expect("label_weights", nullptr, "loadstar weighs labels equally");
  read.expect("from_logits", false, "loadstar takes probabilities");
  return std::make_unique<AUC>(read.get("num_thresholds", std::size_t{200}),
                               read.get("name", "auc"));
}

nlohmann::json AUC::get_config() const {
  auto config = Metric::get_config();
  config["num_thresholds"] = counts_.size();
  config["curve"] = "ROC";
  config["summation_method"] = "interpolation";
  config["multi_label"] = false;
  config["label_weights"] = nullptr;
  return config;
}

double AUC::result() const {
  // Keras's AUC.result for ROC with 'interpolation': sum over i of
  // (fpr[i] - fpr[i+1]) * (recall[i] + recall[i+1]) / 2.
  auto point = [&](std::size_t i) {
    const double tp = counts_.true_positives(i);
    const double fp = counts_.false_positives(i);
    return std::pair{detail::divide_no_nan(fp, fp + counts_.true_negatives(i)),
                     detail::divide_no_nan(tp, tp + counts_.false_negatives(i))};
  };
  double area = 0;
  auto [x0, y0] = point(0);
  for (std::size_t i = 0; i + 1 < counts_.size(); ++i) {
    const auto [x1, y1] = point(i + 1);
    area += (x0 - x1) * (y0 + y1) / 2;
    x0 = x1;
    y0 = y1;
  }
  return area;
}

std::vector<double> AUC::thresholds(const std::string& owner, std::size_t n) {
  if (n < 2) {
    throw ConfigError(owner + ": num_thresholds must be at least 2 but is " + std::to_string(n));
  }
  constexpr double epsilon = 1e-7;
  std::vector<double> t;
  // Keras holds the thresholds as float32 and compares float32 predictions with them.
  auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  t.push_back(as_float(-epsilon));
  for (std::size_t i = 1; i + 1 < n; ++i)
    t.push_back(as_float(static_cast<double>(i) / static_cast<double>(n - 1)));
  t.push_back(as_float(1.0 + epsilon));
  return t;
}

}  // namespace loadstar::keras::metrics
#endif
