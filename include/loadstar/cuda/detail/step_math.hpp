/// \file
/// What each thread of the CUDA backend's optimizer-step, row-loss and mean-metric kernels
/// computes, as `__host__ __device__` functions (plain functions under a host compiler): one
/// element of one variable of a fused optimizer step (with its gradient clipping and the fills of
/// its slots), one last-axis row of a loss, one row of a mean metric. The formulas are the
/// optimizers' `update_step` (keras/optimizers/*.hpp) operation for operation, and the loss and
/// metric classes' own per-row formulas (keras/losses/detail/row_formulas.hpp), so that host tests
/// run the kernels' per-thread work and compare with the CPU without a GPU. Included by math.hpp;
/// it includes no CUDA header and nothing of the executor but its dependency-free headers.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "loadstar/keras/backend/kinds.hpp"
#include "loadstar/keras/losses/detail/row_formulas.hpp"
#include "loadstar/keras/optimizers/detail/clip_formulas.hpp"

namespace loadstar::cuda::detail {

using keras::MeanMetricKind;
using keras::RowLossKind;
using keras::UpdateRule;

// The gradient clipping is the host optimizers'.
using keras::detail::clip_scale;
using keras::detail::clip_to_value;

// --- Optimizer steps: one element of one variable ------------------------------------------------

/// Float arithmetic rounded after every operation, on the device: nvcc would otherwise contract
/// `a * b + c` into one fused multiply-add wherever it sees fit, so the optimizer's update
/// follows the formula as written, rounding for rounding, whatever the compiler decides (on the
/// host, the compiler's contraction rules apply as they do to the CPU backend's code).
LOADSTAR_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LOADSTAR_HOST_DEVICE inline float add_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LOADSTAR_HOST_DEVICE inline float sub_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

/// One optimizer step's rule and operands (`keras::OptimizerStep`'s floats).
struct UpdateParams {
  UpdateRule rule = UpdateRule::sgd;
  float learning_rate = 0.0F, alpha = 0.0F, one_minus_beta_1 = 0.0F, one_minus_beta_2 = 0.0F;
  float momentum = 0.0F, rho = 0.0F, epsilon = 0.0F, weight_decay = 0.0F;
  bool nesterov = false, amsgrad = false, centered = false;
  /// `clipvalue` (`by_value`), else 0.
  float clip_value = 0.0F;
};

/// `1 / sqrt(x)`.
LOADSTAR_HOST_DEVICE inline float reciprocal_sqrt(float x) noexcept {
  return 1.0F / ::sqrtf(x);
}

/// One element's step: `w` its value, `g` its (clipped) gradient, `s0..s2` its slots in the
/// optimizer's order (unused ones are dummies). The formulas are the optimizers' `update_step`
/// (keras/optimizers/*.hpp) operation for operation.
LOADSTAR_HOST_DEVICE inline void update_element(const UpdateParams& p, float g, float& w, float& s0,
                                                float& s1, float& s2) noexcept {
  switch (p.rule) {
    case UpdateRule::sgd:  // w -= lr * g
      w = sub_rn(w, mul_rn(p.learning_rate, g));
      return;
    case UpdateRule::sgd_momentum: {  // velocity = momentum * velocity - lr * g
      s0 = sub_rn(mul_rn(p.momentum, s0), mul_rn(p.learning_rate, g));
      w = p.nesterov ? add_rn(w, sub_rn(mul_rn(p.momentum, s0), mul_rn(p.learning_rate, g)))
                     : add_rn(w, s0);
      return;
    }
    case UpdateRule::adam: {
      if (p.weight_decay != 0.0F) w = sub_rn(w, mul_rn(w, p.weight_decay));   // AdamW
      s0 = add_rn(s0, mul_rn(sub_rn(g, s0), p.one_minus_beta_1));             // m
      s1 = add_rn(s1, mul_rn(sub_rn(mul_rn(g, g), s1), p.one_minus_beta_2));  // v
      float v = s1;
      if (p.amsgrad) {
        s2 = s2 < s1 ? s1 : s2;  // vhat = max(vhat, v)
        v = s2;
      }
      w = sub_rn(w, mul_rn(s0, p.alpha) / add_rn(::sqrtf(v), p.epsilon));
      return;
    }
    case UpdateRule::rmsprop: {
      const float decay = 1.0F - p.rho;
      s0 = add_rn(mul_rn(p.rho, s0), mul_rn(decay, mul_rn(g, g)));  // velocity
      float denominator = 0.0F;
      if (p.centered) {
        float& average = p.momentum > 0.0F ? s2 : s1;
        average = add_rn(mul_rn(p.rho, average), mul_rn(decay, g));
        denominator = add_rn(sub_rn(s0, mul_rn(average, average)), p.epsilon);
      } else {
        denominator = add_rn(s0, p.epsilon);
      }
      const float increment = mul_rn(mul_rn(p.learning_rate, g), reciprocal_sqrt(denominator));
      if (p.momentum > 0.0F) {
        s1 = add_rn(mul_rn(p.momentum, s1), increment);
        w = sub_rn(w, s1);
      } else {
        w = sub_rn(w, increment);
      }
      return;
    }
    case UpdateRule::adagrad:  // accumulator += g^2; w -= lr * g / sqrt(accumulator + epsilon)
      s0 = add_rn(s0, mul_rn(g, g));
      w = sub_rn(w, mul_rn(mul_rn(p.learning_rate, g), reciprocal_sqrt(add_rn(s0, p.epsilon))));
      return;
    case UpdateRule::adadelta: {
      const float decay = 1.0F - p.rho;
      s0 = add_rn(mul_rn(p.rho, s0), mul_rn(decay, mul_rn(g, g)));  // accumulated_grad
      const float delta =
          mul_rn(-::sqrtf(add_rn(s1, p.epsilon)), g) / ::sqrtf(add_rn(s0, p.epsilon));
      s1 = add_rn(mul_rn(p.rho, s1), mul_rn(mul_rn(decay, delta), delta));
      w = add_rn(w, mul_rn(p.learning_rate, delta));
      return;
    }
  }
}

/// One variable of a fused optimizer step: its memory and where its elements and its norm
/// segments start in the step's flat numbering.
struct UpdateTarget {
  static constexpr std::size_t max_slots = 3;
  friend bool operator==(const UpdateTarget&, const UpdateTarget&) = default;
  float* value = nullptr;
  const float* gradient = nullptr;
  float* slots[max_slots] = {};
  std::size_t size = 0;
  std::size_t begin = 0;          // its first element's flat index
  std::size_t segment_begin = 0;  // its first norm segment's flat index
};

/// The elements one partial sum of a gradient's squared norm covers.
inline constexpr std::size_t norm_segment = 1024;

LOADSTAR_HOST_DEVICE inline std::size_t norm_segments(std::size_t size) noexcept {
  return (size + norm_segment - 1) / norm_segment;
}

/// The target holding flat position `i` of the field `Key` (`begin` or `segment_begin`): the last
/// one starting at or before it (targets are in flat order; empty ones are skipped).
template <class Target, class Key>
LOADSTAR_HOST_DEVICE std::size_t find_target(const Target* targets, std::size_t count,
                                             std::size_t i, Key key) noexcept {
  std::size_t low = 0, high = count;  // the answer is in [low, high)
  while (high - low > 1) {
    const std::size_t middle = low + (high - low) / 2;
    if (key(targets[middle]) <= i) {
      low = middle;
    } else {
      high = middle;
    }
  }
  return low;
}

/// One tensor of a fill over several (`fill_many`): its memory, its elements and its first
/// element's flat index.
struct FillTarget {
  friend bool operator==(const FillTarget&, const FillTarget&) = default;
  float* data = nullptr;
  std::size_t size = 0;
  std::size_t begin = 0;
};

/// Flat position `i` of a fill over `targets` (non-empty ones, in flat order) set to `value`.
LOADSTAR_HOST_DEVICE inline void fill_flat(const FillTarget* targets, std::size_t count,
                                           float value, std::size_t i) noexcept {
  const std::size_t k = find_target(targets, count, i, [](const FillTarget& t) { return t.begin; });
  targets[k].data[i - targets[k].begin] = value;
}

/// The squared norm of norm segment `s` (in flat order), in double, elements in order.
LOADSTAR_HOST_DEVICE inline double segment_squares(const UpdateTarget* targets, std::size_t count,
                                                   std::size_t s) noexcept {
  const std::size_t k =
      find_target(targets, count, s, [](const UpdateTarget& t) { return t.segment_begin; });
  const UpdateTarget& t = targets[k];
  const std::size_t first = (s - t.segment_begin) * norm_segment;
  const std::size_t last = first + norm_segment < t.size ? first + norm_segment : t.size;
  double sum = 0.0;
  for (std::size_t i = first; i < last; ++i) {
    const double v = t.gradient[i];
    sum += v * v;
  }
  return sum;
}

/// The clipping scales from the segments' squared norms, in a fixed order: each variable's
/// segments in order, then (`global`) the variables in order, as the CPU sums the gradients one
/// after the other. Writes one scale per variable (all the same with `global`).
LOADSTAR_HOST_DEVICE inline void clip_scales(const UpdateTarget* targets, std::size_t count,
                                             const double* partials, bool global, double threshold,
                                             float* scales) noexcept {
  double all = 0.0;
  for (std::size_t k = 0; k < count; ++k) {
    double squares = 0.0;
    for (std::size_t s = 0; s < norm_segments(targets[k].size); ++s)
      squares += partials[targets[k].segment_begin + s];
    if (global) {
      all += squares;
    } else {
      scales[k] = clip_scale(squares, threshold);
    }
  }
  if (global)
    for (std::size_t k = 0; k < count; ++k)
      scales[k] = clip_scale(all, threshold);
}

/// The step of flat element `i`: its variable found by binary search, its gradient clipped by
/// value or scaled by its variable's `scales` entry (null: no scaling).
LOADSTAR_HOST_DEVICE inline void update_flat(const UpdateTarget* targets, std::size_t count,
                                             const UpdateParams& p, const float* scales,
                                             std::size_t i) noexcept {
  const std::size_t k =
      find_target(targets, count, i, [](const UpdateTarget& t) { return t.begin; });
  const UpdateTarget& t = targets[k];
  const std::size_t j = i - t.begin;
  float g = t.gradient[j];
  if (p.clip_value > 0.0F) {
    g = clip_to_value(g, p.clip_value);
  } else if (scales != nullptr) {
    g = mul_rn(g, scales[k]);
  }
  float unused[UpdateTarget::max_slots] = {};
  float& s0 = t.slots[0] != nullptr ? t.slots[0][j] : unused[0];
  float& s1 = t.slots[1] != nullptr ? t.slots[1][j] : unused[1];
  float& s2 = t.slots[2] != nullptr ? t.slots[2][j] : unused[2];
  update_element(p, g, t.value[j], s0, s1, s2);
}

// --- Losses: one last-axis row, in double, as the loss classes compute it -----------------------

struct RowLossParams {
  RowLossKind kind = RowLossKind::mean_squared_error;
  bool from_logits = false;
  double label_smoothing = 0.0;
  double denominator = 1.0;
  double delta = 1.0;  // Huber's
};

/// Whether a sparse label (a float) is a class index in `[0, classes)`; NaN is not.
LOADSTAR_HOST_DEVICE inline bool label_in_range(float v, std::size_t classes) noexcept {
  const double d = v;
  return d >= 0 && d < static_cast<double>(classes);
}

/// The shape of a row loss's work: `values` rows of `classes` predictions, `true_size` labels
/// each, and `per_row` values per row of the sample weights.
struct RowDims {
  std::size_t values = 0, classes = 1, true_size = 1, per_row = 1;
};

/// The "no bad label" value of a row loss's `first_bad` (all ones: an integer minimum finds any
/// smaller position).
inline constexpr unsigned long long no_bad_label = ~0ULL;

/// Completes a row loss's result record once every row is done: `record[0]` the sum,
/// `record[1]` the first bad label's position (written by the rows, as bits), `record[2]` that
/// label (0 when none), so that the host reads all of it in one copy, later, when the labels may
/// have been overwritten by the next batch.
LOADSTAR_HOST_DEVICE inline void finish_row_loss(double sum, const float* y_true,
                                                 std::size_t true_size, double* record) noexcept {
  record[0] = sum;
  const unsigned long long bad = *reinterpret_cast<const unsigned long long*>(record + 1);
  record[2] = bad == no_bad_label ? 0.0 : static_cast<double>(y_true[bad * true_size]);
}

/// Row `j` of a row loss: its loss times its weight (what the reduction sums), its gradient
/// written when `g` is not null. A sparse label out of range gives 0 (the caller reports it).
LOADSTAR_HOST_DEVICE inline double row_loss_term(const RowLossParams& p, const RowDims& d,
                                                 const float* t, const float* y, const float* w,
                                                 float* g, std::size_t j) noexcept {
  const double weight = w == nullptr ? 1.0 : static_cast<double>(w[j / d.per_row]);
  const double scale = weight / p.denominator;
  const float* tj = t + j * d.true_size;
  const float* yj = y + j * d.classes;
  float* gj = g == nullptr ? nullptr : g + j * d.classes;
  double loss = 0.0;
  switch (p.kind) {
    case RowLossKind::sparse_categorical_crossentropy:
      if (!label_in_range(*tj, d.classes)) return 0.0;
      loss = keras::detail::sparse_crossentropy_row(p.from_logits, tj, yj, d.classes, gj, scale);
      break;
    case RowLossKind::categorical_crossentropy:
      loss = keras::detail::crossentropy_row(p.from_logits, p.label_smoothing, tj, yj, d.classes,
                                             gj, scale);
      break;
    case RowLossKind::mean_squared_error:
      loss = keras::detail::squared_error_row(tj, yj, d.classes, gj, scale);
      break;
    case RowLossKind::binary_crossentropy:
      loss = keras::detail::binary_crossentropy_row(p.from_logits, p.label_smoothing, tj, yj,
                                                    d.classes, gj, scale);
      break;
    case RowLossKind::mean_absolute_error:
      loss = keras::detail::absolute_error_row(tj, yj, d.classes, gj, scale);
      break;
    case RowLossKind::huber:
      loss = keras::detail::huber_row(p.delta, tj, yj, d.classes, gj, scale);
      break;
    case RowLossKind::kl_divergence:
      loss = keras::detail::kl_divergence_row(tj, yj, d.classes, gj, scale);
      break;
  }
  return loss * weight;
}

// --- Mean metrics: one value per row -----------------------------------------------------------

/// The metric's value of row `j` (`classes` predictions, `true_size` labels): the metric classes'
/// own per-row formulas (keras/losses/detail/row_formulas.hpp), and `Mean`'s value.
LOADSTAR_HOST_DEVICE inline double metric_value(MeanMetricKind kind, double threshold,
                                                const float* t, const float* p,
                                                std::size_t classes) noexcept {
  switch (kind) {
    case MeanMetricKind::accuracy:
      return keras::detail::accuracy_value(t, p);
    case MeanMetricKind::binary_accuracy:
      return keras::detail::binary_accuracy_value(t, p, classes, threshold);
    case MeanMetricKind::categorical_accuracy:
      return keras::detail::categorical_accuracy_value(t, p, classes);
    case MeanMetricKind::sparse_categorical_accuracy:
      return keras::detail::sparse_categorical_accuracy_value(t, p, classes);
    case MeanMetricKind::mean:
      return *p;
    case MeanMetricKind::mean_squared_error:
      return keras::detail::squared_error_mean(t, p, classes);
    case MeanMetricKind::mean_absolute_error:
      return keras::detail::absolute_error_mean(t, p, classes);
  }
  return 0.0;
}

/// Row `j` of a mean metric: `terms[2 j]` its value times its weight, `terms[2 j + 1]` its weight.
LOADSTAR_HOST_DEVICE inline void metric_terms(MeanMetricKind kind, double threshold,
                                              const RowDims& d, const float* t, const float* p,
                                              const float* w, double* terms,
                                              std::size_t j) noexcept {
  const double weight = w == nullptr ? 1.0 : static_cast<double>(w[j / d.per_row]);
  const float* tj = t == nullptr ? nullptr : t + j * d.true_size;  // Mean reads no labels
  terms[2 * j] = metric_value(kind, threshold, tj, p + j * d.classes, d.classes) * weight;
  terms[2 * j + 1] = weight;
}

}  // namespace loadstar::cuda::detail
