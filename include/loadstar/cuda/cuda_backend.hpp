/// \file
/// `CudaBackend`: the executor's `Backend` on one NVIDIA GPU, with cuBLAS for GEMM and the
/// kernels of loadstar/cuda/detail/kernels.cuh for the rest. Opt-in: not included by
/// `<loadstar/loadstar.hpp>` or `<loadstar/keras.hpp>`; a trainer includes `<loadstar/cuda.hpp>`
/// and links Meson's `loadstar-cuda` dependency (the kernels compiled once by nvcc, cudart,
/// cuBLAS and cuBLASLt).
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/cuda/detail/kernels.hpp"
#include "loadstar/cuda/detail/math.hpp"
#include "loadstar/cuda/error.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::cuda {

namespace detail {

// The kernels see `keras::Activation` as `ActivationCode`: the same values.
#define LOADSTAR_SAME_ACTIVATION(name)                                                     \
  static_assert(                                                                           \
      static_cast<int>(keras::Activation::name) == static_cast<int>(ActivationCode::name), \
      "ActivationCode::" #name " must have keras::Activation::" #name "'s value")
LOADSTAR_SAME_ACTIVATION(linear);
LOADSTAR_SAME_ACTIVATION(relu);
LOADSTAR_SAME_ACTIVATION(sigmoid);
LOADSTAR_SAME_ACTIVATION(tanh);
LOADSTAR_SAME_ACTIVATION(softmax);
LOADSTAR_SAME_ACTIVATION(elu);
LOADSTAR_SAME_ACTIVATION(selu);
LOADSTAR_SAME_ACTIVATION(softplus);
LOADSTAR_SAME_ACTIVATION(softsign);
LOADSTAR_SAME_ACTIVATION(gelu);
LOADSTAR_SAME_ACTIVATION(swish);
LOADSTAR_SAME_ACTIVATION(hard_sigmoid);
LOADSTAR_SAME_ACTIVATION(exponential);
#undef LOADSTAR_SAME_ACTIVATION

#define LOADSTAR_SAME_CODE(type, code, name)                                         \
  static_assert(static_cast<int>(keras::type::name) == static_cast<int>(code::name), \
                #code "::" #name " must have keras::" #type "::" #name "'s value")
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, sgd);
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, sgd_momentum);
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, adam);
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, rmsprop);
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, adagrad);
LOADSTAR_SAME_CODE(UpdateRule, UpdateCode, adadelta);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, sparse_categorical_crossentropy);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, categorical_crossentropy);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, mean_squared_error);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, binary_crossentropy);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, mean_absolute_error);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, huber);
LOADSTAR_SAME_CODE(RowLossKind, RowLossCode, kl_divergence);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, accuracy);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, binary_accuracy);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, categorical_accuracy);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, sparse_categorical_accuracy);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, mean);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, mean_squared_error);
LOADSTAR_SAME_CODE(MeanMetricKind, MeanMetricCode, mean_absolute_error);
#undef LOADSTAR_SAME_CODE

/// The kernels' operands of an optimizer step.
inline UpdateParams update_params(const keras::OptimizerStep& step) noexcept {
  UpdateParams p;
  p.rule = static_cast<UpdateCode>(static_cast<int>(step.rule));
  p.learning_rate = step.learning_rate;
  p.alpha = step.alpha;
  p.one_minus_beta_1 = step.one_minus_beta_1;
  p.one_minus_beta_2 = step.one_minus_beta_2;
  p.momentum = step.momentum;
  p.rho = step.rho;
  p.epsilon = step.epsilon;
  p.weight_decay = step.weight_decay;
  p.nesterov = step.nesterov;
  p.amsgrad = step.amsgrad;
  p.centered = step.centered;
  p.clip_value = step.clipping == keras::GradientClipping::by_value
                     ? static_cast<float>(step.clip_threshold)
                     : 0.0F;
  return p;
}

/// The rows of a row loss or a mean metric: one per last-axis row of `y_pred` (one per element
/// when `elementwise`), `true_size` labels each (`classes` unless `sparse`).
inline RowDims row_dims(const Tensor<float>& y_pred, bool sparse, bool elementwise) noexcept {
  RowDims d;
  d.classes = elementwise || y_pred.rank() < 2 ? 1 : y_pred.shape()[y_pred.rank() - 1];
  d.values = d.classes == 0 ? 0 : y_pred.size() / d.classes;
  d.true_size = sparse ? 1 : d.classes;
  d.per_row = y_pred.rows() == 0 ? 1 : d.values / y_pred.rows();
  if (d.per_row == 0) d.per_row = 1;
  return d;
}

inline ActivationCode activation_code(keras::Activation kind) noexcept {
  return static_cast<ActivationCode>(static_cast<int>(kind));
}

/// The kernels' view of a convolution's geometry.
inline ConvDims conv_dims(const keras::Conv2DGeometry& g) noexcept {
  ConvDims d;
  d.batch = g.batch;
  d.in_h = g.in_h;
  d.in_w = g.in_w;
  d.in_c = g.in_c;
  d.out_h = g.out_h;
  d.out_w = g.out_w;
  d.kernel_h = g.kernel_h;
  d.kernel_w = g.kernel_w;
  d.stride_h = g.stride_h;
  d.stride_w = g.stride_w;
  d.dilation_h = g.dilation_h;
  d.dilation_w = g.dilation_w;
  d.pad_top = g.pad_top;
  d.pad_left = g.pad_left;
  return d;
}

/// The kernels' view of a pooling's geometry.
inline PoolDims pool_dims(const keras::Pool2DGeometry& g) noexcept {
  PoolDims d;
  d.batch = g.batch;
  d.in_h = g.in_h;
  d.in_w = g.in_w;
  d.channels = g.channels;
  d.out_h = g.out_h;
  d.out_w = g.out_w;
  d.pool_h = g.pool_h;
  d.pool_w = g.pool_w;
  d.stride_h = g.stride_h;
  d.stride_w = g.stride_w;
  d.pad_top = g.pad_top;
  d.pad_left = g.pad_left;
  return d;
}

static_assert(Shape::max_rank <= PermuteDims::max_rank,
              "PermuteDims must hold a tensor of the highest rank");

/// The kernels' view of `y = transpose(x, axes)`: for each axis of `y`, its size and the stride
/// of the axis of `x` it walks.
inline PermuteDims permute_dims(const Shape& x, std::span<const std::size_t> axes,
                                const Shape& y) noexcept {
  PermuteDims d;
  d.rank = x.rank();
  std::size_t x_strides[PermuteDims::max_rank] = {};
  std::size_t stride = 1;
  for (std::size_t i = d.rank; i-- > 0;) {
    x_strides[i] = stride;
    stride *= x[i];
  }
  for (std::size_t i = 0; i < d.rank; ++i) {
    d.out_dims[i] = y[i];
    d.in_strides[i] = x_strides[axes[i]];
  }
  return d;
}

/// A run of device memory staged through the host as one piece.
struct StagedBlock {
  float* begin;
  float* end;
  std::size_t offset;  // in floats, into the staging memory
  std::size_t floats() const noexcept { return static_cast<std::size_t>(end - begin); }
};

