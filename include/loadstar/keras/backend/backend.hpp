/// \file
/// `Backend`: the kernels every layer computes with (GEMM, convolution, pooling, elementwise and
/// reduction kernels), so that another backend (CUDA) adds kernels without touching the layers.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include "loadstar/config.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/deferred.hpp"
#include "loadstar/keras/backend/kinds.hpp"
#include "loadstar/keras/detail/attention_rows.hpp"
#include "loadstar/keras/detail/depthwise_loops.hpp"
#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/detail/layer_norm_formulas.hpp"
#include "loadstar/keras/detail/recurrent_kernels.hpp"
#include "loadstar/keras/mixed_precision/detail/half_rounding.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// Keras/TensorFlow output size and padding before of one spatial axis: `valid` gives
/// `ceil((in - (k - 1) * d) / s)`, `same` gives `ceil(in / s)` with a total padding of
/// `max((out - 1) * s + (k - 1) * d + 1 - in, 0)`, `total / 2` of it before.
struct AxisGeometry {
  std::size_t out = 0;
  std::size_t pad_before = 0;
};

/// The output size and padding of one axis under `same` (`true`) or `valid` padding; `out` is 0
/// when a `valid` window does not fit.
LOADSTAR_DECL AxisGeometry axis_geometry(std::size_t in, std::size_t kernel, std::size_t stride,
                                         std::size_t dilation, bool same) noexcept;

namespace detail {

/// `(outer, length, inner)`: a tensor seen around one axis (what every backend's softmax,
/// concatenate and split walk).
struct AxisView {
  std::size_t outer = 1, length = 1, inner = 1;
};

inline AxisView axis_view(const Shape& shape, std::size_t axis) noexcept {
  AxisView v;
  for (std::size_t i = 0; i < shape.rank(); ++i) {
    if (i < axis) v.outer *= shape[i];
    if (i == axis) v.length = shape[i];
    if (i > axis) v.inner *= shape[i];
  }
  return v;
}

/// Rows `[row_begin, row_end)` of axis 0 of `y = transpose(x, axes)` (NumPy's and TensorFlow's
/// `transpose`: axis `i` of `y` is axis `axes[i]` of `x`), on host memory. Runs of the last axis
/// are copied whole when `axes` keeps the last axis last.
LOADSTAR_DECL void permute_rows(const Tensor<float>& x, std::span<const std::size_t> axes,
                                const Tensor<float>& y, std::size_t row_begin, std::size_t row_end);

}  // namespace detail

/// An index outside its range found by a kernel: its position and its value.
struct BadIndex {
  std::size_t position = 0;
  float value = 0.0F;
};

/// How an optimizer step clips its gradients (Keras 2.11+'s `_clip_gradients`).
enum class GradientClipping { none, by_norm, by_global_norm, by_value };

/// One step of an optimizer over all its variables, for `Backend::apply_optimizer_step`: its rule
/// and the float operands the optimizer's host `update_step` computes for this step (so that a
/// device applies the same rule, keras/optimizers/detail/update_rules.hpp, to the same operands),
/// and how the gradients are clipped first.
struct OptimizerStep : UpdateOperands {
  GradientClipping clipping = GradientClipping::none;
  /// `clipnorm`, `global_clipnorm` or `clipvalue`.
  double clip_threshold = 0.0;
  /// Empty, or a one-element tensor that the step reads when it runs: where it holds 0, nothing
  /// is updated (`LossScaleOptimizer` skipping a step whose gradients are not finite, decided on
  /// the device by `Backend::all_finite`).
  Tensor<float> condition;
};

/// One variable of an optimizer step: its value, its gradient (left unchanged) and its slots in
/// the optimizer's order (empty tensors past the rule's slots).
struct VariableSlots {
  static constexpr std::size_t max_slots = 5;
  Tensor<float> value, gradient;
  std::array<Tensor<float>, max_slots> slots;
  /// Whether the step's `weight_decay` applies to it (`Optimizer::exclude_from_weight_decay`).
  bool decay = true;
};

struct RowLossSpec {
  RowLossKind kind = RowLossKind::mean_squared_error;
  bool from_logits = false;
  double label_smoothing = 0.0;
  /// Huber's `delta`.
  double delta = 1.0;
  /// The reduction's divisor (set by the loss): 1 for `sum`, the number of per-sample values
  /// for `sum_over_batch_size`. The gradient of a row is scaled by its weight over it.
  double denominator = 1.0;
};

/// A row loss's result: the weighted sum of the per-sample losses (in double) and the first label
/// outside `[0, classes)` of a sparse loss (then the sum and the gradient are unspecified).
struct RowLossResult {
  double total = 0.0;
  std::optional<BadIndex> bad_label;
};

struct MeanMetricSpec {
  MeanMetricKind kind = MeanMetricKind::mean;
  double threshold = 0.5;
};

/// A batch's contribution to a weighted running mean: the sum of `value * weight` and of the
/// weights.
struct MeanMetricSums {
  double total = 0.0;
  double count = 0.0;
};

class HostKernelRef;

/// A callable `HostKernelRef` refers to: one taking the host views of a kernel's tensors (and
/// not a `HostKernelRef` itself, which is copied instead).
template <class F>
concept HostKernelCallable = std::invocable<F&, std::span<const Tensor<float>>> &&
    !std::same_as<std::remove_cvref_t<F>, HostKernelRef>;

/// A host computation handed to `Backend::host_kernel`: a non-owning reference to a callable
/// taking the host views of the kernel's tensors (no allocation, unlike `std::function`). It
/// refers to the callable, which must outlive the call (a lambda written in the call does).
class HostKernelRef {
 public:
  template <HostKernelCallable F>
  HostKernelRef(F&& kernel) noexcept  // NOLINT: implicit, for `host_kernel(tensors, lambda)`
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(kernel)))),
        call_([](void* object, std::span<const Tensor<float>> tensors) {
          (*static_cast<std::remove_reference_t<F>*>(object))(tensors);
        }) {}

  void operator()(std::span<const Tensor<float>> tensors) const { call_(object_, tensors); }

 private:
  void* object_;
  void (*call_)(void*, std::span<const Tensor<float>>);
};

