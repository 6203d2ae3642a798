/// \file
/// `FBetaScore` and `F1Score`, as `keras.metrics.FBetaScore` and `keras.metrics.F1Score`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The F-beta score of 2-D labels and predictions (batch, classes), multi-class or multi-label,
/// as Keras: a prediction is positive when above `threshold`, or, without a threshold, when it is
/// its row's largest and not 0. Weighted true positives, false positives, false negatives and
/// label counts accumulate per class (over every element for `"micro"`); per class
/// `(1 + beta²) P R / (beta² P + R)` with Keras's epsilon of 1e-7 in each division. `average`:
/// `"micro"` (global counts), `"macro"` (the mean over classes), `"weighted"` (weighted by each
/// class's labels) or none (`scores()` gives one per class; `result()` then throws).
/// \code
/// metrics::FBetaScore f2(metrics::FBetaScore::Average::macro, /*beta=*/2.0, /*threshold=*/0.5);
/// \endcode
class FBetaScore : public Metric {
 public:
  enum class Average { none, micro, macro, weighted };

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  /// Throws `ConfigError` for `beta` not above 0 or `threshold` outside (0, 1].
  LOADSTAR_DECL explicit FBetaScore(Average average = Average::none, double beta = 1.0,
                                    std::optional<double> threshold = std::nullopt,
                                    std::string name = "fbeta_score");
  std::string class_name() const override { return "FBetaScore"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Throws `ShapeError` unless both tensors are 2-D of one shape with as many classes as the
  /// batches before.
  LOADSTAR_DECL void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                  const Tensor<float>* sample_weight) override;
  /// The averaged score; throws `ConfigError` without `average` (read `scores()`).
  LOADSTAR_DECL double result() const override;
  /// The score of each class (one for `"micro"`); empty before the first batch.
  LOADSTAR_DECL std::vector<double> scores() const;
  LOADSTAR_DECL void reset_state() override;
  /// `{"true_positives": [...], "false_positives": [...], "false_negatives": [...],
  /// "intermediate_weights": [...]}`.
  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void set_state(const nlohmann::json& state) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<FBetaScore>(*this); }

 protected:
  /// Reads `average` and `threshold` of a config.
  LOADSTAR_DECL static Average config_average(const detail::ConfigReader& read);
  LOADSTAR_DECL static std::optional<double> config_threshold(const detail::ConfigReader& read);

 private:
  Average average_;
  double beta_;
  std::optional<double> threshold_;
  std::size_t classes_ = 0;  // 0 before the first batch
  std::vector<double> true_positives_, false_positives_, false_negatives_, weights_;
};

/// The F-1 score: `FBetaScore` with `beta` 1, logged as `f1_score`.
/// \code
/// metrics::F1Score f1(metrics::FBetaScore::Average::micro, /*threshold=*/0.5);
/// \endcode
class F1Score : public FBetaScore {
 public:
  explicit F1Score(Average average = Average::none, std::optional<double> threshold = std::nullopt,
                   std::string name = "f1_score")
      : FBetaScore(average, 1.0, threshold, std::move(name)) {}
  std::string class_name() const override { return "F1Score"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory); a `beta` other than
  /// 1 is a `ConfigError`.
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<F1Score>(*this); }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

FBetaScore::FBetaScore(Average average, double beta, std::optional<double> threshold,
                       std::string name)
    : Metric(std::move(name)), average_(average), beta_(beta), threshold_(threshold) {
  if (!(beta > 0)) {
    throw ConfigError(this->name() + " (" + "FBetaScore): beta must be above 0 but is " +
                      nlohmann::json(beta).dump());
  }
  if (threshold && !(*threshold > 0 && *threshold <= 1)) {
    throw ConfigError(this->name() + " (FBetaScore): threshold must be in (0, 1] but is " +
                      nlohmann::json(*threshold).dump());
  }
}

FBetaScore::Average FBetaScore::config_average(const detail::ConfigReader& read) {
  const nlohmann::json* found = read.find("average");
  if (found == nullptr || found->is_null()) return Average::none;
  if (*found == "micro") return Average::micro;
  if (*found == "macro") return Average::macro;
  if (*found == "weighted") return Average::weighted;
  read.fail("average", "null, \"micro\", \"macro\" or \"weighted\"");
}

std::optional<double> FBetaScore::config_threshold(const detail::ConfigReader& read) {
  return read.optional<double>("threshold");
}

std::unique_ptr<Metric> FBetaScore::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "FBetaScore");
  return std::make_unique<FBetaScore>(config_average(read), read.get("beta", 1.0),
                                      config_threshold(read), read.get("name", "fbeta_score"));
}

nlohmann::json FBetaScore::get_config() const {
  auto config = Metric::get_config();
  const char* names[] = {nullptr, "micro", "macro", "weighted"};
  config["average"] = average_ == Average::none ? nlohmann::json(nullptr)
                                                : nlohmann::json(names[static_cast<int>(average_)]);
  config["beta"] = beta_;
  config["threshold"] = threshold_ ? nlohmann::json(*threshold_) : nlohmann::json(nullptr);
  return config;
}

