/// \file
/// `CudaBackend`: the executor's `Backend` on one NVIDIA GPU, with cuBLAS for GEMM and the
/// kernels of loadstar/cuda/detail/kernels.cuh for the rest. Opt-in: not included by
/// `<loadstar/loadstar.hpp>` or `<loadstar/keras.hpp>`; a trainer includes `<loadstar/cuda.hpp>`
/// and links Meson's `loadstar-cuda` dependency (the backend compiled once: its host code by the
/// C++ compiler, its kernels by nvcc; with cudart, cuBLAS and cuBLASLt). This header declares the
/// backend only and includes no CUDA header; its work is `detail::CudaBackendImpl`
/// (loadstar/cuda/detail/cuda_backend.hpp, defined in src/cuda/).
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::cuda {

namespace detail {
class CudaBackendImpl;
}  // namespace detail

/// How `CudaBackend` computes `Conv2D` (`CudaOptions::convolution`).
enum class Convolution {
  /// im2col (or col2im) and one cuBLASLt GEMM with the bias and ReLU in its epilogue.
  im2col,
  /// cuDNN's convolutions (forward, backward data, backward filter), each the first
  /// deterministic full-fp32 algorithm of cuDNN's heuristic, with the kernel transposed into
  /// cuDNN's filter layout, then the bias and activation kernels. A geometry cuDNN cannot run as
  /// TensorFlow pads (an odd total `same` padding that the last window reaches), or has no
  /// deterministic algorithm for, and a shared layer's accumulated gradients take `im2col`. Needs
  /// a build with cuDNN (`LOADSTAR_CUDA_WITH_CUDNN`, Meson's `-Dcudnn`).
  cudnn,
};

/// How a `CudaBackend` runs.
struct CudaOptions {
  /// Whole steps as CUDA graphs: the second training, evaluation or prediction step of a shape
  /// (a model's steps of one kind and size) is recorded, captured as one CUDA graph and launched;
  /// later steps of that shape whose work is the same (the same kernels on the same buffers,
  /// checked call by call) launch the graph instead of each kernel. Step-dependent scalars (the
  /// optimizer's learning rate and bias corrections, dropout's key) reach the graph through device
  /// memory uploaded before each launch, so the results are those of the kernels launched one by
  /// one, bit for bit. A step that cannot be captured (one that computes on the host, allocates or
  /// waits) runs kernel by kernel.
  bool graphs = true;
  /// How convolutions run: im2col and cuBLASLt (the default), or cuDNN.
  Convolution convolution = Convolution::im2col;
};

/// Whether this build has cuDNN's convolutions (`Convolution::cudnn`).
inline constexpr bool has_cudnn = LOADSTAR_CUDA_WITH_CUDNN != 0;

/// What a `CudaBackend`'s steps did (`CudaBackend::graph_stats`).
struct GraphStats {
  std::size_t eager = 0;      ///< steps not recorded: a shape's first, or graphs off or given up
  std::size_t captured = 0;   ///< steps captured as a graph (then launched)
  std::size_t replayed = 0;   ///< steps that launched a graph captured before
  std::size_t fallbacks = 0;  ///< recorded steps that ran kernel by kernel after all
  std::string last_fallback;  ///< what made the last of them run so (a host computation, ...)
};

/// Whether a CUDA device can be used (`cudaGetDeviceCount` succeeds and finds one); never throws.
bool device_available() noexcept;

/// The executor's `Backend` on one GPU: tensors live in device memory (`Device{"cuda", index}`)
/// and own it through `Tensor::wrap`'s owner; every kernel is queued on one stream.
///
/// - Memory comes from a stream-ordered pool of the backend's own that keeps what is freed, so
///   that after the first batch no step allocates from the driver. Host copies go through
///   reused page-locked staging buffers.
/// - GEMM is cuBLAS `sgemm` in full fp32 (no TF32), row-major through the transposition identity
///   `C^T = op(B)^T op(A)^T`; the rest are loadstar's kernels, whose element-wise math is the CPU
///   backend's (loadstar/cuda/detail/math.hpp).
/// - Deterministic: no float reduction uses atomics; sums run in an order fixed by the sizes, so
///   the same inputs give the same bits run to run. Results match the CPU backend to float
///   tolerance (the device's `expf` and GEMM blocking differ in the last bits).
/// - Optimizer steps are one fused kernel over all variables (`apply_optimizer_step`); the
///   cross-entropies (sparse, categorical, binary), mean squared and absolute error, Huber and
///   Kullback-Leibler, the accuracies, the regression metrics and `Mean` are kernels too, each
///   leaving its result in a device ring that is read back only when a loss or metric is read
///   (`keras::Deferred`): a training step queues its work and returns without waiting for the
///   device, and the logs wait when a callback reads them. A bad sparse label is found by the
///   loss kernel and raised then, as the CPU's `ConfigError`. Uploads take turns among several
///   page-locked buffers, so that the host copies the next batches while the device computes.
///   Other host computations (`host_kernel`: other losses and metrics, a few layers) stage their
///   tensors through host memory and wait; `host_kernel_calls` counts them.
///
/// Construction throws `CudaError` when no device is present and `ConfigError` for an index that
/// is not one.
/// \code
/// #include <loadstar/cuda.hpp>
/// auto backend = loadstar::keras::cuda_backend(0);
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = backend});
/// \endcode
class CudaBackend final : public keras::Backend {
 public:
  /// A backend on device `device` (0 is the first).
  explicit CudaBackend(int device = 0, CudaOptions options = {});
  ~CudaBackend() override;