/// The memory and the kernels layers, losses, metrics and optimizers compute with, all on
/// `Tensor<float>` (a CUDA backend holds device tensors).
///
/// Memory (ggml's buffer split, Eigen's devices): `allocate` makes tensors in the backend's
/// memory (`device()`), `copy_from_host` and `copy_to_host` move elements across, `synchronize`
/// waits for queued work. Code outside a backend never dereferences a tensor that may live on a
/// device: it calls a kernel, or `host_kernel` for a host computation on host views of the
/// tensors (what a device backend stages through host memory).
///
/// Matrices are tensors seen as `rows() x row_size()` (`as_matrix`). Output tensors are written,
/// never resized; gradients of weights are accumulated (`beta = 1`) as `Layer::backward` requires.
/// \code
/// CpuBackend backend(4);
/// Tensor<float> x = backend.from_host(batch), y = backend.allocate({32, 10});
/// backend.gemm(x, false, kernel, false, y);  // y = x * kernel
/// backend.bias_add(y, bias);
/// Tensor<float> result = backend.to_host(y);
/// \endcode
class Backend {
 public:
  Backend() = default;
  virtual ~Backend() = default;
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // --- Memory ---------------------------------------------------------------------------------

  /// The memory `allocate` returns (`Device::host()` for the CPU backend).
  virtual Device device() const noexcept = 0;
  /// Whether the backend's memory is host memory (then host code may read its tensors directly,
  /// and batches are converted straight into its buffers).
  bool is_host() const noexcept { return device().is_host(); }
  /// A zero-filled tensor of `shape` in the backend's memory.
  virtual Tensor<float> allocate(const Shape& shape) = 0;
  /// Copies the host tensor `host` into `tensor` (same number of elements, the backend's memory).
  virtual void copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) = 0;
  /// Copies `tensor` (the backend's memory) into the host tensor `host` (same number of elements)
  /// and waits until the copy is complete.
  virtual void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) = 0;
  /// Waits until every kernel and copy queued so far is complete.
  virtual void synchronize() = 0;
  /// Runs `kernel` on the host with host views of `tensors` (in order; empty tensors and host
  /// tensors are passed as they are): the elements the tensors hold before the call are visible
  /// to the kernel, and what it writes is in the tensors afterwards. Exceptions propagate. The
  /// CPU backend calls `kernel(tensors)`; a device backend stages the tensors through the host.
  virtual void host_kernel(std::span<const Tensor<float>> tensors, HostKernelRef kernel) = 0;

  // --- Steps ----------------------------------------------------------------------------------

  /// Brackets the device work of one training, evaluation or prediction step: `Model` calls
  /// `begin_step` once the batch is uploaded and `end_step` once every kernel of the step is
  /// queued (or `abandon_step` when the step throws in between). Steps with the same `key` (the
  /// model, the kind of step, its rows and whether it has weights) usually queue the same kernels
  /// on the same buffers, so that a device backend may record such a step once and replay it (the
  /// CUDA backend's CUDA graphs).
  /// The defaults do nothing: the kernels run as they are called.
  virtual void begin_step(std::uint64_t /*key*/) {}
  /// Ends the step `begin_step` began: its work is queued (or done) when this returns.
  virtual void end_step() {}
  /// Ends a step that threw: the work queued so far is queued (or done), nothing is recorded.
  virtual void abandon_step() noexcept {}

  /// Writes `tensor` (the backend's memory) from the host: `write` is given one host tensor of
  /// `tensor`'s shape to fill, whose elements are then copied into `tensor`. The default hands it
  /// `staging` (a host tensor of that shape); a device backend may hand it page-locked memory of
  /// its own instead and copy from there, saving a copy of the batch.
  virtual void upload(const Tensor<float>& staging, const Tensor<float>& tensor,
                      HostKernelRef write) {
    write(std::span<const Tensor<float>>(&staging, 1));
    copy_from_host(staging, tensor);
  }

  /// Copies rows of `source` (the backend's memory) into `target` (`target.rows()` rows of the
  /// same row size): rows `rows[i]` when `rows` is not empty, else the rows from `offset` on. A
  /// batch of arrays the user keeps on the device, copied without crossing the bus. The row
  /// indices are the caller's, already within `source`. The default copies row by row
  /// (`copy`); a device backend gathers in one kernel.
  virtual void copy_rows(const Tensor<float>& source, std::span<const std::size_t> rows,
                         std::size_t offset, const Tensor<float>& target) {
    const std::size_t count = target.rows();
    if (rows.empty()) {
      copy(source.slice_rows(offset, offset + count), target);
      return;
    }
    for (std::size_t i = 0; i < count; ++i)
      copy(source.slice_rows(rows[i], rows[i] + 1), target.slice_rows(i, i + 1));
  }

  /// `host_kernel` on a list of tensors: `backend.on_host({y_true, y_pred}, [&](auto t) {...})`.
  template <class F>
  requires std::invocable<F&, std::span<const Tensor<float>>>
  void on_host(std::initializer_list<Tensor<float>> tensors, F&& kernel) {
    host_kernel(std::span<const Tensor<float>>(tensors.begin(), tensors.size()), kernel);
  }

  /// A host copy of `tensor`, which lives in this backend's memory (or on the host).
  LOADSTAR_DECL Tensor<float> to_host(const Tensor<float>& tensor);
  /// A copy of the host tensor `host` in this backend's memory.
  LOADSTAR_DECL Tensor<float> from_host(const Tensor<float>& host);

  // --- Optimizers, losses and metrics ----------------------------------------------------------

  /// Applies one optimizer step to all `variables` at once (PyTorch's `_foreach`/multi-tensor
  /// apply, llm.c's fused AdamW) and returns `true`, or returns `false` when this backend has no
  /// such kernel: the optimizer then runs its own host `update_step` per variable through
  /// `host_kernel` (the default, which keeps the CPU backend's results bit for bit).
  virtual bool apply_optimizer_step(const OptimizerStep& /*step*/,
                                    std::span<const VariableSlots> /*variables*/) {
    return false;
  }

  /// Computes a row loss and, when `gradient` has elements, writes `weight / denominator` times
  /// its derivative into it (`weight` is empty or one weight per row of `y_pred`); or returns
  /// `std::nullopt` when this backend has no such kernel (the default), and the loss computes on
  /// the host through `host_kernel`. Shapes are checked by the caller. The result may still be
  /// computed on the device when this returns (`Deferred`): the gradient is queued like any
  /// kernel's output, and only reading the sum waits.
  virtual std::optional<Deferred<RowLossResult>> row_loss(const RowLossSpec& /*spec*/,
                                                          const Tensor<float>& /*y_true*/,
                                                          const Tensor<float>& /*y_pred*/,
                                                          const Tensor<float>& /*weight*/,
                                                          const Tensor<float>& /*gradient*/) {
    return std::nullopt;
  }

  /// One batch of a mean metric (`weight` empty or one weight per row), or `std::nullopt` when
  /// this backend has no such kernel (the default: the metric runs on the host). As `row_loss`,
  /// the sums may still be computed on the device when this returns.
  virtual std::optional<Deferred<MeanMetricSums>> mean_metric(const MeanMetricSpec& /*spec*/,
                                                              const Tensor<float>& /*y_true*/,
                                                              const Tensor<float>& /*y_pred*/,
                                                              const Tensor<float>& /*weight*/) {
    return std::nullopt;
  }

  // --- Threads ----------------------------------------------------------------------------------

  /// The number of threads the backend computes with.
  virtual std::size_t threads() const noexcept = 0;

  // --- Linear algebra -----------------------------------------------------------------------

  /// `c = alpha * op(a) * op(b) + beta * c` on the matrices `a`, `b`, `c`; `op` transposes when
  /// asked. With `beta == 0`, `c`'s previous contents are ignored (even NaN).
  virtual void gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b,
                    bool transpose_b, const Tensor<float>& c, float alpha = 1.0F,
                    float beta = 0.0F) = 0;
  /// Adds `bias` (of `n` elements) to every group of `n` consecutive elements of `x` (the last
  /// axis).
  virtual void bias_add(const Tensor<float>& x, const Tensor<float>& bias) = 0;
  /// `out = beta * out + (sums of x over all but the last axis)`; `out` has `n` elements and `x`
  /// is seen as `(size / n, n)` (the bias gradient).
  virtual void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) = 0;
  /// `y = activation(x * kernel + bias)` (`Dense`'s forward: `x` is `rows x features`, `kernel`
  /// `features x units`, `bias` empty or `units` elements, `y` `rows x units`) as one fused
  /// operation, returning `true`; or `false` when this backend has none (the default), and the
  /// layer runs `gemm`, `bias_add` and `activation_forward` (which keeps the CPU backend's
  /// results bit for bit).
  virtual bool dense_forward(const Tensor<float>& /*x*/, const Tensor<float>& /*kernel*/,
                             const Tensor<float>& /*bias*/, Activation /*activation*/,
                             const Tensor<float>& /*y*/) {
    return false;
  }
  /// `dkernel = x^T * dz` and `dbias = ` the sums of `dz`'s columns (`Dense`'s weight
  /// gradients, written: their contents are ignored; `x` is `rows x features`, `dz`
  /// `rows x units`) as one fused operation, returning `true`; or `false` when this backend has
  /// none (the default), and the layer runs `gemm` and `column_sums`.
  virtual bool dense_weight_gradients(const Tensor<float>& /*x*/, const Tensor<float>& /*dz*/,
                                      const Tensor<float>& /*dkernel*/,
                                      const Tensor<float>& /*dbias*/) {
    return false;
  }
  /// What a backend keeps of a fused ReLU's forward for its gradient (which elements passed):
  /// created, laid out and reused by the backend that fuses them (`dense_forward_relu_mask`),
  /// held by the caller until the gradient (`dense_input_gradient_relu`), opaque to it.
  class ReluMask {
   public:
    ReluMask() = default;
    virtual ~ReluMask() = default;
    ReluMask(const ReluMask&) = delete;
    ReluMask& operator=(const ReluMask&) = delete;
    ReluMask(ReluMask&&) = delete;
    ReluMask& operator=(ReluMask&&) = delete;
  };
  /// `dense_forward` with a ReLU and a bias (`units` elements) that also records which elements
  /// of `y` are positive in `mask`, for `dense_input_gradient_relu`, as one fused operation,
  /// returning `true`; or `false` when this backend has none (the default), and nothing is done.
  /// `mask` is the backend's own: made when null or not fit for these shapes, else reused (its
  /// memory kept for the largest batch, so that shorter batches allocate nothing).
  virtual bool dense_forward_relu_mask(const Tensor<float>& /*x*/, const Tensor<float>& /*kernel*/,
                                       const Tensor<float>& /*bias*/, const Tensor<float>& /*y*/,
                                       std::unique_ptr<ReluMask>& /*mask*/) {
    return false;
  }
  /// The input gradient of a `Dense` layer whose input is the output of a `Dense` layer with a
  /// ReLU and a bias, carried through that ReLU: `dx = dz * kernel^T` where `mask` (recorded by
  /// `dense_forward_relu_mask` for that input) is set, 0 elsewhere, and `dbias` = the sums of
  /// `dx`'s columns (that layer's bias gradient, written), as one fused operation, returning
  /// `true`; or `false` when this backend has none (the default), and nothing is done.
  virtual bool dense_input_gradient_relu(const Tensor<float>& /*dz*/,
                                         const Tensor<float>& /*kernel*/, const ReluMask& /*mask*/,
                                         const Tensor<float>& /*dx*/,
                                         const Tensor<float>& /*dbias*/) {
    return false;
  }
  /// A dense product's weight gradients, `x^T * dz` into `dkernel` and the sums of `dz`'s columns
  /// into `dbias` (skipped when empty): added when `accumulate`, else written, by
  /// `dense_weight_gradients` where this backend fuses them, else by `gemm` and `column_sums`.
  LOADSTAR_DECL void weight_gradients(const Tensor<float>& x, const Tensor<float>& dz,
                                      const Tensor<float>& dkernel, const Tensor<float>& dbias,
                                      bool accumulate);

  // --- Elementwise --------------------------------------------------------------------------

  /// Every element of `x` set to `value`.
  virtual void fill(const Tensor<float>& x, float value) = 0;
  /// Every element of every tensor of `tensors` set to `value` (a step's gradients set to zero);
  /// the default fills them one by one, a device backend in one kernel.
  virtual void fill_many(std::span<const Tensor<float>> tensors, float value) {
    for (const auto& t : tensors)
      fill(t, value);
  }
  /// Every element of every tensor of `tensors` multiplied by `alpha` (a loss scale, applied to
  /// the gradients); the default scales them one by one. A device backend runs one kernel that
  /// reads `alpha` from the step's scalars, so that a replayed step uses this step's value.
  virtual void scale_many(std::span<const Tensor<float>> tensors, float alpha) {
    for (const auto& t : tensors)
      if (!t.empty()) scale(t, alpha);
  }
  /// Whether every element of every tensor of `tensors` is finite: `flag` (one element, in this
  /// backend's memory) is set to 1 or 0 by the step's own work, so that a later kernel of the
  /// same step can read it (`OptimizerStep::condition`), and the result is returned for the host
  /// (known at once on the host; a device backend's waits for the step when read). The default
  /// computes it on the host through `host_kernel`.
  LOADSTAR_DECL virtual Deferred<bool> all_finite(std::span<const Tensor<float>> tensors,
                                                  const Tensor<float>& flag);
  /// `y = x` (same number of elements).
  virtual void copy(const Tensor<float>& x, const Tensor<float>& y) = 0;
  /// `x *= alpha`.
  virtual void scale(const Tensor<float>& x, float alpha) = 0;
  /// `y += alpha * x`.
  virtual void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) = 0;
  /// `out = a + b` (`out` may be `a` or `b`).
  virtual void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) = 0;

  /// `y = f(x)`; `softmax` acts over the last axis. `y` may be `x`.
  virtual void activation_forward(Activation kind, const Tensor<float>& x,
                                  const Tensor<float>& y) = 0;
  /// `dx = f'(x) * dy` (softmax: the Jacobian-vector product over the last axis). Computed from
  /// the output `y`, except for `activation_gradient_needs_input(kind)` kinds, which read `x`
  /// (otherwise `x` may be empty). `dx` may be `dy`.
  virtual void activation_backward(Activation kind, const Tensor<float>& x, const Tensor<float>& y,
                                   const Tensor<float>& dy, const Tensor<float>& dx) = 0;

  /// Keras's `ReLU` (and `LeakyReLU`): `max_value` for `x >= max_value`, `x` for
  /// `threshold <= x < max_value`, `negative_slope * (x - threshold)` below.
  virtual void relu_forward(const Tensor<float>& x, const Tensor<float>& y,
                            std::optional<float> max_value, float negative_slope,
                            float threshold) = 0;
  virtual void relu_backward(const Tensor<float>& x, const Tensor<float>& dy,
                             const Tensor<float>& dx, std::optional<float> max_value,
                             float negative_slope, float threshold) = 0;

  /// `y = softmax(x)` over `axis`.
  virtual void softmax_forward(const Tensor<float>& x, const Tensor<float>& y,
                               std::size_t axis) = 0;
  /// `dx = y * (dy - sum(dy * y))` over `axis`.
  virtual void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy,
                                const Tensor<float>& dx, std::size_t axis) = 0;

  /// Inverted dropout: element `i` is kept when a counter-based hash of `(key, i)` falls at or
  /// above `rate`, and kept elements are scaled by `1 / (1 - rate)`. The same key gives the same
  /// mask, so `backward` applies it again to the gradient without storing it.
  virtual void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
                       std::uint64_t key) = 0;

  // --- Convolution and pooling -----------------------------------------------------------------

  /// Unfolds the input into `columns` of shape `(batch * out_h * out_w, patch_size)`, each row a
  /// receptive field in `(kh, kw, in_c)` order (zeros where it falls into the padding).
  virtual void im2col(const Tensor<float>& x, const Conv2DGeometry& g,
                      const Tensor<float>& columns) = 0;
  /// The adjoint of `im2col`: `dx = 0`, then every column element is added back to its pixel.
  virtual void col2im(const Tensor<float>& columns, const Conv2DGeometry& g,
                      const Tensor<float>& dx) = 0;

  /// A convolution layer's forward pass: `y = activation(im2col(x) * kernel + bias)`, with `x`
  /// channels-last, `kernel` the `(patch_size, filters)` matrix, `bias` of `filters` elements (or
  /// empty) and `y` seen as `(batch * out_h * out_w, filters)`. The default unfolds the whole
  /// batch (`im2col`) into memory it allocates, then calls `gemm`, `bias_add` and
  /// `activation_forward`; a backend may fuse and tile.
  LOADSTAR_DECL virtual void conv2d_forward(const Tensor<float>& x, const Conv2DGeometry& g,
                                            const Tensor<float>& kernel, const Tensor<float>& bias,
                                            Activation activation, const Tensor<float>& y);
  /// Its backward pass, from the output `y` and its gradient `dy`: the kernel's gradient is
  /// added into `dkernel` and the bias's into `dbias` (skipped when empty) when `accumulate`,
  /// else written there (their contents ignored); `dx` is written (skipped when empty). `bias` is
  /// read where the activation's gradient needs its input (recomputed). The default is made of
  /// the other kernels, with memory it allocates.
  LOADSTAR_DECL virtual void conv2d_backward(const Tensor<float>& x, const Conv2DGeometry& g,
                                             const Tensor<float>& kernel, const Tensor<float>& bias,
                                             Activation activation, const Tensor<float>& y,
                                             const Tensor<float>& dy, const Tensor<float>& dkernel,
                                             const Tensor<float>& dbias, const Tensor<float>& dx,
                                             bool accumulate);
  /// A grouped convolution's forward pass (Keras's `groups`): `conv2d_forward` with the `g.in_c`
  /// input channels and the `filters` output channels each split into `groups` contiguous groups,
  /// output channel `o` seeing only the input channels of its group `o / (filters / groups)`;
  /// `kernel` is the `(kernel_h * kernel_w * in_c / groups, filters)` matrix of Keras's layout.
  /// Returns `false`, computing nothing, where the backend has no such kernel (the default): the
  /// layer then gathers each group's channels with `permute` and calls `conv2d_forward` per group.
  virtual bool grouped_conv2d_forward(const Tensor<float>& /*x*/, const Conv2DGeometry& /*g*/,
                                      std::size_t /*groups*/, const Tensor<float>& /*kernel*/,
                                      const Tensor<float>& /*bias*/, Activation /*activation*/,
                                      const Tensor<float>& /*y*/) {
    return false;
  }
  /// Its backward pass, with `conv2d_backward`'s arguments and contract; `false` as
  /// `grouped_conv2d_forward`.
  virtual bool grouped_conv2d_backward(const Tensor<float>& /*x*/, const Conv2DGeometry& /*g*/,
                                       std::size_t /*groups*/, const Tensor<float>& /*kernel*/,
                                       const Tensor<float>& /*bias*/, Activation /*activation*/,
                                       const Tensor<float>& /*y*/, const Tensor<float>& /*dy*/,
                                       const Tensor<float>& /*dkernel*/,
                                       const Tensor<float>& /*dbias*/, const Tensor<float>& /*dx*/,
                                       bool /*accumulate*/) {
    return false;
  }
  /// A depthwise convolution: `z = depthwise(x) (+ bias)` with `x` channels-last, `kernel`
  /// `(kernel_h, kernel_w, in_c, out_c / in_c)` (Keras's layout), `bias` of `out_c` elements (or
  /// empty) and `z` `(batch, out_h, out_w, out_c)` in any shape of that size. The default runs
  /// detail/depthwise_loops.hpp on the host through `host_kernel`.
  LOADSTAR_DECL virtual void depthwise_forward(const Tensor<float>& x, const Conv2DGeometry& g,
                                               const Tensor<float>& kernel,
                                               const Tensor<float>& bias, const Tensor<float>& z);
  /// Its backward pass from the pre-bias gradient `dz`: the kernel's and the bias's gradients are
  /// added into `dkernel` and `dbias`, `dx` is written (each skipped when empty).
  LOADSTAR_DECL virtual void depthwise_backward(const Tensor<float>& x, const Conv2DGeometry& g,
                                                const Tensor<float>& kernel,
                                                const Tensor<float>& dz, const Tensor<float>& dx,
                                                const Tensor<float>& dkernel,
                                                const Tensor<float>& dbias);

  virtual void max_pool_forward(const Tensor<float>& x, const Pool2DGeometry& g,
                                const Tensor<float>& y) = 0;
  /// Routes each output gradient to the first maximum of its window (recomputed from `x`).
  virtual void max_pool_backward(const Tensor<float>& x, const Pool2DGeometry& g,
                                 const Tensor<float>& dy, const Tensor<float>& dx) = 0;
  /// `max_pool_backward` carried on through the ReLU whose output `x` is (the gradient set to 0
  /// where `x` is not positive, as `activation_backward` of a ReLU does), as one fused operation,
  /// returning `true`; or `false` when this backend has none (the default), and nothing is done.
  virtual bool max_pool_backward_relu(const Tensor<float>& /*x*/, const Pool2DGeometry& /*g*/,
                                      const Tensor<float>& /*dy*/, const Tensor<float>& /*dx*/) {
    return false;
  }
  /// Averages over the window's elements inside the input (TensorFlow's `same` padding).
  virtual void avg_pool_forward(const Tensor<float>& x, const Pool2DGeometry& g,
                                const Tensor<float>& y) = 0;
  virtual void avg_pool_backward(const Pool2DGeometry& g, const Tensor<float>& dy,
                                 const Tensor<float>& dx) = 0;
  /// `(batch, h, w, c)` to `(batch, c)`: mean (or max) over `h * w`.
  virtual void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) = 0;
  virtual void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                                    const Tensor<float>& dx) = 0;

  // --- Normalisation -----------------------------------------------------------------------------

  /// Mean and biased variance over all but the last axis (`x` as `(n, c)`).
  virtual void moments(const Tensor<float>& x, const Tensor<float>& mean,
                       const Tensor<float>& variance) = 0;
  /// `y = gamma * (x - mean) / sqrt(variance + epsilon) + beta` over the last axis; an empty
  /// `gamma` means 1 and an empty `beta` 0.
  virtual void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                                  const Tensor<float>& variance, const Tensor<float>& gamma,
                                  const Tensor<float>& beta, float epsilon,
                                  const Tensor<float>& y) = 0;
  /// The gradient of `batch_norm_forward` with respect to `x`, `gamma` and `beta` (the latter two
  /// accumulated; skipped when empty). `training` means that `mean` and `variance` are the
  /// batch's own statistics (and so depend on `x`); otherwise they are constants.
  virtual void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                                   const Tensor<float>& variance, const Tensor<float>& gamma,
                                   float epsilon, bool training, const Tensor<float>& dy,
                                   const Tensor<float>& dx, const Tensor<float>& dgamma,
                                   const Tensor<float>& dbeta) = 0;
  /// `moving = moving * momentum + value * (1 - momentum)`.
  virtual void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                              float momentum) = 0;

  // --- Indexing and layout
  // -------------------------------------------------------------------------

  /// `out[i, :] = table[indices[i], :]` with `indices` given as floats (cast toward zero). Returns
  /// the first index outside `[0, table.rows())` and its position (then `out` is unspecified), so
  /// that the caller reports it without reading `indices` on the host.
  virtual std::optional<BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                         const Tensor<float>& out) = 0;
  /// `gather` whose check of the indices a device may still be running when this returns, so
  /// that the step need not wait for it: the first bad index when read (`Deferred::get`), and
  /// meanwhile zeros in `out` for the bad indices' rows. The default is `gather`'s, known at once.
  virtual Deferred<std::optional<BadIndex>> gather_deferred(const Tensor<float>& indices,
                                                            const Tensor<float>& table,
                                                            const Tensor<float>& out) {
    return gather(indices, table, out);
  }
  /// `table_gradient[indices[i], :] += dy[i, :]` (indices checked by `gather`; a device backend
  /// skips an index outside the table, whose error `gather_deferred` reports).
  virtual void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                           const Tensor<float>& table_gradient) = 0;
  /// Concatenates `parts` along `axis` into `out`.
  virtual void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                           const Tensor<float>& out) = 0;
  /// The adjoint: copies the slices of `x` along `axis`, `extents[i]` wide, into `parts` (an
  /// empty part is skipped).
  virtual void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
                     std::span<const Tensor<float>> parts) = 0;

  /// `y = transpose(x, axes)` (NumPy's `transpose`: axis `i` of `y` is axis `axes[i]` of `x`;
  /// `y` has the permuted shape). The channels_first layers and `Permute` move axes with it.
  /// The default runs on the host through `host_kernel`; a backend may override it.
  LOADSTAR_DECL virtual void permute(const Tensor<float>& x, std::span<const std::size_t> axes,
                                     const Tensor<float>& y);

  /// Rounds every element of `x`, in place, to the nearest value of `dtype` (`float16` or
  /// `bfloat16`, to nearest even; `float32` leaves `x` as it is): mixed precision's one kernel
  /// (keras/mixed_precision/detail/half_rounding.hpp). The default runs on the host through
  /// `host_kernel`; a backend may override it.
  LOADSTAR_DECL virtual void round_to(const Tensor<float>& x, DType dtype);
  /// The dtype the operands of the matrix products that follow are held in: a mixed-precision
  /// layer's inputs, weights and output gradients are rounded to its compute dtype (`float16` or
  /// `bfloat16`; `float32`, the default, for every other layer). A device backend may then
  /// multiply in that dtype, on its tensor cores, with float32 sums and results: the same
  /// products, as a product of two half values is exact in float32, in another order (values a
  /// layer computes in between, such as a fused activation's gradient, are rounded to it first,
  /// as the layer computes in it in Keras). The default ignores it: the CPU backend finds
  /// bfloat16 operands by their values (`CpuBackend::bfloat16_products`).
  virtual void set_product_dtype(DType /*dtype*/) {}

  /// One of the recurrent layers' element-wise kernels over its `elements` elements
  /// (keras/detail/recurrent_kernels.hpp): `tensors` in `RecurrentOp`'s order, an empty one not
  /// given, at most `RecurrentTensors::max`; `key` keys the dropout masks. The default runs
  /// `recurrent_element` on the host through `host_kernel`; a backend may override it.
  LOADSTAR_DECL virtual void recurrent_kernel(const detail::RecurrentKernel& kernel,
                                              std::span<const Tensor<float>> tensors,
                                              std::size_t elements, std::uint64_t key = 0);

  /// One of the element-wise kernels of the shape, activation and noise layers over its
  /// `elements` elements (keras/detail/layer_kernels.hpp): `tensors` in `LayerOp`'s order, an
  /// empty one not given, at most `LayerTensors::max`; `key` keys the noise. The default runs
  /// `layer_element_of` on the host through `host_kernel`; a backend may override it.
  LOADSTAR_DECL virtual void layer_kernel(const detail::LayerKernel& kernel,
                                          std::span<const Tensor<float>> tensors,
                                          std::size_t elements, std::uint64_t key = 0);

  /// Dot-product attention (`MultiHeadAttention`, and `Attention` with a fixed scale) on a
  /// device, a thread per query row (keras/detail/attention_rows.hpp): `tensors` are `q, k, v,
  /// probabilities, out`, then the query's, value's and key's masks and the attention mask (empty
  /// where none; `call`'s mask pointers are taken from them). Returns `false`, computing
  /// nothing, where the layer computes attention itself (the default: the CPU's products per
  /// head).
  virtual bool attention_forward(const detail::AttentionShape& /*shape*/,
                                 const detail::AttentionCall& /*call*/, float /*scale*/,
                                 std::span<const Tensor<float>> /*tensors*/) {
    return false;
  }
  /// Its gradients: `tensors` are `q, k, v, probabilities, dout, dq, dk, dv`, the four masks, and
  /// the gradient of the returned probabilities (empty when nothing reads them); `dq`, `dk` and
  /// `dv` are written (each skipped when empty). `false` as `attention_forward`.
  virtual bool attention_backward(const detail::AttentionShape& /*shape*/,
                                  const detail::AttentionCall& /*call*/, float /*scale*/,
                                  std::span<const Tensor<float>> /*tensors*/) {
    return false;
  }

  /// `LayerNormalization` over the lines of `width` values of `x` (the trailing axes it
  /// normalises): `y = xhat * gamma + beta` per line (keras/detail/layer_norm_formulas.hpp;
  /// `gamma`, `beta` of `width` values, or empty). The default runs on the host through
  /// `host_kernel`; a backend may override it.
  LOADSTAR_DECL virtual void layer_norm_forward(const Tensor<float>& x, std::size_t width,
                                                const Tensor<float>& gamma,
                                                const Tensor<float>& beta, float epsilon,
                                                const Tensor<float>& y);
  /// Its gradients from `dy`: writes `dx` and adds to `dgamma` and `dbeta` (each skipped when
  /// empty), the lines in order.
  LOADSTAR_DECL virtual void layer_norm_backward(const Tensor<float>& x, std::size_t width,
                                                 const Tensor<float>& gamma, float epsilon,
                                                 const Tensor<float>& dy, const Tensor<float>& dx,
                                                 const Tensor<float>& dgamma,
                                                 const Tensor<float>& dbeta);
};

