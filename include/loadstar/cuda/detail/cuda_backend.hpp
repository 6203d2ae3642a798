/// \file
/// `CudaBackendImpl`: the `CudaBackend` (loadstar/cuda/cuda_backend.hpp) that
/// `CudaBackend::create` makes, with its state and every `Backend` call. Internal to the CUDA
/// backend: its definitions are compiled into `loadstar_cuda` (src/cuda/cuda_backend.cpp and, for
/// steps as CUDA graphs, src/cuda/step_graph.cpp); the tests reach its parts through this header.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstar/cuda/cuda_backend.hpp"
#include "loadstar/cuda/detail/context.hpp"
#include "loadstar/cuda/detail/cudnn.hpp"
#include "loadstar/cuda/detail/kernel_args.hpp"
#include "loadstar/cuda/detail/kernels.hpp"
#include "loadstar/cuda/detail/lt_plans.hpp"
#include "loadstar/cuda/detail/math.hpp"
#include "loadstar/cuda/detail/result_ring.hpp"
#include "loadstar/cuda/detail/step_graph.hpp"
#include "loadstar/cuda/error.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::cuda::detail {

/// The CUDA backend's `Backend::ReluMask`: cuBLASLt's ReLU bit mask of a `rows x units` output
/// (`RELU_AUX_BIAS` writes it, `DRELU_BGRAD` reads it), one bit per element, each row's bits
/// padded to a multiple of 128 (its leading dimension, `CudaBackendImpl::relu_mask_ld`), held in
/// a float tensor of the device's memory.
class CudaReluMask final : public keras::Backend::ReluMask {
 public:
  /// The shape of the float tensor that holds the mask of a `rows x units` output.
  static Shape shape(std::size_t rows, std::size_t units) {
    return {rows, (units + 127) / 128 * 4};
  }
  /// The mask's memory for the largest batch yet, so that shorter batches allocate nothing.
  Tensor<float> storage;
  /// This step's rows of `storage`.
  Tensor<float> bits;
};

/// The CUDA backend's state and kernels' queuing; `CudaBackend` is its public interface.
class CudaBackendImpl final : public CudaBackend {
 public:
  /// A backend on device `device` (0 is the first).
  explicit CudaBackendImpl(int device = 0, CudaOptions options = {});

  ~CudaBackendImpl() override;

  std::size_t host_kernel_calls() const noexcept override { return host_kernel_calls_; }

  const GraphStats& graph_stats() const noexcept override { return stats_; }

  int device_index() const noexcept override { return context_->device; }
  /// The stream every kernel and copy of this backend is queued on.
  cudaStream_t stream() const noexcept { return context_->stream; }
  std::size_t reserved_bytes() const override;

  // --- Memory ---------------------------------------------------------------------------------

  Device device() const noexcept override { return {"cuda", context_->device}; }

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
  std::size_t threads() const noexcept override { return 1; }

  std::size_t cudnn_calls() const noexcept override { return cudnn_calls_; }

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

  /// The bit mask's leading dimension for `units` rows of the column-major output: a multiple
  /// of 128 bits (`CudaReluMask`).
  static std::uint64_t relu_mask_ld(std::size_t units) noexcept;

