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

/// Keras's `AUC` `curve`: ROC (recall over the false-positive rate), PR (precision over recall)
/// or PRGAIN (precision gain over recall gain).
enum class AUCCurve { roc, pr, prgain };
/// Keras's `AUC` `summation_method`.
enum class AUCSummation { interpolation, minoring, majoring };

/// `AUC`'s Keras arguments, with Keras's defaults.
struct AUCOptions {
  /// Evenly spaced thresholds: `-1e-7`, `i / (num_thresholds - 1)` for `i` in
  /// `1..num_thresholds-2`, `1 + 1e-7`.
  std::size_t num_thresholds = 200;
  AUCCurve curve = AUCCurve::roc;
  AUCSummation summation_method = AUCSummation::interpolation;
  std::string name = "auc";
  /// Keras's `thresholds`: these (sorted) between `-1e-7` and `1 + 1e-7`, in place of
  /// `num_thresholds` evenly spaced ones.
  std::vector<double> thresholds = {};
  /// One curve per label (the last axis of rank-2 predictions), the result their mean, or their
  /// mean weighted by `label_weights`.
  bool multi_label = false;
  /// With `multi_label`: the number of labels (0, Keras's None: that of the first batch).
  std::size_t num_labels = 0;
  /// Non-negative weights of the labels (the last axis): without `multi_label` they weigh each
  /// prediction's count, with it each label's area.
  std::vector<double> label_weights = {};
  /// The predictions are logits: the sigmoid of each is counted.
  bool from_logits = false;
};

/// The AUC of Keras's `AUC`: confusion counts at thresholds, then a Riemann sum over the curve:
/// `curve` ROC, PR or PRGAIN; `summation_method` interpolation (trapezoids; for PR, Davis and
/// Goadrich's interpolation of precision along the true positives, as Keras's
/// `interpolate_pr_auc`), minoring (the lower of each pair of heights) or majoring (the higher).
/// With `multi_label`, one curve per label, as Keras.
/// \code
/// metrics::AUC pr_auc(200, "pr_auc", metrics::AUC::Curve::pr);
/// metrics::AUC per_label({.multi_label = true, .label_weights = {1.0, 2.0, 1.0}});
/// pr_auc.update_state(labels, probabilities, nullptr);
/// \endcode
class AUC : public Metric {
 public:
  using Curve = AUCCurve;
  using Summation = AUCSummation;

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit AUC(std::size_t num_thresholds = 200, std::string name = "auc", Curve curve = Curve::roc,
               Summation summation_method = Summation::interpolation)
      : AUC(AUCOptions{.num_thresholds = num_thresholds,
                       .curve = curve,
                       .summation_method = summation_method,
                       .name = std::move(name)}) {}
  /// Throws `ConfigError` naming the metric for fewer than 2 thresholds, `num_labels` without
  /// `multi_label`, a negative label weight or a threshold outside [0, 1].
  LOADSTAR_DECL explicit AUC(AUCOptions options);
  std::string class_name() const override { return "AUC"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Throws `ShapeError` naming the metric for predictions whose labels do not fit
  /// `num_labels` or `label_weights`, or, with `multi_label`, that are not of rank 2.
  LOADSTAR_DECL void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                  const Tensor<float>* sample_weight) override;
  LOADSTAR_DECL double result() const override;
  LOADSTAR_DECL void reset_state() override;
  /// The counts: `{"positives", "negatives"}`, or with `multi_label` `{"labels": [...]}`, one
  /// such object per label.
  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void set_state(const nlohmann::json& state) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<AUC>(*this); }

 private:
  LOADSTAR_DECL static std::vector<double> thresholds(const std::string& owner,
                                                      const AUCOptions& options);
  /// The area under one curve.
  LOADSTAR_DECL double area(const detail::ConfusionCounts& counts) const;
  /// Keras's `interpolate_pr_auc` of one curve.
  LOADSTAR_DECL static double interpolate_pr_auc(const detail::ConfusionCounts& counts);

  AUCOptions options_;
  std::vector<double> thresholds_;
  /// One set of counts, or with `multi_label` one per label (none before the first batch when
  /// `num_labels` is 0).
  std::vector<detail::ConfusionCounts> counts_;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

