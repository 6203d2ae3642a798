/// \file
/// `AUC`: the area under the ROC or precision-recall curve at evenly spaced thresholds, as
/// `tf.keras.metrics.AUC`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/metrics/detail/confusion.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The AUC of Keras's `AUC(num_thresholds=200, curve='ROC', summation_method='interpolation')`:
/// confusion counts at `num_thresholds` thresholds (`-1e-7`, `i / (num_thresholds - 1)` for `i`
/// in `1..num_thresholds-2`, `1 + 1e-7`), then a Riemann sum over the curve: `curve` ROC (recall
/// over the false-positive rate), PR (precision over recall) or PRGAIN (precision gain over
/// recall gain); `summation_method` interpolation (trapezoids; for PR, Davis and Goadrich's
/// interpolation of precision along the true positives, as Keras's `interpolate_pr_auc`),
/// minoring (the lower of each pair of heights) or majoring (the higher).
/// \code
/// metrics::AUC pr_auc(200, "pr_auc", metrics::AUC::Curve::pr);
/// pr_auc.update_state(labels, probabilities, nullptr);
/// \endcode
class AUC : public Metric {
 public:
  /// Keras's `curve`.
  enum class Curve { roc, pr, prgain };
  /// Keras's `summation_method`.
  enum class Summation { interpolation, minoring, majoring };

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit AUC(std::size_t num_thresholds = 200, std::string name = "auc", Curve curve = Curve::roc,
               Summation summation_method = Summation::interpolation)
      : Metric(std::move(name)),
        curve_(curve),
        summation_(summation_method),
        counts_(thresholds(this->name(), num_thresholds)) {}
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
  /// Keras's `interpolate_pr_auc`.
  LOADSTAR_DECL double interpolate_pr_auc() const;

  Curve curve_;
  Summation summation_;
  detail::ConfusionCounts counts_;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> AUC::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "AUC");
  read.expect("multi_label", false, "loadstar computes one curve");
  read.expect("num_labels", nullptr, "loadstar computes one curve");
  read.expect("thresholds", nullptr, "loadstar spaces thresholds evenly");
  read.expect("label_weights", nullptr, "loadstar weighs labels equally");
  read.expect("from_logits", false, "loadstar takes probabilities");
  // Keras's AUCCurve.from_str and AUCSummationMethod.from_str: lower or upper case.
  Curve curve = Curve::roc;
  const std::string curve_name = read.get("curve", "ROC");
  if (curve_name == "PR" || curve_name == "pr") {
    curve = Curve::pr;
  } else if (curve_name == "PRGAIN" || curve_name == "prgain") {
    curve = Curve::prgain;
  } else if (curve_name != "ROC" && curve_name != "roc") {
    read.fail("curve", "\"ROC\", \"PR\" or \"PRGAIN\"");
  }
  Summation summation = Summation::interpolation;
  const std::string method = read.get("summation_method", "interpolation");
  if (method == "minoring" || method == "Minoring") {
    summation = Summation::minoring;
  } else if (method == "majoring" || method == "Majoring") {
    summation = Summation::majoring;
  } else if (method != "interpolation" && method != "Interpolation") {
    read.fail("summation_method", "\"interpolation\", \"minoring\" or \"majoring\"");
  }
  return std::make_unique<AUC>(read.get("num_thresholds", std::size_t{200}),
                               read.get("name", "auc"), curve, summation);
}

nlohmann::json AUC::get_config() const {
  auto config = Metric::get_config();
  const char* curves[] = {"ROC", "PR", "PRGAIN"};
  const char* methods[] = {"interpolation", "minoring", "majoring"};
  config["num_thresholds"] = counts_.size();
  config["curve"] = curves[static_cast<int>(curve_)];
  config["summation_method"] = methods[static_cast<int>(summation_)];
  config["multi_label"] = false;
  config["label_weights"] = nullptr;
  return config;
}

double AUC::result() const {
  if (curve_ == Curve::pr && summation_ == Summation::interpolation) return interpolate_pr_auc();
  // Keras's AUC.result: the (x, y) point of each threshold, then the sum over i of
  // (x[i] - x[i+1]) * height(y[i], y[i+1]).
  auto point = [&](std::size_t i) -> std::pair<double, double> {
    const double tp = counts_.true_positives(i);
    const double fp = counts_.false_positives(i);
    const double fn = counts_.false_negatives(i);
    const double tn = counts_.true_negatives(i);
    const double recall = detail::divide_no_nan(tp, tp + fn);
    if (curve_ == Curve::roc) return {detail::divide_no_nan(fp, fp + tn), recall};
    if (curve_ == Curve::pr) return {recall, detail::divide_no_nan(tp, tp + fp)};
    // PRGAIN: gains scaled by P / N; no true positives: recall gain 0 and precision gain 1;
    // a negative recall gain is 0.
    const double scale = detail::divide_no_nan(tp + fn, tn + fp);
    if (tp == 0) return {0.0, 1.0};
    const double recall_gain = 1.0 - scale * detail::divide_no_nan(fn, tp);
    const double precision_gain = 1.0 - scale * detail::divide_no_nan(fp, tp);
    return {std::max(recall_gain, 0.0), precision_gain};
  };
  double area = 0;
  auto [x0, y0] = point(0);
  for (std::size_t i = 0; i + 1 < counts_.size(); ++i) {
    const auto [x1, y1] = point(i + 1);
    const double height = summation_ == Summation::interpolation ? (y0 + y1) / 2
                          : summation_ == Summation::minoring    ? std::min(y0, y1)
                                                                 : std::max(y0, y1);
    area += (x0 - x1) * height;
    x0 = x1;
    y0 = y1;
  }
  return area;
}

double AUC::interpolate_pr_auc() const {
  // Davis & Goadrich (2006), as Keras: between thresholds i and i+1, precision is interpolated
  // along the true positives, P = tp + fp; the area of the step is
  // slope * (dtp + intercept * log(P_i / P_{i+1})) / (tp + fn)_{i+1}.
  double area = 0;
  for (std::size_t i = 0; i + 1 < counts_.size(); ++i) {
    const double tp0 = counts_.true_positives(i), tp1 = counts_.true_positives(i + 1);
    const double p0 = tp0 + counts_.false_positives(i);
    const double p1 = tp1 + counts_.false_positives(i + 1);
    const double dtp = tp0 - tp1;
    const double slope = detail::divide_no_nan(dtp, std::max(p0 - p1, 0.0));
    const double intercept = tp1 - slope * p1;
    const double ratio = p0 > 0 && p1 > 0 ? detail::divide_no_nan(p0, std::max(p1, 0.0)) : 1.0;
    area += detail::divide_no_nan(slope * (dtp + intercept * std::log(ratio)),
                                  std::max(tp1 + counts_.false_negatives(i + 1), 0.0));
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