  /// `dense_forward`'s multiplication with the `RELU_AUX_BIAS` epilogue: the bias and ReLU, and
  /// the ReLU's bit mask written into `mask` (a `CudaReluMask`, made when `mask` is not one of
  /// this device's or is too small for this batch). Declines where cuBLASLt has no algorithm.
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
  /// One kernel over every tensor (a table as `fill_many`'s), `alpha` read from the step's
  /// scalars while a step records, so that a replayed graph scales by this step's loss scale.
  void scale_many(std::span<const Tensor<float>> tensors, float alpha) override;
  /// Two kernels: the flag and a result record set to 1, then cleared by any element that is not
  /// finite; the result is read from the record (`ResultRing`) when asked for.
  keras::Deferred<bool> all_finite(std::span<const Tensor<float>> tensors,
                                   const Tensor<float>& flag) override;

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

#if LOADSTAR_CUDA_WITH_CUDNN
  /// With `Convolution::cudnn`: the kernel transposed into cuDNN's filter layout, cuDNN's
  /// forward convolution, then the bias and the activation; false where cuDNN does not run `g`
  /// (im2col then).
  bool cudnn_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                     const Tensor<float>& kernel, const Tensor<float>& bias,
                     keras::Activation activation, const Tensor<float>& y);

  /// With `Convolution::cudnn`: the activation's gradient, cuDNN's filter gradient transposed
  /// back into the kernel's layout, the bias gradient (`column_sums`) and cuDNN's input gradient,
  /// all written; false where cuDNN does not run `g` (im2col then).
  bool cudnn_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                      const Tensor<float>& kernel, const Tensor<float>& bias,
                      keras::Activation activation, const Tensor<float>& y, const Tensor<float>& dy,
                      const Tensor<float>& dkernel, const Tensor<float>& dbias,
                      const Tensor<float>& dx);
#else
  bool cudnn_forward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                     const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                     keras::Activation /*activation*/, const Tensor<float>& /*y*/);
  bool cudnn_backward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                      const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                      keras::Activation /*activation*/, const Tensor<float>& /*y*/,
                      const Tensor<float>& /*dy*/, const Tensor<float>& /*dkernel*/,
                      const Tensor<float>& /*dbias*/, const Tensor<float>& /*dx*/);