AUC::AUC(AUCOptions options)
    : Metric(options.name),
      options_(std::move(options)),
      thresholds_(thresholds(name(), options_)) {
  if (options_.num_labels != 0 && !options_.multi_label) {
    throw ConfigError(name() + ": num_labels is needed only when multi_label is true but it is " +
                      std::to_string(options_.num_labels));
  }
  for (const double w : options_.label_weights) {
    if (!(w >= 0.0)) {
      throw ConfigError(name() + ": label_weights must be non-negative but one is " +
                        std::to_string(w));
    }
  }
  if (!options_.multi_label || options_.num_labels != 0) reset_state();
}

std::unique_ptr<Metric> AUC::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "AUC");
  // Keras's AUCCurve.from_str and AUCSummationMethod.from_str: lower or upper case.
  AUCOptions options;
  const std::string curve_name = read.get("curve", "ROC");
  if (curve_name == "PR" || curve_name == "pr") {
    options.curve = Curve::pr;
  } else if (curve_name == "PRGAIN" || curve_name == "prgain") {
    options.curve = Curve::prgain;
  } else if (curve_name != "ROC" && curve_name != "roc") {
    read.fail("curve", "\"ROC\", \"PR\" or \"PRGAIN\"");
  }
  const std::string method = read.get("summation_method", "interpolation");
  if (method == "minoring" || method == "Minoring") {
    options.summation_method = Summation::minoring;
  } else if (method == "majoring" || method == "Majoring") {
    options.summation_method = Summation::majoring;
  } else if (method != "interpolation" && method != "Interpolation") {
    read.fail("summation_method", "\"interpolation\", \"minoring\" or \"majoring\"");
  }
  options.num_thresholds = read.get("num_thresholds", std::size_t{200});
  options.name = read.get("name", "auc");
  options.thresholds = read.get("thresholds", std::vector<double>{});
  options.multi_label = read.get("multi_label", false);
  options.num_labels = read.get("num_labels", std::size_t{0});
  options.label_weights = read.get("label_weights", std::vector<double>{});
  options.from_logits = read.get("from_logits", false);
  return std::make_unique<AUC>(std::move(options));
}

nlohmann::json AUC::get_config() const {
  auto config = Metric::get_config();
  const char* curves[] = {"ROC", "PR", "PRGAIN"};
  const char* methods[] = {"interpolation", "minoring", "majoring"};
  config["num_thresholds"] = thresholds_.size();
  config["curve"] = curves[static_cast<int>(options_.curve)];
  config["summation_method"] = methods[static_cast<int>(options_.summation_method)];
  config["multi_label"] = options_.multi_label;
  config["num_labels"] =
      options_.num_labels == 0 ? nlohmann::json(nullptr) : nlohmann::json(options_.num_labels);
  config["label_weights"] = options_.label_weights.empty() ? nlohmann::json(nullptr)
                                                           : nlohmann::json(options_.label_weights);
  config["from_logits"] = options_.from_logits;
  // As Keras: the thresholds given, without the two it adds at the ends.
  if (!options_.thresholds.empty()) {
    config["thresholds"] = std::vector<double>(thresholds_.begin() + 1, thresholds_.end() - 1);
  }
  return config;
}

