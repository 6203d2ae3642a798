/// \file
/// The machinery of the metrics that are the running mean of a loss function (Keras's
/// `MeanMetricWrapper` of `losses.binary_crossentropy`, `losses.hinge`, ...).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <optional>
#include <span>

#include "loadstar/keras/losses/loss.hpp"
#include "loadstar/keras/metrics/detail/mean_wrapper.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// A metric that is the weighted running mean of the per-sample values of the loss `L` (one per
/// last-axis row of `y_pred`, each weighted by its batch row's sample weight), computed by the
/// loss itself with `Reduction::none`, so that its shape and label checks and its formula are the
/// loss's. `Derived` provides `L make_loss() const`, which makes the loss with the metric's
/// options, its `name()` and `Reduction::none`, and may set `sign` to -1 (Keras's
/// `CosineSimilarity` metric is the loss negated). Runs on the host on every backend.
template <class Derived, class L>
class LossMetric : public MeanWrapper<Derived> {
 public:
  using MeanWrapper<Derived>::MeanWrapper;
  using MeanWrapper<Derived>::update_state;

  static constexpr double sign = 1.0;

  void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                    const Tensor<float>* sample_weight) override {
    check_sample_weight(this->name(), sample_weight, y_pred, true);
    // The loss is made again when the metric was renamed, so that its messages name the metric.
    if (!loss_ || loss_->name() != this->name()) {
      loss_.emplace(static_cast<const Derived&>(*this).make_loss());
    }
    loss_->compute(y_true, y_pred, nullptr, Tensor<float>());
    const std::span<const float> values = loss_->per_sample();
    const ValueWeights weight_of(sample_weight, values.size());
    for (std::size_t j = 0; j < values.size(); ++j)
      this->add_value(Derived::sign * static_cast<double>(values[j]), weight_of(j));
  }

  /// Unused: `update_state` computes the values through the loss.
  double value(const float*, const float*, std::size_t) const { return 0; }

 private:
  std::optional<L> loss_;
};

}  // namespace loadstar::keras::detail
