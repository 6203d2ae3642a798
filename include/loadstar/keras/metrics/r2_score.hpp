/// \file
/// `R2Score`: the coefficient of determination, as `keras.metrics.R2Score`.
#pragma once

#include "loadstar/config.hpp"

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

/// The R² of 2-D `y_true` and `y_pred` (batch, outputs), accumulated over batches as Keras 3
/// does: per output, the weighted sums of `y`, `y²`, the squared residuals and the weights, and
/// the number of samples with a non-zero weight. Per output `1 - residual / total` (0 where the
/// total variance is 0), aggregated by `class_aggregation`: `"uniform_average"` (the mean,
/// Keras's default), `"variance_weighted_average"` (weighted by each output's variance) or none
/// (`scores()` gives one per output; `result()` then throws). With `num_regressors` above 0 the
/// adjusted R², `1 - (1 - R²)(n - 1)/(n - p - 1)`, unless `p >= n - 1` (then the plain R², as
/// Keras, which warns).
/// \code
/// metrics::R2Score r2;
/// r2.update_state(y_true, y_pred, nullptr);
/// double score = r2.result();
/// \endcode
class R2Score : public Metric {
 public:
  /// How the per-output scores become one number.
  enum class Aggregation { none, uniform_average, variance_weighted_average };

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit R2Score(Aggregation class_aggregation = Aggregation::uniform_average,
                   std::size_t num_regressors = 0, std::string name = "r2_score")
      : Metric(std::move(name)), aggregation_(class_aggregation), regressors_(num_regressors) {}
  std::string class_name() const override { return "R2Score"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory); throws `ConfigError`
  /// for an unknown `class_aggregation` or a negative `num_regressors`.
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// Throws `ShapeError` unless both tensors are 2-D of one shape (up to Keras's squeeze of a
  /// trailing 1) with as many outputs as the batches before.
  LOADSTAR_DECL void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                  const Tensor<float>* sample_weight) override;
  /// The aggregated score; throws `ConfigError` without aggregation (read `scores()`).
  LOADSTAR_DECL double result() const override;
  /// The score of each output (Keras's `raw_scores`); empty before the first batch.
  LOADSTAR_DECL std::vector<double> scores() const;
  void reset_state() override { *this = R2Score(aggregation_, regressors_, name()); }
  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void set_state(const nlohmann::json& state) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<R2Score>(*this); }

 private:
  Aggregation aggregation_;
  std::size_t regressors_;
  std::vector<double> sum_, squared_sum_, residual_, count_;
  double num_samples_ = 0;
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> R2Score::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "R2Score");
  Aggregation aggregation = Aggregation::uniform_average;
  if (const nlohmann::json* found = read.find("class_aggregation")) {
    if (found->is_null()) {
      aggregation = Aggregation::none;
    } else if (*found == "variance_weighted_average") {
      aggregation = Aggregation::variance_weighted_average;
    } else if (*found != "uniform_average") {
      read.fail("class_aggregation", "null, \"uniform_average\" or \"variance_weighted_average\"");
    }
  }
  return std::make_unique<R2Score>(aggregation, read.get("num_regressors", std::size_t{0}),
                                   read.get("name", "r2_score"));
}

nlohmann::json R2Score::get_config() const {
  auto config = Metric::get_config();
  const char* names[] = {nullptr, "uniform_average", "variance_weighted_average"};
  config["class_aggregation"] = aggregation_ == Aggregation::none
                                    ? nlohmann::json(nullptr)
                                    : nlohmann::json(names[static_cast<int>(aggregation_)]);
  config["num_regressors"] = regressors_;
  return config;
}