void AUC::update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                       const Tensor<float>* sample_weight) {
  Tensor<float> probabilities = y_pred;
  if (options_.from_logits) {
    probabilities = y_pred.clone();
    float* p = probabilities.data();
    for (std::size_t i = 0; i < probabilities.size(); ++i)
      p[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(p[i]))));
  }
  const std::size_t labels = y_pred.rank() == 0 ? 1 : y_pred.shape()[y_pred.rank() - 1];
  if (!options_.label_weights.empty() && options_.label_weights.size() != labels) {
    throw ShapeError(name() + ": label_weights has " +
                     std::to_string(options_.label_weights.size()) +
                     " weights but y_pred of shape " + y_pred.shape().str() + " has " +
                     std::to_string(labels) + " labels on its last axis");
  }
  if (!options_.multi_label) {
    counts_.front().update(name(), y_true, probabilities, sample_weight, options_.label_weights);
    return;
  }
  if (y_pred.rank() != 2) {
    throw ShapeError(name() +
                     ": with multi_label, y_pred must have rank 2 (samples, labels) but "
                     "has shape " +
                     y_pred.shape().str());
  }
  if (counts_.empty()) counts_.assign(labels, detail::ConfusionCounts(thresholds_));
  if (counts_.size() != labels) {
    throw ShapeError(name() + ": counts " + std::to_string(counts_.size()) +
                     " labels but y_pred has shape " + y_pred.shape().str());
  }
  if (y_true.shape() != y_pred.shape()) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                     " does not match y_pred of shape " + y_pred.shape().str());
  }
  // Each label's column, counted on its own.
  const std::size_t rows = y_pred.shape()[0];
  Tensor<float> truth = Tensor<float>::uninitialized({rows});
  Tensor<float> predicted = Tensor<float>::uninitialized({rows});
  for (std::size_t label = 0; label < labels; ++label) {
    for (std::size_t r = 0; r < rows; ++r) {
      truth.data()[r] = y_true.data()[r * labels + label];
      predicted.data()[r] = probabilities.data()[r * labels + label];
    }
    counts_[label].update(name(), truth, predicted, sample_weight, {});
  }
}

void AUC::reset_state() {
  if (options_.multi_label && options_.num_labels == 0) {
    for (auto& counts : counts_)
      counts.reset();
    return;
  }
  counts_.assign(options_.multi_label ? options_.num_labels : 1,
                 detail::ConfusionCounts(thresholds_));
}

nlohmann::json AUC::get_state() const {
  if (!options_.multi_label) return counts_.front().state();
  nlohmann::json labels = nlohmann::json::array();
  for (const auto& counts : counts_)
    labels.push_back(counts.state());
  return {{"labels", labels}};
}

void AUC::set_state(const nlohmann::json& state) {
  if (!options_.multi_label) {
    counts_.front().restore(name(), state);
    return;
  }
  const loadstar::detail::StateReader read(name(), state);
  const auto labels = read.get<std::vector<nlohmann::json>>("labels");
  if (options_.num_labels != 0 && labels.size() != options_.num_labels) {
    throw CheckpointError(name() + " state: expected the counts of " +
                          std::to_string(options_.num_labels) + " labels but found " +
                          std::to_string(labels.size()));
  }
  std::vector<detail::ConfusionCounts> restored(labels.size(),
                                                detail::ConfusionCounts(thresholds_));
  for (std::size_t i = 0; i < labels.size(); ++i)
    restored[i].restore(name(), labels[i]);
  counts_ = std::move(restored);
}

double AUC::result() const {
  if (!options_.multi_label) return area(counts_.front());
  if (counts_.empty()) return 0.0;
  // Keras: the mean of the labels' areas, or their mean weighted by label_weights.
  double sum = 0.0, weights = 0.0;
  for (std::size_t label = 0; label < counts_.size(); ++label) {
    const double w = options_.label_weights.empty() ? 1.0 : options_.label_weights[label];
    sum += w * area(counts_[label]);
    weights += w;
  }
  return detail::divide_no_nan(sum, weights);
}