/// How `host_kernel` stages device tensors: the memory they cover, with overlapping tensors (a
/// tensor and a view of it) merged into one block, so that their host views overlap as the
/// tensors do and writes through one are seen through the other. Each staged address has the
/// device address's offset from a `LOADSTAR_TENSOR_ALIGNMENT` boundary (the staging memory is
/// page-aligned), so a tensor that starts a device allocation is as aligned on the host as a host
/// tensor is, for the Eigen maps that assume it (`as_matrix`).
struct StagingPlan {
  std::vector<StagedBlock> blocks;  // by address
  std::size_t floats = 0;           // the staging memory needed

  /// Where device address `p` (inside a block) lands in the staging memory.
  std::size_t offset_of(const float* p) const noexcept {
    const auto after =
        std::upper_bound(blocks.begin(), blocks.end(), p,
                         [](const float* q, const StagedBlock& b) { return q < b.begin; });
    LOADSTAR_ASSERT(after != blocks.begin(), "host_kernel: a tensor outside the staged blocks");
    const StagedBlock& block = *(after - 1);
    return block.offset + static_cast<std::size_t>(p - block.begin);
  }
};

/// The staging plan of the non-empty device tensors among `tensors` (host tensors are used as
/// they are).
inline StagingPlan plan_staging(std::span<const Tensor<float>> tensors) {
  StagingPlan plan;
  std::vector<StagedBlock> spans;
  for (const auto& t : tensors)
    if (!t.empty() && !t.is_host()) spans.push_back({t.data(), t.data() + t.size(), 0});
  std::sort(spans.begin(), spans.end(),
            [](const StagedBlock& a, const StagedBlock& b) { return a.begin < b.begin; });
  for (const auto& b : spans) {
    if (!plan.blocks.empty() && b.begin < plan.blocks.back().end) {
      plan.blocks.back().end = std::max(plan.blocks.back().end, b.end);
    } else {
      plan.blocks.push_back(b);
    }
  }
  constexpr std::size_t align = LOADSTAR_TENSOR_ALIGNMENT / sizeof(float);
  for (auto& b : plan.blocks) {
    const std::size_t skew =
        reinterpret_cast<std::uintptr_t>(b.begin) % LOADSTAR_TENSOR_ALIGNMENT / sizeof(float);
    b.offset = plan.floats + skew;
    plan.floats += (skew + b.floats() + align - 1) / align * align;
  }
  return plan;
}

/// The bytes cuBLAS may use as workspace: preset, so that GEMMs never allocate (and can be
/// captured in a CUDA graph); 32 MiB is what cuBLAS asks for on Hopper.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20U;

/// Page-locked host memory that grows and is reused, for staging copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() {
    if (data_ != nullptr) static_cast<void>(cudaFreeHost(data_));
  }

  /// At least `bytes` of pinned memory; the caller has made sure no copy still uses the old one.
  void* reserve(std::size_t bytes) {
    if (bytes <= bytes_) return data_;
    const std::size_t grown = std::max(bytes, bytes_ * 2);
    if (data_ != nullptr) check(cudaFreeHost(data_), "cudaFreeHost");
    data_ = nullptr;
    bytes_ = 0;
    check(cudaMallocHost(&data_, grown), "cudaMallocHost");
    bytes_ = grown;
    return data_;
  }

  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// What every tensor of a `CudaBackend` keeps alive: the device, its stream, the memory pool
/// its storage comes from and the library handles. Tensors that outlive their backend free
/// their storage through it, in stream order.
struct Context {
  int device = 0;
  std::string name;  // "cuda:0"
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublas_lt = nullptr;
  void* cublas_workspace = nullptr;
  /// Page-locked buffers that uploads (`copy_from_host`) take in turn, each with an event
  /// recorded after the copy that reads it: an upload waits only for the copy `upload_slots`
  /// uploads before it, so that the host queues the next batches while the device computes.
  static constexpr std::size_t upload_slots = 8;
  struct UploadSlot {
    PinnedBuffer buffer;
    cudaEvent_t copied = nullptr;
  };
  std::array<UploadSlot, upload_slots> uploads;
  std::size_t next_upload = 0;
  PinnedBuffer download;                      // copy_to_host, which waits for its copy
  PinnedBuffer host_stage;                    // host_kernel
  unsigned long long* device_slot = nullptr;  // gather's first bad index
  PinnedBuffer host_slot;

  explicit Context(int index) : device(index), name("cuda:" + std::to_string(index)) {
    try {
      check(cudaSetDevice(device), "cudaSetDevice");
      check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      // A pool of our own that keeps what is freed (release threshold: all of it), so that after
      // the first batch every allocation is served from memory already mapped.
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
      std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
      check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
            "cudaMemPoolSetAttribute");
      check(cublasCreate(&cublas), "cublasCreate");
      check(cublasLtCreate(&cublas_lt), "cublasLtCreate");
      check(cublasSetStream(cublas, stream), "cublasSetStream");
      // Full fp32 GEMMs (no TF32), as on the CPU; the default atomics mode (not allowed) keeps
      // cuBLAS's results the same run to run.
      check(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      check(cudaMalloc(&cublas_workspace, cublas_workspace_bytes), "cudaMalloc");
      check(cublasSetWorkspace(cublas, cublas_workspace, cublas_workspace_bytes),
            "cublasSetWorkspace");
      for (auto& slot : uploads)
        check(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming), "cudaEventCreate");
      void* slot = nullptr;
      check(cudaMalloc(&slot, sizeof(unsigned long long)), "cudaMalloc");
      device_slot = static_cast<unsigned long long*>(slot);
      host_slot.reserve(2 * sizeof(unsigned long long));
    } catch (...) {
      release_all();
      throw;
    }
  }

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { release_all(); }

  /// Makes this context's device the calling thread's current device.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device)
      check(cudaSetDevice(device), "cudaSetDevice");
  }

  /// Zero-filled device memory for `what` (a tensor's description, for the error message).
  void* allocate(std::size_t bytes, const std::string& what) {
    void* memory = nullptr;
    const cudaError_t status = cudaMallocFromPoolAsync(&memory, bytes, pool, stream);
    if (status == cudaErrorMemoryAllocation) {
      static_cast<void>(cudaGetLastError());
      std::size_t free_bytes = 0, total_bytes = 0;
      static_cast<void>(cudaMemGetInfo(&free_bytes, &total_bytes));
      throw CudaError(out_of_memory_message(name, "cudaMallocFromPoolAsync", bytes, what,
                                            free_bytes, total_bytes));
    }
    check(status, "cudaMallocFromPoolAsync");
    if (const cudaError_t set = cudaMemsetAsync(memory, 0, bytes, stream); set != cudaSuccess) {
      static_cast<void>(cudaFreeAsync(memory, stream));
      check(set, "cudaMemsetAsync");
    }
    return memory;
  }

  /// Gives `memory` back to the pool in stream order (after the kernels queued so far that may
  /// use it). Never throws: it runs in a tensor's deleter.
  void free(void* memory) const noexcept {
    int current = -1;
    const bool switched = cudaGetDevice(&current) == cudaSuccess && current != device &&
                          cudaSetDevice(device) == cudaSuccess;
    static_cast<void>(cudaFreeAsync(memory, stream));
    if (switched) static_cast<void>(cudaSetDevice(current));
  }

 private:
  void release_all() noexcept {
    if (stream != nullptr) static_cast<void>(cudaStreamSynchronize(stream));
    if (device_slot != nullptr) static_cast<void>(cudaFree(device_slot));
    for (auto& slot : uploads) {
      if (slot.copied != nullptr) static_cast<void>(cudaEventDestroy(slot.copied));
      slot.copied = nullptr;
    }
    if (cublas != nullptr) static_cast<void>(cublasDestroy(cublas));
    if (cublas_lt != nullptr) static_cast<void>(cublasLtDestroy(cublas_lt));
    cublas_lt = nullptr;
    if (cublas_workspace != nullptr) static_cast<void>(cudaFree(cublas_workspace));
    if (pool != nullptr) static_cast<void>(cudaMemPoolDestroy(pool));
    if (stream != nullptr) static_cast<void>(cudaStreamDestroy(stream));
    device_slot = nullptr;
    cublas = nullptr;
    cublas_workspace = nullptr;
    pool = nullptr;
    stream = nullptr;
  }
};