namespace detail {
/// `Backend::set_product_dtype` for the layer calls of its scope, `float32` again when it ends.
class ProductDtypeScope {
 public:
  explicit ProductDtypeScope(Backend& backend) : backend_(backend) {}
  ProductDtypeScope(const ProductDtypeScope&) = delete;
  ProductDtypeScope& operator=(const ProductDtypeScope&) = delete;
  ~ProductDtypeScope() { backend_.set_product_dtype(DType::float32); }
  /// Tells the backend (every time: a nested model's own scope may have reset it in between).
  void set(DType dtype) { backend_.set_product_dtype(dtype); }

 private:
  Backend& backend_;
};

/// One step's `begin_step`, and its `end_step` on `end()` or its `abandon_step` when left by an
/// exception first.
class StepScope {
 public:
  StepScope(Backend& backend, std::uint64_t key) : backend_(&backend) { backend.begin_step(key); }
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  ~StepScope() {
    if (backend_ != nullptr) backend_->abandon_step();
  }
  void end() {
    Backend* backend = backend_;
    backend_ = nullptr;
    backend->end_step();
  }

 private:
  Backend* backend_;
};
}  // namespace detail

/// A `CpuBackend` (keras/backend/cpu_backend.hpp) of `threads` threads, at least 1: the backend
/// `compile` makes when `CompileOptions::backend` is empty. Throws `ConfigError` for 0 threads.
/// \code
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = cpu_backend(4)});
/// \endcode
LOADSTAR_DECL std::shared_ptr<Backend> cpu_backend(std::size_t threads = 1);

