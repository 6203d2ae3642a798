/// \file
/// The per-row formulas of the losses (and the mean metrics' per-row values), in double: the loss
/// of one last-axis row and, when `g` is not null, `scale` times its gradient. Host and device code
/// (`LOADSTAR_HOST_DEVICE`): the CPU loss and metric classes and the CUDA backend's loss and metric
/// kernels compute the same expressions.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>

namespace loadstar::keras::detail {

/// Keras's `backend.epsilon()`.
inline constexpr double loss_epsilon = 1e-7;

LOADSTAR_HOST_DEVICE inline double clamp_double(double v, double low, double high) noexcept {
  return v < low ? low : high < v ? high : v;
}

/// `log(sum(exp(x)))` of a row, in double, shifted by its largest value.
LOADSTAR_HOST_DEVICE inline double log_sum_exp(const float* x, std::size_t n) noexcept {
  double top = -INFINITY;
  for (std::size_t i = 0; i < n; ++i)
    top = top < static_cast<double>(x[i]) ? static_cast<double>(x[i]) : top;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i)
    sum += ::exp(static_cast<double>(x[i]) - top);
  return top + ::log(sum);
}

/// Sparse categorical cross-entropy: the loss of one row and (when `g` is not null) `scale`
/// times its gradient; the label must be in range.
LOADSTAR_HOST_DEVICE inline double sparse_crossentropy_row(bool from_logits, const float* t,
                                                           const float* p, std::size_t n, float* g,
                                                           double scale) noexcept {
  const auto label = static_cast<std::size_t>(*t);
  if (from_logits) {
    const double lse = log_sum_exp(p, n);
    if (g != nullptr) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>(scale * (::exp(p[i] - lse) - (i == label ? 1.0 : 0.0)));
    }
    return lse - p[label];
  }
  constexpr double eps = loss_epsilon;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i)
    total += clamp_double(static_cast<double>(p[i]), eps, 1.0 - eps);
  const double c_label = clamp_double(static_cast<double>(p[label]), eps, 1.0 - eps);
  if (g != nullptr) {
    for (std::size_t i = 0; i < n; ++i) {
      const bool inside = p[i] >= eps && p[i] <= 1.0 - eps;
      const double d = 1.0 / total - (i == label ? 1.0 / c_label : 0.0);
      g[i] = static_cast<float>(inside ? scale * d : 0.0);
    }
  }
  return ::log(total) - ::log(c_label);
}

/// Categorical cross-entropy of one row (one-hot or soft labels, with label smoothing).
LOADSTAR_HOST_DEVICE inline double crossentropy_row(bool from_logits, double smoothing,
                                                    const float* t, const float* p, std::size_t n,
                                                    float* g, double scale) noexcept {
  const double smooth = smoothing / static_cast<double>(n);
  const auto label = [&](std::size_t i) { return t[i] * (1.0 - smoothing) + smooth; };
  if (from_logits) {
    const double lse = log_sum_exp(p, n);
    double sum = 0;
    double label_sum = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sum -= label(i) * (p[i] - lse);
      label_sum += label(i);
    }
    if (g != nullptr) {
      for (std::size_t i = 0; i < n; ++i)
        g[i] = static_cast<float>(scale * (label_sum * ::exp(p[i] - lse) - label(i)));
    }
    return sum;
  }
  constexpr double eps = loss_epsilon;
  double total = 0;
  for (std::size_t i = 0; i < n; ++i)
    total += p[i];
  double sum = 0;
  double weighted = 0;  // sum_j d(loss)/d(q_j) * q_j, for the derivative of the normalisation
  for (std::size_t i = 0; i < n; ++i) {
    const double q = p[i] / total;
    const double c = clamp_double(q, eps, 1.0 - eps);
    sum -= label(i) * ::log(c);
    if (q >= eps && q <= 1.0 - eps) weighted += -label(i) / c * q;
  }
  if (g != nullptr) {
    // q = p / sum(p): d(loss)/d(p_i) = (d(loss)/d(q_i) - sum_j d(loss)/d(q_j) q_j) / sum(p).
    for (std::size_t i = 0; i < n; ++i) {
      const double q = p[i] / total;
      const double c = clamp_double(q, eps, 1.0 - eps);
      const double dq = q >= eps && q <= 1.0 - eps ? -label(i) / c : 0.0;
      g[i] = static_cast<float>(scale * (dq - weighted) / total);
    }
  }
  return sum;
}

/// The mean squared error of one row.
LOADSTAR_HOST_DEVICE inline double squared_error_row(const float* t, const float* p, std::size_t n,
                                                     float* g, double scale) noexcept {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(p[i]) - t[i];
    sum += e * e;
    if (g != nullptr) g[i] = static_cast<float>(scale * 2.0 * e * inverse);
  }
  return sum * inverse;
}

/// The mean absolute error of one row.
LOADSTAR_HOST_DEVICE inline double absolute_error_row(const float* t, const float* p, std::size_t n,
                                                      float* g, double scale) noexcept {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(p[i]) - t[i];
    sum += ::fabs(e);
    if (g != nullptr) g[i] = static_cast<float>(scale * ((e > 0) - (e < 0)) * inverse);
  }
  return sum * inverse;
}