double AUC::area(const detail::ConfusionCounts& counts) const {
  if (options_.curve == Curve::pr && options_.summation_method == Summation::interpolation) {
    return interpolate_pr_auc(counts);
  }
  // Keras's AUC.result: the (x, y) point of each threshold, then the sum over i of
  // (x[i] - x[i+1]) * height(y[i], y[i+1]).
  auto point = [&](std::size_t i) -> std::pair<double, double> {
    const double tp = counts.true_positives(i);
    const double fp = counts.false_positives(i);
    const double fn = counts.false_negatives(i);
    const double tn = counts.true_negatives(i);
    const double recall = detail::divide_no_nan(tp, tp + fn);
    if (options_.curve == Curve::roc) return {detail::divide_no_nan(fp, fp + tn), recall};
    if (options_.curve == Curve::pr) return {recall, detail::divide_no_nan(tp, tp + fp)};
    // PRGAIN: gains scaled by P / N; no true positives: recall gain 0 and precision gain 1;
    // a negative recall gain is 0.
    const double scale = detail::divide_no_nan(tp + fn, tn + fp);
    if (tp == 0) return {0.0, 1.0};
    const double recall_gain = 1.0 - scale * detail::divide_no_nan(fn, tp);
    const double precision_gain = 1.0 - scale * detail::divide_no_nan(fp, tp);
    return {std::max(recall_gain, 0.0), precision_gain};
  };
  const Summation summation = options_.summation_method;
  double total = 0;
  auto [x0, y0] = point(0);
  for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
    const auto [x1, y1] = point(i + 1);
    const double height = summation == Summation::interpolation ? (y0 + y1) / 2
                          : summation == Summation::minoring    ? std::min(y0, y1)
                                                                : std::max(y0, y1);
    total += (x0 - x1) * height;
    x0 = x1;
    y0 = y1;
  }
  return total;
}

double AUC::interpolate_pr_auc(const detail::ConfusionCounts& counts) {
  // Davis & Goadrich (2006), as Keras: between thresholds i and i+1, precision is interpolated
  // along the true positives, P = tp + fp; the area of the step is
  // slope * (dtp + intercept * log(P_i / P_{i+1})) / (tp + fn)_{i+1}.
  double total = 0;
  for (std::size_t i = 0; i + 1 < counts.size(); ++i) {
    const double tp0 = counts.true_positives(i), tp1 = counts.true_positives(i + 1);
    const double p0 = tp0 + counts.false_positives(i);
    const double p1 = tp1 + counts.false_positives(i + 1);
    const double dtp = tp0 - tp1;
    const double slope = detail::divide_no_nan(dtp, std::max(p0 - p1, 0.0));
    const double intercept = tp1 - slope * p1;
    const double ratio = p0 > 0 && p1 > 0 ? detail::divide_no_nan(p0, std::max(p1, 0.0)) : 1.0;
    total += detail::divide_no_nan(slope * (dtp + intercept * std::log(ratio)),
                                   std::max(tp1 + counts.false_negatives(i + 1), 0.0));
  }
  return total;
}

std::vector<double> AUC::thresholds(const std::string& owner, const AUCOptions& options) {
  constexpr double epsilon = 1e-7;
  // Keras holds the thresholds as float32 and compares float32 predictions with them.
  auto as_float = [](double v) { return static_cast<double>(static_cast<float>(v)); };
  std::vector<double> t{as_float(-epsilon)};
  if (!options.thresholds.empty()) {
    std::vector<double> given = options.thresholds;
    std::sort(given.begin(), given.end());
    for (const double v : given) {
      if (!(v >= 0.0 && v <= 1.0)) {
        throw ConfigError(owner + ": thresholds must lie in [0, 1] but one is " +
                          std::to_string(v));
      }
      t.push_back(as_float(v));
    }
  } else {
    const std::size_t n = options.num_thresholds;
    if (n < 2) {
      throw ConfigError(owner + ": num_thresholds must be at least 2 but is " + std::to_string(n));
    }
    for (std::size_t i = 1; i + 1 < n; ++i)
      t.push_back(as_float(static_cast<double>(i) / static_cast<double>(n - 1)));
  }
  t.push_back(as_float(1.0 + epsilon));
  return t;
}

}  // namespace loadstar::keras::metrics
#endif