namespace detail {
/// The one-thread CPU backend that the host-tensor conveniences (`Loss::compute`,
/// `Metric::update_state` and `Optimizer::apply_gradients` without a backend) compute with.
LOADSTAR_DECL Backend& host_backend();
}  // namespace detail

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp);
// `cpu_backend` and `host_backend` in cpu_backend.hpp.
#if LOADSTAR_KERAS_BODIES
#include "loadstar/keras/backend/cpu_backend.hpp"

namespace loadstar::keras {

Tensor<float> Backend::to_host(const Tensor<float>& tensor) {
  if (tensor.is_host()) return tensor.clone();
  auto host = Tensor<float>::uninitialized(tensor.shape());
  copy_to_host(tensor, host);
  return host;
}

Tensor<float> Backend::from_host(const Tensor<float>& host) {
  Tensor<float> tensor = allocate(host.shape());
  copy_from_host(host, tensor);
  return tensor;
}

void Backend::permute(const Tensor<float>& x, std::span<const std::size_t> axes,
                      const Tensor<float>& y) {
  LOADSTAR_ASSERT(axes.size() == x.rank() && x.rank() == y.rank() && x.size() == y.size(),
                  "permute: shapes and axes do not fit");
  const Tensor<float> tensors[] = {x, y};
  host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    detail::permute_rows(t[0], axes, t[1], 0, t[1].rank() == 0 ? 0 : t[1].shape()[0]);
  });
}

