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
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstar/cuda/detail/cudnn.hpp"
#include "loadstar/cuda/detail/kernels.hpp"
#include "loadstar/cuda/detail/math.hpp"
#include "loadstar/cuda/error.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::cuda {

namespace detail {

/// The kernels' operands of an optimizer step.
inline UpdateParams update_params(const keras::OptimizerStep& step) noexcept {
  UpdateParams p;
  p.rule = step.rule;
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
  /// Uploads of `copy_stream_bytes` or more cross to the device on `copy_stream`, into the slot's
  /// device buffer, while `stream` computes; `stream` then waits for them (`arrived`) and copies
  /// device to device, so that a batch crosses the bus during the step before its own. Small
  /// uploads (labels, a step's scalars) take turns in a ring of their own, so that the batches
  /// keep to the fewest large buffers whatever else a step uploads.
  static constexpr std::size_t upload_slots = 8;
  static constexpr std::size_t copy_stream_bytes = std::size_t{64} << 10U;
  struct UploadSlot {
    PinnedBuffer buffer;
    cudaEvent_t copied = nullptr;
    cudaEvent_t arrived = nullptr;
    void* device_buffer = nullptr;
    std::size_t device_bytes = 0;
  };
  cudaStream_t copy_stream = nullptr;
  struct UploadRing {
    std::array<UploadSlot, upload_slots> slots;
    std::size_t next = 0;
  };
  std::array<UploadRing, 2> uploads;          // small, large
  PinnedBuffer download;                      // copy_to_host, which waits for its copy
  PinnedBuffer host_stage;                    // host_kernel
  unsigned long long* device_slot = nullptr;  // gather's first bad index
  PinnedBuffer host_slot;
  /// While `CudaBackend` records a step (to capture or replay it as a CUDA graph), its kernels
  /// wait on the host to be queued: memory freed meanwhile is given back after them
  /// (`deferred_frees`), and an allocation or a read-back queues them first (`flush`).
  bool recording = false;
  std::function<void(const std::string& why)> flush;
  std::vector<void*> deferred_frees;

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
      check(cudaStreamCreateWithFlags(&copy_stream, cudaStreamNonBlocking), "cudaStreamCreate");
      for (UploadSlot* slot : all_upload_slots()) {
        check(cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming), "cudaEventCreate");
        check(cudaEventCreateWithFlags(&slot->arrived, cudaEventDisableTiming), "cudaEventCreate");
      }
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

  /// Copies `bytes` of host memory to `device` through the next of the page-locked upload
  /// buffers, in stream order, without waiting for the copy.
  void upload(void* device, const void* host, std::size_t bytes) {
    upload_with(device, bytes, [&](void* staging) { std::memcpy(staging, host, bytes); });
  }

  /// `upload` of the `bytes` that `write(staging)` writes into the page-locked buffer.
  template <class Write>
  void upload_with(void* device, std::size_t bytes, Write&& write) {
    UploadRing& ring = uploads[bytes < copy_stream_bytes ? 0 : 1];
    UploadSlot& slot = ring.slots[ring.next];
    ring.next = (ring.next + 1) % upload_slots;
    // The slot is free once the copy that last read it is done (upload_slots uploads ago).
    check(cudaEventSynchronize(slot.copied), "cudaEventSynchronize");
    void* staging = slot.buffer.reserve(bytes);
    write(staging);
    if (bytes < copy_stream_bytes) {
      check(cudaMemcpyAsync(device, staging, bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync (host to device)");
    } else {
      if (slot.device_bytes < bytes) {  // rare: the first batches, or larger ones
        const std::size_t grown = std::max(bytes, slot.device_bytes * 2);
        if (slot.device_buffer != nullptr) check(cudaFree(slot.device_buffer), "cudaFree");
        slot.device_buffer = nullptr;
        slot.device_bytes = 0;
        const cudaError_t status = cudaMalloc(&slot.device_buffer, grown);
        if (status == cudaErrorMemoryAllocation)
          throw_out_of_memory("cudaMalloc", grown, "an upload buffer");
        check(status, "cudaMalloc");
        slot.device_bytes = grown;
      }
      check(
          cudaMemcpyAsync(slot.device_buffer, staging, bytes, cudaMemcpyHostToDevice, copy_stream),
          "cudaMemcpyAsync (host to device)");
      check(cudaEventRecord(slot.arrived, copy_stream), "cudaEventRecord");
      check(cudaStreamWaitEvent(stream, slot.arrived, 0), "cudaStreamWaitEvent");
      check(cudaMemcpyAsync(device, slot.device_buffer, bytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync (device to device)");
    }
    check(cudaEventRecord(slot.copied, stream), "cudaEventRecord");
  }

  /// Every upload slot, of both rings.
  std::array<UploadSlot*, 2 * upload_slots> all_upload_slots() noexcept {
    std::array<UploadSlot*, 2 * upload_slots> all{};
    for (std::size_t i = 0; i < upload_slots; ++i) {
      all[i] = &uploads[0].slots[i];
      all[upload_slots + i] = &uploads[1].slots[i];
    }
    return all;
  }

  /// Makes this context's device the calling thread's current device.
  void activate() const {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != device)
      check(cudaSetDevice(device), "cudaSetDevice");
  }

  /// Throws the `CudaError` of `call` failing for want of device memory: the bytes asked for
  /// `what` and those free.
  [[noreturn]] void throw_out_of_memory(const char* call, std::size_t bytes,
                                        const std::string& what) const {
    static_cast<void>(cudaGetLastError());
    std::size_t free_bytes = 0, total_bytes = 0;
    static_cast<void>(cudaMemGetInfo(&free_bytes, &total_bytes));
    throw CudaError(out_of_memory_message(name, call, bytes, what, free_bytes, total_bytes));
  }

  /// Zero-filled device memory for `what` (a tensor's description, for the error message).
  void* allocate(std::size_t bytes, const std::string& what) {
    if (recording && flush) flush("an allocation of " + what);
    void* memory = nullptr;
    const cudaError_t status = cudaMallocFromPoolAsync(&memory, bytes, pool, stream);
    if (status == cudaErrorMemoryAllocation)
      throw_out_of_memory("cudaMallocFromPoolAsync", bytes, what);
    check(status, "cudaMallocFromPoolAsync");
    if (const cudaError_t set = cudaMemsetAsync(memory, 0, bytes, stream); set != cudaSuccess) {
      static_cast<void>(cudaFreeAsync(memory, stream));
      check(set, "cudaMemsetAsync");
    }
    return memory;
  }

  /// Gives `memory` back to the pool in stream order (after the kernels queued so far that may
  /// use it). Never throws: it runs in a tensor's deleter.
  void free(void* memory) noexcept {
    if (recording) {
      try {
        deferred_frees.push_back(memory);
      } catch (...) {  // NOLINT(bugprone-empty-catch): kept rather than freed under queued work
      }
      return;
    }
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
    if (copy_stream != nullptr) static_cast<void>(cudaStreamSynchronize(copy_stream));
    for (UploadSlot* slot : all_upload_slots()) {
      if (slot->copied != nullptr) static_cast<void>(cudaEventDestroy(slot->copied));
      if (slot->arrived != nullptr) static_cast<void>(cudaEventDestroy(slot->arrived));
      if (slot->device_buffer != nullptr) static_cast<void>(cudaFree(slot->device_buffer));
      slot->copied = nullptr;
      slot->arrived = nullptr;
      slot->device_buffer = nullptr;
    }
    if (cublas != nullptr) static_cast<void>(cublasDestroy(cublas));
    if (cublas_lt != nullptr) static_cast<void>(cublasLtDestroy(cublas_lt));
    cublas_lt = nullptr;
    if (cublas_workspace != nullptr) static_cast<void>(cudaFree(cublas_workspace));
    if (pool != nullptr) static_cast<void>(cudaMemPoolDestroy(pool));
    if (stream != nullptr) static_cast<void>(cudaStreamDestroy(stream));
    if (copy_stream != nullptr) static_cast<void>(cudaStreamDestroy(copy_stream));
    copy_stream = nullptr;
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

  /// The records that can be acquired before one makes the ring read back.
  std::size_t room() const noexcept { return records - outstanding_.size(); }

  /// Copies every record not read yet to the host, waits, and fills their cells.
  void read_back() {
    // Their kernels first.
    if (context_->recording && context_->flush) context_->flush("a read-back of results");
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
  /// Column-major `D (m x n) = op(A) * op(B)`, with `A` stored `m x k`, or `k x m` and
  /// transposed when `transpose_a`, and `B` stored `k x n`, or `n x k` and transposed when
  /// `transpose_b`, then `epilogue` (a bias of `m` elements added, ReLU, its bit mask written; or
  /// the bias gradient, `A`'s sums over `k` or `D`'s over `n`, written, and the ReLU gradient
  /// applied from the bit mask), in full fp32. `aux_ld` is the bit mask's leading dimension in
  /// bits (a multiple of 128, at least `m`; 0 without a mask).
  struct Key {
    std::uint64_t m, n, k;
    cublasLtEpilogue_t epilogue;
    bool transpose_b = false;
    /// The alignment in bytes that the matrices' pointers all have (`alignment`): cuBLASLt's
    /// heuristic assumes 256 unless told, and may pick an algorithm that a view starting inside
    /// an allocation would make fail.
    std::uint32_t alignment = 256;
    bool transpose_a = false;
    std::uint64_t aux_ld = 0;
    bool operator==(const Key&) const = default;
  };

  /// The largest power of two, at most 256, that divides every address of `pointers`.
  static std::uint32_t alignment(std::initializer_list<const void*> pointers) noexcept {
    std::uintptr_t bits = 256;
    for (const void* p : pointers)
      bits |= reinterpret_cast<std::uintptr_t>(p);
    return static_cast<std::uint32_t>(bits & (~bits + 1));
  }

  explicit LtPlans(std::shared_ptr<Context> context) : context_(std::move(context)) {}
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  ~LtPlans() {
    for (auto& plan : plans_)
      destroy(plan);
  }

  struct Plan;

  /// The plan of `key`, made at its first use (host calls only: nothing is queued), or null when
  /// cuBLASLt has no algorithm for it.
  const Plan* plan(const Key& key) {
    const Plan* found = find(key);
    return found != nullptr && found->usable ? found : nullptr;
  }

  /// Queues the multiplication of `plan` on `stream`; `bias` is the epilogue's vector (read by a
  /// bias epilogue, written by a bias-gradient one), `aux` its ReLU bit mask (written by
  /// `RELU_AUX_BIAS`, read by `DRELU_BGRAD`).
  void run(const Plan& plan_ref, const float* a, const float* b, const float* bias, float* d,
           cudaStream_t stream, const void* aux = nullptr) const {
    const Plan* plan = &plan_ref;
    if (bias != nullptr) {
      check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof bias),
            "cublasLtMatmulDescSetAttribute (bias)");
    }
    if (aux != nullptr) {
      check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                           &aux, sizeof aux),
            "cublasLtMatmulDescSetAttribute (aux)");
    }
    const float alpha = 1.0F, beta = 0.0F;
    check(cublasLtMatmul(context_->cublas_lt, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, d,
                         plan->d, d, plan->d, &plan->algo, context_->cublas_workspace,
                         cublas_workspace_bytes, stream),
          "cublasLtMatmul");
  }

  struct Plan {
    Key key{};
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };

 private:
  const Plan* find(const Key& key) {
    for (const auto& plan : plans_)
      if (plan.key == key) return &plan;
    Plan plan;
    plan.key = key;
    try {
      check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            "cublasLtMatmulDescCreate");
      const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a,
                                           sizeof op_a),
            "cublasLtMatmulDescSetAttribute (transa)");
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b,
                                           sizeof op_b),
            "cublasLtMatmulDescSetAttribute (transb)");
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue,
                                           sizeof key.epilogue),
            "cublasLtMatmulDescSetAttribute (epilogue)");
      if (key.aux_ld != 0) {
        const auto aux_ld = static_cast<std::int64_t>(key.aux_ld);
        check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                             &aux_ld, sizeof aux_ld),
              "cublasLtMatmulDescSetAttribute (aux ld)");
      }
      const std::uint64_t a_rows = key.transpose_a ? key.k : key.m;
      const std::uint64_t a_cols = key.transpose_a ? key.m : key.k;
      check(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_32F, a_rows, a_cols,
                                       static_cast<std::int64_t>(a_rows)),
            "cublasLtMatrixLayoutCreate");
      const std::uint64_t b_rows = key.transpose_b ? key.n : key.k;
      const std::uint64_t b_cols = key.transpose_b ? key.k : key.n;
      check(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_32F, b_rows, b_cols,
                                       static_cast<std::int64_t>(b_rows)),
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
      for (const auto attribute :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
        if (status == CUBLAS_STATUS_SUCCESS) {
          status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &key.alignment,
                                                        sizeof key.alignment);
        }
      }
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

