/// \file
/// Weighted confusion counts at thresholds, as Keras's
/// `metrics_utils.update_confusion_matrix_variables`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// Counts of true/false positives and negatives at sorted thresholds, where a prediction is
/// positive at a threshold when it is strictly greater (Keras) and a label is positive when it is
/// not 0 (Keras casts labels to bool). Each element counts with its batch row's sample weight.
class ConfusionCounts {
 public:
  explicit ConfusionCounts(std::vector<double> thresholds)
      : thresholds_(std::move(thresholds)),
        positives_(thresholds_.size() + 1),
        negatives_(thresholds_.size() + 1) {}

  /// Counts each prediction with its row's `sample_weight` (1 without), times the weight of its
  /// label (its index on the last axis) in `label_weights` when that is not empty.
  LOADSTAR_DECL void update(const std::string& owner, const Tensor<float>& y_true,
                            const Tensor<float>& y_pred, const Tensor<float>* sample_weight,
                            std::span<const double> label_weights = {});

  /// True positives at threshold `i`: positive labels predicted above it.
  double true_positives(std::size_t i) const { return above(positives_, i); }
  double false_positives(std::size_t i) const { return above(negatives_, i); }
  double false_negatives(std::size_t i) const { return below(positives_, i); }
  double true_negatives(std::size_t i) const { return below(negatives_, i); }
  std::size_t size() const noexcept { return thresholds_.size(); }

  LOADSTAR_DECL void reset();

  /// `{"positives": [...], "negatives": [...]}`: the weighted counts per bucket.
  nlohmann::json state() const { return {{"positives", positives_}, {"negatives", negatives_}}; }
  LOADSTAR_DECL void restore(const std::string& owner, const nlohmann::json& state);

 private:
  // Bucket b holds predictions above thresholds 0..b-1, so above threshold i means b > i.
  LOADSTAR_DECL static double above(const std::vector<double>& counts, std::size_t i);
  LOADSTAR_DECL static double below(const std::vector<double>& counts, std::size_t i);

  std::vector<double> thresholds_;
  std::vector<double> positives_;
  std::vector<double> negatives_;
};

inline double divide_no_nan(double a, double b) {
  return b == 0 ? 0.0 : a / b;
}

/// Keras's `thresholds` of `Precision` and `Recall`: a number, a list of one, or null for 0.5.
LOADSTAR_DECL double config_threshold(const ConfigReader& read);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void ConfusionCounts::update(const std::string& owner, const Tensor<float>& y_true,
                             const Tensor<float>& y_pred, const Tensor<float>* sample_weight,
                             std::span<const double> label_weights) {
  if (!shapes_fit(y_true.shape(), y_pred.shape())) {
    throw ShapeError(owner + ": y_true of shape " + y_true.shape().str() +
                     " does not match y_pred of shape " + y_pred.shape().str());
  }
  check_sample_weight(owner, sample_weight, y_pred);
  const std::size_t per_row = y_pred.rows() == 0 ? 1 : y_pred.size() / y_pred.rows();
  for (std::size_t j = 0; j < y_pred.size(); ++j) {
    double weight =
        sample_weight == nullptr ? 1.0 : static_cast<double>(sample_weight->data()[j / per_row]);
    if (!label_weights.empty()) weight *= label_weights[j % label_weights.size()];
    // The bucket is the number of thresholds below the prediction: positive at those.
    const auto bucket =
        static_cast<std::size_t>(std::lower_bound(thresholds_.begin(), thresholds_.end(),
                                                  static_cast<double>(y_pred.data()[j])) -
                                 thresholds_.begin());
    (y_true.data()[j] != 0 ? positives_ : negatives_)[bucket] += weight;
  }
}

void ConfusionCounts::reset() {
  std::fill(positives_.begin(), positives_.end(), 0.0);
  std::fill(negatives_.begin(), negatives_.end(), 0.0);
}

void ConfusionCounts::restore(const std::string& owner, const nlohmann::json& state) {
  const loadstar::detail::StateReader read(owner, state);
  auto positives = read.get<std::vector<double>>("positives");
  auto negatives = read.get<std::vector<double>>("negatives");
  if (positives.size() != positives_.size() || negatives.size() != negatives_.size()) {
    throw CheckpointError(owner + " state: expected " + std::to_string(positives_.size()) +
                          " counts per label but found " + std::to_string(positives.size()) +
                          " and " + std::to_string(negatives.size()));
  }
  positives_ = std::move(positives);
  negatives_ = std::move(negatives);
}

double ConfusionCounts::above(const std::vector<double>& counts, std::size_t i) {
  double sum = 0;
  for (std::size_t b = i + 1; b < counts.size(); ++b)
    sum += counts[b];
  return sum;
}

double ConfusionCounts::below(const std::vector<double>& counts, std::size_t i) {
  double sum = 0;
  for (std::size_t b = 0; b <= i; ++b)
    sum += counts[b];
  return sum;
}

double config_threshold(const ConfigReader& read) {
  if (!read.has("thresholds")) return 0.5;
  const nlohmann::json& v = *read.find("thresholds");
  if (v.is_number()) return v.get<double>();
  if (v.is_array() && v.size() == 1 && v[0].is_number()) return v[0].get<double>();
  read.fail("thresholds", "a number or a list of one");
}

}  // namespace loadstar::keras::detail
#endif