void Backend::recurrent_kernel(const detail::RecurrentKernel& kernel,
                               std::span<const Tensor<float>> tensors, std::size_t elements,
                               std::uint64_t key) {
  LOADSTAR_ASSERT(tensors.size() <= detail::RecurrentTensors::max,
                  "recurrent_kernel: more tensors than a kernel takes");
  if (elements == 0) return;
  host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    detail::RecurrentTensors pointers;
    for (std::size_t i = 0; i < t.size(); ++i)
      pointers.t[i] = t[i].empty() ? nullptr : t[i].data();
    detail::recurrent_elements(kernel, pointers, key, elements);
  });
}

void Backend::layer_kernel(const detail::LayerKernel& kernel,
                           std::span<const Tensor<float>> tensors, std::size_t elements,
                           std::uint64_t key) {
  LOADSTAR_ASSERT(tensors.size() <= detail::LayerTensors::max,
                  "layer_kernel: more tensors than a kernel takes");
  if (elements == 0) return;
  host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    detail::LayerTensors pointers;
    for (std::size_t i = 0; i < t.size(); ++i)
      pointers.t[i] = t[i].empty() ? nullptr : t[i].data();
    detail::layer_elements(kernel, pointers, key, elements);
  });
}

void Backend::layer_norm_forward(const Tensor<float>& x, std::size_t width,
                                 const Tensor<float>& gamma, const Tensor<float>& beta,
                                 float epsilon, const Tensor<float>& y) {
  if (x.empty() || width == 0) return;
  const Tensor<float> tensors[] = {x, gamma, beta, y};
  host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    const float* g = t[1].empty() ? nullptr : t[1].data();
    const float* b = t[2].empty() ? nullptr : t[2].data();
    for (std::size_t line = 0; line < t[0].size() / width; ++line) {
      const float* in = t[0].data() + line * width;
      float* out = t[3].data() + line * width;
      const detail::LayerNormLine s = detail::layer_norm_line(in, width, epsilon);
      for (std::size_t p = 0; p < width; ++p)
        out[p] = detail::layer_norm_value(in[p], s, g, b, p);
    }
  });
}

