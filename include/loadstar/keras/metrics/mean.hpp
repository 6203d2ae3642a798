/// \file
/// `Mean`: the weighted running mean of a value, as `tf.keras.metrics.Mean`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <string>

#include "loadstar/keras/metrics/detail/mean_wrapper.hpp"

namespace loadstar::keras::metrics {

/// The weighted mean of the values given so far (what Keras logs the loss with: each batch's loss
/// weighted by its batch size).
/// \code
/// metrics::Mean loss_tracker("loss");
/// loss_tracker.update_state(0.7, 32);
/// loss_tracker.update_state(0.5, 16);
/// loss_tracker.result();  // (0.7 * 32 + 0.5 * 16) / 48
/// \endcode
class Mean : public Metric {
 public:
  // The model calls the backend overload; this class implements the host one.
  using Metric::update_state;
  explicit Mean(std::string name = "mean") : Metric(std::move(name)) {}
  std::string class_name() const override { return "Mean"; }
  /// The metric described by a Keras config (`Registry<Metric>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Metric> from_config(const nlohmann::json& config);

  /// Adds one value with a weight.
  void update_state(double value, double weight = 1.0) { mean_.add(value, weight); }

  /// Adds every element of `values` (`y_true` is ignored), weighted by its row's weight.
  LOADSTAR_DECL void update_state(const Tensor<float>&, const Tensor<float>& values,
                                  const Tensor<float>* sample_weight) override;
  /// On a device backend the batch is reduced there (`Backend::mean_metric`).
  LOADSTAR_DECL void update_state(Backend& backend, const Tensor<float>& y_true,
                                  const Tensor<float>& values,
                                  const Tensor<float>* sample_weight) override;
  double result() const override { return mean_.result(); }
  void reset_state() override { mean_ = {}; }
  nlohmann::json get_state() const override { return mean_.state(); }
  bool pending() const noexcept override { return !mean_.pending.empty(); }
  void set_state(const nlohmann::json& state) override { mean_.restore(name(), state); }
  std::shared_ptr<Metric> clone() const override { return std::make_shared<Mean>(*this); }

 private:
  mutable detail::RunningMean mean_;  // reading adds what a device may still have been computing
};

}  // namespace loadstar::keras::metrics

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::metrics {

std::unique_ptr<Metric> Mean::from_config(const nlohmann::json& config) {
  const auto read = detail::metric_config(config, "Mean");
  return std::make_unique<Mean>(read.get("name", "mean"));
}

void Mean::update_state(Backend& backend, const Tensor<float>& y_true, const Tensor<float>& values,
                        const Tensor<float>* sample_weight) {
  if (!backend.is_host()) {
    detail::check_sample_weight(name(), sample_weight, values);
    static const Tensor<float> none;
    // The labels are not read (and may live elsewhere): an empty tensor stands for them.
    if (auto sums = backend.mean_metric({MeanMetricKind::mean, 0.5}, none, values,
                                        sample_weight != nullptr ? *sample_weight : none)) {
      mean_.add_sums(std::move(*sums));
      return;
    }
  }
  Metric::update_state(backend, y_true, values, sample_weight);
}

void Mean::update_state(const Tensor<float>&, const Tensor<float>& values,
                        const Tensor<float>* sample_weight) {
  detail::check_sample_weight(name(), sample_weight, values);
  const std::size_t per_row = values.rows() == 0 ? 1 : values.size() / values.rows();
  for (std::size_t j = 0; j < values.size(); ++j) {
    mean_.add(values.data()[j],
              sample_weight == nullptr ? 1.0 : sample_weight->data()[j / per_row]);
  }
}

}  // namespace loadstar::keras::metrics
#endif
