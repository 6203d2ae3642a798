// The CUDA backend's device context (loadstar/cuda/detail/context.hpp): page-locked buffers, the
// stream-ordered memory pool, the library handles and the upload slots.

#include "loadstar/cuda/detail/context.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "loadstar/cuda/cuda_backend.hpp"

namespace loadstar::cuda::detail {

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) static_cast<void>(cudaFreeHost(data_));
}

void* PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return data_;
  const std::size_t grown = std::max(bytes, bytes_ * 2);
  if (data_ != nullptr) check(cudaFreeHost(data_), "cudaFreeHost");
  data_ = nullptr;
  bytes_ = 0;
  check(cudaMallocHost(&data_, grown), "cudaMallocHost");
  bytes_ = grown;
  return data_;
}

Context::Context(int index) : device(index), name("cuda:" + std::to_string(index)) {
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

void Context::upload(void* device, const void* host, std::size_t bytes) {
  upload_with(device, bytes, [&](void* staging) { std::memcpy(staging, host, bytes); });
}

std::array<Context::UploadSlot*, 2 * Context::upload_slots> Context::all_upload_slots() noexcept {
  std::array<UploadSlot*, 2 * upload_slots> all{};
  for (std::size_t i = 0; i < upload_slots; ++i) {
    all[i] = &uploads[0].slots[i];
    all[upload_slots + i] = &uploads[1].slots[i];
  }
  return all;
}

void Context::activate() const {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device)
    check(cudaSetDevice(device), "cudaSetDevice");
}

[[noreturn]] void Context::throw_out_of_memory(const char* call, std::size_t bytes,
                                               const std::string& what) const {
  static_cast<void>(cudaGetLastError());
  std::size_t free_bytes = 0, total_bytes = 0;
  static_cast<void>(cudaMemGetInfo(&free_bytes, &total_bytes));
  throw CudaError(out_of_memory_message(name, call, bytes, what, free_bytes, total_bytes));
}

void* Context::allocate(std::size_t bytes, const std::string& what) {
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

void Context::free(void* memory) noexcept {
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

void Context::release_all() noexcept {
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

int device_count() {
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

}  // namespace loadstar::cuda::detail

namespace loadstar::cuda {

/// Whether a CUDA device can be used (`cudaGetDeviceCount` succeeds and finds one); never throws.
bool device_available() noexcept {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return status == cudaSuccess && count > 0;
}

}  // namespace loadstar::cuda