void Backend::layer_norm_backward(const Tensor<float>& x, std::size_t width,
                                  const Tensor<float>& gamma, float epsilon,
                                  const Tensor<float>& dy, const Tensor<float>& dx,
                                  const Tensor<float>& dgamma, const Tensor<float>& dbeta) {
  if (x.empty() || width == 0) return;
  const Tensor<float> tensors[] = {x, gamma, dy, dx, dgamma, dbeta};
  host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    const float* g = t[1].empty() ? nullptr : t[1].data();
    for (std::size_t line = 0; line < t[0].size() / width; ++line) {
      const float* in = t[0].data() + line * width;
      const float* d = t[2].data() + line * width;
      const detail::LayerNormLine s = detail::layer_norm_line(in, width, epsilon);
      for (std::size_t p = 0; p < width; ++p) {
        if (!t[4].empty())
          t[4].data()[p] += static_cast<float>(detail::layer_norm_dy_xhat(in[p], d[p], s));
        if (!t[5].empty()) t[5].data()[p] += d[p];
      }
      if (t[3].empty()) continue;
      const detail::LayerNormSums sums = detail::layer_norm_sums(in, d, g, width, s);
      float* out = t[3].data() + line * width;
      for (std::size_t p = 0; p < width; ++p)
        out[p] = detail::layer_norm_gradient(in[p], d[p], g, p, width, s, sums);
    }
  });
}