/// A recorded step's signature: every argument of every call it queued (pointers, sizes and
/// scalars, as words), in order, so that two steps with the same signature queue the same work.
using Signature = std::vector<std::uint64_t>;

/// A pointer, floating-point number, integer or enumerator as a signature word (its bits).
template <class T>
requires std::is_pointer_v<T> || std::is_arithmetic_v<T> || std::is_enum_v<T> std::uint64_t word(
    T value)
noexcept {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<std::uintptr_t>(value);
  } else if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<std::uint64_t>(value);
  } else {
    return static_cast<std::uint64_t>(value);
  }
}

template <class T>
void sign(Signature& out, const T& value) {
  if constexpr (std::is_pointer_v<T> || std::is_arithmetic_v<T> || std::is_enum_v<T>) {
    out.push_back(word(value));
  } else {
    // Geometry structs of sizes only: every byte is a value byte.
    static_assert(std::has_unique_object_representations_v<T> && sizeof(T) % 8 == 0,
                  "sign: give this type its own overload");
    std::uint64_t words[sizeof(T) / 8];
    std::memcpy(words, &value, sizeof(T));
    out.insert(out.end(), std::begin(words), std::end(words));
  }
}

inline void sign(Signature& out, const RowLossParams& p) {
  sign(out, p.kind);
  sign(out, p.from_logits);
  sign(out, p.label_smoothing);
  sign(out, p.denominator);
  sign(out, p.delta);
}

/// A step's shape as the backend has seen it: how often, and its CUDA graph once captured.
struct StepGraph {
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { reset(); }
  void reset() noexcept {
    if (exec != nullptr) static_cast<void>(cudaGraphExecDestroy(exec));
    exec = nullptr;
    signature.clear();
  }
  Signature signature;             // of the work the graph holds
  cudaGraphExec_t exec = nullptr;  // null until captured
  std::size_t seen = 0;            // steps begun with this key
  std::uint64_t last_used = 0;     // the backend's step count when one last began
  std::size_t captures = 0;
  std::size_t fallbacks = 0;
  bool eager = false;  // its steps are no longer recorded
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
  explicit CudaBackend(int device = 0, CudaOptions options = {}) : options_(options) {
    if (device < 0) {
      throw ConfigError("cuda backend: the device index must be at least 0 but is " +
                        std::to_string(device));
    }
    if (options_.convolution == Convolution::cudnn && !has_cudnn) {
      throw ConfigError(
          "cuda backend: CudaOptions::convolution is Convolution::cudnn but this build has no "
          "cuDNN (Meson's -Dcudnn found no cudnn.h and libcudnn beside the CUDA toolkit)");
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
      context_->flush = [this](const std::string& why) { flush_recording(why); };
    } catch (const CudaError& error) {
      throw CudaError("cuda backend on cuda:" + std::to_string(device) +
                      ": cannot start: " + error.what());
    }
  }