std::unique_ptr<Metric> F1Score::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "F1Score");
  read.expect("beta", 1.0, "F1Score is FBetaScore with beta 1");
  return std::make_unique<F1Score>(config_average(read), config_threshold(read),
                                   read.get("name", "f1_score"));
}

nlohmann::json F1Score::get_config() const {
  auto config = FBetaScore::get_config();
  config.erase("beta");
  return config;
}

void FBetaScore::update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                              const Tensor<float>* sample_weight) {
  if (y_pred.rank() != 2 || y_true.shape() != y_pred.shape()) {
    throw ShapeError(name() + ": expects 2-D y_true and y_pred of one shape (batch_size, " +
                     "classes) but found y_true of shape " + y_true.shape().str() +
                     " and y_pred of shape " + y_pred.shape().str());
  }
  const std::size_t classes = y_pred.shape()[1];
  if (classes_ == 0) {
    classes_ = classes;
    reset_state();
  } else if (classes != classes_) {
    throw ShapeError(name() + ": y_pred of shape " + y_pred.shape().str() + " has " +
                     std::to_string(classes) + " classes but the batches before had " +
                     std::to_string(classes_));
  }
  detail::check_sample_weight(name(), sample_weight, y_pred);
  const bool micro = average_ == Average::micro;
  for (std::size_t r = 0; r < y_pred.rows(); ++r) {
    const double w = sample_weight == nullptr ? 1.0 : sample_weight->data()[r];
    const float* p = y_pred.data() + r * classes;
    const float* t = y_true.data() + r * classes;
    float top = p[0];
    for (std::size_t k = 1; k < classes; ++k)
      top = std::max(top, p[k]);
    for (std::size_t k = 0; k < classes; ++k) {
      const bool positive = threshold_ ? p[k] > *threshold_ : p[k] >= top && std::fabs(p[k]) > 1e-9;
      const double y = t[k];
      const double q = positive ? 1.0 : 0.0;
      const std::size_t c = micro ? 0 : k;
      true_positives_[c] += q * y * w;
      false_positives_[c] += q * (1.0 - y) * w;
      false_negatives_[c] += (1.0 - q) * y * w;
      weights_[c] += y * w;
    }
  }
}

std::vector<double> FBetaScore::scores() const {
  constexpr double eps = 1e-7;  // Keras's backend.epsilon()
  const double b2 = beta_ * beta_;
  std::vector<double> f(true_positives_.size());
  for (std::size_t c = 0; c < f.size(); ++c) {
    const double tp = true_positives_[c];
    const double precision = tp / (tp + false_positives_[c] + eps);
    const double recall = tp / (tp + false_negatives_[c] + eps);
    f[c] = precision * recall / (b2 * precision + recall + eps) * (1.0 + b2);
  }
  return f;
}

double FBetaScore::result() const {
  if (average_ == Average::none) {
    throw ConfigError(name() + " (" + class_name() + "): average None gives one score per " +
                      "class; read scores(), or choose average \"micro\", \"macro\" or " +
                      "\"weighted\" for one number");
  }
  const std::vector<double> f = scores();
  if (f.empty()) return 0.0;
  double score = 0;
  if (average_ == Average::weighted) {
    constexpr double eps = 1e-7;
    double total = 0;
    for (const double w : weights_)
      total += w;
    for (std::size_t c = 0; c < f.size(); ++c)
      score += f[c] * weights_[c] / (total + eps);
    return score;
  }
  for (const double v : f)
    score += v;
  return score / static_cast<double>(f.size());
}

void FBetaScore::reset_state() {
  const std::size_t size = average_ == Average::micro ? (classes_ == 0 ? 0 : 1) : classes_;
  true_positives_.assign(size, 0.0);
  false_positives_.assign(size, 0.0);
  false_negatives_.assign(size, 0.0);
  weights_.assign(size, 0.0);
}

nlohmann::json FBetaScore::get_state() const {
  return {{"true_positives", true_positives_},
          {"false_positives", false_positives_},
          {"false_negatives", false_negatives_},
          {"intermediate_weights", weights_},
          {"classes", classes_}};
}

void FBetaScore::set_state(const nlohmann::json& state) {
  const loadstar::detail::StateReader read(name(), state);
  const auto classes = read.get<std::size_t>("classes");
  auto tp = read.get<std::vector<double>>("true_positives");
  auto fp = read.get<std::vector<double>>("false_positives");
  auto fn = read.get<std::vector<double>>("false_negatives");
  auto weights = read.get<std::vector<double>>("intermediate_weights");
  const std::size_t size = average_ == Average::micro ? (classes == 0 ? 0 : 1) : classes;
  if (tp.size() != size || fp.size() != size || fn.size() != size || weights.size() != size) {
    throw CheckpointError(name() + " state: expected " + std::to_string(size) +
                          " counts of each kind for " + std::to_string(classes) +
                          " classes but found " + std::to_string(tp.size()) + ", " +
                          std::to_string(fp.size()) + ", " + std::to_string(fn.size()) + " and " +
                          std::to_string(weights.size()));
  }
  classes_ = classes;
  true_positives_ = std::move(tp);
  false_positives_ = std::move(fp);
  false_negatives_ = std::move(fn);
  weights_ = std::move(weights);
}

}  // namespace loadstar::keras::metrics
#endif
