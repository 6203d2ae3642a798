/// \file
/// The machinery of Keras's `MeanMetricWrapper`: a weighted running mean of per-sample values.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"
#include "loadstar/keras/metrics/metric.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// A weighted running mean (Keras's `Reduce` metric with `WEIGHTED_MEAN`): `total / count`, or 0
/// before any weight was seen (`div_no_nan`). A device backend's batch sums may still be computed
/// when they are added: they are kept in order and added when the mean is read, so that the sums
/// are the same, bit for bit, as when each batch is added at once.
struct RunningMean {
  double total = 0;
  double count = 0;
  LOADSTAR_DECL void add(double value, double weight);
  /// Adds a batch's sums (a device backend's `mean_metric`).
  void add_sums(Deferred<MeanMetricSums> sums) {
    if (pending.empty() && sums.ready()) {
      add_known(sums.get());
    } else {
      pending.push_back(std::move(sums));
    }
  }
  /// Adds the pending batch sums, in order (waits for the device).
  void settle() {
    for (const auto& sums : pending)
      add_known(sums.get());
    pending.clear();
  }
  double result() {
    settle();
    return count == 0 ? 0.0 : total / count;
  }
  nlohmann::json state() {
    settle();
    return {{"total", total}, {"count", count}};
  }
  LOADSTAR_DECL void restore(const std::string& owner, const nlohmann::json& state);

  std::vector<Deferred<MeanMetricSums>> pending;

 private:
  void add_known(const MeanMetricSums& sums) {
    total += sums.total;
    count += sums.count;
  }
};

/// A metric that is the weighted mean of one value per last-axis row of `y_pred` (or per element
/// when `Derived::elementwise`), each weighted by its batch row's sample weight, as Keras's
/// `MeanMetricWrapper`. `Derived` provides `double value(const float* y_true, const float* y_pred,
/// std::size_t classes) const`, `true_size(classes)` and `check_shapes(y_true, y_pred)`.
template <class Derived>
class MeanWrapper : public Metric {
 public:
  // The model calls the backend overload; this class implements the host one.
  using Metric::Metric;
  using Metric::update_state;

  void update_state(const Tensor<float>& y_true, const Tensor<float>& y_pred,
                    const Tensor<float>* sample_weight) override {
    const auto& self = static_cast<const Derived&>(*this);
    self.check_shapes(y_true, y_pred);
    check_sample_weight(name(), sample_weight, y_pred, true);
    const std::size_t classes = Derived::elementwise ? 1 : last_axis(y_pred);
    const std::size_t values = classes == 0 ? 0 : y_pred.size() / classes;
    const std::size_t true_size = self.true_size(classes);
    const ValueWeights weight_of(sample_weight, values);
    for (std::size_t j = 0; j < values; ++j) {
      mean_.add(self.value(y_true.data() + j * true_size, y_pred.data() + j * classes, classes),
                weight_of(j));
    }
  }
  /// On a device backend with a kernel for the metric (`Derived::device_spec()`), the batch is
  /// reduced there; otherwise the host `update_state` runs as the backend's host kernel.
  void update_state(Backend& backend, const Tensor<float>& y_true, const Tensor<float>& y_pred,
                    const Tensor<float>* sample_weight) override {
    const auto& self = static_cast<const Derived&>(*this);
    if (!backend.is_host() &&
        (sample_weight == nullptr || sample_weight->size() == y_pred.rows())) {
      if (const std::optional<MeanMetricSpec> spec = self.device_spec()) {
        self.check_shapes(y_true, y_pred);
        check_sample_weight(name(), sample_weight, y_pred, true);
        static const Tensor<float> none;
        if (auto sums = backend.mean_metric(*spec, y_true, y_pred,
                                            sample_weight != nullptr ? *sample_weight : none)) {
          mean_.add_sums(std::move(*sums));
          return;
        }
      }
    }
    Metric::update_state(backend, y_true, y_pred, sample_weight);
  }
  double result() const override { return mean_.result(); }
  /// Keras's `MeanMetricWrapper` weights each value by the output's mask.
  bool applies_masks() const noexcept override { return true; }
  void reset_state() override { mean_ = {}; }
  nlohmann::json get_state() const override { return mean_.state(); }
  bool pending() const noexcept override { return !mean_.pending.empty(); }
  void set_state(const nlohmann::json& state) override { mean_.restore(name(), state); }
  std::shared_ptr<Metric> clone() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }

  static constexpr bool elementwise = false;
  /// What a device backend's `mean_metric` computes for this metric (`std::nullopt`: host only).
  std::optional<MeanMetricSpec> device_spec() const { return std::nullopt; }
  std::size_t true_size(std::size_t classes) const noexcept { return classes; }
  void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const {
    if (!shapes_fit(y_true.shape(), y_pred.shape())) {
      throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                       " does not match y_pred of shape " + y_pred.shape().str());
    }
  }

 protected:
  /// Adds one per-sample value with its weight (a derived class that computes its values
  /// itself).
  void add_value(double value, double weight) { mean_.add(value, weight); }

  /// Throws `ShapeError` unless `y_true` holds one label per last-axis row of `y_pred`.
  void check_sparse_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const {
    const Shape expected = without_last_axis(y_pred.shape());
    if (y_pred.rank() < 2 || !shapes_fit(y_true.shape(), expected)) {
      throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                       " does not match y_pred of shape " + y_pred.shape().str() +
                       " (expected one class index per row of shape " + expected.str() + ")");
    }
  }

 private:
  mutable RunningMean mean_;  // reading adds the batches a device may still have been computing
};

/// `tf.math.in_top_k`: whether `x[target]` is among the `k` largest (ties at the boundary count
/// as inside; a non-finite `x[target]` is not).
LOADSTAR_DECL bool in_top_k(const float* x, std::size_t n, std::size_t target, std::size_t k);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void RunningMean::add(double value, double weight) {
  settle();  // the batches before this one first, as they were added
  total += value * weight;
  count += weight;
}

void RunningMean::restore(const std::string& owner, const nlohmann::json& state) {
  const loadstar::detail::StateReader read(owner, state);
  pending.clear();
  total = read.get<double>("total");
  count = read.get<double>("count");
}

bool in_top_k(const float* x, std::size_t n, std::size_t target, std::size_t k) {
  const float v = x[target];
  if (!std::isfinite(v)) return false;
  std::size_t greater = 0;
  for (std::size_t i = 0; i < n; ++i)
    greater += x[i] > v ? 1 : 0;
  return greater < k;
}

}  // namespace loadstar::keras::detail
#endif