  ~CudaBackend() override {
    abandon_step();
    context_->flush = nullptr;
    // Results nobody has read yet stay readable after the backend is gone.
    try {
      results_->read_back();
    } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device is reported by its reader
    }
    graphs_.clear();
    if (scratch_ != nullptr) context_->free(scratch_);
    free_tables(update_tables_);
    free_tables(fill_tables_);
    for (void* memory : {step_scratch_, row_indices_, static_cast<void*>(step_results_),
                         static_cast<void*>(step_scalars_)})
      if (memory != nullptr) context_->free(memory);
    for (const auto& slot : scratch_slots_)
      if (slot.memory != nullptr) context_->free(slot.memory);
    if (cudnn_workspace_ != nullptr) context_->free(cudnn_workspace_);
  }

  /// How many times `host_kernel` has staged device tensors through the host (a test counts that
  /// a training step makes none).
  std::size_t host_kernel_calls() const noexcept { return host_kernel_calls_; }

  /// What the steps did: how many ran kernel by kernel, were captured as CUDA graphs, or replayed
  /// one (`CudaOptions::graphs`).
  const GraphStats& graph_stats() const noexcept { return stats_; }

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
    active_stream("an upload (copy_from_host)");
    context_->upload(tensor.data(), host.data(), host.bytes());
  }

  /// `write` fills the next page-locked upload buffer itself (a batch converted straight into
  /// it), which is then copied to `tensor`: one host copy fewer than `copy_from_host`.
  void upload(const Tensor<float>& staging, const Tensor<float>& tensor,
              keras::HostKernelRef write) override {
    expect_host("upload", staging);
    expect("upload", {&tensor});
    LOADSTAR_ASSERT(staging.size() == tensor.size(), "upload: sizes differ");
    if (tensor.empty()) {
      write(std::span<const Tensor<float>>(&staging, 1));
      return;
    }
    active_stream("an upload");
    context_->upload_with(tensor.data(), tensor.bytes(), [&](void* pinned) {
      const Tensor<float> view =
          Tensor<float>::wrap(static_cast<float*>(pinned), tensor.shape(), nullptr);
      write(std::span<const Tensor<float>>(&view, 1));
    });
  }

  void copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) override {
    expect_host("copy_to_host", host);
    expect("copy_to_host", {&tensor});
    LOADSTAR_ASSERT(host.size() == tensor.size(), "copy_to_host: sizes differ");
    if (host.empty()) return;
    const cudaStream_t s = active_stream("a download (copy_to_host)");
    void* staging = context_->download.reserve(host.bytes());  // its last copy has been waited for
    check(cudaMemcpyAsync(staging, tensor.data(), host.bytes(), cudaMemcpyDeviceToHost, s),
          "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    std::memcpy(host.data(), staging, host.bytes());
  }

  void synchronize() override {
    check(cudaStreamSynchronize(active_stream("a wait (synchronize)")), "cudaStreamSynchronize");
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
    const cudaStream_t s = active_stream("a host computation (host_kernel)");
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

  // --- Steps as CUDA graphs --------------------------------------------------------------------

  /// Begins a step of shape `key`: its first step runs kernel by kernel (it allocates and plans);
  /// later ones are recorded (`CudaOptions::graphs`): each call's arguments are noted and its work
  /// kept on the host until `end_step`, which launches the shape's graph when the step's work
  /// is the graph's, and captures a graph of it otherwise.
  void begin_step(std::uint64_t key) override {
    abandon_step();
    if (!options_.graphs) {
      ++stats_.eager;
      return;
    }
    detail::StepGraph& graph = graphs_[key];
    ++graph.seen;
    graph.last_used = ++steps_begun_;
    if (graphs_.size() > max_shapes) forget_oldest_shape();
    if (graph.eager || graph.seen < 2) {
      ++stats_.eager;
      return;
    }
    // Room for the step's results without a read-back mid-step, and the memory the recorded
    // work reads its results area and its scalars from, allocated before recording begins.
    if (results_->room() < step_result_records) results_->read_back();
    context_->activate();
    if (step_scalars_ == nullptr) {
      step_scalars_ = static_cast<std::uint64_t*>(
          context_->allocate(step_scalar_words * sizeof(std::uint64_t), "a step's scalars"));
    }
    if (step_results_ == nullptr) {
      step_results_ = static_cast<double*>(context_->allocate(
          step_result_records * detail::ResultRing::record_doubles * sizeof(double),
          "a step's loss and metric results"));
    }
    step_ = &graph;
    context_->recording = true;
  }

  /// Queues the recorded step's work: the graph launched (captured first when there is none or
  /// the step's work differs from it), after the step's scalars are uploaded; its results are
  /// then copied into the result ring.
  void end_step() override {
    if (!context_->recording) {
      clear_step();
      return;
    }
    detail::StepGraph& graph = *step_;
    context_->recording = false;
    const StepCleanup cleanup(*this);
    bool captured = false;
    if (graph.exec == nullptr || graph.signature != signature_) captured = capture(graph);
    queue_recorded(graph.exec);
    if (graph.exec != nullptr) ++(captured ? stats_.captured : stats_.replayed);
  }

  /// Queues what a step that threw had recorded, kernel by kernel; never throws.
  void abandon_step() noexcept override {
    try {
      flush_recording("an exception");
    } catch (...) {  // NOLINT(bugprone-empty-catch): the step's own exception is the one to see
    }
    release_deferred_frees();
    clear_step();
  }

  /// One host thread queues the work.
  std::size_t threads() const noexcept override { return 1; }

  /// How many cuDNN convolutions were queued or recorded (`Convolution::cudnn`; a replayed graph
  /// adds none): 0 where every geometry took im2col.
  std::size_t cudnn_calls() const noexcept { return cudnn_calls_; }

  // --- Optimizers, losses and metrics ----------------------------------------------------------

  /// One kernel launch over every element of every variable (`detail::update_flat`), from a
  /// device table of the variables' pointers and sizes, uploaded at the first step of each set
  /// of variables and kept (`device_table`); norm clipping adds two launches (segment sums of
  /// squares in double, then one thread adding them in a fixed order). Nothing is allocated after
  /// the first step and nothing waits for the device.
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
    const detail::UpdateTarget* targets =
        device_table(update_tables_, table_, "an optimizer's variable table");
    const float* scales = nullptr;
    if (step.clipping == keras::GradientClipping::by_norm ||
        step.clipping == keras::GradientClipping::by_global_norm) {
      auto* partials = static_cast<double*>(
          step_scratch(segments * sizeof(double) + table_.size() * sizeof(float)));
      auto* scale_memory = reinterpret_cast<float*>(partials + segments);
      launch("clip_scales", detail::launch_clip_scales, targets, table_.size(), segments, partials,
             step.clipping == keras::GradientClipping::by_global_norm, step.clip_threshold,
             scale_memory);
      scales = scale_memory;
    }
    // The step's hyper-parameters (the learning rate and Adam's bias corrections change from step
    // to step): read from device memory by a recorded step, so that its graph replays with them.
    const detail::UpdateParams params = detail::update_params(step);
    const detail::UpdateParams* device_params = nullptr;
    if (context_->recording) device_params = step_scalar(params);
    const std::size_t count = table_.size();
    enqueue({detail::word("optimizer_step"), detail::word(targets), detail::word(count),
             detail::word(elements), detail::word(device_params), detail::word(scales)},
            [this, targets, count, elements, params, device_params, scales](cudaStream_t s) {
              launched(detail::launch_optimizer_step(s, targets, count, elements, params,
                                                     device_params, scales),
                       "optimizer_step");
            });
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
    p.kind = spec.kind;
    p.from_logits = spec.from_logits;
    p.label_smoothing = spec.label_smoothing;
    p.delta = spec.delta;
    p.denominator = spec.denominator;
    double* terms = reduction_terms(d.values, 1);
    auto [ring_record, cell] = results_->acquire();
    double* record = step_result(ring_record);
    enqueue({detail::word("row_loss: clear the first bad label"), detail::word(record)},
            [record](cudaStream_t s) {
              check(cudaMemsetAsync(record + 1, 0xFF, sizeof(double), s), "cudaMemsetAsync");
            });
    launch("row_loss", detail::launch_row_loss, p, d, y_true.data(), y_pred.data(), or_null(weight),
           or_null(gradient), terms, terms + d.values, record);
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
    double* terms = reduction_terms(d.values, 2);
    auto [ring_record, cell] = results_->acquire();
    double* record = step_result(ring_record);
    launch("mean_metric", detail::launch_mean_metric, spec.kind, spec.threshold, d, y_true.data(),
           y_pred.data(), or_null(weight), terms, terms + 2 * d.values, record);
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
    // Row-major X is column-major X^T, so C^T = op(B)^T * op(A)^T is one column-major GEMM of
    // the same buffers with the operands swapped.
    const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int rows = to_int(n, "gemm"), columns = to_int(m, "gemm"), inner = to_int(k, "gemm");
    const int ldb = to_int(b_cols, "gemm"), lda = to_int(a_cols, "gemm");
    const float* b_data = b.data();
    const float* a_data = a.data();
    float* c_data = c.data();
    enqueue({detail::word("gemm"), detail::word(op_b), detail::word(op_a), detail::word(rows),
             detail::word(columns), detail::word(inner), detail::word(alpha), detail::word(beta),
             detail::word(b_data), detail::word(ldb), detail::word(a_data), detail::word(lda),
             detail::word(c_data)},
            [=, this](cudaStream_t) {
              // cuBLAS queues on the context's stream (cublasSetStream).
              check(cublasSgemm(context_->cublas, op_b, op_a, rows, columns, inner, &alpha, b_data,
                                ldb, a_data, lda, &beta, c_data, rows),
                    "cublasSgemm");
            });
  }

  void bias_add(const Tensor<float>& x, const Tensor<float>& bias) override {
    expect("bias_add", {&x, &bias});
    LOADSTAR_ASSERT(bias.size() > 0 && x.size() % bias.size() == 0, "bias_add: sizes do not fit");
    launch("bias_add", detail::launch_bias_add, x.data(), x.size(), bias.data(), bias.size());
  }

  void column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) override {
    expect("column_sums", {&x, &out});
    const std::size_t n = out.size();
    LOADSTAR_ASSERT(n > 0 && x.size() % n == 0, "column_sums: sizes do not fit");
    const std::size_t rows = x.size() / n;
    double* scratch = reduction_scratch(rows, n);
    launch("column_sums", detail::launch_column_sums, x.data(), out.data(), rows, n, beta, scratch);
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
    if (!queue_matmul("dense_forward", {units, rows, features, epilogue}, kernel.data(), x.data(),
                      or_null(bias), y.data()))
      return false;
    if (!relu && activation != keras::Activation::linear) activation_forward(activation, y, y);
    return true;
  }

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

  /// One cuBLASLt multiplication with the bias gradient in its epilogue: the row-major
  /// `dkernel = x^T * dz` is the column-major `dkernel^T (units x features) = dz^T * x`, whose
  /// `A` is `dz^T` (units x rows): the bias gradient is `A`'s sums over the rows (`BGRADA`).
  /// Declines (the layer's `gemm` and `column_sums`) without a bias, beyond
  /// `max_bias_epilogue_rows` rows, or where cuBLASLt has no algorithm for the shape.
  bool dense_weight_gradients(const Tensor<float>& x, const Tensor<float>& dz,
                              const Tensor<float>& dkernel, const Tensor<float>& dbias) override {
    expect("dense_weight_gradients", {&x, &dz, &dkernel, &dbias});
    const std::size_t rows = x.rows(), features = x.row_size(), units = dz.row_size();
    LOADSTAR_ASSERT(dz.rows() == rows && dkernel.size() == features * units &&
                        (dbias.empty() || dbias.size() == units),
                    "dense_weight_gradients: shapes do not fit");
    if (dbias.empty() || rows == 0 || units == 0 || features == 0) return false;
    if (rows > max_bias_epilogue_rows) return false;
    return queue_matmul("dense_weight_gradients",
                        {units, features, rows, CUBLASLT_EPILOGUE_BGRADA, true}, dz.data(),
                        x.data(), dbias.data(), dkernel.data());
  }

  /// The bit mask's leading dimension for `units` rows of the column-major output: a multiple
  /// of 128 bits (`Backend::relu_mask_shape`).
  static std::uint64_t relu_mask_ld(std::size_t units) noexcept {
    return (units + 127) / 128 * 128;
  }

  /// `dense_forward`'s multiplication with the `RELU_AUX_BIAS` epilogue: the bias and ReLU, and
  /// the ReLU's bit mask written into `mask`. Declines where cuBLASLt has no algorithm.
  bool dense_forward_relu_mask(const Tensor<float>& x, const Tensor<float>& kernel,
                               const Tensor<float>& bias, const Tensor<float>& y,
                               const Tensor<float>& mask) override {
    expect("dense_forward_relu_mask", {&x, &kernel, &bias, &y, &mask});
    const std::size_t rows = x.rows(), features = x.row_size(), units = kernel.row_size();
    LOADSTAR_ASSERT(kernel.rows() == features && y.rows() == rows && y.row_size() == units &&
                        bias.size() == units &&
                        mask.shape() == keras::Backend::relu_mask_shape(rows, units),
                    "dense_forward_relu_mask: shapes do not fit");
    if (rows == 0 || units == 0 || features == 0) return false;
    return queue_matmul("dense_forward_relu_mask",
                        {.m = units,
                         .n = rows,
                         .k = features,
                         .epilogue = CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
                         .aux_ld = relu_mask_ld(units)},
                        kernel.data(), x.data(), bias.data(), y.data(), mask.data());
  }

  /// The row-major `dx = dz * kernel^T` is the column-major `dx^T (features x rows) = kernel'^T
  /// * dz^T`, where `kernel'` is the row-major kernel read column-major (`units x features`,
  /// transposed: `A`) and `dz^T` is `dz` read column-major (`B`): one cuBLASLt multiplication with
  /// the `DRELU_BGRAD` epilogue, whose output rows are the previous layer's units (the mask's and
  /// the bias gradient's). Declines where cuBLASLt has no algorithm.
  bool dense_input_gradient_relu(const Tensor<float>& dz, const Tensor<float>& kernel,
                                 const Tensor<float>& mask, const Tensor<float>& dx,
                                 const Tensor<float>& dbias) override {
    expect("dense_input_gradient_relu", {&dz, &kernel, &mask, &dx, &dbias});
    const std::size_t rows = dz.rows(), units = dz.row_size(), features = kernel.rows();
    LOADSTAR_ASSERT(kernel.row_size() == units && dx.rows() == rows && dx.row_size() == features &&
                        dbias.size() == features &&
                        mask.shape() == keras::Backend::relu_mask_shape(rows, features),
                    "dense_input_gradient_relu: shapes do not fit");
    if (rows == 0 || units == 0 || features == 0) return false;
    return queue_matmul("dense_input_gradient_relu",
                        {.m = features,
                         .n = rows,
                         .k = units,
                         .epilogue = CUBLASLT_EPILOGUE_DRELU_BGRAD,
                         .transpose_a = true,
                         .aux_ld = relu_mask_ld(features)},
                        kernel.data(), dz.data(), dbias.data(), dx.data(), mask.data());
  }

  // --- Elementwise --------------------------------------------------------------------------

  void fill(const Tensor<float>& x, float value) override {
    expect("fill", {&x});
    launch("fill", detail::launch_fill, x.data(), x.size(), value);
  }

  /// One kernel over every tensor, from a device table of their pointers and sizes, uploaded the
  /// first time these tensors are filled together and kept (`device_table`).
  void fill_many(std::span<const Tensor<float>> tensors, float value) override {
    fill_table_.clear();  // keeps its capacity
    std::size_t elements = 0;
    for (const auto& t : tensors) {
      expect("fill_many", {&t});
      if (t.empty()) continue;
      fill_table_.push_back({t.data(), t.size(), elements});
      elements += t.size();
    }
    if (elements == 0) return;
    if (fill_table_.size() == 1) {
      launch("fill", detail::launch_fill, fill_table_[0].data, fill_table_[0].size, value);
      return;
    }
    launch("fill_many", detail::launch_fill_many,
           device_table(fill_tables_, fill_table_, "a fill table"), fill_table_.size(), elements,
           value);
  }

  void copy(const Tensor<float>& x, const Tensor<float>& y) override {
    expect("copy", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "copy: sizes differ");
    if (x.data() == y.data() || x.empty()) return;
    float* to = y.data();
    const float* from = x.data();
    const std::size_t bytes = x.bytes();
    enqueue({detail::word("copy"), detail::word(to), detail::word(from), detail::word(bytes)},
            [to, from, bytes](cudaStream_t s) {
              check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, s),
                    "cudaMemcpyAsync (device to device)");
            });
  }

  void scale(const Tensor<float>& x, float alpha) override {
    expect("scale", {&x});
    launch("scale", detail::launch_scale, x.data(), x.size(), alpha);
  }

  void axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) override {
    expect("axpy", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "axpy: sizes differ");
    launch("axpy", detail::launch_axpy, alpha, x.data(), y.data(), x.size());
  }

  void add(const Tensor<float>& a, const Tensor<float>& b, const Tensor<float>& out) override {
    expect("add", {&a, &b, &out});
    LOADSTAR_ASSERT(a.size() == b.size() && a.size() == out.size(), "add: sizes differ");
    launch("add", detail::launch_add, a.data(), b.data(), out.data(), a.size());
  }

  void activation_forward(keras::Activation kind, const Tensor<float>& x,
                          const Tensor<float>& y) override {
    expect("activation_forward", {&x, &y});
    LOADSTAR_ASSERT(x.size() == y.size(), "activation_forward: sizes differ");
    if (kind == keras::Activation::softmax) {
      softmax_forward(x, y, x.rank() == 0 ? 0 : x.rank() - 1);
      return;
    }
    launch("activation_forward", detail::launch_activation_forward, kind, x.data(), y.data(),
           x.size());
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
    launch("activation_backward", detail::launch_activation_backward, kind,
           needs_x ? x.data() : nullptr, y.data(), dy.data(), dx.data(), y.size());
  }

  void relu_forward(const Tensor<float>& x, const Tensor<float>& y, std::optional<float> max_value,
                    float negative_slope, float threshold) override {
    expect("relu_forward", {&x, &y});
    launch("relu_forward", detail::launch_relu_forward, x.data(), y.data(), x.size(),
           max_value.value_or(std::numeric_limits<float>::infinity()), negative_slope, threshold);
  }

  void relu_backward(const Tensor<float>& x, const Tensor<float>& dy, const Tensor<float>& dx,
                     std::optional<float> max_value, float negative_slope,
                     float threshold) override {
    expect("relu_backward", {&x, &dy, &dx});
    launch("relu_backward", detail::launch_relu_backward, x.data(), dy.data(), dx.data(), x.size(),
           max_value.value_or(std::numeric_limits<float>::infinity()), negative_slope, threshold);
  }

  void softmax_forward(const Tensor<float>& x, const Tensor<float>& y, std::size_t axis) override {
    expect("softmax_forward", {&x, &y});
    const auto v = keras::detail::axis_view(x.shape(), axis);
    launch("softmax_forward", detail::launch_softmax_forward, x.data(), y.data(), v.outer, v.length,
           v.inner);
  }

  void softmax_backward(const Tensor<float>& y, const Tensor<float>& dy, const Tensor<float>& dx,
                        std::size_t axis) override {
    expect("softmax_backward", {&y, &dy, &dx});
    const auto v = keras::detail::axis_view(y.shape(), axis);
    launch("softmax_backward", detail::launch_softmax_backward, y.data(), dy.data(), dx.data(),
           v.outer, v.length, v.inner);
  }

  void dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
               std::uint64_t key) override {
    expect("dropout", {&x, &y});
    if (rate <= 0.0F) {
      copy(x, y);
      return;
    }
    const float keep_scale = rate < 1.0F ? 1.0F / (1.0F - rate) : 0.0F;
    // The key changes from step to step: a recorded step reads it from device memory.
    const std::uint64_t* device_key = context_->recording ? step_scalar(key) : nullptr;
    float* out = y.data();
    const float* in = x.data();
    const std::size_t n = x.size();
    enqueue({detail::word("dropout"), detail::word(in), detail::word(out), detail::word(n),
             detail::word(rate), detail::word(device_key)},
            [this, in, out, n, rate, keep_scale, key, device_key](cudaStream_t s) {
              launched(detail::launch_dropout(s, in, out, n, rate, keep_scale, key, device_key),
                       "dropout");
            });
  }

  // --- Convolution and pooling -----------------------------------------------------------------

  /// `Backend::conv2d_forward`'s im2col and GEMM, with the columns in the backend's scratch
  /// memory (allocated at the first step and reused) instead of a tensor per call, and the bias
  /// and ReLU in the GEMM's epilogue (`dense_forward`).
  void conv2d_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                      const Tensor<float>& kernel, const Tensor<float>& bias,
                      keras::Activation activation, const Tensor<float>& y) override {
    if (cudnn_forward(x, g, kernel, bias, activation, y)) return;
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    const Tensor<float> columns = scratch_tensor(0, {rows, g.patch_size()});
    im2col(x, g, columns);
    const Tensor<float> z = y.reshape({rows, kernel.row_size()});
    // The columns times the kernel is a Dense layer's product: one cuBLASLt multiplication with
    // the bias and a ReLU in its epilogue where cuBLASLt has an algorithm for the shape.
    if (dense_forward(columns, kernel, bias, activation, z)) return;
    gemm(columns, false, kernel, false, z, 1.0F, 0.0F);
    if (!bias.empty()) bias_add(z, bias);
    if (activation != keras::Activation::linear) activation_forward(activation, z, z);
  }

  /// `Backend::conv2d_backward` with its temporaries in the backend's scratch memory, and written
  /// weight gradients from `dense_weight_gradients`.
  void conv2d_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                       const Tensor<float>& kernel, const Tensor<float>& bias,
                       keras::Activation activation, const Tensor<float>& y,
                       const Tensor<float>& dy, const Tensor<float>& dkernel,
                       const Tensor<float>& dbias, const Tensor<float>& dx,
                       bool accumulate) override {
    if (!accumulate && cudnn_backward(x, g, kernel, bias, activation, y, dy, dkernel, dbias, dx))
      return;
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    const std::size_t filters = kernel.row_size();
    const Tensor<float> columns = scratch_tensor(0, {rows, g.patch_size()});
    // Many rows and few weights (a first convolution at a large batch): the weight gradients as
    // one column reduction over the input, instead of the unfolded columns and a split-K GEMM.
    const bool reduce =
        rows >= min_reduction_rows && g.patch_size() * filters <= max_reduction_weights;
    if (reduce) {
      expect("conv2d_backward", {&x, &kernel, &dy, &dkernel, &dbias});
    } else {
      im2col(x, g, columns);
    }
    Tensor<float> dz = dy.reshape({rows, filters});
    if (activation != keras::Activation::linear) {
      Tensor<float> z;
      if (keras::activation_gradient_needs_input(activation)) {
        z = scratch_tensor(1, {rows, filters});
        gemm(columns, false, kernel, false, z, 1.0F, 0.0F);
        if (!bias.empty()) bias_add(z, bias);
      }
      const Tensor<float> gradient = scratch_tensor(2, {rows, filters});
      activation_backward(activation, z, y.reshape({rows, filters}), dz, gradient);
      dz = gradient;
    }
    if (reduce) {
      const std::size_t terms = (g.patch_size() + (dbias.empty() ? 0 : 1)) * filters;
      launch("conv_weight_gradients", detail::launch_conv_weight_gradients, x.data(), g, dz.data(),
             filters, dkernel.data(), dbias.empty() ? nullptr : dbias.data(), accumulate,
             reduction_scratch(rows, terms));
    } else {
      // Written gradients: the bias gradient in the kernel gradient's product where cuBLASLt
      // has an algorithm (as `Dense`).
      weight_gradients(columns, dz, dkernel.reshape(kernel.shape()), dbias, accumulate);
    }
    if (!dx.empty()) {
      gemm(dz, false, kernel, true, columns, 1.0F, 0.0F);
      col2im(columns, g, dx);
    }
  }

