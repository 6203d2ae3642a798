/// \file
/// The intersection-over-union metrics of `keras.metrics`: `IoU`, `MeanIoU`, `BinaryIoU`,
/// `OneHotIoU` and `OneHotMeanIoU`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"
#include "loadstar/keras/metrics/metric.hpp"

namespace loadstar::keras::metrics {

/// The options of the IoU metrics beyond the classes.
struct IoUOptions {
  std::optional<long long> ignore_class;
  bool sparse_y_true = true;
  bool sparse_y_pred = true;
  /// `BinaryIoU`: a prediction is class 1 when at least this.
  std::optional<double> threshold;
  /// Weights as integers (Keras 3's `dtype="int"`).
  bool integer_weights = false;
};

/// The IoU of chosen classes, `tp / (tp + fp + fn)` from a weighted confusion matrix of class
/// indices accumulated over batches, averaged over the target classes whose denominator is not 0,
/// as Keras's `IoU`. Labels and predictions are class indices (truncated towards 0, as Keras's
/// cast to int), every element counting with its batch row's sample weight; one-hot labels
/// (`sparse_y_true` false) and scores (`sparse_y_pred` false) are reduced by their argmax over the
/// last axis first. A label or prediction outside `[0, num_classes)`, and a label equal to
/// `ignore_class`, are left out (Keras masks them). With an integer `dtype` (Keras 3's default),
/// weights are truncated to integers as Keras casts them.
/// \code
/// metrics::IoU iou(/*num_classes=*/3, /*target_class_ids=*/{0, 2});
/// iou.update_state(labels, predicted_classes, nullptr);
/// \endcode
class IoU : public Metric {
 public:
  using Options = IoUOptions;

  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  /// Throws `ConfigError` for `num_classes` 0 or a target class outside `[0, num_classes)`.
  LOADSTAR_DECL IoU(std::size_t num_classes, std::vector<std::size_t> target_class_ids,
                    std::string name = "io_u", Options options = {});
  std::string class_name() const override { return "IoU"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                                  const Tensor<float>* sample_weight) override;
  LOADSTAR_DECL double result() const override;
  void reset_state() override { std::fill(matrix_.begin(), matrix_.end(), 0.0); }
  /// `{"total_confusion_matrix": [...]}`, row-major, labels along the rows.
  nlohmann::json get_state() const override { return {{"total_confusion_matrix", matrix_}}; }
  LOADSTAR_DECL void set_state(const nlohmann::json& state) override;
  std::shared_ptr<Metric> clone() const override { return std::make_shared<IoU>(*this); }

  std::size_t num_classes() const noexcept { return classes_; }
  const std::vector<std::size_t>& target_class_ids() const noexcept { return targets_; }
  const Options& options() const noexcept { return options_; }

 protected:
  /// The options every IoU config shares (`ignore_class`, `sparse_y_true`, `sparse_y_pred`,
  /// `axis`, `dtype`); `sparse_y_pred` is false by default for the one-hot metrics.
  LOADSTAR_DECL static Options config_options(const detail::ConfigReader& read,
                                              bool sparse_y_pred = true);
  /// The options of the one-hot metrics by default: scores as predictions.
  static Options one_hot_options() {
    Options options;
    options.sparse_y_pred = false;
    return options;
  }
  /// The class ids of `target_class_ids`.
  LOADSTAR_DECL static std::vector<std::size_t> config_targets(const detail::ConfigReader& read);
  /// `0, 1, ..., n - 1`: the targets of the mean IoU metrics.
  LOADSTAR_DECL static std::vector<std::size_t> every_class(std::size_t n);
  /// `get_config` of the given keys only (each subclass writes Keras's own set).
  LOADSTAR_DECL nlohmann::json config_of(std::initializer_list<const char*> keys) const;