  /// How many times `host_kernel` has staged device tensors through the host (a test counts that
  /// a training step makes none).
  std::size_t host_kernel_calls() const noexcept;

  /// What the steps did: how many ran kernel by kernel, were captured as CUDA graphs, or replayed
  /// one (`CudaOptions::graphs`).
  const GraphStats& graph_stats() const noexcept;

  /// The device's index.
  int device_index() const noexcept;
  /// The device memory the backend's pool holds (in use or kept for reuse), in bytes: it stops
  /// growing once every buffer of a training step has been allocated once.
  std::size_t reserved_bytes() const;

  /// How many cuDNN convolutions were queued or recorded (`Convolution::cudnn`; a replayed graph
  /// adds none): 0 where every geometry took im2col.
  std::size_t cudnn_calls() const noexcept;

  /// The most rows whose bias gradient `dense_weight_gradients` takes from cuBLASLt's `BGRADA`
  /// epilogue; beyond them `column_sums` sums the columns. cuBLASLt 13 computes that gradient in a
  /// reduction kernel of its own after the product (`globalKernelBgradAB`). On an H200 (Nsight
  /// Compute) that kernel took 2 us for a Dense layer's 32 to 256 rows, but 14 us for 21,632 x 32
  /// and 20 us for 30,976 x 64 (the benchmark CNN's convolutions at batch 32 and 256), where
  /// `column_sums` in 64-row chunks took 10 us for 173,056 x 32.
  static constexpr std::size_t max_bias_epilogue_rows = 4096;
  /// A convolution's weight gradients are one column reduction over its input
  /// (`conv_weight_gradients`) instead of im2col and a GEMM from this many output positions
  /// (rows) on, where its kernel has at most `max_reduction_weights` weights: the GEMM's inner
  /// dimension is then the rows, which cuBLASLt splits (split-K) and reduces in a kernel of its
  /// own. On an H200 the benchmark CNN's first convolution (173,056 rows, 3x3x1x32) took 65 us
  /// that way (im2col, the GEMM, its split-K reduction and the bias gradient).
  static constexpr std::size_t min_reduction_rows = 8192;
  static constexpr std::size_t max_reduction_weights = 1024;

  /// The backend's state and the queuing of its work (loadstar/cuda/detail/cuda_backend.hpp).
  detail::CudaBackendImpl& impl() noexcept { return *impl_; }

  // --- Memory ---------------------------------------------------------------------------------

  Device device() const noexcept override;

  Tensor<float> allocate(const Shape& shape) override;