#if LOADSTAR_CUDA_WITH_CUDNN
  /// With `Convolution::cudnn`: the kernel transposed into cuDNN's filter layout, cuDNN's
  /// forward convolution, then the bias and the activation; false where cuDNN does not run `g`
  /// (im2col then).
  bool cudnn_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                     const Tensor<float>& kernel, const Tensor<float>& bias,
                     keras::Activation activation, const Tensor<float>& y) {
    const detail::CudnnConvolution* conv = cudnn_convolution(g);
    if (conv == nullptr) return false;
    expect("conv2d_forward", {&x, &kernel, &bias, &y});
    const Tensor<float> filter = cudnn_filter(kernel, g);
    queue_cudnn("cudnn_forward", conv, &detail::CudnnConvolution::forward, x.data(), filter.data(),
                y.data());
    const Tensor<float> z = y.reshape({g.batch * g.out_h * g.out_w, g.out_c});
    if (!bias.empty()) bias_add(z, bias);
    if (activation != keras::Activation::linear) activation_forward(activation, z, z);
    return true;
  }

  /// With `Convolution::cudnn`: the activation's gradient, cuDNN's filter gradient transposed
  /// back into the kernel's layout, the bias gradient (`column_sums`) and cuDNN's input gradient,
  /// all written; false where cuDNN does not run `g` (im2col then).
  bool cudnn_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                      const Tensor<float>& kernel, const Tensor<float>& bias,
                      keras::Activation activation, const Tensor<float>& y, const Tensor<float>& dy,
                      const Tensor<float>& dkernel, const Tensor<float>& dbias,
                      const Tensor<float>& dx) {
    const detail::CudnnConvolution* conv = cudnn_convolution(g);
    if (conv == nullptr) return false;
    expect("conv2d_backward", {&x, &kernel, &y, &dy, &dkernel});
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    Tensor<float> dz = dy.reshape({rows, g.out_c});
    const bool recompute = activation != keras::Activation::linear &&
                           keras::activation_gradient_needs_input(activation);
    // The filter, transposed once for the pre-activation's recomputation and the input gradient.
    const Tensor<float> filter =
        recompute || !dx.empty() ? cudnn_filter(kernel, g) : Tensor<float>();
    if (activation != keras::Activation::linear) {
      Tensor<float> z;
      if (recompute) {
        z = scratch_tensor(1, {rows, g.out_c});
        queue_cudnn("cudnn_forward", conv, &detail::CudnnConvolution::forward, x.data(),
                    filter.data(), z.data());
        if (!bias.empty()) bias_add(z, bias);
      }
      const Tensor<float> gradient = scratch_tensor(2, {rows, g.out_c});
      activation_backward(activation, z, y.reshape({rows, g.out_c}), dz, gradient);
      dz = gradient;
    }
    const Tensor<float> dfilter = scratch_tensor(3, {g.out_c, g.patch_size()});
    queue_cudnn("cudnn_backward_filter", conv, &detail::CudnnConvolution::backward_filter, x.data(),
                dz.data(), dfilter.data());
    constexpr std::array<std::size_t, 2> swap{1, 0};
    permute(dfilter, swap, dkernel.reshape({g.patch_size(), g.out_c}));
    if (!dbias.empty()) column_sums(dz, dbias, 0.0F);
    if (!dx.empty()) {
      queue_cudnn("cudnn_backward_data", conv, &detail::CudnnConvolution::backward_data,
                  filter.data(), dz.data(), dx.data());
    }
    return true;
  }