void Backend::round_to(const Tensor<float>& x, DType dtype) {
  if (dtype == DType::float32 || x.empty()) return;
  LOADSTAR_ASSERT(dtype == DType::float16 || dtype == DType::bfloat16,
                  "round_to: float16 or bfloat16");
  const detail::HalfKind kind =
      dtype == DType::bfloat16 ? detail::HalfKind::bfloat16 : detail::HalfKind::float16;
  const Tensor<float> tensors[] = {x};
  host_kernel(tensors, [kind](std::span<const Tensor<float>> t) {
    float* data = t[0].data();
    const std::size_t n = t[0].size();
    for (std::size_t i = 0; i < n; ++i)
      data[i] = detail::round_half(data[i], kind);
  });
}

Deferred<bool> Backend::all_finite(std::span<const Tensor<float>> tensors,
                                   const Tensor<float>& flag) {
  LOADSTAR_ASSERT(flag.size() == 1, "all_finite: the flag has one element");
  bool finite = true;
  for (const auto& t : tensors) {
    if (t.empty() || !finite) continue;
    const Tensor<float> one[] = {t};
    host_kernel(one, [&finite](std::span<const Tensor<float>> v) {
      const float* data = v[0].data();
      for (std::size_t i = 0, n = v[0].size(); i < n && finite; ++i)
        finite = std::isfinite(data[i]);
    });
  }
  fill(flag, finite ? 1.0F : 0.0F);
  return finite;
}