#endif

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
  keras::Deferred<std::optional<keras::BadIndex>> gather_deferred(
      const Tensor<float>& indices, const Tensor<float>& table, const Tensor<float>& out) override;

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

  void round_to(const Tensor<float>& x, DType dtype) override;
  /// A thread per output element; backward, a thread per input element and one column reduction
  /// for the kernel's and the bias's gradients (kernels.cuh).
  void depthwise_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                         const Tensor<float>& kernel, const Tensor<float>& bias,
                         const Tensor<float>& z) override;
  void depthwise_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                          const Tensor<float>& kernel, const Tensor<float>& dz,
                          const Tensor<float>& dx, const Tensor<float>& dkernel,
                          const Tensor<float>& dbias) override;
  /// Under `float16` or `bfloat16`, `gemm` and the fused dense products convert their operands
  /// to that dtype (`launch_to_half`, into scratch) and multiply on cuBLASLt's half-precision
  /// kernels (the tensor cores), fp32 sums, results and epilogues; where cuBLASLt has no
  /// algorithm, in fp32 as before.
  void set_product_dtype(DType dtype) override {
    product_dtype_ = dtype;
  }

  bool attention_forward(const keras::detail::AttentionShape& shape,
                         const keras::detail::AttentionCall& call, float scale,
                         std::span<const Tensor<float>> tensors) override;
  bool attention_backward(const keras::detail::AttentionShape& shape,
                          const keras::detail::AttentionCall& call, float scale,
                          std::span<const Tensor<float>> tensors) override;

  void layer_norm_forward(const Tensor<float>& x, std::size_t width, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override;
  void layer_norm_backward(const Tensor<float>& x, std::size_t width, const Tensor<float>& gamma,
                           float epsilon, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override;

  void recurrent_kernel(const keras::detail::RecurrentKernel& kernel,
                        std::span<const Tensor<float>> tensors, std::size_t elements,
                        std::uint64_t key) override;

  void layer_kernel(const keras::detail::LayerKernel& kernel,
                    std::span<const Tensor<float>> tensors, std::size_t elements,
                    std::uint64_t key) override;

 private:
  /// The stream, for work queued directly (copies to and from the host, waits, host kernels):
  /// the work of a step being recorded is queued first, and the rest of that step runs kernel
  /// by kernel.
  cudaStream_t active_stream(const char* call);

  /// Plans the cuBLASLt multiplication of `key` (its `alignment` that of the pointers) and queues
  /// it, or records it while a step is recorded, as `name`; false, with nothing queued, where
  /// cuBLASLt has no algorithm for it. `bias` is the epilogue's vector (read, or written by a
  /// bias gradient), `aux` its ReLU bit mask.
  bool queue_matmul(const char* name, detail::LtPlans::Key key, const float* a, const float* b,
                    const float* bias, float* d, const void* aux = nullptr, float alpha = 1.0F,
                    float beta = 0.0F);
  /// Scratch for `n` half-precision values: `slot` 0 holds a product's A, 1 its B.
  std::uint16_t* half_scratch(std::size_t slot, std::size_t n);

  // --- Recording ---------------------------------------------------------------------------------

  /// The results (loss and metric records) and scalar words one recorded step may hold; a step
  /// with more runs kernel by kernel.
  static constexpr std::size_t step_result_records = 64;
  static constexpr std::size_t step_scalar_words = 256;

  /// Queues `launcher(stream, args...)`, or records it while a step is recorded.
  template <class... P, class... A>
  void launch(const char* kernel, cudaError_t (*launcher)(cudaStream_t, P...), A&&... args) {
    if (!context_->recording) {
      context_->activate();
      launched(launcher(context_->stream, std::forward<A>(args)...), kernel);
      return;
    }
    std::tuple<std::decay_t<P>...> values(std::forward<A>(args)...);
    signature_.push_back(reinterpret_cast<std::uintptr_t>(kernel));
    std::apply([this](const auto&... v) { (detail::sign(signature_, v), ...); }, values);
    pending_.emplace_back([this, kernel, launcher, values = std::move(values)](cudaStream_t s) {
      launched(std::apply([&](const auto&... v) { return launcher(s, v...); }, values), kernel);
    });
  }

  /// Queues `work(stream)`, or records it, with `words` (every argument it passes on) as its
  /// part of the signature, while a step is recorded.
  template <class F>
  void enqueue(std::initializer_list<std::uint64_t> words, F&& work) {
    if (!context_->recording) {
      context_->activate();
      work(context_->stream);
      return;
    }
    signature_.insert(signature_.end(), words);
    pending_.emplace_back(std::forward<F>(work));
  }

  /// Where `value`, a scalar of the step being recorded, will be on the device when the step's
  /// work runs (uploaded before it: a graph reads this step's value, not the captured step's),
  /// or null when the step no longer records.
  template <class T>
  const T* step_scalar(const T& value) {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= alignof(std::uint64_t));
    const std::size_t words = (sizeof(T) + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t);
    if (block_.size() + words > step_scalar_words)
      flush_recording("more scalars than a step holds");
    if (!context_->recording) return nullptr;
    const std::size_t offset = block_.size();
    block_.resize(offset + words);
    std::memcpy(block_.data() + offset, &value, sizeof(T));
    return reinterpret_cast<const T*>(step_scalars_ + offset);
  }

  /// Where a loss or metric kernel of the step being recorded writes the result that belongs in
  /// `record` (of the result ring): a record of the step's own results area, copied to `record`
  /// once the step's work is queued. `record` itself when the step does not record.
  double* step_result(double* record);

  /// Captures the recorded work as `graph`'s CUDA graph; `false` (and the step's shape runs kernel
  /// by kernel from now on) when it cannot be captured or instantiated.
  bool capture(detail::StepGraph& graph);

  /// Queues the recorded work kernel by kernel.
  void run_pending();

  /// Copies the step's results area into the ring records its results belong in (one copy per
  /// run of consecutive records).
  void copy_step_results();

  /// Queues the work of the step being recorded, kernel by kernel, with its scalars and results,
  /// and lets the rest of the step run unrecorded (something in it cannot be captured: a host
  /// computation, an allocation, a wait). A shape that does this twice is no longer recorded.
  void flush_recording(const std::string& why);

  /// Queues the recorded step's work: its scalars' upload, then `exec` (its graph) or, when null,
  /// each recorded call, then the copy of its results into the result ring.
  void queue_recorded(cudaGraphExec_t exec);

  /// Ends a recorded step's state however its queuing ends: what was freed while it recorded is
  /// given back (in stream order, after its work), and its records are cleared.
  struct StepCleanup {
    explicit StepCleanup(CudaBackendImpl& owner) noexcept : backend(owner) {}
    StepCleanup(const StepCleanup&) = delete;
    StepCleanup& operator=(const StepCleanup&) = delete;
    ~StepCleanup() {
      backend.release_deferred_frees();
      backend.clear_step();
    }
    CudaBackendImpl& backend;
  };

  /// Frees, in stream order, what was freed while the step recorded.
  void release_deferred_frees() noexcept;

  void clear_step() noexcept;

  /// How often a shape's graph is captured again (its work changed) before it is given up.
  static constexpr std::size_t max_captures = 4;
  /// The shapes (models' steps of a kind and size) the backend keeps graphs of: past this, the
  /// one unused the longest is forgotten (a process that makes model after model on one backend).
  static constexpr std::size_t max_shapes = 64;

  void forget_oldest_shape();

  /// Throws `DeviceError` unless every non-empty tensor lives on this backend's device (a host
  /// pointer handed to a kernel would be an illegal address, reported much later).
  void expect(const char* kernel, std::initializer_list<const Tensor<float>*> tensors) const;

  static void expect_host(const char* call, const Tensor<float>& host);

  /// Throws `CudaError` naming the kernel when its launch failed.
  void launched(cudaError_t status, const char* kernel) const;

  /// `rows` rows of `width` floats from `from` (rows `from_pitch` floats apart) to `to` (rows
  /// `to_pitch` floats apart), on the device.
  void strided_copy(float* to, std::size_t to_pitch, const float* from, std::size_t from_pitch,
                    std::size_t width, std::size_t rows);

  static int to_int(std::size_t value, const char* call);

  static float* or_null(const Tensor<float>& t) noexcept;

  /// Device scratch of at least the doubles a column reduction of `rows x columns` needs; it
  /// grows and is then reused (kernels on the one stream use it in turn).
  double* reduction_scratch(std::size_t rows, std::size_t columns);
  /// At least `doubles` doubles of the scratch `reduction_scratch` gives.
  double* scratch_doubles(std::size_t doubles);

  /// Device memory that grows and is then reused: `memory` holds at least `bytes`.
  void* grow(void*& memory, std::size_t& capacity, std::size_t bytes, const char* what);

  /// A tensor of `shape` over scratch buffer `slot` (one of `scratch_slots`), which grows and is
  /// then reused: its contents are the previous user's (kernels on the one stream use it in turn).
  Tensor<float> scratch_tensor(std::size_t slot, const Shape& shape);

#if LOADSTAR_CUDA_WITH_CUDNN
  /// The cuDNN convolution of `g` (its descriptors and algorithms made at its first use, outside
  /// any recording), or null without `Convolution::cudnn` or where cuDNN does not run `g`.
  const detail::CudnnConvolution* cudnn_convolution(const keras::Conv2DGeometry& g);

  /// The kernel `(kernel_h * kernel_w * in_c, out_c)` transposed into cuDNN's filter
  /// `(out_c, kernel_h, kernel_w, in_c)`, in convolution scratch.
  Tensor<float> cudnn_filter(const Tensor<float>& kernel, const keras::Conv2DGeometry& g);

  /// Queues (or records) one of `conv`'s convolutions, `(conv->*run)(handle, a, b, out,
  /// workspace)`, with the workspace its algorithms need.
  using CudnnRun = void (detail::CudnnConvolution::*)(cudnnHandle_t, const float*, const float*,
                                                      float*, void*) const;
  void queue_cudnn(const char* name, const detail::CudnnConvolution* conv, CudnnRun run,
                   const float* a, const float* b, float* out);
#endif

  void* step_scratch(std::size_t bytes);

  /// `fill_table_` made of the non-empty `tensors` (checked to be on this device for `call`),
  /// `elements` their elements in all, and its device copy (`device_table`); null when there are
  /// no elements.
  const detail::FillTarget* flat_table(const char* call, std::span<const Tensor<float>> tensors,
                                       std::size_t& elements);

  /// Scratch for `rows x columns` per-row terms followed by their column reduction's partials.
  double* reduction_terms(std::size_t rows, std::size_t columns);

  /// Device copies of tables of pointers and sizes (an optimizer's variables, a fill's tensors),
  /// kept by content: never written again once uploaded, so that a graph reads the table it was
  /// captured with, and each model on the backend keeps its own.
  template <class T>
  struct TableCache {
    struct Entry {
      std::vector<T> table;
      void* device = nullptr;
      std::uint64_t last_used = 0;
    };
    std::vector<Entry> entries;
  };
  static constexpr std::size_t max_tables = 16;  // per cache; the one unused longest goes

  /// The device copy of `table`: found, or allocated and uploaded (in stream order; a recorded
  /// step that does this runs kernel by kernel).
  template <class T>
  const T* device_table(TableCache<T>& cache, const std::vector<T>& table, const char* what) {
    for (auto& entry : cache.entries) {
      if (entry.table == table) {
        entry.last_used = ++table_uses_;
        return static_cast<const T*>(entry.device);
      }
    }
    const std::size_t bytes = table.size() * sizeof(T);
    void* device = context_->allocate(bytes, what);  // queues a recorded step's work first
    if (cache.entries.size() == max_tables) {
      auto oldest = cache.entries.begin();
      for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it)
        if (it->last_used < oldest->last_used) oldest = it;
      context_->free(oldest->device);  // in stream order, after the work that reads it
      cache.entries.erase(oldest);
    }
    active_stream(what);
    context_->upload(device, table.data(), bytes);
    cache.entries.push_back({table, device, ++table_uses_});
    return static_cast<const T*>(device);
  }

  template <class T>
  void free_tables(TableCache<T>& cache) noexcept {
    for (const auto& entry : cache.entries)
      context_->free(entry.device);
    cache.entries.clear();
  }

  std::shared_ptr<detail::Context> context_;
  double* scratch_ = nullptr;
  std::size_t scratch_doubles_ = 0;
  int host_kernel_depth_ = 0;
  std::size_t host_kernel_calls_ = 0;
  std::vector<detail::UpdateTarget> table_;
  TableCache<detail::UpdateTarget> update_tables_;
  void* step_scratch_ = nullptr;
  void* row_indices_ = nullptr;  // copy_rows
  std::size_t row_indices_bytes_ = 0;
  std::size_t step_scratch_bytes_ = 0;
  struct ScratchSlot {
    void* memory = nullptr;
    std::size_t bytes = 0;
  };
  std::array<ScratchSlot, 4> scratch_slots_;
  std::array<ScratchSlot, 2> half_slots_;  // half-precision operands of A and B
  DType product_dtype_ = DType::float32;
  std::size_t cudnn_calls_ = 0;
  void* cudnn_workspace_ = nullptr;  // Convolution::cudnn
#if LOADSTAR_CUDA_WITH_CUDNN
  std::size_t cudnn_workspace_bytes_ = 0;
  std::unique_ptr<detail::CudnnConvolutions> cudnn_;
#endif
  std::vector<detail::FillTarget> fill_table_;
  TableCache<detail::FillTarget> fill_tables_;
  std::uint64_t table_uses_ = 0;
  std::shared_ptr<detail::ResultRing> results_;
  std::unique_ptr<detail::LtPlans> lt_;
  // Steps as CUDA graphs.
  CudaOptions options_;
  GraphStats stats_;
  std::unordered_map<std::uint64_t, detail::StepGraph> graphs_;  // nodes: stable addresses
  std::uint64_t steps_begun_ = 0;
  detail::StepGraph* step_ = nullptr;  // the step being recorded
  detail::Signature signature_;
  std::vector<std::function<void(cudaStream_t)>> pending_;
  std::vector<std::uint64_t> block_;   // the recorded step's scalars, uploaded to step_scalars_
  std::vector<double*> ring_records_;  // where each record of step_results_ belongs
  double* step_results_ = nullptr;
  std::uint64_t* step_scalars_ = nullptr;
};

}  // namespace loadstar::cuda::detail
