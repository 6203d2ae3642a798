/// \file
/// The machinery the losses share: shape checks, sample weights and Keras's reductions.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/losses/detail/row_formulas.hpp"
#include "loadstar/keras/losses/loss.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// A label or value as a message shows it: `12` for an integral value, `2.5` otherwise.
LOADSTAR_DECL std::string format_value(double value);

/// Whether two shapes are equal up to one trailing axis of size 1 (Keras's
/// `squeeze_or_expand_dimensions`: `y_true` of shape `(n,)` fits `y_pred` of shape `(n, 1)`).
LOADSTAR_DECL bool shapes_fit(const Shape& a, const Shape& b);

/// `y_pred`'s shape without its last axis (the shape of the per-sample values).
LOADSTAR_DECL Shape without_last_axis(const Shape& shape);

/// The number of classes (the last axis) of `y_pred`; 1 for rank 0 and 1.
inline std::size_t last_axis(const Tensor<float>& y_pred) {
  return y_pred.rank() >= 2 ? y_pred.shape()[y_pred.rank() - 1] : 1;
}

/// Throws `ShapeError` unless `sample_weight` holds one weight per row of `y_pred`, or, with
/// `per_value`, one per per-sample value (the shape of `y_pred` without its last axis: the
/// weights a model makes from an output's mask, as Keras 3's `apply_mask`).
LOADSTAR_DECL void check_sample_weight(const std::string& owner, const Tensor<float>* sample_weight,
                                       const Tensor<float>& y_pred, bool per_value = false);

/// The weight of each per-sample value `j` of a batch of `values` values: 1 without sample
/// weights, else its row's (weights per row) or its own (weights per value, from a mask).
class ValueWeights {
 public:
  ValueWeights(const Tensor<float>* sample_weight, std::size_t values) noexcept
      : weights_(sample_weight),
        shared_(sample_weight == nullptr || sample_weight->size() == 0
                    ? 1
                    : std::max<std::size_t>(values / sample_weight->size(), 1)) {}
  double operator()(std::size_t j) const noexcept {
    return weights_ == nullptr ? 1.0 : static_cast<double>(weights_->data()[j / shared_]);
  }

 private:
  const Tensor<float>* weights_;
  std::size_t shared_;  // the values sharing a weight
};

/// A loss whose value is a function of each last-axis row of `y_pred` (one per-sample value per
/// row), reduced as `tf.keras`'s `compute_weighted_loss`: the per-sample values times the row's
/// weight, summed, divided by the number of per-sample values for `sum_over_batch_size` (not by
/// the sum of the weights). `Derived` provides
/// `double row(const float* y_true, const float* y_pred, std::size_t classes, float* gradient,
/// double scale)`, returning the row's loss and, when `gradient` is not null, writing `scale`
/// times its derivative; `true_size(classes)` (the elements of `y_true` per row) and
/// `check_shapes(y_true, y_pred)`, and may hide `prepare(y_true)`.
///
/// On a device backend with a kernel for the loss, `compute_deferred`'s value refers to the loss
/// object, which reports a bad label when it is read: the loss must outlive it (a model holds
/// both).
template <class Derived>
class RowLoss : public Loss {
 public:
  using Loss::Loss;

  using Loss::compute;

  float compute(Backend& backend, const Tensor<float>& y_true, const Tensor<float>& y_pred,
                const Tensor<float>* sample_weight, const Tensor<float>& gradient) override {
    return static_cast<float>(
        static_cast<Derived&>(*this)
            .compute_deferred(backend, y_true, y_pred, sample_weight, gradient)
            .get());
  }

  Deferred<double> compute_deferred(Backend& backend, const Tensor<float>& y_true,
                                    const Tensor<float>& y_pred, const Tensor<float>* sample_weight,
                                    const Tensor<float>& gradient) override {
    auto& self = static_cast<Derived&>(*this);
    self.check_shapes(y_true, y_pred);
    check_sample_weight(name(), sample_weight, y_pred, true);
    if (!gradient.empty() && gradient.shape() != y_pred.shape()) {
      throw ShapeError(name() + ": the gradient buffer has shape " + gradient.shape().str() +
                       " but y_pred has shape " + y_pred.shape().str());
    }
    const bool weighted = sample_weight != nullptr;
    static const Tensor<float> none;
    const Tensor<float>& weight = weighted ? *sample_weight : none;
    // A device backend's kernel where it has one (the per-sample values of `none`, and weights
    // per value, stay on the host); the CPU backend computes below, on the tensors themselves.
    if (!backend.is_host() && reduction() != Reduction::none &&
        (!weighted || weight.size() == y_pred.rows())) {
      if (std::optional<RowLossSpec> spec = self.device_spec()) {
        const std::size_t classes = last_axis(y_pred);
        const std::size_t values = classes == 0 ? 0 : y_pred.size() / classes;
        spec->denominator = reduction() == Reduction::sum ? 1.0 : static_cast<double>(values);
        if (auto computed = backend.row_loss(*spec, y_true, y_pred, weight, gradient)) {
          // The loss outlives what it returns: the model holds both (see the class comment).
          return computed->then([&self, classes, values, denominator = spec->denominator](
                                    const RowLossResult& r) -> double {
            if (r.bad_label) self.report_bad_label(*r.bad_label, classes);
            return values == 0 ? 0.0
                               : static_cast<double>(static_cast<float>(r.total / denominator));
          });
        }
      }
    }
    float result = 0.0F;
    backend.on_host({y_true, y_pred, weight, gradient}, [&](std::span<const Tensor<float>> t) {
      result = reduce(t[0], t[1], weighted ? &t[2] : nullptr, t[3]);
    });
    return static_cast<double>(result);
  }