 private:
  std::size_t classes_;
  std::vector<std::size_t> targets_;
  Options options_;
  std::vector<double> matrix_;  // classes x classes
};

/// The IoU averaged over every class, as Keras's `MeanIoU`.
/// \code
/// metrics::MeanIoU mean_iou(/*num_classes=*/4);
/// \endcode
class MeanIoU : public IoU {
 public:
  LOADSTAR_DECL explicit MeanIoU(std::size_t num_classes, std::string name = "mean_io_u",
                                 Options options = {});
  std::string class_name() const override { return "MeanIoU"; }
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  nlohmann::json get_config() const override {
    return config_of({"num_classes", "ignore_class", "sparse_y_true", "sparse_y_pred", "axis"});
  }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<MeanIoU>(*this); }
};

/// The IoU of binary labels against predictions thresholded at `threshold` (class 1 when at
/// least it), for the classes `target_class_ids` of {0, 1}, as Keras's `BinaryIoU`.
/// \code
/// metrics::BinaryIoU binary_iou({1}, /*threshold=*/0.5);
/// \endcode
class BinaryIoU : public IoU {
 public:
  LOADSTAR_DECL explicit BinaryIoU(std::vector<std::size_t> target_class_ids = {0, 1},
                                   double threshold = 0.5, std::string name = "binary_io_u",
                                   bool integer_weights = false);
  std::string class_name() const override { return "BinaryIoU"; }
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  nlohmann::json get_config() const override {
    return config_of({"target_class_ids", "threshold"});
  }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<BinaryIoU>(*this); }
};

/// `IoU` of one-hot labels and scores (class indices with `sparse_y_pred`), as Keras's
/// `OneHotIoU`.
/// \code
/// metrics::OneHotIoU iou(/*num_classes=*/3, {0, 2});
/// \endcode
class OneHotIoU : public IoU {
 public:
  LOADSTAR_DECL OneHotIoU(std::size_t num_classes, std::vector<std::size_t> target_class_ids,
                          std::string name = "one_hot_io_u", Options options = one_hot_options());
  std::string class_name() const override { return "OneHotIoU"; }
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  nlohmann::json get_config() const override {
    return config_of({"num_classes", "target_class_ids", "ignore_class", "sparse_y_pred", "axis"});
  }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<OneHotIoU>(*this); }
};

/// `MeanIoU` of one-hot labels and scores (class indices with `sparse_y_pred`), as Keras's
/// `OneHotMeanIoU`.
/// \code
/// metrics::OneHotMeanIoU iou(/*num_classes=*/3);
/// \endcode
class OneHotMeanIoU : public IoU {
 public:
  LOADSTAR_DECL explicit OneHotMeanIoU(std::size_t num_classes,
                                       std::string name = "one_hot_mean_io_u",
                                       Options options = one_hot_options());
  std::string class_name() const override { return "OneHotMeanIoU"; }
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);
  nlohmann::json get_config() const override {
    return config_of({"num_classes", "ignore_class", "sparse_y_pred", "axis"});
  }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<OneHotMeanIoU>(*this); }
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::vector<std::size_t> IoU::every_class(std::size_t n) {
  std::vector<std::size_t> ids(n);
  for (std::size_t i = 0; i < n; ++i)
    ids[i] = i;
  return ids;
}

IoU::IoU(std::size_t num_classes, std::vector<std::size_t> target_class_ids, std::string name,
         Options options)
    : Metric(std::move(name)),
      classes_(num_classes),
      targets_(std::move(target_class_ids)),
      options_(options),
      matrix_(num_classes * num_classes, 0.0) {
  if (num_classes == 0) {
    throw ConfigError(this->name() + ": num_classes must be at least 1 but is 0");
  }
  if (targets_.empty()) {
    throw ConfigError(this->name() + ": target_class_ids must name at least one class");
  }
  for (const std::size_t id : targets_) {
    if (id >= num_classes) {
      throw ConfigError(this->name() + ": target class id " + std::to_string(id) +
                        " is outside [0, num_classes) with num_classes " +
                        std::to_string(num_classes));
    }
  }
}

MeanIoU::MeanIoU(std::size_t num_classes, std::string name, Options options)
    : IoU(num_classes, every_class(num_classes), std::move(name), options) {}