void Backend::conv2d_forward(const Tensor<float>& x, const Conv2DGeometry& g,
                             const Tensor<float>& kernel, const Tensor<float>& bias,
                             Activation activation, const Tensor<float>& y) {
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const Tensor<float> columns = allocate({rows, g.patch_size()});
  im2col(x, g, columns);
  const Tensor<float> z = y.reshape({rows, kernel.row_size()});
  gemm(columns, false, kernel, false, z);
  if (!bias.empty()) bias_add(z, bias);
  if (activation != Activation::linear) activation_forward(activation, z, z);
}

void Backend::depthwise_forward(const Tensor<float>& x, const Conv2DGeometry& g,
                                const Tensor<float>& kernel, const Tensor<float>& bias,
                                const Tensor<float>& z) {
  const Tensor<float> tensors[] = {x, kernel, bias, z};
  host_kernel(tensors, [&g](std::span<const Tensor<float>> t) {
    detail::depthwise_forward_rows(t[0].data(), g, t[1].data(),
                                   t[2].empty() ? nullptr : t[2].data(), t[3].data(), 0,
                                   g.batch * g.out_h);
  });
}

void Backend::depthwise_backward(const Tensor<float>& x, const Conv2DGeometry& g,
                                 const Tensor<float>& kernel, const Tensor<float>& dz,
                                 const Tensor<float>& dx, const Tensor<float>& dkernel,
                                 const Tensor<float>& dbias) {
  const Tensor<float> tensors[] = {x, kernel, dz, dx, dkernel, dbias};
  host_kernel(tensors, [&g](std::span<const Tensor<float>> t) {
    const auto data = [](const Tensor<float>& v) { return v.empty() ? nullptr : v.data(); };
    detail::depthwise_backward_images(t[0].data(), g, t[1].data(), t[2].data(), data(t[3]),
                                      data(t[4]), data(t[5]), 0, g.batch, true);
  });
}

void Backend::conv2d_backward(const Tensor<float>& x, const Conv2DGeometry& g,
                              const Tensor<float>& kernel, const Tensor<float>& bias,
                              Activation activation, const Tensor<float>& y,
                              const Tensor<float>& dy, const Tensor<float>& dkernel,
                              const Tensor<float>& dbias, const Tensor<float>& dx,
                              bool accumulate) {
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const std::size_t filters = kernel.row_size();
  const Tensor<float> columns = allocate({rows, g.patch_size()});
  im2col(x, g, columns);
  Tensor<float> dz = dy.reshape({rows, filters});
  if (activation != Activation::linear) {
    Tensor<float> z;
    if (activation_gradient_needs_input(activation)) {
      z = allocate({rows, filters});
      gemm(columns, false, kernel, false, z);
      if (!bias.empty()) bias_add(z, bias);
    }
    const Tensor<float> gradient = allocate({rows, filters});
    activation_backward(activation, z, y.reshape({rows, filters}), dz, gradient);
    dz = gradient;
  }
  weight_gradients(columns, dz, dkernel, dbias, accumulate);
  if (!dx.empty()) {
    gemm(dz, false, kernel, true, columns);
    col2im(columns, g, dx);
  }
}

void Backend::weight_gradients(const Tensor<float>& x, const Tensor<float>& dz,
                               const Tensor<float>& dkernel, const Tensor<float>& dbias,
                               bool accumulate) {
  if (!accumulate && dense_weight_gradients(x, dz, dkernel, dbias)) return;
  const float beta = accumulate ? 1.0F : 0.0F;
  gemm(x, true, dz, false, dkernel, 1.0F, beta);
  if (!dbias.empty()) column_sums(dz, dbias, beta);
}

AxisGeometry axis_geometry(std::size_t in, std::size_t kernel, std::size_t stride,
                           std::size_t dilation, bool same) noexcept {
  const std::size_t span = (kernel - 1) * dilation + 1;
  if (!same) return {in >= span ? (in - span) / stride + 1 : 0, 0};
  const std::size_t out = (in + stride - 1) / stride;
  const std::size_t needed = out == 0 ? 0 : (out - 1) * stride + span;
  const std::size_t total = needed > in ? needed - in : 0;
  return {out, total / 2};
}

}  // namespace loadstar::keras
namespace loadstar::keras::detail {

void permute_rows(const Tensor<float>& x, std::span<const std::size_t> axes, const Tensor<float>& y,
                  std::size_t row_begin, std::size_t row_end) {
  const std::size_t rank = x.rank();
  if (rank <= 1) {
    std::memcpy(y.data() + row_begin, x.data() + row_begin, (row_end - row_begin) * sizeof(float));
    return;
  }
  std::array<std::size_t, Shape::max_rank> x_strides{}, strides{}, dims{}, index{};
  std::size_t stride = 1;
  for (std::size_t i = rank; i-- > 0;) {
    x_strides[i] = stride;
    stride *= x.shape()[i];
  }
  for (std::size_t i = 0; i < rank; ++i) {
    strides[i] = x_strides[axes[i]];
    dims[i] = y.shape()[i];
  }
  // The last axis of y is copied in one go per position of the others: a memcpy when it stays
  // last (stride 1 in both), else a strided gather; an odometer walks axes 1..rank-2 of y.
  const std::size_t run = dims[rank - 1];
  const std::size_t run_stride = strides[rank - 1];
  const std::size_t row = y.size() / std::max<std::size_t>(y.shape()[0], 1);
  if (row == 0 || run == 0) return;
  for (std::size_t r = row_begin; r < row_end; ++r) {
    float* out = y.data() + r * row;
    const float* out_end = out + row;
    index.fill(0);
    std::size_t offset = r * strides[0];
    while (out < out_end) {
      const float* in = x.data() + offset;
      if (run_stride == 1) {
        std::memcpy(out, in, run * sizeof(float));
      } else {
        for (std::size_t j = 0; j < run; ++j)
          out[j] = in[j * run_stride];
      }
      out += run;
      for (std::size_t i = rank - 1; i-- > 1;) {
        offset += strides[i];
        if (++index[i] < dims[i]) break;
        offset -= strides[i] * dims[i];
        index[i] = 0;
      }
    }
  }
}

}  // namespace loadstar::keras::detail
#endif