/// The Huber loss of one row: quadratic within `delta` of the target, linear beyond.
LOADSTAR_HOST_DEVICE inline double huber_row(double delta, const float* t, const float* p,
                                             std::size_t n, float* g, double scale) noexcept {
  double sum = 0;
  const double inverse = 1.0 / static_cast<double>(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(p[i]) - t[i];
    const double a = ::fabs(e);
    const bool inside = a <= delta;
    sum += inside ? 0.5 * e * e : delta * a - 0.5 * delta * delta;
    if (g != nullptr) {
      const double d = inside ? e : delta * ((e > 0) - (e < 0));
      g[i] = static_cast<float>(scale * d * inverse);
    }
  }
  return sum * inverse;
}

/// The Kullback-Leibler divergence of one row, both sides clipped to `[epsilon, 1]`.
LOADSTAR_HOST_DEVICE inline double kl_divergence_row(const float* t, const float* p, std::size_t n,
                                                     float* g, double scale) noexcept {
  constexpr double eps = loss_epsilon;
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double y = clamp_double(static_cast<double>(t[i]), eps, 1.0);
    const double q = clamp_double(static_cast<double>(p[i]), eps, 1.0);
    sum += y * ::log(y / q);
    if (g != nullptr) {
      const bool inside = p[i] >= eps && p[i] <= 1.0;
      g[i] = static_cast<float>(inside ? -scale * y / q : 0.0);
    }
  }
  return sum;
}

/// Label smoothing for binary labels, as Keras: `y * (1 - s) + 0.5 * s`.
LOADSTAR_HOST_DEVICE inline double smooth_binary(double y, double smoothing) noexcept {
  return y * (1.0 - smoothing) + 0.5 * smoothing;
}

/// Binary cross-entropy of one row (the mean over its elements), from logits or probabilities,
/// with label smoothing.
LOADSTAR_HOST_DEVICE inline double binary_crossentropy_row(bool from_logits, double smoothing,
                                                           const float* t, const float* p,
                                                           std::size_t n, float* g,
                                                           double scale) noexcept {
  constexpr double eps = loss_epsilon;
  const double inverse = 1.0 / static_cast<double>(n);
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double y = smooth_binary(t[i], smoothing);
    const double x = p[i];
    if (from_logits) {
      sum += (x < 0.0 ? 0.0 : x) - x * y + ::log1p(::exp(-::fabs(x)));
      if (g != nullptr) g[i] = static_cast<float>(scale * (1.0 / (1.0 + ::exp(-x)) - y) * inverse);
    } else {
      const double q = clamp_double(x, eps, 1.0 - eps);
      sum -= y * ::log(q + eps) + (1.0 - y) * ::log(1.0 - q + eps);
      if (g != nullptr) {
        const bool inside = x >= eps && x <= 1.0 - eps;
        const double d = -y / (q + eps) + (1.0 - y) / (1.0 - q + eps);
        g[i] = static_cast<float>(inside ? scale * d * inverse : 0.0);
      }
    }
  }
  return sum * inverse;
}

// --- The regression metrics' per-row values ------------------------------------------------------

/// `mean(square(y_true - y_pred))` of one row.
LOADSTAR_HOST_DEVICE inline double squared_error_mean(const float* t, const float* p,
                                                      std::size_t n) noexcept {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double e = static_cast<double>(p[i]) - t[i];
    sum += e * e;
  }
  return sum / static_cast<double>(n);
}

/// `mean(abs(y_true - y_pred))` of one row.
LOADSTAR_HOST_DEVICE inline double absolute_error_mean(const float* t, const float* p,
                                                       std::size_t n) noexcept {
  double sum = 0;
  for (std::size_t i = 0; i < n; ++i)
    sum += ::fabs(static_cast<double>(p[i]) - t[i]);
  return sum / static_cast<double>(n);
}

// --- The accuracy metrics' per-row values -------------------------------------------------------

/// The index of the largest element (the first one on ties, as `tf.argmax`).
LOADSTAR_HOST_DEVICE inline std::size_t argmax(const float* x, std::size_t n) noexcept {
  std::size_t best = 0;
  for (std::size_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

/// `Accuracy`'s value of one element: whether the label equals the prediction.
LOADSTAR_HOST_DEVICE inline double accuracy_value(const float* t, const float* p) noexcept {
  return *t == *p ? 1.0 : 0.0;
}

/// `BinaryAccuracy`'s value of one row: how often `y_pred > threshold` matches the 0/1 label.
LOADSTAR_HOST_DEVICE inline double binary_accuracy_value(const float* t, const float* p,
                                                         std::size_t n, double threshold) noexcept {
  std::size_t hits = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float predicted = p[i] > threshold ? 1.0F : 0.0F;
    hits += t[i] == predicted ? 1 : 0;
  }
  return static_cast<double>(hits) / static_cast<double>(n);
}

/// `CategoricalAccuracy`'s value of one row: whether the one-hot label's argmax is the
/// prediction's.
LOADSTAR_HOST_DEVICE inline double categorical_accuracy_value(const float* t, const float* p,
                                                              std::size_t n) noexcept {
  return argmax(t, n) == argmax(p, n) ? 1.0 : 0.0;
}

/// `SparseCategoricalAccuracy`'s value of one row: whether the class index `*t` is the
/// prediction's argmax.
LOADSTAR_HOST_DEVICE inline double sparse_categorical_accuracy_value(const float* t, const float* p,
                                                                     std::size_t n) noexcept {
  return static_cast<double>(*t) == static_cast<double>(argmax(p, n)) ? 1.0 : 0.0;
}

}  // namespace loadstar::keras::detail