BinaryIoU::BinaryIoU(std::vector<std::size_t> target_class_ids, double threshold, std::string name,
                     bool integer_weights)
    : IoU(2, std::move(target_class_ids), std::move(name),
          Options{std::nullopt, true, true, threshold, integer_weights}) {}

OneHotIoU::OneHotIoU(std::size_t num_classes, std::vector<std::size_t> target_class_ids,
                     std::string name, Options options)
    : IoU(num_classes, std::move(target_class_ids), std::move(name),
          (options.sparse_y_true = false, options)) {}

OneHotMeanIoU::OneHotMeanIoU(std::size_t num_classes, std::string name, Options options)
    : IoU(num_classes, every_class(num_classes), std::move(name),
          (options.sparse_y_true = false, options)) {}

IoU::Options IoU::config_options(const detail::ConfigReader& read, bool sparse_y_pred) {
  Options options;
  read.expect("axis", -1, "loadstar takes the argmax over the last axis");
  options.ignore_class = read.optional<std::int64_t>("ignore_class");
  options.sparse_y_true = read.get("sparse_y_true", true);
  options.sparse_y_pred = read.get("sparse_y_pred", sparse_y_pred);
  if (const nlohmann::json* dtype = read.find("dtype"); dtype != nullptr && !dtype->is_null()) {
    if (*dtype == "int32" || *dtype == "int64" || *dtype == "int") {
      options.integer_weights = true;
    } else if (*dtype != "float32") {
      read.fail("dtype", "\"float32\" or an integer type (\"int32\", \"int64\")");
    }
  }
  return options;
}

std::vector<std::size_t> IoU::config_targets(const detail::ConfigReader& read) {
  return read.get<std::vector<std::size_t>>("target_class_ids");
}

// The IoU metrics read their own `dtype` (Keras 3 writes "int32"), so they read their configs
// without `metric_config`'s float32 check.
std::unique_ptr<Metric> IoU::from_config(const nlohmann::json& config) {
  const auto read = detail::ConfigReader::of(config, "metric", "IoU");
  return std::make_unique<IoU>(read.positive("num_classes"), config_targets(read),
                               read.get("name", "io_u"), config_options(read));
}

std::unique_ptr<Metric> MeanIoU::from_config(const nlohmann::json& config) {
  const auto read = detail::ConfigReader::of(config, "metric", "MeanIoU");
  return std::make_unique<MeanIoU>(read.positive("num_classes"), read.get("name", "mean_io_u"),
                                   config_options(read));
}

std::unique_ptr<Metric> BinaryIoU::from_config(const nlohmann::json& config) {
  const auto read = detail::ConfigReader::of(config, "metric", "BinaryIoU");
  const Options options = config_options(read);
  std::vector<std::size_t> targets{0, 1};
  if (read.has("target_class_ids")) targets = config_targets(read);
  return std::make_unique<BinaryIoU>(std::move(targets), read.get("threshold", 0.5),
                                     read.get("name", "binary_io_u"), options.integer_weights);
}

std::unique_ptr<Metric> OneHotIoU::from_config(const nlohmann::json& config) {
  const auto read = detail::ConfigReader::of(config, "metric", "OneHotIoU");
  read.expect("sparse_y_true", false, "OneHotIoU takes one-hot labels");
  return std::make_unique<OneHotIoU>(read.positive("num_classes"), config_targets(read),
                                     read.get("name", "one_hot_io_u"), config_options(read, false));
}

std::unique_ptr<Metric> OneHotMeanIoU::from_config(const nlohmann::json& config) {
  const auto read = detail::ConfigReader::of(config, "metric", "OneHotMeanIoU");
  read.expect("sparse_y_true", false, "OneHotMeanIoU takes one-hot labels");
  return std::make_unique<OneHotMeanIoU>(read.positive("num_classes"),
                                         read.get("name", "one_hot_mean_io_u"),
                                         config_options(read, false));
}

nlohmann::json IoU::get_config() const {
  return config_of({"num_classes", "target_class_ids", "ignore_class", "sparse_y_true",
                    "sparse_y_pred", "axis"});
}