void R2Score::update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                           const Tensor<float>* sample_weight) {
  if (y_pred.rank() != 2 || !detail::shapes_fit(y_true.shape(), y_pred.shape())) {
    throw ShapeError(name() + ": expects 2-D y_true and y_pred of one shape (batch_size, " +
                     "outputs) but found y_true of shape " + y_true.shape().str() +
                     " and y_pred of shape " + y_pred.shape().str());
  }
  const std::size_t outputs = y_pred.shape()[1];
  if (sum_.empty()) {
    sum_.assign(outputs, 0.0);
    squared_sum_.assign(outputs, 0.0);
    residual_.assign(outputs, 0.0);
    count_.assign(outputs, 0.0);
  } else if (sum_.size() != outputs) {
    throw ShapeError(name() + ": y_pred of shape " + y_pred.shape().str() + " has " +
                     std::to_string(outputs) + " outputs but the batches before had " +
                     std::to_string(sum_.size()));
  }
  detail::check_sample_weight(name(), sample_weight, y_pred);
  for (std::size_t r = 0; r < y_pred.rows(); ++r) {
    const double w = sample_weight == nullptr ? 1.0 : sample_weight->data()[r];
    for (std::size_t k = 0; k < outputs; ++k) {
      const double y = y_true.data()[r * outputs + k];
      const double e = y - static_cast<double>(y_pred.data()[r * outputs + k]);
      sum_[k] += y * w;
      squared_sum_[k] += y * y * w;
      residual_[k] += e * e * w;
      count_[k] += w;
    }
    // A sample counts when its weight is not 0 for some output (one weight per row here).
    num_samples_ += w != 0 ? 1.0 : 0.0;
  }
}

std::vector<double> R2Score::scores() const {
  std::vector<double> raw(sum_.size());
  for (std::size_t k = 0; k < raw.size(); ++k) {
    const double mean = sum_[k] / count_[k];
    const double total = squared_sum_[k] - sum_[k] * mean;
    const double score = 1.0 - residual_[k] / total;
    raw[k] = std::isinf(score) ? 0.0 : score;  // Keras: where(isinf(raw_scores), 0, raw_scores)
  }
  return raw;
}

double R2Score::result() const {
  if (aggregation_ == Aggregation::none) {
    throw ConfigError(name() + " (R2Score): class_aggregation None gives one score per output; " +
                      "read scores(), or choose \"uniform_average\" or " +
                      "\"variance_weighted_average\" for one number");
  }
  const std::vector<double> raw = scores();
  if (raw.empty()) return 0.0;
  double score = 0;
  if (aggregation_ == Aggregation::uniform_average) {
    for (const double s : raw)
      score += s;
    score /= static_cast<double>(raw.size());
  } else {
    double weighted = 0, weights = 0;
    for (std::size_t k = 0; k < raw.size(); ++k) {
      const double total = squared_sum_[k] - sum_[k] * (sum_[k] / count_[k]);
      weighted += total * raw[k];
      weights += total;
    }
    score = weighted / weights;
  }
  const auto n = num_samples_;
  const auto p = static_cast<double>(regressors_);
  if (regressors_ != 0 && p < n - 1) score = 1.0 - (1.0 - score) * (n - 1) / (n - p - 1);
  return score;
}

nlohmann::json R2Score::get_state() const {
  return {{"sum", sum_},
          {"squared_sum", squared_sum_},
          {"residual", residual_},
          {"count", count_},
          {"num_samples", num_samples_}};
}

void R2Score::set_state(const nlohmann::json& state) {
  const loadstar::detail::StateReader read(name(), state);
  auto sum = read.get<std::vector<double>>("sum");
  auto squared_sum = read.get<std::vector<double>>("squared_sum");
  auto residual = read.get<std::vector<double>>("residual");
  auto count = read.get<std::vector<double>>("count");
  if (squared_sum.size() != sum.size() || residual.size() != sum.size() ||
      count.size() != sum.size()) {
    throw CheckpointError(name() + " state: expected sum, squared_sum, residual and count of " +
                          "one size but found " + std::to_string(sum.size()) + ", " +
                          std::to_string(squared_sum.size()) + ", " +
                          std::to_string(residual.size()) + " and " + std::to_string(count.size()));
  }
  num_samples_ = read.get<double>("num_samples");
  sum_ = std::move(sum);
  squared_sum_ = std::move(squared_sum);
  residual_ = std::move(residual);
  count_ = std::move(count);
}

}  // namespace loadstar::keras::metrics
#endif
