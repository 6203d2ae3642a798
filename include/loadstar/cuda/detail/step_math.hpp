/// \file
/// What each thread of the CUDA backend's optimizer-step, row-loss and mean-metric kernels
/// computes, as `__host__ __device__` functions (plain functions under a host compiler): one
/// element of one variable of a fused optimizer step (with its gradient clipping and the fills of
/// its slots), one last-axis row of a loss, one row of a mean metric. The formulas are the
/// optimizers' own rules (keras/optimizers/detail/update_rules.hpp), and the loss and metric
/// classes' own per-row formulas (keras/losses/detail/row_formulas.hpp), so that host tests run
/// the kernels' per-thread work and compare with the CPU without a GPU. Included by math.hpp;
/// it includes no CUDA header and nothing of the executor but its dependency-free headers.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "loadstar/keras/backend/kinds.hpp"
#include "loadstar/keras/detail/rounded_arithmetic.hpp"
#include "loadstar/keras/losses/detail/row_formulas.hpp"
#include "loadstar/keras/optimizers/detail/clip_formulas.hpp"
#include "loadstar/keras/optimizers/detail/update_rules.hpp"

namespace loadstar::cuda::detail {

using keras::MeanMetricKind;
using keras::RowLossKind;
using keras::UpdateRule;

// The gradient clipping is the host optimizers'.
using keras::detail::clip_scale;
using keras::detail::clip_to_value;

// --- Optimizer steps: one element of one variable ------------------------------------------------

// Float arithmetic rounded after every operation, on the device too (the optimizer's update
// follows its formula rounding for rounding).
using keras::detail::add_rn;
using keras::detail::mul_rn;
using keras::detail::sub_rn;

/// Device division rounded to nearest (what `/` is on the host).
LOADSTAR_HOST_DEVICE inline float div_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// A float whose arithmetic rounds after every operation as written (`mul_rn`, `add_rn`, ...):
/// the operands' type of the optimizers' shared rules (keras/optimizers/detail/update_rules.hpp)
/// on the device, so that nvcc contracts nothing the rule does not say.
struct Rounded {
  LOADSTAR_HOST_DEVICE Rounded(float v) noexcept : value(v) {}  // NOLINT: floats mix in freely
  float value;
};
LOADSTAR_HOST_DEVICE inline Rounded operator+(Rounded a, Rounded b) noexcept {
  return add_rn(a.value, b.value);
}
LOADSTAR_HOST_DEVICE inline Rounded operator-(Rounded a, Rounded b) noexcept {
  return sub_rn(a.value, b.value);
}
LOADSTAR_HOST_DEVICE inline Rounded operator*(Rounded a, Rounded b) noexcept {
  return mul_rn(a.value, b.value);
}
LOADSTAR_HOST_DEVICE inline Rounded operator/(Rounded a, Rounded b) noexcept {
  return div_rn(a.value, b.value);
}
LOADSTAR_HOST_DEVICE inline Rounded operator-(Rounded a) noexcept {
  return -a.value;
}

/// The functions the shared rules take beside the operators, on one `Rounded` element.
struct RoundedMath {
  LOADSTAR_HOST_DEVICE static Rounded sqrt(Rounded x) noexcept { return ::sqrtf(x.value); }
  /// `1 / sqrt(x)`.
  LOADSTAR_HOST_DEVICE static Rounded rsqrt(Rounded x) noexcept {
    return div_rn(1.0F, ::sqrtf(x.value));
  }
  LOADSTAR_HOST_DEVICE static Rounded square(Rounded x) noexcept { return x * x; }
  LOADSTAR_HOST_DEVICE static Rounded max(Rounded a, Rounded b) noexcept {
    return a.value < b.value ? b : a;
  }
  LOADSTAR_HOST_DEVICE static Rounded min(Rounded a, Rounded b) noexcept {
    return b.value < a.value ? b : a;
  }
  LOADSTAR_HOST_DEVICE static Rounded abs(Rounded x) noexcept { return ::fabsf(x.value); }
  /// -1, 0 or 1 (0 for 0 and NaN, as Eigen's `sign`).
  LOADSTAR_HOST_DEVICE static Rounded sign(Rounded x) noexcept {
    return x.value > 0.0F ? 1.0F : (x.value < 0.0F ? -1.0F : 0.0F);
  }
  LOADSTAR_HOST_DEVICE static Rounded pow(Rounded x, float exponent) noexcept {
    return ::powf(x.value, exponent);
  }
};

/// One optimizer step's rule and operands (`keras::OptimizerStep`'s), and its `clipvalue`.
struct UpdateParams : keras::UpdateOperands {
  /// `clipvalue` (`by_value`), else 0.
  float clip_value = 0.0F;
};

/// One element's step: `w` its value, `g` its (clipped) gradient, `s0..s2` its slots in the
/// optimizer's order (unused ones are dummies), `decay` whether the weight decay applies to it:
/// the optimizer's rule from update_rules.hpp, the one its CPU `update_step` applies.
LOADSTAR_HOST_DEVICE inline void update_element(const UpdateParams& p, float g, float& w, float& s0,
                                                float& s1, float& s2, bool decay = true) noexcept {
  namespace rules = keras::detail::update_rules;
  const Rounded gradient = g;
  Rounded value = w, r0 = s0, r1 = s1, r2 = s2;
  if (decay) rules::decay_weight<RoundedMath>(p, value);
  switch (p.rule) {
    case UpdateRule::sgd:
      rules::sgd<RoundedMath>(p, value, gradient);
      break;
    case UpdateRule::sgd_momentum:
      rules::sgd_momentum<RoundedMath>(p, value, gradient, r0);
      break;
    case UpdateRule::adam:
      if (p.amsgrad) {
        rules::adam_amsgrad<RoundedMath>(p, value, gradient, r0, r1, r2);
      } else {
        rules::adam<RoundedMath>(p, value, gradient, r0, r1);
      }
      break;
    case UpdateRule::rmsprop:  // velocity, then momentum when there is some, then the average
      rules::rmsprop<RoundedMath>(p, value, gradient, r0, r1, p.momentum > 0.0F ? r2 : r1);
      break;
    case UpdateRule::adagrad:
      rules::adagrad<RoundedMath>(p, value, gradient, r0);
      break;
    case UpdateRule::adadelta:
      rules::adadelta<RoundedMath>(p, value, gradient, r0, r1);
      break;
    case UpdateRule::nadam:
      rules::nadam<RoundedMath>(p, value, gradient, r0, r1);
      break;
    case UpdateRule::adamax:
      rules::adamax<RoundedMath>(p, value, gradient, r0, r1);
      break;
    case UpdateRule::lion:
      rules::lion<RoundedMath>(p, value, gradient, r0);
      break;
    case UpdateRule::ftrl:
      rules::ftrl<RoundedMath>(p, value, gradient, r0, r1);
      break;
  }
  w = value.value;
  s0 = r0.value;
  s1 = r1.value;
  s2 = r2.value;
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
  bool decay = true;              // whether the weight decay applies to it
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

/// Flat position `i` of a scaling of `targets` (non-empty ones, in flat order) by `alpha`.
LOADSTAR_HOST_DEVICE inline void scale_flat(const FillTarget* targets, std::size_t count,
                                            float alpha, std::size_t i) noexcept {
  const std::size_t k = find_target(targets, count, i, [](const FillTarget& t) { return t.begin; });
  float& x = targets[k].data[i - targets[k].begin];
  x *= alpha;
}

/// Whether flat position `i` of `targets` holds a finite number (neither infinite nor NaN: its
/// exponent bits are not all ones).
LOADSTAR_HOST_DEVICE inline bool finite_flat(const FillTarget* targets, std::size_t count,
                                             std::size_t i) noexcept {
  const std::size_t k = find_target(targets, count, i, [](const FillTarget& t) { return t.begin; });
  float x = targets[k].data[i - targets[k].begin];
  std::uint32_t bits = 0;
  memcpy(&bits, &x, sizeof bits);
  return (bits & 0x7F800000U) != 0x7F800000U;
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
  update_element(p, g, t.value[j], s0, s1, s2, t.decay);
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