  void copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) override;

  /// `write` fills the next page-locked upload buffer itself (a batch converted straight into
  /// it), which is then copied to `tensor`: one host copy fewer than `copy_from_host`.
  void upload(const Tensor<float>& staging, const Tensor<float>& tensor,
              keras::HostKernelRef write) override;

  void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) override;

  void synchronize() override;

  /// Copies the device tensors to page-locked host memory (tensors that overlap, such as a tensor
  /// and a view of it, share one staged block, so that the views stay views), runs `kernel` on
  /// host views and copies the blocks back. A host computation that itself calls `host_kernel`
  /// stages through ordinary host memory.
  void host_kernel(std::span<const Tensor<float>> tensors, keras::HostKernelRef kernel) override;

  // --- Steps as CUDA graphs --------------------------------------------------------------------

  /// Begins a step of shape `key`: its first step runs kernel by kernel (it allocates and plans);
  /// later ones are recorded (`CudaOptions::graphs`): each call's arguments are noted and its work
  /// kept on the host until `end_step`, which launches the shape's graph when the step's work
  /// is the graph's, and captures a graph of it otherwise.
  void begin_step(std::uint64_t key) override;

  /// Queues the recorded step's work: the graph launched (captured first when there is none or
  /// the step's work differs from it), after the step's scalars are uploaded; its results are
  /// then copied into the result ring.
  void end_step() override;

  /// Queues what a step that threw had recorded, kernel by kernel; never throws.
  void abandon_step() noexcept override;

  /// One host thread queues the work.
  std::size_t threads() const noexcept override;

  // --- Optimizers, losses and metrics ----------------------------------------------------------

  /// One kernel launch over every element of every variable (`detail::update_flat`), from a
  /// device table of the variables' pointers and sizes, uploaded at the first step of each set
  /// of variables and kept (`device_table`); norm clipping adds two launches (segment sums of
  /// squares in double, then one thread adding them in a fixed order). Nothing is allocated after
  /// the first step and nothing waits for the device.
  bool apply_optimizer_step(const keras::OptimizerStep& step,
                            std::span<const keras::VariableSlots> variables) override;

  /// The per-row terms and the gradient in one kernel (one thread per row, in double, the loss
  /// classes' formulas), their sum in a fixed order (chunks of rows added in order: with up to
  /// 512 rows, the CPU's sequential sum bit for bit) into a result record with the first bad
  /// label. Nothing waits: the record is read back when the loss is first read (`ResultRing`).
  std::optional<keras::Deferred<keras::RowLossResult>> row_loss(
      const keras::RowLossSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
      const Tensor<float>& weight, const Tensor<float>& gradient) override;

  /// The per-row values times their weights and the weights (one thread per row), summed in a
  /// fixed order into a result record, read back when the metric is first read.
  std::optional<keras::Deferred<keras::MeanMetricSums>> mean_metric(
      const keras::MeanMetricSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
      const Tensor<float>& weight) override;

  // --- Linear algebra -----------------------------------------------------------------------

  void gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b, bool transpose_b,
            const Tensor<float>& c, float alpha, float beta) override;

  void bias_add(const Tensor<float>& x, const Tensor<float>& bias) override;

  void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) override;

  /// One cuBLASLt multiplication with the bias, and a ReLU, in its epilogue (the row-major
  /// `y = x * kernel` is the column-major `y^T = kernel^T * x^T`, whose rows are the units: the
  /// bias is cuBLASLt's per-row vector). Other activations run after it, as the layer would run
  /// them. Declines (the layer's own path) where cuBLASLt has no algorithm for the shape.
  bool dense_forward(const Tensor<float>& x, const Tensor<float>& kernel, const Tensor<float>& bias,
                     keras::Activation activation, const Tensor<float>& y) override;

  /// One cuBLASLt multiplication with the bias gradient in its epilogue: the row-major
  /// `dkernel = x^T * dz` is the column-major `dkernel^T (units x features) = dz^T * x`, whose
  /// `A` is `dz^T` (units x rows): the bias gradient is `A`'s sums over the rows (`BGRADA`).
  /// Declines (the layer's `gemm` and `column_sums`) without a bias, beyond
  /// `max_bias_epilogue_rows` rows, or where cuBLASLt has no algorithm for the shape.
  bool dense_weight_gradients(const Tensor<float>& x, const Tensor<float>& dz,
                              const Tensor<float>& dkernel, const Tensor<float>& dbias) override;

  /// `dense_forward`'s multiplication with the `RELU_AUX_BIAS` epilogue: the bias and ReLU, and
  /// the ReLU's bit mask written into `mask` (device memory this backend makes and keeps for the
  /// largest batch). Declines where cuBLASLt has no algorithm.
  bool dense_forward_relu_mask(const Tensor<float>& x, const Tensor<float>& kernel,
                               const Tensor<float>& bias, const Tensor<float>& y,
                               std::unique_ptr<ReluMask>& mask) override;

  /// The row-major `dx = dz * kernel^T` is the column-major `dx^T (features x rows) = kernel'^T
  /// * dz^T`, where `kernel'` is the row-major kernel read column-major (`units x features`,
  /// transposed: `A`) and `dz^T` is `dz` read column-major (`B`): one cuBLASLt multiplication with
  /// the `DRELU_BGRAD` epilogue, whose output rows are the previous layer's units (the mask's and
  /// the bias gradient's). Declines where cuBLASLt has no algorithm.
  bool dense_input_gradient_relu(const Tensor<float>& dz, const Tensor<float>& kernel,
                                 const ReluMask& mask, const Tensor<float>& dx,
                                 const Tensor<float>& dbias) override;

  // --- Elementwise --------------------------------------------------------------------------

  void fill(const Tensor<float>& x, float value) override;

  /// One kernel over every tensor, from a device table of their pointers and sizes, uploaded the
  /// first time these tensors are filled together and kept (`device_table`).
  void fill_many(std::span<const Tensor<float>> tensors, float value) override;

  void copy(const Tensor<float>& x, const Tensor<float>& y) override;

  void scale(const Tensor<float>& x, float alpha) override;

  void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) override;

  void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) override;

  void activation_forward(keras::Activation kind, const Tensor<float>& x,
                          const Tensor<float>& y) override;

  void activation_backward(keras::Activation kind, const Tensor<float>& x, const Tensor<float>& y,
                           const Tensor<float>& dy, const Tensor<float>& dx) override;

  void relu_forward(const Tensor<float>& x, const Tensor<float>& y, std::optional<float> max_value,
                    float negative_slope, float threshold) override;

  void relu_backward(const Tensor<float>& x, const Tensor<float>& dy, const Tensor<float>& dx,
                     std::optional<float> max_value, float negative_slope,
                     float threshold) override;

  void softmax_forward(const Tensor<float>& x, const Tensor<float>& y, std::size_t axis) override;

  void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy, const Tensor<float>& dx,
                        std::size_t axis) override;

  void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
               std::uint64_t key) override;

  // --- Convolution and pooling -----------------------------------------------------------------

  /// `Backend::conv2d_forward`'s im2col and GEMM, with the columns in the backend's scratch
  /// memory (allocated at the first step and reused) instead of a tensor per call, and the bias
  /// and ReLU in the GEMM's epilogue (`dense_forward`).
  void conv2d_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                      const Tensor<float>& kernel, const Tensor<float>& bias,
                      keras::Activation activation, const Tensor<float>& y) override;

  /// `Backend::conv2d_backward` with its temporaries in the backend's scratch memory, and written
  /// weight gradients from `dense_weight_gradients`.
  void conv2d_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                       const Tensor<float>& kernel, const Tensor<float>& bias,
                       keras::Activation activation, const Tensor<float>& y,
                       const Tensor<float>& dy, const Tensor<float>& dkernel,
                       const Tensor<float>& dbias, const Tensor<float>& dx,
                       bool accumulate) override;
  void im2col(const Tensor<float>& x, const keras::Conv2DGeometry& g,
              const Tensor<float>& columns) override;

  void col2im(const Tensor<float>& columns, const keras::Conv2DGeometry& g,
              const Tensor<float>& dx) override;

  void max_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override;

  void max_pool_backward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                         const Tensor<float>& dy, const Tensor<float>& dx) override;

  /// The max pooling gradient and the ReLU's before it in one kernel.
  bool max_pool_backward_relu(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                              const Tensor<float>& dy, const Tensor<float>& dx) override;

  void avg_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override;

  void avg_pool_backward(const keras::Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override;

  void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) override;

  void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                            const Tensor<float>& dx) override;

  // --- Normalisation -----------------------------------------------------------------------------

  void moments(const Tensor<float>& x, const Tensor<float>& mean,
               const Tensor<float>& variance) override;

  void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                          const Tensor<float>& variance, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override;

  void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                           const Tensor<float>& variance, const Tensor<float>& gamma, float epsilon,
                           bool training, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override;

  void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                      float momentum) override;

  // --- Indexing and layout
  // -------------------------------------------------------------------------

  /// Finds the first bad index on the device and reads back only its position (one small copy
  /// and a wait per call), then gathers.
  std::optional<keras::BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                        const Tensor<float>& out) override;

  /// Rows from `offset` on: one device-to-device copy. Rows by index: the indices uploaded
  /// (page-locked, in stream order, `rows.size()` 64-bit words), then one gather kernel.
  void copy_rows(const Tensor<float>& source, std::span<const std::size_t> rows, std::size_t offset,
                 const Tensor<float>& target) override;

  void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                   const Tensor<float>& table_gradient) override;

  /// Strided copies (`cudaMemcpy2DAsync`), one per part.
  void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                   const Tensor<float>& out) override;

  void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
             std::span<const Tensor<float>> parts) override;

  void permute(const Tensor<float>& x, std::span<const std::size_t> axes,
               const Tensor<float>& y) override;

 private:
  std::unique_ptr<detail::CudaBackendImpl> impl_;
};

/// A `CudaBackend` on device `device`, for `CompileOptions::backend`. Throws `CudaError` when no
/// CUDA device is present and `ConfigError` for an index that is not a device.
/// \code
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = cuda_backend(0)});
/// \endcode
std::shared_ptr<keras::Backend> cuda_backend(int device = 0, CudaOptions options = {});

}  // namespace loadstar::cuda

namespace loadstar::keras {
using cuda::cuda_backend;
}  // namespace loadstar::keras