#else
  bool cudnn_forward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                     const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                     keras::Activation /*activation*/, const Tensor<float>& /*y*/) {
    return false;
  }
  bool cudnn_backward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                      const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                      keras::Activation /*activation*/, const Tensor<float>& /*y*/,
                      const Tensor<float>& /*dy*/, const Tensor<float>& /*dkernel*/,
                      const Tensor<float>& /*dbias*/, const Tensor<float>& /*dx*/) {
    return false;
  }
#endif

  void im2col(const Tensor<float>& x, const keras::Conv2DGeometry& g,
              const Tensor<float>& columns) override {
    expect("im2col", {&x, &columns});
    LOADSTAR_ASSERT(columns.size() == g.batch * g.out_h * g.out_w * g.patch_size(),
                    "im2col: columns have the wrong size");
    launch("im2col", detail::launch_im2col, x.data(), g, columns.data());
  }

  void col2im(const Tensor<float>& columns, const keras::Conv2DGeometry& g,
              const Tensor<float>& dx) override {
    expect("col2im", {&columns, &dx});
    launch("col2im", detail::launch_col2im, columns.data(), g, dx.data());
  }

  void max_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    expect("max_pool_forward", {&x, &y});
    launch("max_pool_forward", detail::launch_max_pool_forward, x.data(), g, y.data());
  }

  void max_pool_backward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                         const Tensor<float>& dy, const Tensor<float>& dx) override {
    expect("max_pool_backward", {&x, &dy, &dx});
    launch("max_pool_backward", detail::launch_max_pool_backward, x.data(), g, dy.data(), dx.data(),
           false);
  }

  /// The max pooling gradient and the ReLU's before it in one kernel (`ReluGradientFusion`).
  bool max_pool_backward_relu(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                              const Tensor<float>& dy, const Tensor<float>& dx) override {
    expect("max_pool_backward_relu", {&x, &dy, &dx});
    launch("max_pool_backward_relu", detail::launch_max_pool_backward, x.data(), g, dy.data(),
           dx.data(), true);
    return true;
  }

  void avg_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                        const Tensor<float>& y) override {
    expect("avg_pool_forward", {&x, &y});
    launch("avg_pool_forward", detail::launch_avg_pool_forward, x.data(), g, y.data());
  }

  void avg_pool_backward(const keras::Pool2DGeometry& g, const Tensor<float>& dy,
                         const Tensor<float>& dx) override {
    expect("avg_pool_backward", {&dy, &dx});
    launch("avg_pool_backward", detail::launch_avg_pool_backward, g, dy.data(), dx.data());
  }

  void global_pool_forward(const Tensor<float>& x, bool max, const Tensor<float>& y) override {
    expect("global_pool_forward", {&x, &y});
    const std::size_t channels = x.shape()[x.rank() - 1];
    launch("global_pool_forward", detail::launch_global_pool_forward, x.data(), max, y.data(),
           x.rows(), x.row_size() / channels, channels);
  }

  void global_pool_backward(const Tensor<float>& x, bool max, const Tensor<float>& dy,
                            const Tensor<float>& dx) override {
    expect("global_pool_backward", {&x, &dy, &dx});
    const std::size_t channels = x.shape()[x.rank() - 1];
    launch("global_pool_backward", detail::launch_global_pool_backward, x.data(), max, dy.data(),
           dx.data(), x.rows(), x.row_size() / channels, channels);
  }

  // --- Normalisation -----------------------------------------------------------------------------

  void moments(const Tensor<float>& x, const Tensor<float>& mean,
               const Tensor<float>& variance) override {
    expect("moments", {&x, &mean, &variance});
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    double* scratch = reduction_scratch(n, c);
    launch("moments", detail::launch_moments, x.data(), mean.data(), variance.data(), n, c,
           scratch);
  }

  void batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                          const Tensor<float>& variance, const Tensor<float>& gamma,
                          const Tensor<float>& beta, float epsilon,
                          const Tensor<float>& y) override {
    expect("batch_norm_forward", {&x, &mean, &variance, &gamma, &beta, &y});
    const std::size_t c = mean.size();
    launch("batch_norm_forward", detail::launch_batch_norm_forward, x.data(), mean.data(),
           variance.data(), or_null(gamma), or_null(beta), epsilon, y.data(), x.size() / c, c);
  }

  void batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                           const Tensor<float>& variance, const Tensor<float>& gamma, float epsilon,
                           bool training, const Tensor<float>& dy, const Tensor<float>& dx,
                           const Tensor<float>& dgamma, const Tensor<float>& dbeta) override {
    expect("batch_norm_backward", {&x, &mean, &variance, &gamma, &dy, &dx, &dgamma, &dbeta});
    const std::size_t c = mean.size();
    const std::size_t n = x.size() / c;
    double* scratch = reduction_scratch(n, c);
    launch("batch_norm_backward", detail::launch_batch_norm_backward, x.data(), mean.data(),
           variance.data(), or_null(gamma), epsilon, training, dy.data(), or_null(dx),
           or_null(dgamma), or_null(dbeta), n, c, scratch);
  }

  void moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                      float momentum) override {
    expect("moving_average", {&moving, &value});
    launch("moving_average", detail::launch_moving_average, moving.data(), value.data(),
           moving.size(), momentum);
  }

  // --- Indexing and layout
  // -------------------------------------------------------------------------

  /// Finds the first bad index on the device and reads back only its position (one small copy
  /// and a wait per call), then gathers.
  std::optional<keras::BadIndex> gather(const Tensor<float>& indices, const Tensor<float>& table,
                                        const Tensor<float>& out) override {
    expect("gather", {&indices, &table, &out});
    if (indices.empty()) return std::nullopt;
    const cudaStream_t s = active_stream("gather's check of the indices");
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

  /// Rows from `offset` on: one device-to-device copy. Rows by index: the indices uploaded
  /// (page-locked, in stream order, `rows.size()` 64-bit words), then one gather kernel.
  void copy_rows(const Tensor<float>& source, std::span<const std::size_t> rows, std::size_t offset,
                 const Tensor<float>& target) override {
    expect("copy_rows", {&source, &target});
    const std::size_t count = target.rows();
    const std::size_t width = target.row_size();
    LOADSTAR_ASSERT(source.row_size() == width && (rows.empty() || rows.size() >= count),
                    "copy_rows: shapes do not fit");
    if (count == 0 || width == 0) return;
    if (rows.empty()) {
      copy(source.slice_rows(offset, offset + count), target);
      return;
    }
    static_assert(sizeof(std::size_t) == sizeof(std::uint64_t));
    const cudaStream_t s = active_stream("copy_rows");
    const std::size_t bytes = count * sizeof(std::uint64_t);
    auto* indices = static_cast<std::uint64_t*>(
        grow(row_indices_, row_indices_bytes_, bytes, "a batch's row indices"));
    context_->upload(indices, rows.data(), bytes);
    launched(detail::launch_gather_rows(s, indices, count, source.data(), width, target.data()),
             "gather_rows");
  }

  void scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                   const Tensor<float>& table_gradient) override {
    expect("scatter_add", {&indices, &dy, &table_gradient});
    launch("scatter_add", detail::launch_scatter_add, indices.data(), indices.size(), dy.data(),
           table_gradient.row_size(), table_gradient.data());
  }

  /// Strided copies (`cudaMemcpy2DAsync`), one per part.
  void concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                   const Tensor<float>& out) override {
    expect("concatenate", {&out});
    const std::size_t outer = keras::detail::axis_view(out.shape(), axis).outer;
    if (outer == 0) return;
    const std::size_t out_inner = out.size() / outer;
    std::size_t offset = 0;
    for (const auto& part : parts) {
      expect("concatenate", {&part});
      const std::size_t inner = part.size() / outer;
      if (inner > 0) strided_copy(out.data() + offset, out_inner, part.data(), inner, inner, outer);
      offset += inner;
    }
  }

  void split(const Tensor<float>& x, std::size_t axis, std::span<const std::size_t> extents,
             std::span<const Tensor<float>> parts) override {
    expect("split", {&x});
    const auto v = keras::detail::axis_view(x.shape(), axis);
    if (v.outer == 0) return;
    const std::size_t x_inner = v.length * v.inner;
    std::size_t offset = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const std::size_t inner = extents[p] * v.inner;
      if (!parts[p].empty() && inner > 0) {
        expect("split", {&parts[p]});
        strided_copy(parts[p].data(), inner, x.data() + offset, x_inner, inner, v.outer);
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
    launch("permute", detail::launch_permute, x.data(), y.data(), d, y.size());
  }

 private:
  /// The stream, for work queued directly (copies to and from the host, waits, host kernels):
  /// the work of a step being recorded is queued first, and the rest of that step runs kernel
  /// by kernel.
  cudaStream_t active_stream(const char* call) {
    if (context_->recording) flush_recording(call);
    context_->activate();
    return context_->stream;
  }

  /// Plans the cuBLASLt multiplication of `key` (its `alignment` that of the pointers) and queues
  /// it, or records it while a step is recorded, as `name`; false, with nothing queued, where
  /// cuBLASLt has no algorithm for it. `bias` is the epilogue's vector (read, or written by a
  /// bias gradient), `aux` its ReLU bit mask.
  bool queue_matmul(const char* name, detail::LtPlans::Key key, const float* a, const float* b,
                    const float* bias, float* d, const void* aux = nullptr) {
    key.alignment = detail::LtPlans::alignment({a, b, d, bias, aux});
    const detail::LtPlans::Plan* plan = lt_->plan(key);
    if (plan == nullptr) return false;
    enqueue({detail::word(name), detail::word(plan), detail::word(a), detail::word(b),
             detail::word(bias), detail::word(d), detail::word(aux)},
            [this, plan, a, b, bias, d, aux](cudaStream_t s) {
              lt_->run(*plan, a, b, bias, d, s, aux);
            });
    return true;
  }

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
  double* step_result(double* record) {
    if (context_->recording && ring_records_.size() == step_result_records)
      flush_recording("more results than a step holds");
    if (!context_->recording) return record;
    ring_records_.push_back(record);
    return step_results_ + (ring_records_.size() - 1) * detail::ResultRing::record_doubles;
  }

  /// Captures the recorded work as `graph`'s CUDA graph; `false` (and the step's shape runs kernel
  /// by kernel from now on) when it cannot be captured or instantiated.
  bool capture(detail::StepGraph& graph) {
    graph.reset();
    const auto give_up = [&] {
      graph.eager = true;
      ++stats_.fallbacks;
      return false;
    };
    // A shape whose work keeps changing (buffers moved, scalars passed by value changed) is
    // captured a few times, then left to run kernel by kernel.
    if (graph.captures >= max_captures) return give_up();
    context_->activate();
    const cudaStream_t s = context_->stream;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    bool queued = true;
    try {
      for (auto& work : pending_)
        work(s);
    } catch (const CudaError&) {
      queued = false;  // run kernel by kernel below, where the error is reported if it stays
    }
    cudaGraph_t captured = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(s, &captured);
    cudaGraphExec_t exec = nullptr;
    bool ok = queued && ended == cudaSuccess && captured != nullptr &&
              cudaGraphInstantiate(&exec, captured, 0) == cudaSuccess;
    if (captured != nullptr) static_cast<void>(cudaGraphDestroy(captured));
    if (!ok) {
      static_cast<void>(cudaGetLastError());
      if (exec != nullptr) static_cast<void>(cudaGraphExecDestroy(exec));
      return give_up();
    }
    graph.exec = exec;
    graph.signature = signature_;
    ++graph.captures;
    return true;
  }

  /// Queues the recorded work kernel by kernel.
  void run_pending() {
    context_->activate();
    for (auto& work : pending_)
      work(context_->stream);
    pending_.clear();
  }

  /// Copies the step's results area into the ring records its results belong in (one copy per
  /// run of consecutive records).
  void copy_step_results() {
    constexpr std::size_t record_bytes = detail::ResultRing::record_doubles * sizeof(double);
    for (std::size_t j = 0; j < ring_records_.size();) {
      std::size_t n = 1;
      while (j + n < ring_records_.size() &&
             ring_records_[j + n] == ring_records_[j] + n * detail::ResultRing::record_doubles) {
        ++n;
      }
      check(
          cudaMemcpyAsync(ring_records_[j], step_results_ + j * detail::ResultRing::record_doubles,
                          n * record_bytes, cudaMemcpyDeviceToDevice, context_->stream),
          "cudaMemcpyAsync (device to device)");
      j += n;
    }
    ring_records_.clear();
  }

  /// Queues the work of the step being recorded, kernel by kernel, with its scalars and results,
  /// and lets the rest of the step run unrecorded (something in it cannot be captured: a host
  /// computation, an allocation, a wait). A shape that does this twice is no longer recorded.
  void flush_recording(const std::string& why) {
    if (!context_->recording) return;
    context_->recording = false;
    ++stats_.fallbacks;
    stats_.last_fallback = why;
    if (step_ != nullptr && ++step_->fallbacks >= 2) step_->eager = true;
    const StepCleanup cleanup(*this);
    queue_recorded(nullptr);
  }

  /// Queues the recorded step's work: its scalars' upload, then `exec` (its graph) or, when null,
  /// each recorded call, then the copy of its results into the result ring.
  void queue_recorded(cudaGraphExec_t exec) {
    context_->activate();
    if (!block_.empty()) {
      context_->upload(step_scalars_, block_.data(), block_.size() * sizeof(std::uint64_t));
    }
    if (exec != nullptr) {
      check(cudaGraphLaunch(exec, context_->stream), "cudaGraphLaunch");
    } else {
      run_pending();
    }
    copy_step_results();
  }

  /// Ends a recorded step's state however its queuing ends: what was freed while it recorded is
  /// given back (in stream order, after its work), and its records are cleared.
  struct StepCleanup {
    explicit StepCleanup(CudaBackend& owner) noexcept : backend(owner) {}
    StepCleanup(const StepCleanup&) = delete;
    StepCleanup& operator=(const StepCleanup&) = delete;
    ~StepCleanup() {
      backend.release_deferred_frees();
      backend.clear_step();
    }
    CudaBackend& backend;
  };

  /// Frees, in stream order, what was freed while the step recorded.
  void release_deferred_frees() noexcept {
    std::vector<void*> frees;
    frees.swap(context_->deferred_frees);
    for (void* memory : frees)
      context_->free(memory);
  }

  void clear_step() noexcept {
    pending_.clear();
    signature_.clear();
    block_.clear();
    ring_records_.clear();
    step_ = nullptr;
  }

  /// How often a shape's graph is captured again (its work changed) before it is given up.
  static constexpr std::size_t max_captures = 4;
  /// The shapes (models' steps of a kind and size) the backend keeps graphs of: past this, the
  /// one unused the longest is forgotten (a process that makes model after model on one backend).
  static constexpr std::size_t max_shapes = 64;

  void forget_oldest_shape() {
    auto oldest = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    graphs_.erase(oldest);  // never the current step's: it was used last
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

  /// `rows` rows of `width` floats from `from` (rows `from_pitch` floats apart) to `to` (rows
  /// `to_pitch` floats apart), on the device.
  void strided_copy(float* to, std::size_t to_pitch, const float* from, std::size_t from_pitch,
                    std::size_t width, std::size_t rows) {
    enqueue({detail::word("strided_copy"), detail::word(to), detail::word(to_pitch),
             detail::word(from), detail::word(from_pitch), detail::word(width), detail::word(rows)},
            [=](cudaStream_t s) {
              check(
                  cudaMemcpy2DAsync(to, to_pitch * sizeof(float), from, from_pitch * sizeof(float),
                                    width * sizeof(float), rows, cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpy2DAsync");
            });
  }

  static int to_int(std::size_t value, const char* call) {
    if (value > static_cast<std::size_t>(INT_MAX)) {
      throw ShapeError("cuda backend: " + std::string(call) + " dimension " +
                       std::to_string(value) + " exceeds cuBLAS's limit of " +
                       std::to_string(INT_MAX));
    }
    return static_cast<int>(value);
  }

  static float* or_null(const Tensor<float>& t) noexcept {
    return t.empty() ? nullptr : t.data();
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

  /// A tensor of `shape` over scratch buffer `slot` (one of `scratch_slots`), which grows and is
  /// then reused: its contents are the previous user's (kernels on the one stream use it in turn).
  Tensor<float> scratch_tensor(std::size_t slot, const Shape& shape) {
    const std::size_t bytes = shape.elements() * sizeof(float);
    void* memory = grow(scratch_slots_[slot].memory, scratch_slots_[slot].bytes,
                        std::max<std::size_t>(bytes, 1), "convolution scratch");
    return Tensor<float>::wrap(static_cast<float*>(memory), shape, nullptr, device());
  }

#if LOADSTAR_CUDA_WITH_CUDNN
  /// The cuDNN convolution of `g` (its descriptors and algorithms made at its first use, outside
  /// any recording), or null without `Convolution::cudnn` or where cuDNN does not run `g`.
  const detail::CudnnConvolution* cudnn_convolution(const keras::Conv2DGeometry& g) {
    if (options_.convolution != Convolution::cudnn) return nullptr;
    if (!cudnn_) cudnn_ = std::make_unique<detail::CudnnConvolutions>();
    if (!cudnn_->known(g)) active_stream("a cuDNN convolution's first use");
    context_->activate();
    return cudnn_->find(g, context_->stream);
  }

  /// The kernel `(kernel_h * kernel_w * in_c, out_c)` transposed into cuDNN's filter
  /// `(out_c, kernel_h, kernel_w, in_c)`, in convolution scratch.
  Tensor<float> cudnn_filter(const Tensor<float>& kernel, const keras::Conv2DGeometry& g) {
    const Tensor<float> filter = scratch_tensor(0, {g.out_c, g.patch_size()});
    constexpr std::array<std::size_t, 2> swap{1, 0};
    permute(kernel.reshape({g.patch_size(), g.out_c}), swap, filter);
    return filter;
  }

  /// Queues (or records) one of `conv`'s convolutions, `(conv->*run)(handle, a, b, out,
  /// workspace)`, with the workspace its algorithms need.
  using CudnnRun = void (detail::CudnnConvolution::*)(cudnnHandle_t, const float*, const float*,
                                                      float*, void*) const;
  void queue_cudnn(const char* name, const detail::CudnnConvolution* conv, CudnnRun run,
                   const float* a, const float* b, float* out) {
    void* workspace = conv->workspace_bytes() == 0
                          ? nullptr
                          : grow(cudnn_workspace_, cudnn_workspace_bytes_, conv->workspace_bytes(),
                                 "cuDNN workspace");
    ++cudnn_calls_;
    enqueue({detail::word(name), detail::word(conv), detail::word(a), detail::word(b),
             detail::word(out), detail::word(workspace)},
            [this, conv, a, b, out, workspace, run](cudaStream_t s) {
              (conv->*run)(cudnn_->handle(s), a, b, out, workspace);
            });
  }
#endif

  void* step_scratch(std::size_t bytes) {
    return grow(step_scratch_, step_scratch_bytes_, bytes, "optimizer, loss and metric scratch");
  }

  /// Scratch for `rows x columns` per-row terms followed by their column reduction's partials.
  double* reduction_terms(std::size_t rows, std::size_t columns) {
    const std::size_t doubles = rows * columns + detail::reduction_chunks(rows) * columns;
    return static_cast<double*>(step_scratch(doubles * sizeof(double)));
  }

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