  /// The unweighted per-sample losses of the last batch, with `Reduction::none` (empty otherwise).
  std::span<const float> per_sample() const noexcept { return per_sample_; }

  // Hooks with defaults.
  void prepare(const Tensor<float>&) {}
  /// What a device backend's `row_loss` computes for this loss (`std::nullopt`: host only).
  std::optional<RowLossSpec> device_spec() const { return std::nullopt; }
  /// Throws the loss's error for a label out of range found by a device kernel.
  [[noreturn]] void report_bad_label(const BadIndex&, std::size_t) const {
    LOADSTAR_ASSERT(false, "report_bad_label: only sparse losses check labels");
    std::abort();
  }
  std::size_t true_size(std::size_t classes) const noexcept { return classes; }
  void check_shapes(const Tensor<float>& y_true, const Tensor<float>& y_pred) const {
    if (!shapes_fit(y_true.shape(), y_pred.shape())) {
      throw ShapeError(name() + ": y_true of shape " + y_true.shape().str() +
                       " does not match y_pred of shape " + y_pred.shape().str());
    }
  }

 private:
  /// The loss of host tensors (the body of the backend's host kernel).
  float reduce(const Tensor<float>& y_true, const Tensor<float>& y_pred,
               const Tensor<float>* sample_weight, const Tensor<float>& gradient) {
    auto& self = static_cast<Derived&>(*this);
    self.prepare(y_true);
    const std::size_t classes = last_axis(y_pred);
    const std::size_t values = classes == 0 ? 0 : y_pred.size() / classes;
    const std::size_t true_size = self.true_size(classes);
    const ValueWeights weight_of(sample_weight, values);
    const double denominator = reduction() == Reduction::sum ? 1.0 : static_cast<double>(values);
    const bool keep = reduction() == Reduction::none;
    if (keep) per_sample_.resize(values);  // reuses its capacity after the first batch
    const float* t = y_true.data();
    const float* p = y_pred.data();
    float* g = gradient.empty() ? nullptr : gradient.data();
    double total = 0;
    for (std::size_t j = 0; j < values; ++j) {
      const double weight = weight_of(j);
      const double loss = self.row(t + j * true_size, p + j * classes, classes,
                                   g == nullptr ? nullptr : g + j * classes, weight / denominator);
      if (keep) per_sample_[j] = static_cast<float>(loss);
      total += loss * weight;
    }
    return values == 0 ? 0.0f : static_cast<float>(total / denominator);
  }

  std::vector<float> per_sample_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::string format_value(double value) {
  if (std::isfinite(value) && value == std::floor(value) && std::abs(value) < 1e15) {
    return std::to_string(static_cast<long long>(value));
  }
  std::string text = std::to_string(value);
  return text;
}

bool shapes_fit(const Shape& a, const Shape& b) {
  if (a == b) return true;
  const Shape& longer = a.rank() > b.rank() ? a : b;
  const Shape& shorter = a.rank() > b.rank() ? b : a;
  if (longer.rank() != shorter.rank() + 1 || longer[longer.rank() - 1] != 1) return false;
  for (std::size_t i = 0; i < shorter.rank(); ++i)
    if (longer[i] != shorter[i]) return false;
  return true;
}

Shape without_last_axis(const Shape& shape) {
  if (shape.rank() == 0) return shape;
  return Shape(std::span<const std::size_t>(shape.begin(), shape.rank() - 1));
}

void check_sample_weight(const std::string& owner, const Tensor<float>* sample_weight,
                         const Tensor<float>& y_pred, bool per_value) {
  if (sample_weight == nullptr) return;
  const std::size_t classes = last_axis(y_pred);
  const std::size_t values = classes == 0 ? 0 : y_pred.size() / classes;
  const bool valued = per_value && sample_weight->rank() >= 1 && sample_weight->size() == values &&
                      sample_weight->rows() == y_pred.rows();
  if ((sample_weight->size() != y_pred.rows() && !valued) ||
      (sample_weight->rank() > 1 && sample_weight->rank() != 2 && !valued)) {
    throw ShapeError(owner + ": sample_weight of shape " + sample_weight->shape().str() +
                     " needs one weight per row but y_pred has shape " + y_pred.shape().str());
  }
}

}  // namespace loadstar::keras::detail
#endif