nlohmann::json IoU::config_of(std::initializer_list<const char*> keys) const {
  nlohmann::json config = {{"name", name()},
                           {"dtype", options_.integer_weights ? "int32" : "float32"}};
  for (const std::string key : keys) {
    if (key == "num_classes") config[key] = classes_;
    if (key == "target_class_ids") config[key] = targets_;
    if (key == "ignore_class") {
      config[key] =
          options_.ignore_class ? nlohmann::json(*options_.ignore_class) : nlohmann::json(nullptr);
    }
    if (key == "sparse_y_true") config[key] = options_.sparse_y_true;
    if (key == "sparse_y_pred") config[key] = options_.sparse_y_pred;
    if (key == "axis") config[key] = -1;
    if (key == "threshold") config[key] = options_.threshold.value_or(0.5);
  }
  return config;
}

void IoU::update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                       const Tensor<float>* sample_weight) {
  // The class index of each element (of each last-axis row where one-hot).
  const auto indices_per_row = [](const Tensor<float>& t, bool sparse) {
    return sparse ? 1 : detail::last_axis(t);
  };
  const std::size_t true_width = indices_per_row(y_true, options_.sparse_y_true);
  const std::size_t pred_width = indices_per_row(y_pred, options_.sparse_y_pred);
  const std::size_t true_count = true_width == 0 ? 0 : y_true.size() / true_width;
  const std::size_t pred_count = pred_width == 0 ? 0 : y_pred.size() / pred_width;
  if (true_count != pred_count || y_true.rows() != y_pred.rows()) {
    throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() + " gives " +
                     std::to_string(true_count) + " class indices but y_pred of shape " +
                     y_pred.shape().str() + " gives " + std::to_string(pred_count));
  }
  detail::check_sample_weight(name(), sample_weight, y_pred);
  const std::size_t per_row = y_pred.rows() == 0 ? 1 : true_count / y_pred.rows();
  const auto index = [&](const float* x, std::size_t width, bool threshold) -> double {
    if (width != 1) return static_cast<double>(detail::argmax(x, width));
    if (threshold) return *x >= *options_.threshold ? 1.0 : 0.0;
    return std::trunc(static_cast<double>(*x));  // Keras casts to an integer type
  };
  const auto classes = static_cast<double>(classes_);
  for (std::size_t j = 0; j < true_count; ++j) {
    const double t = index(y_true.data() + j * true_width, true_width, false);
    const double p =
        index(y_pred.data() + j * pred_width, pred_width, options_.threshold.has_value());
    if (!(t >= 0 && t < classes && p >= 0 && p < classes)) continue;
    if (options_.ignore_class && t == static_cast<double>(*options_.ignore_class)) continue;
    double weight =
        sample_weight == nullptr ? 1.0 : static_cast<double>(sample_weight->data()[j / per_row]);
    if (options_.integer_weights) weight = std::trunc(weight);
    matrix_[static_cast<std::size_t>(t) * classes_ + static_cast<std::size_t>(p)] += weight;
  }
}

double IoU::result() const {
  constexpr double eps = 1e-7;  // Keras's backend.epsilon()
  double sum = 0, valid = 0;
  for (const std::size_t c : targets_) {
    double row = 0, column = 0;
    for (std::size_t k = 0; k < classes_; ++k) {
      row += matrix_[c * classes_ + k];
      column += matrix_[k * classes_ + c];
    }
    const double tp = matrix_[c * classes_ + c];
    const double denominator = row + column - tp;
    if (denominator > 1e-9) {
      sum += tp / (denominator + eps);
      valid += 1;
    }
  }
  return sum / (valid + eps);
}

void IoU::set_state(const nlohmann::json& state) {
  const loadstar::detail::StateReader read(name(), state);
  auto matrix = read.get<std::vector<double>>("total_confusion_matrix");
  if (matrix.size() != matrix_.size()) {
    throw CheckpointError(name() + " state: expected a confusion matrix of " +
                          std::to_string(matrix_.size()) + " counts but found " +
                          std::to_string(matrix.size()));
  }
  matrix_ = std::move(matrix);
}

}  // namespace loadstar::keras::metrics
#endif
