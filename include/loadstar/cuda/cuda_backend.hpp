/// \file
/// `CudaBackend`: the executor's `Backend` on one NVIDIA GPU, with cuBLAS for GEMM and the
/// kernels of loadstar/cuda/detail/kernels.cuh for the rest. Opt-in: not included by
/// `<loadstar/loadstar.hpp>` or `<loadstar/keras.hpp>`; a trainer includes `<loadstar/cuda.hpp>`
/// and links Meson's `loadstar-cuda` dependency (the backend compiled once: its host code by the
/// C++ compiler, its kernels by nvcc; with cudart, cuBLAS and cuBLASLt). This header declares the
/// backend's interface and its factory only, and includes no CUDA header; the backend is
/// `detail::CudaBackendImpl` (loadstar/cuda/detail/cuda_backend.hpp, defined in src/cuda/).
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
/// `create` (or `cuda_backend`) throws `CudaError` when no device is present and `ConfigError` for
/// an index that is not one.
/// \code
/// #include <loadstar/cuda.hpp>
/// auto backend = loadstar::keras::cuda_backend(0);
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = backend});
/// \endcode
class CudaBackend : public keras::Backend {
 public:
  /// A backend on device `device` (0 is the first).
  static std::shared_ptr<CudaBackend> create(int device = 0, CudaOptions options = {});

  /// How many times `host_kernel` has staged device tensors through the host (a test counts that
  /// a training step makes none).
  virtual std::size_t host_kernel_calls() const noexcept = 0;

  /// What the steps did: how many ran kernel by kernel, were captured as CUDA graphs, or replayed
  /// one (`CudaOptions::graphs`).
  virtual const GraphStats& graph_stats() const noexcept = 0;

  /// The device's index.
  virtual int device_index() const noexcept = 0;
  /// The device memory the backend's pool holds (in use or kept for reuse), in bytes: it stops
  /// growing once every buffer of a training step has been allocated once.
  virtual std::size_t reserved_bytes() const = 0;

  /// How many cuDNN convolutions were queued or recorded (`Convolution::cudnn`; a replayed graph
  /// adds none): 0 where every geometry took im2col.
  virtual std::size_t cudnn_calls() const noexcept = 0;

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