/// One result of a loss or metric kernel as the host sees it: filled when its record is read
/// back.
struct ResultCell {
  std::array<double, 4> values{};
  bool ready = false;
};

/// Where the loss and metric kernels leave their results: a ring of 4-double records in device
/// memory. Nothing is copied back when a kernel is queued; the first read of a result copies
/// every record not read yet in one or two copies and waits once (so a training step that nobody
/// reads the logs of does not wait), and so does a kernel that finds the ring full.
class ResultRing {
 public:
  static constexpr std::size_t records = 1024;
  static constexpr std::size_t record_doubles = 4;

  explicit ResultRing(std::shared_ptr<Context> context) : context_(std::move(context)) {}
  ResultRing(const ResultRing&) = delete;
  ResultRing& operator=(const ResultRing&) = delete;
  ~ResultRing() {
    if (device_ != nullptr) context_->free(device_);
  }

  /// The next record for a kernel to write, and the cell its values will reach.
  std::pair<double*, std::shared_ptr<ResultCell>> acquire() {
    if (device_ == nullptr) {
      device_ = static_cast<double*>(
          context_->allocate(records * record_doubles * sizeof(double), "loss and metric results"));
      host_ = static_cast<double*>(host_memory_.reserve(records * record_doubles * sizeof(double)));
    }
    if (outstanding_.size() == records) read_back();
    const std::size_t record = next_;
    next_ = (next_ + 1) % records;
    auto cell = std::make_shared<ResultCell>();
    outstanding_.push_back({cell, record});
    return {device_ + record * record_doubles, std::move(cell)};
  }

  /// Copies every record not read yet to the host, waits, and fills their cells.
  void read_back() {
    if (outstanding_.empty()) return;
    context_->activate();
    const std::size_t first = outstanding_.front().record;
    const std::size_t count = outstanding_.size();
    const std::size_t head = std::min(count, records - first);  // up to the ring's end
    const auto copy = [&](std::size_t from, std::size_t n) {
      check(cudaMemcpyAsync(host_ + from * record_doubles, device_ + from * record_doubles,
                            n * record_doubles * sizeof(double), cudaMemcpyDeviceToHost,
                            context_->stream),
            "cudaMemcpyAsync (device to host)");
    };
    copy(first, head);
    if (count > head) copy(0, count - head);
    check(cudaStreamSynchronize(context_->stream), "cudaStreamSynchronize");
    for (const auto& [cell, record] : outstanding_) {
      std::copy_n(host_ + record * record_doubles, record_doubles, cell->values.begin());
      cell->ready = true;
    }
    outstanding_.clear();
  }

  /// The values of `cell`, read back first when they are not yet.
  static const std::array<double, 4>& values(const std::shared_ptr<ResultCell>& cell,
                                             const std::weak_ptr<ResultRing>& ring) {
    if (!cell->ready) {
      const auto owner = ring.lock();
      if (!owner) {
        throw CudaError(
            "cuda backend: a loss or metric result was read after its backend was "
            "destroyed without reading it back");
      }
      owner->read_back();
    }
    return cell->values;
  }

 private:
  struct Outstanding {
    std::shared_ptr<ResultCell> cell;
    std::size_t record;
  };
  std::shared_ptr<Context> context_;
  double* device_ = nullptr;
  double* host_ = nullptr;
  PinnedBuffer host_memory_;
  std::vector<Outstanding> outstanding_;  // in record order, from the oldest
  std::size_t next_ = 0;
};

/// cuBLASLt matrix multiplications with a fused epilogue, planned once per shape: the descriptors
/// and the algorithm cuBLASLt's heuristic picks are kept, so that a call after the first sets
/// the bias pointer and launches (the same algorithm for the same shape: the same bits run to
/// run).
class LtPlans {
 public:
  /// Column-major `D (m x n) = A (m x k, no transpose) * B (k x n, no transpose)`, then
  /// `epilogue` (a bias of `m` elements, ReLU), in full fp32.
  struct Key {
    std::uint64_t m, n, k;
    cublasLtEpilogue_t epilogue;
    bool operator==(const Key&) const = default;
  };

  explicit LtPlans(std::shared_ptr<Context> context) : context_(std::move(context)) {}
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  ~LtPlans() {
    for (auto& plan : plans_)
      destroy(plan);
  }

  /// Queues the multiplication, or returns `false` when cuBLASLt has no algorithm for it.
  bool run(const Key& key, const float* a, const float* b, const float* bias, float* d) {
    const Plan* plan = find(key);
    if (plan == nullptr || !plan->usable) return false;
    if (bias != nullptr) {
      check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias),
            "cublasLtMatmulDescSetAttribute (bias)");
    }
    const float alpha = 1.0F, beta = 0.0F;
    check(cublasLtMatmul(context_->cublas_lt, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, d,
                         plan->d, d, plan->d, &plan->algo, context_->cublas_workspace,
                         cublas_workspace_bytes, context_->stream),
          "cublasLtMatmul");
    return true;
  }

 private:
  struct Plan {
    Key key{};
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };

  const Plan* find(const Key& key) {
    for (const auto& plan : plans_)
      if (plan.key == key) return &plan;
    Plan plan;
    plan.key = key;
    try {
      check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate");
      const cublasOperation_t none = CUBLAS_OP_N;
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &none,
                                           sizeof none),
            "cublasLtMatmulDescSetAttribute (transa)");
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &none,
                                           sizeof none),
            "cublasLtMatmulDescSetAttribute (transb)");
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue,
                                           sizeof key.epilogue),
            "cublasLtMatmulDescSetAttribute (epilogue)");
      check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_32F, key.m, key.k,
                                       static_cast<std::int64_t>(key.m)),
            "cublasLtMatrixLayoutCreate");
      check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_32F, key.k, key.n,
                                       static_cast<std::int64_t>(key.k)),
            "cublasLtMatrixLayoutCreate");
      check(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_32F, key.m, key.n,
                                       static_cast<std::int64_t>(key.m)),
            "cublasLtMatrixLayoutCreate");
      cublasLtMatmulPreference_t preference = nullptr;
      check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
      const std::uint64_t workspace = cublas_workspace_bytes;
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
      if (status == CUBLAS_STATUS_SUCCESS) {
        status = cublasLtMatmulAlgoGetHeuristic(context_->cublas_lt, plan.desc, plan.a, plan.b,
                                                plan.d, plan.d, preference, 1, &result, &found);
      }
      static_cast<void>(cublasLtMatmulPreferenceDestroy(preference));
      // No algorithm (CUBLAS_STATUS_NOT_SUPPORTED, or none found): the caller falls back.
      if (status != CUBLAS_STATUS_NOT_SUPPORTED) check(status, "cublasLtMatmulAlgoGetHeuristic");
      plan.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
      if (plan.usable) plan.algo = result.algo;
    } catch (...) {
      destroy(plan);
      throw;
    }
    plans_.push_back(plan);
    return &plans_.back();
  }

  static void destroy(Plan& plan) noexcept {
    if (plan.d != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.d));
    if (plan.b != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.b));
    if (plan.a != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.a));
    if (plan.desc != nullptr) static_cast<void>(cublasLtMatmulDescDestroy(plan.desc));
    plan = Plan{};
  }

  std::shared_ptr<Context> context_;
  std::deque<Plan> plans_;  // stable addresses
};

/// The number of CUDA devices, or a `CudaError` saying why there is none.
inline int device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    static_cast<void>(cudaGetLastError());
    throw CudaError("cuda backend: no CUDA device is available: " +
                    error_message("cudaGetDeviceCount", status));
  }
  if (count == 0)
    throw CudaError("cuda backend: no CUDA device is available: cudaGetDeviceCount found 0");
  return count;
}

}  // namespace detail

/// Whether a CUDA device can be used (`cudaGetDeviceCount` succeeds and finds one); never throws.
inline bool device_available() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return status == cudaSuccess && count > 0;
}

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
  explicit CudaBackend(int device = 0) {
    if (device < 0) {
      throw ConfigError("cuda backend: the device index must be at least 0 but is " +
                        std::to_string(device));
    }
    const int count = detail::device_count();
    if (device >= count) {
      throw ConfigError("cuda backend: device " + std::to_string(device) + " was asked for but " +
                        std::to_string(count) + " CUDA device" + (count == 1 ? " is" : "s are") +
                        " present");
    }
    try {
      context_ = std::make_shared<detail::Context>(device);
      results_ = std::make_shared<detail::ResultRing>(context_);
      lt_ = std::make_unique<detail::LtPlans>(context_);
    } catch (const CudaError& error) {
      throw CudaError("cuda backend on cuda:" + std::to_string(device) +
                      ": cannot start: " + error.what());
    }
  }

  ~CudaBackend() override {
    // Results nobody has read yet stay readable after the backend is gone.
    try {
      results_->read_back();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device is reported by its reader
    }
    if (scratch_ != nullptr) context_->free(scratch_);
    for (void* memory : {step_table_, step_scratch_})
      if (memory != nullptr) context_->free(memory);
  }

  /// How many times `host_kernel` has staged device tensors through the host (a test counts that
  /// a training step makes none).
  std::size_t host_kernel_calls() const noexcept { return host_kernel_calls_; }

  /// The device's index.
  int device_index() const noexcept { return context_->device; }
  /// The stream every kernel and copy of this backend is queued on.
  cudaStream_t stream() const noexcept { return context_->stream; }
  /// The device memory the backend's pool holds (in use or kept for reuse), in bytes: it stops
  /// growing once every buffer of a training step has been allocated once.
  std::size_t reserved_bytes() const {
    std::uint64_t bytes = 0;
    check(cudaMemPoolGetAttribute(context_->pool, cudaMemPoolAttrReservedMemCurrent, &bytes),
          "cudaMemPoolGetAttribute");
    return static_cast<std::size_t>(bytes);
  }

  // --- Memory ---------------------------------------------------------------------------------

  Device device() const noexcept override { return {"cuda", context_->device}; }

  Tensor<float> allocate(const Shape& shape) override {
    const std::size_t elements = shape.elements();
    if (elements == 0) return Tensor<float>::wrap(nullptr, shape, nullptr, device());
    context_->activate();
    void* memory =
        context_->allocate(elements * sizeof(float), "a float32 tensor of shape " + shape.str());
    // If the control block cannot be allocated, shared_ptr calls the deleter itself.
    std::shared_ptr<void> owner(memory,
                                [context = context_](void* p) noexcept { context->free(p); });
    return Tensor<float>::wrap(static_cast<float*>(memory), shape, std::move(owner), device());
  }

  void copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) override {
    expect_host("copy_from_host", host);
    expect("copy_from_host", {&tensor});
    LOADSTAR_ASSERT(host.size() == tensor.size(), "copy_from_host: sizes differ");
    if (host.empty()) return;
    const cudaStream_t s = active_stream();
    auto& slot = context_->uploads[context_->next_upload];
    context_->next_upload = (context_->next_upload + 1) % detail::Context::upload_slots;
    // The slot is free once the copy that last read it is done (upload_slots uploads ago).
    check(cudaEventSynchronize(slot.copied), "cudaEventSynchronize");
    void* staging = slot.buffer.reserve(host.bytes());
    std::memcpy(staging, host.data(), host.bytes());
    check(cudaMemcpyAsync(tensor.data(), staging, host.bytes(), cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (host to device)");
    check(cudaEventRecord(slot.copied, s), "cudaEventRecord");
  }

  void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) override {
    expect_host("copy_to_host", host);
    expect("copy_to_host", {&tensor});
    LOADSTAR_ASSERT(host.size() == tensor.size(), "copy_to_host: sizes differ");
    if (host.empty()) return;
    const cudaStream_t s = active_stream();
    void* staging = context_->download.reserve(host.bytes());  // its last copy has been waited for
    check(cudaMemcpyAsync(staging, tensor.data(), host.bytes(), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    std::memcpy(host.data(), staging, host.bytes());
  }

  void synchronize() override {
    check(cudaStreamSynchronize(active_stream()), "cudaStreamSynchronize");
  }

  /// Copies the device tensors to page-locked host memory (tensors that overlap, such as a tensor
  /// and a view of it, share one staged block, so that the views stay views), runs `kernel` on
  /// host views and copies the blocks back. A host computation that itself calls `host_kernel`
  /// stages through ordinary host memory.
  void host_kernel(std::span<const Tensor<float>> tensors, keras::HostKernelRef kernel) override {
    for (const auto& t : tensors)
      if (!t.empty() && !t.is_host()) expect("host_kernel", {&t});
    const detail::StagingPlan plan = detail::plan_staging(tensors);
    if (plan.blocks.empty()) {  // host tensors only: nothing to stage or wait for
      kernel(tensors);
      return;
    }
    ++host_kernel_calls_;
    const cudaStream_t s = active_stream();
    Tensor<float> nested;  // a host kernel inside a host kernel stages here
    float* stage = nullptr;
    if (host_kernel_depth_ == 0) {
      // The previous host kernel's copies back read the staging memory: wait before reusing it.
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      stage = static_cast<float*>(context_->host_stage.reserve(plan.floats * sizeof(float)));
    } else {
      nested = Tensor<float>::uninitialized({plan.floats});
      stage = nested.data();
    }
    for (const auto& b : plan.blocks) {
      check(cudaMemcpyAsync(stage + b.offset, b.begin, b.floats() * sizeof(float),
                            cudaMemcpyDeviceToHost, s),
            "cudaMemcpyAsync (device to host)");
    }
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    std::vector<Tensor<float>> views;
    views.reserve(tensors.size());
    for (const auto& t : tensors) {
      views.push_back(
          t.empty() || t.is_host()
              ? t
              : Tensor<float>::wrap(stage + plan.offset_of(t.data()), t.shape(), nullptr));
    }
    ++host_kernel_depth_;
    try {
      kernel(views);
    } catch (...) {
      --host_kernel_depth_;
      throw;
    }
    --host_kernel_depth_;
    for (const auto& b : plan.blocks) {
      check(cudaMemcpyAsync(b.begin, stage + b.offset, b.floats() * sizeof(float),
                            cudaMemcpyHostToDevice, s),
            "cudaMemcpyAsync (host to device)");
    }
    // The nested staging memory goes away with this call: the copies must be done first.
    if (!nested.empty()) check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  }

  /// One host thread queues the work.
  std::size_t threads() const noexcept override { return 1; }

  // --- Optimizers, losses and metrics ----------------------------------------------------------

  /// One kernel launch over every element of every variable (`detail::update_flat`), from a
  /// device table of the variables' pointers and sizes that is uploaded at the first step and
  /// again only when a pointer changes; norm clipping adds two launches (segment sums of squares
  /// in double, then one thread adding them in a fixed order). Nothing is allocated after the
  /// first step and nothing waits for the device.
  bool apply_optimizer_step(const keras::OptimizerStep& step,
                            std::span<const keras::VariableSlots> variables) override {
    table_.clear();  // keeps its capacity
    std::size_t elements = 0, segments = 0;
    for (const auto& v : variables) {
      expect("apply_optimizer_step", {&v.value, &v.gradient});
      LOADSTAR_ASSERT(v.gradient.size() == v.value.size(), "apply_optimizer_step: sizes differ");
      detail::UpdateTarget t;
      t.value = v.value.data();
      t.gradient = v.gradient.data();
      for (std::size_t k = 0; k < keras::VariableSlots::max_slots; ++k) {
        if (v.slots[k].empty()) continue;
        if (k >= detail::UpdateTarget::max_slots) return false;  // not a rule of ours
        expect("apply_optimizer_step", {&v.slots[k]});
        t.slots[k] = v.slots[k].data();
      }
      t.size = v.value.size();
      t.begin = elements;
      t.segment_begin = segments;
      elements += t.size;
      segments += detail::norm_segments(t.size);
      table_.push_back(t);
    }
    if (elements == 0) return true;
    const cudaStream_t s = active_stream();
    upload_table();
    const float* scales = nullptr;
    if (step.clipping == keras::GradientClipping::by_norm ||
        step.clipping == keras::GradientClipping::by_global_norm) {
      auto* partials = static_cast<double*>(
          step_scratch(segments * sizeof(double) + table_.size() * sizeof(float)));
      auto* scale_memory = reinterpret_cast<float*>(partials + segments);
      launched(detail::launch_clip_scales(s, static_cast<const detail::UpdateTarget*>(step_table_),
                                          table_.size(), segments, partials,
                                          step.clipping == keras::GradientClipping::by_global_norm,
                                          step.clip_threshold, scale_memory),
               "clip_scales");
      scales = scale_memory;
    }
    launched(
        detail::launch_optimizer_step(s, static_cast<const detail::UpdateTarget*>(step_table_),
                                      table_.size(), elements, detail::update_params(step), scales),
        "optimizer_step");
    return true;
  }

  /// The per-row terms and the gradient in one kernel (one thread per row, in double, the loss
  /// classes' formulas), their sum in a fixed order (chunks of rows added in order: with up to
  /// 512 rows, the CPU's sequential sum bit for bit) into a result record with the first bad
  /// label. Nothing waits: the record is read back when the loss is first read (`ResultRing`).
  std::optional<keras::Deferred<keras::RowLossResult>> row_loss(
      const keras::RowLossSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
      const Tensor<float>& weight, const Tensor<float>& gradient) override {
    expect("row_loss", {&y_true, &y_pred, &weight, &gradient});
    const bool sparse = spec.kind == keras::RowLossKind::sparse_categorical_crossentropy;
    const detail::RowDims d = detail::row_dims(y_pred, sparse, false);
    detail::RowLossParams p;
    p.kind = static_cast<detail::RowLossCode>(static_cast<int>(spec.kind));
    p.from_logits = spec.from_logits;
    p.label_smoothing = spec.label_smoothing;
    p.delta = spec.delta;
    p.denominator = spec.denominator;
    const cudaStream_t s = active_stream();
    double* terms = reduction_terms(d.values, 1);
    auto [record, cell] = results_->acquire();
    check(cudaMemsetAsync(record + 1, 0xFF, sizeof(double), s), "cudaMemsetAsync");
    launched(detail::launch_row_loss(s, p, d, y_true.data(), y_pred.data(), or_null(weight),
                                     or_null(gradient), terms, terms + d.values, record),
             "row_loss");
    return keras::Deferred<
        keras::RowLossResult>(std::function<
                              keras::RowLossResult()>([cell = std::move(cell),
                                                       ring = std::weak_ptr<detail::ResultRing>(
                                                           results_)] {
      const auto& v = detail::ResultRing::values(cell, ring);
      keras::RowLossResult out;
      out.total = v[0];
      unsigned long long bad = 0;
      std::memcpy(&bad, &v[1], sizeof bad);
      if (bad != detail::no_bad_label)
        out.bad_label = keras::BadIndex{static_cast<std::size_t>(bad), static_cast<float>(v[2])};
      return out;
    }));
  }

  /// The per-row values times their weights and the weights (one thread per row), summed in a
  /// fixed order into a result record, read back when the metric is first read.
  std::optional<keras::Deferred<keras::MeanMetricSums>> mean_metric(
      const keras::MeanMetricSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
      const Tensor<float>& weight) override {
    expect("mean_metric", {&y_true, &y_pred, &weight});
    const bool sparse = spec.kind == keras::MeanMetricKind::sparse_categorical_accuracy;
    const bool elementwise =
        spec.kind == keras::MeanMetricKind::accuracy || spec.kind == keras::MeanMetricKind::mean;
    const detail::RowDims d = detail::row_dims(y_pred, sparse, elementwise);
    const cudaStream_t s = active_stream();
    double* terms = reduction_terms(d.values, 2);
    auto [record, cell] = results_->acquire();
    launched(
        detail::launch_mean_metric(
            s, static_cast<detail::MeanMetricCode>(static_cast<int>(spec.kind)), spec.threshold, d,
            y_true.data(), y_pred.data(), or_null(weight), terms, terms + 2 * d.values, record),
        "mean_metric");
    return keras::Deferred<keras::MeanMetricSums>(std::function<keras::MeanMetricSums()>(
        [cell = std::move(cell), ring = std::weak_ptr<detail::ResultRing>(results_)] {
          const auto& v = detail::ResultRing::values(cell, ring);
          return keras::MeanMetricSums{v[0], v[1]};
        }));
  }

  // --- Linear algebra -----------------------------------------------------------------------

  void gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b, bool transpose_b,
            const Tensor<float>& c, float alpha, float beta) override {
    expect("gemm", {&a, &b, &c});
    const std::size_t a_rows = a.rows(), a_cols = a.row_size();
    const std::size_t b_rows = b.rows(), b_cols = b.row_size();
    const std::size_t m = transpose_a ? a_cols : a_rows;
    const std::size_t k = transpose_a ? a_rows : a_cols;
    const std::size_t n = transpose_b ? b_rows : b_cols;
    LOADSTAR_ASSERT(m == c.rows(), "gemm: rows of op(a) and c differ");
    LOADSTAR_ASSERT(k == (transpose_b ? b_cols : b_rows), "gemm: inner dimensions differ");
    LOADSTAR_ASSERT(n == c.row_size(), "gemm: columns differ");
    if (m == 0 || n == 0) return;
    if (k == 0) {  // op(a) * op(b) is zero
      if (beta == 0.0F) {
        fill(c, 0.0F);
      } else {
        scale(c, beta);
      }
      return;
    }
    const cudaStream_t s = active_stream();
    static_cast<void>(s);
    // Row-major X is column-major X^T, so C^T = op(B)^T * op(A)^T is one column-major GEMM of
    // the same buffers with the operands swapped.
    check(cublasSgemm(context_->cublas, transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                      transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n, "gemm"), to_int(m, "gemm"),
                      to_int(k, "gemm"), &alpha, b.data(), to_int(b_cols, "gemm"), a.data(),
                      to_int(a_cols, "gemm"), &beta, c.data(), to_int(n, "gemm")),
          "cublasSgemm");
  }

  void bias_add(const Tensor<float>& x, const Tensor<float>& bias) override {
    expect("bias_add", {&x, &bias});
    LOADSTAR_ASSERT(bias.size() > 0 && x.size() % bias.size() == 0, "bias_add: sizes do not fit");
    launched(detail::launch_bias_add(active_stream(), x.data(), x.size(), bias.data(), bias.size()),
             "bias_add");
  }

  void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) override {
    expect("column_sums", {&x, &out});
    const std::size_t n = out.size();
    LOADSTAR_ASSERT(n > 0 && x.size() % n == 0, "column_sums: sizes do not fit");
    const std::size_t rows = x.size() / n;
    double* scratch = reduction_scratch(rows, n);
    launched(
        detail::launch_column_sums(active_stream(), x.data(), out.data(), rows, n, beta, scratch),
        "column_sums");
  }

  /// One cuBLASLt multiplication with the bias, and a ReLU, in its epilogue (the row-major
  /// `y = x * kernel` is the column-major `y^T = kernel^T * x^T`, whose rows are the units: the
  /// bias is cuBLASLt's per-row vector). Other activations run after it, as the layer would run
  /// them. Declines (the layer's own path) where cuBLASLt has no algorithm for the shape.
  bool dense_forward(const Tensor<float>& x, const Tensor<float>& kernel, const Tensor<float>& bias,
                     keras::Activation activation, const Tensor<float>& y) override {
    expect("dense_forward", {&x, &kernel, &bias, &y});
    const std::size_t rows = x.rows(), features = x.row_size(), units = kernel.row_size();
    LOADSTAR_ASSERT(kernel.rows() == features && y.rows() == rows && y.row_size() == units &&
                        (bias.empty() || bias.size() == units),
                    "dense_forward: shapes do not fit");
    if (rows == 0 || units == 0 || features == 0) return false;
    const bool relu = activation == keras::Activation::relu;
    const cublasLtEpilogue_t epilogue =
        bias.empty() ? (relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT)
                     : (relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS);
    context_->activate();
    if (!lt_->run({units, rows, features, epilogue}, kernel.data(), x.data(), or_null(bias),
                  y.data())) {
      return false;
    }
    if (!relu && activation != keras::Activation::linear) activation_forward(activation, y, y);
    return true;
  }

  // --- Elementwise --------------------------------------------------------------------------

  void fill(const Tensor<float>& x, float value) override {
    expect("fill", {&x});
    launched(detail::launch_fill(active_stream(), x.data(), x.size(), value), "fill");
  }

  void copy(const Tensor<float>& x, const Tensor<float>& y) override {
    expect("copy", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "copy: sizes differ");
    if (x.data() == y.data() || x.empty()) return;
    check(cudaMemcpyAsync(y.data(), x.data(), x.bytes(), cudaMemcpyDeviceToDevice, active_stream()),
          "cudaMemcpyAsync (device to device)");
  }

  void scale(const Tensor<float>& x, float alpha) override {
    expect("scale", {&x});
    launched(detail::launch_scale(active_stream(), x.data(), x.size(), alpha), "scale");
  }

  void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) override {
    expect("axpy", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "axpy: sizes differ");
    launched(detail::launch_axpy(active_stream(), alpha, x.data(), y.data(), x.size()), "axpy");
  }

  void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) override {
    expect("add", {&a, &b, &out});
    LOADSTAR_ASSERT(a.size() == b.size() && a.size() == out.size(), "add: sizes differ");
    launched(detail::launch_add(active_stream(), a.data(), b.data(), out.data(), a.size()), "add");
  }

  void activation_forward(keras::Activation kind, const Tensor<float>& x,
                          const Tensor<float>& y) override {
    expect("activation_forward", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "activation_forward: sizes differ");
    if (kind == keras::Activation::softmax) {
      softmax_forward(x, y, x.rank() == 0 ? 0 : x.rank() - 1);
      return;
    }
    launched(detail::launch_activation_forward(active_stream(), detail::activation_code(kind),
                                               x.data(), y.data(), x.size()),
             "activation_forward");
  }

  void activation_backward(keras::Activation kind, const Tensor<float>& x, const Tensor<float>& y,
                           const Tensor<float>& dy, const Tensor<float>& dx) override {
    expect("activation_backward", {&x, &y, &dy, &dx});
    LOADSTAR_ASSERT(y.size() == dy.size() && dy.size() == dx.size(), "activation: sizes differ");
    if (kind == keras::Activation::softmax) {
      softmax_backward(y, dy, dx, y.rank() == 0 ? 0 : y.rank() - 1);
      return;
    }
    const bool needs_x = keras::activation_gradient_needs_input(kind);
    LOADSTAR_ASSERT(!needs_x || x.size() == y.size(), "activation: the input is needed");
    launched(detail::launch_activation_backward(active_stream(), detail::activation_code(kind),
                                                needs_x ? x.data() : nullptr, y.data(), dy.data(),
                                                dx.data(), y.size()),
             "activation_backward");
  }

  void relu_forward(const Tensor<float>& x, const Tensor<float>& y, std::optional<float> max_value,
                    float negative_slope, float threshold) override {
    expect("relu_forward", {&x, &y});
    launched(detail::launch_relu_forward(active_stream(), x.data(), y.data(), x.size(),
                                         max_value.value_or(std::numeric_limits<float>::infinity()),
                                         negative_slope, threshold),
             "relu_forward");
  }

  void relu_backward(const Tensor<float>& x, const Tensor<float>& dy, const Tensor<float>& dx,
                     std::optional<float> max_value, float negative_slope,
                     float threshold) override {
    expect("relu_backward", {&x, &dy, &dx});
    launched(
        detail::launch_relu_backward(active_stream(), x.data(), dy.data(), dx.data(), x.size(),
                                     max_value.value_or(std::numeric_limits<float>::infinity()),
                                     negative_slope, threshold),
        "relu_backward");
  }

  void softmax_forward(const Tensor<float>& x, const Tensor<float>& y, std::size_t axis) override {
    expect("softmax_forward", {&x, &y});
    const auto v = keras::detail::axis_view(x.shape(), axis);
    launched(detail::launch_softmax_forward(active_stream(), x.data(), y.data(), v.outer, v.length,
                                            v.inner),
             "softmax_forward");
  }

  void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy, const Tensor<float>& dx,
                        std::size_t axis) override {
    expect("softmax_backward", {&y, &dy, &dx});
    const auto v = keras::detail::axis_view(y.shape(), axis);
    launched(detail::launch_softmax_backward(active_stream(), y.data(), dy.data(), dx.data(),
                                             v.outer, v.length, v.inner),
             "softmax_backward");
  }

  void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
               std::uint64_t key) override {
    expect("dropout", {&x, &y});
    if (rate <= 0.0F) {
      copy(x, y);
      return;
    }
    const float keep_scale = rate < 1.0F ? 1.0F / (1.0F - rate) : 0.0F;
    launched(detail::launch_dropout(active_stream(), x.data(), y.data(), x.size(), rate, keep_scale,
                                    key),
             "dropout");
  }

  // --- Convolution and pooling -----------------------------------------------------------------

  void im2col(const Tensor<float>& x, const keras::Conv2DGeometry& g,
              const Tensor<float>& columns) override {
    expect("im2col", {&x, &columns});
    LOADSTAR_ASSERT(columns.size() == g.batch * g.out_h * g.out_w * g.patch_size(),
                    "im2col: columns have the wrong size");
    launched(detail::launch_im2col(active_stream(), x.data(), dims(g), columns.data()), "im2col");
  }

  void col2im(const Tensor<float>& columns, const keras::Conv2DGeometry& g,
              const Tensor<float>& dx) override {
    expect("col2im", {&columns, &dx});
    launched(detail::launch_col2im(active_stream(), columns.data(), dims(g), dx.data()), "col2im");
  }

  void max_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    expect("max_pool_forward", {&x, &y});
    launched(detail::launch_max_pool_forward(active_stream(), x.data(), dims(g), y.data()),
             "max_pool_forward");
  }

  void max_pool_backward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                         const Tensor<float>& dy, const Tensor<float>& dx) override {
    expect("max_pool_backward", {&x, &dy, &dx});
    launched(
        detail::launch_max_pool_backward(active_stream(), x.data(), dims(g), dy.data(), dx.data()),
        "max_pool_backward");
  }

  void avg_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    expect("avg_pool_forward", {&x, &y});
    launched(detail::launch_avg_pool_forward(active_stream(), x.data(), dims(g), y.data()),
             "avg_pool_forward");
  }

  void avg_pool_backward(const keras::Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override {
    expect("avg_pool_backward", {&dy, &dx});
    launched(detail::launch_avg_pool_backward(active_stream(), dims(g), dy.data(), dx.data()),
             "avg_pool_backward");
  }

  void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) override {
    expect("global_pool_forward", {&x, &y});
    const std::size_t channels = x.shape()[x.rank() - 1];
    launched(detail::launch_global_pool_forward(active_stream(), x.data(), max, y.data(), x.rows(),
                                                x.row_size() / channels, channels),
             "global_pool_forward");
  }

  void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                            const Tensor<float>& dx) override {
    expect("global_pool_backward", {&x, &dy, &dx});
    const std::size_t channels = x.shape()[x.rank() - 1];
    launched(
        detail::launch_global_pool_backward(active_stream(), x.data(), max, dy.data(), dx.data(),
                                            x.rows(), x.row_size() / channels, channels),
        "global_pool_backward");
  }

  // --- Normalisation -----------------------------------------------------------------------------

  void moments(const Tensor<float>& x, const Tensor<float>& mean,
               const Tensor<float>& variance) override {
    expect("moments", {&x, &mean, &variance});
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    double* scratch = reduction_scratch(n, c);
    launched(detail::launch_moments(active_stream(), x.data(), mean.data(), variance.data(), n, c,
                                    scratch),
             "moments");
  }

  void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                          const Tensor<float>& variance, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override {
    expect("batch_norm_forward", {&x, &mean, &variance, &gamma, &beta, &y});
    const std::size_t c = mean.size();
    launched(detail::launch_batch_norm_forward(active_stream(), x.data(), mean.data(),
                                               variance.data(), or_null(gamma), or_null(beta),
                                               epsilon, y.data(), x.size() / c, c),
             "batch_norm_forward");
  }

  void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                           const Tensor<float>& variance, const Tensor<float>& gamma, float epsilon,
                           bool training, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override {
    expect("batch_norm_backward", {&x, &mean, &variance, &gamma, &dy, &dx, &dgamma, &dbeta});
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    double* scratch = reduction_scratch(n, c);
    launched(detail::launch_batch_norm_backward(
                 active_stream(), x.data(), mean.data(), variance.data(), or_null(gamma), epsilon,
                 training, dy.data(), or_null(dx), or_null(dgamma), or_null(dbeta), n, c, scratch),
             "batch_norm_backward");
  }

  void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                      float momentum) override {
    expect("moving_average", {&moving, &value});
    launched(detail::launch_moving_average(active_stream(), moving.data(), value.data(),
                                           moving.size(), momentum),
             "moving_average");
  }

  // --- Indexing and layout
  // -------------------------------------------------------------------------

  /// Finds the first bad index on the device and reads back only its position (one small copy
  /// and a wait per call), then gathers.
  std::optional<keras::BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                        const Tensor<float>& out) override {
    expect("gather", {&indices, &table, &out});
    if (indices.empty()) return std::nullopt;
    const cudaStream_t s = active_stream();
    auto* first = context_->device_slot;
    auto* host = static_cast<unsigned long long*>(context_->host_slot.reserve(16));
    check(cudaMemsetAsync(first, 0xFF, sizeof(unsigned long long), s), "cudaMemsetAsync");
    launched(detail::launch_find_bad_index(s, indices.data(), indices.size(), table.rows(), first),
             "gather");
    check(cudaMemcpyAsync(host, first, sizeof(unsigned long long), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    if (host[0] != std::numeric_limits<unsigned long long>::max()) {
      const auto position = static_cast<std::size_t>(host[0]);
      auto* value = reinterpret_cast<float*>(host + 1);
      check(cudaMemcpyAsync(value, indices.data() + position, sizeof(float), cudaMemcpyDeviceToHost,
                            s),
            "cudaMemcpyAsync (device to host)");
      check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
      return keras::BadIndex{position, *value};
    }
    launched(detail::launch_gather(s, indices.data(), indices.size(), table.data(),
                                   table.row_size(), out.data()),
             "gather");
    return std::nullopt;
  }

  void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                   const Tensor<float>& table_gradient) override {
    expect("scatter_add", {&indices, &dy, &table_gradient});
    launched(detail::launch_scatter_add(active_stream(), indices.data(), indices.size(), dy.data(),
                                        table_gradient.row_size(), table_gradient.data()),
             "scatter_add");
  }

  /// Strided copies (`cudaMemcpy2DAsync`), one per part.
  void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                   const Tensor<float>& out) override {
    expect("concatenate", {&out});
    const std::size_t outer = keras::detail::axis_view(out.shape(), axis).outer;
    if (outer == 0) return;
    const std::size_t out_inner = out.size() / outer;
    const cudaStream_t s = active_stream();
    std::size_t offset = 0;
    for (const auto& part : parts) {
      expect("concatenate", {&part});
      const std::size_t inner = part.size() / outer;
      if (inner > 0) {
        check(cudaMemcpy2DAsync(out.data() + offset, out_inner * sizeof(float), part.data(),
                                inner * sizeof(float), inner * sizeof(float), outer,
                                cudaMemcpyDeviceToDevice, s),
              "cudaMemcpy2DAsync");
      }
      offset += inner;
    }
  }

  void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
             std::span<const Tensor<float>> parts) override {
    expect("split", {&x});
    const auto v = keras::detail::axis_view(x.shape(), axis);
    if (v.outer == 0) return;
    const std::size_t x_inner = v.length * v.inner;
    const cudaStream_t s = active_stream();
    std::size_t offset = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const std::size_t inner = extents[p] * v.inner;
      if (!parts[p].empty() && inner > 0) {
        expect("split", {&parts[p]});
        check(cudaMemcpy2DAsync(parts[p].data(), inner * sizeof(float), x.data() + offset,
                                x_inner * sizeof(float), inner * sizeof(float), v.outer,
                                cudaMemcpyDeviceToDevice, s),
              "cudaMemcpy2DAsync");
      }
      offset += inner;
    }
  }

  void permute(const Tensor<float>& x, std::span<const std::size_t> axes,
               const Tensor<float>& y) override {
    expect("permute", {&x, &y});
    LOADSTAR_ASSERT(axes.size() == x.rank() && x.rank() == y.rank() && x.size() == y.size(),
                    "permute: shapes and axes do not fit");
    const detail::PermuteDims d = detail::permute_dims(x.shape(), axes, y.shape());
    launched(detail::launch_permute(active_stream(), x.data(), y.data(), d, y.size()), "permute");
  }

 private:
  cudaStream_t active_stream() const {
    context_->activate();
    return context_->stream;
  }

  /// Throws `DeviceError` unless every non-empty tensor lives on this backend's device (a host
  /// pointer handed to a kernel would be an illegal address, reported much later).
  void expect(const char* kernel, std::initializer_list<const Tensor<float>*> tensors) const {
    const Device mine = device();
    for (const auto* t : tensors) {
      if (t->empty() || t->device() == mine) continue;
      throw DeviceError("cuda backend: " + std::string(kernel) + " was given a " +
                        t->description() + " on " + t->device().str() + " but expects " +
                        mine.str());
    }
  }

  static void expect_host(const char* call, const Tensor<float>& host) {
    if (!host.is_host()) {
      throw DeviceError("cuda backend: " + std::string(call) + " needs a host tensor but the " +
                        host.description() + " lives on " + host.device().str());
    }
  }

  /// Throws `CudaError` naming the kernel when its launch failed.
  void launched(cudaError_t status, const char* kernel) const {
    if (status != cudaSuccess) check(status, context_->name + ": " + kernel + " kernel launch");
  }

  static int to_int(std::size_t value, const char* call) {
    if (value > static_cast<std::size_t>(INT_MAX)) {
      throw ShapeError("cuda backend: " + std::string(call) + " dimension " +
                       std::to_string(value) + " exceeds cuBLAS's limit of " +
                       std::to_string(INT_MAX));
    }
    return static_cast<int>(value);
  }

  static float* or_null(const Tensor<float>& t) noexcept { return t.empty() ? nullptr : t.data(); }

  static detail::ConvDims dims(const keras::Conv2DGeometry& g) noexcept {
    return detail::conv_dims(g);
  }
  static detail::PoolDims dims(const keras::Pool2DGeometry& g) noexcept {
    return detail::pool_dims(g);
  }

  /// Device scratch of at least the doubles a column reduction of `rows x columns` needs; it
  /// grows and is then reused (kernels on the one stream use it in turn).
  double* reduction_scratch(std::size_t rows, std::size_t columns) {
    const std::size_t doubles = detail::reduction_scratch(rows, columns);
    if (doubles > scratch_doubles_) {
      const std::size_t grown = std::max(doubles, scratch_doubles_ * 2);
      context_->activate();
      void* memory = context_->allocate(grown * sizeof(double), "reduction scratch");
      if (scratch_ != nullptr) context_->free(scratch_);
      scratch_ = static_cast<double*>(memory);
      scratch_doubles_ = grown;
    }
    return scratch_;
  }

  /// Device memory that grows and is then reused: `memory` holds at least `bytes`.
  void* grow(void*& memory, std::size_t& capacity, std::size_t bytes, const char* what) {
    if (bytes <= capacity && memory != nullptr) return memory;
    const std::size_t grown = std::max(bytes, capacity * 2);
    context_->activate();
    void* fresh = context_->allocate(grown, what);
    if (memory != nullptr) context_->free(memory);
    memory = fresh;
    capacity = grown;
    return memory;
  }

  void* step_scratch(std::size_t bytes) {
    return grow(step_scratch_, step_scratch_bytes_, bytes, "optimizer, loss and metric scratch");
  }

  /// Scratch for `rows x columns` per-row terms followed by their column reduction's partials.
  double* reduction_terms(std::size_t rows, std::size_t columns) {
    const std::size_t doubles = rows * columns + detail::reduction_chunks(rows) * columns;
    return static_cast<double*>(step_scratch(doubles * sizeof(double)));
  }

  /// Uploads `table_` to the device table unless it holds it already (the variables' memory is
  /// the same from step to step: one upload at the first step).
  void upload_table() {
    const std::size_t bytes = table_.size() * sizeof(detail::UpdateTarget);
    if (uploaded_ == table_) return;
    const cudaStream_t s = active_stream();
    // The previous upload may still read the pinned copy: wait before rewriting it (rare).
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    void* stage = table_stage_.reserve(bytes);
    std::memcpy(stage, table_.data(), bytes);
    grow(step_table_, step_table_bytes_, bytes, "optimizer variable table");
    check(cudaMemcpyAsync(step_table_, stage, bytes, cudaMemcpyHostToDevice, s),
          "cudaMemcpyAsync (host to device)");
    uploaded_ = table_;
  }

  std::shared_ptr<detail::Context> context_;
  double* scratch_ = nullptr;
  std::size_t scratch_doubles_ = 0;
  int host_kernel_depth_ = 0;
  std::size_t host_kernel_calls_ = 0;
  std::vector<detail::UpdateTarget> table_, uploaded_;
  void* step_table_ = nullptr;
  std::size_t step_table_bytes_ = 0;
  void* step_scratch_ = nullptr;
  std::size_t step_scratch_bytes_ = 0;
  std::shared_ptr<detail::ResultRing> results_;
  std::unique_ptr<detail::LtPlans> lt_;
  detail::PinnedBuffer table_stage_;
};

/// A `CudaBackend` on device `device`, for `CompileOptions::backend`. Throws `CudaError` when no
/// CUDA device is present and `ConfigError` for an index that is not a device.
/// \code
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = cuda_backend(0)});
/// \endcode
inline std::shared_ptr<keras::Backend> cuda_backend(int device = 0) {
  return std::make_shared<CudaBackend>(device);
}

}  // namespace loadstar::cuda

namespace loadstar::keras {
using cuda::cuda_backend;
}  // namespace loadstar::keras
