// A host emulation of the CUDA runtime, cuBLAS and loadstar's kernel launchers, just enough for
// `CudaBackend` to run on a machine without a GPU: "device" memory is host memory, a stream runs
// every operation at once, and each launcher runs its kernel's per-thread function
// (loadstar/cuda/detail/math.hpp, the functions the device kernels call) over every thread on the
// host. Linked instead of cudart, cuBLAS and libloadstar_cuda into `test_cuda_emulated`, it runs
// the GPU test suite (test_cuda_backend.cpp) unchanged: the backend's own logic (staging, copies,
// the cuBLAS argument mapping, strided copies, scratch sizing, the gather check) and the model's
// use of it are tested here; what only a GPU shows (asynchrony, the device's math library, cuBLAS
// itself, launch configurations) is not.
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <loadstar/cuda/detail/kernels.hpp>
#include <loadstar/cuda/detail/math.hpp>
#include <loadstar/keras/mixed_precision/detail/half_rounding.hpp>
#include <map>
#include <mutex>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

namespace kd = loadstar::cuda::detail;

/// The emulated device's memory pool: blocks are kept when freed and handed out again for the
/// same size, so `cudaMemPoolAttrReservedMemCurrent` grows only when a new size is asked for.
struct Pool {
  std::mutex mutex;
  std::multimap<std::size_t, void*> free_blocks;
  std::map<void*, std::size_t> sizes;
  std::uint64_t reserved = 0;
};

Pool& pool() {
  static Pool* instance = new Pool;  // never destroyed: tensors may be freed at exit
  return *instance;
}

int current_device = 0;
char stream_object, pool_object, handle_object;

/// The emulated device's memory: allocations beyond the free bytes fail as on a device.
constexpr std::size_t emulated_total_bytes = std::size_t{16} << 30U;
constexpr std::size_t emulated_free_bytes = std::size_t{8} << 30U;

}  // namespace

namespace loadstar::test {
/// Makes the next `cudaStreamCreateWithFlags` fail, so that a test sees a backend that cannot
/// start (test_cuda_backend.cpp, under LOADSTAR_CUDA_EMULATED).
bool fail_next_stream = false;
/// The number of `cudaStreamSynchronize` calls so far: the host's waits for the device.
std::size_t stream_syncs = 0;
/// For each `cudaEventSynchronize` of an event that was recorded, how many events were recorded
/// since (1: the wait was for the latest one): how far the host may run ahead of the device.
std::vector<std::size_t> event_wait_lags;
/// Stream operations (kernels, copies, fills, GEMMs) run outside a graph, and graphs launched.
std::size_t direct_operations = 0;
std::size_t graph_launches = 0;
}  // namespace loadstar::test

namespace {
/// An emulated event: the serial number of its last record (0: never recorded).
struct Event {
  std::size_t serial = 0;
};
std::size_t event_records = 0;

/// An emulated CUDA graph (and its executable form): the operations captured, in stream order.
struct Graph {
  std::vector<std::function<void()>> operations;
};
/// The graph the stream is capturing into (null: none): stream operations are recorded there
/// instead of run, as a capturing stream records them on a device.
Graph* capturing = nullptr;
/// Whether something the capture cannot hold (a wait, an allocation) happened during it: the
/// capture then ends with cudaErrorStreamCaptureInvalidated, as on a device.
bool capture_invalidated = false;

/// Runs a stream operation, or records it into the graph being captured.
template <class F>
cudaError_t submit(cudaStream_t, F&& operation) {
  if (capturing != nullptr) {
    capturing->operations.emplace_back(std::forward<F>(operation));
    return cudaSuccess;
  }
  ++loadstar::test::direct_operations;
  operation();
  return cudaSuccess;
}

/// Whether kernels (the launchers, cuBLAS and cuBLASLt) are skipped: with
/// LOADSTAR_EMULATED_SKIP_KERNELS=1 in the environment, a kernel is queued (and captured) as an
/// operation that does nothing, so that a benchmark on the emulation times the host's side of a
/// step alone (copies and fills still run: the results read back stay well-formed, their values
/// are not computed).
bool skip_kernels() {
  static const bool skip = [] {
    const char* value = std::getenv("LOADSTAR_EMULATED_SKIP_KERNELS");
    return value != nullptr && std::string_view(value) == "1";
  }();
  return skip;
}

/// Runs a kernel, or records it into the graph being captured (an empty operation when kernels
/// are skipped).
template <class F>
cudaError_t submit_kernel(cudaStream_t stream, F&& kernel) {
  if (skip_kernels()) return submit(stream, [] {});
  return submit(stream, std::forward<F>(kernel));
}

/// A call the capture cannot hold: invalidates it.
cudaError_t refuse_in_capture() {
  capture_invalidated = true;
  return cudaErrorStreamCaptureUnsupported;
}
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  current_device = device;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
  *device = current_device;
  return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
  return cudaSuccess;
}
const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorDevicesUnavailable:
      return "cudaErrorDevicesUnavailable";
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t error) {
  return error == cudaSuccess ? "no error" : "emulated error";
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  if (loadstar::test::fail_next_stream) {
    loadstar::test::fail_next_stream = false;
    return cudaErrorDevicesUnavailable;
  }
  *stream = reinterpret_cast<cudaStream_t>(&stream_object);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) {
  if (capturing != nullptr) return refuse_in_capture();
  ++loadstar::test::stream_syncs;
  return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t, enum cudaStreamCaptureMode) {
  if (capturing != nullptr) return cudaErrorIllegalState;
  capturing = new Graph;
  capture_invalidated = false;
  return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (capturing == nullptr) return cudaErrorIllegalState;
  Graph* captured = std::exchange(capturing, nullptr);
  if (capture_invalidated) {
    delete captured;
    *graph = nullptr;
    return cudaErrorStreamCaptureInvalidated;
  }
  *graph = reinterpret_cast<cudaGraph_t>(captured);
  return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (graph == nullptr) return cudaErrorInvalidValue;
  *exec = reinterpret_cast<cudaGraphExec_t>(new Graph(*reinterpret_cast<Graph*>(graph)));
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Graph*>(graph);
  return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<Graph*>(exec);
  return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (capturing != nullptr) return refuse_in_capture();
  ++loadstar::test::graph_launches;
  for (const auto& operation : reinterpret_cast<Graph*>(exec)->operations)
    operation();
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  if (capturing != nullptr) return refuse_in_capture();  // not used in a capture by the backend
  reinterpret_cast<Event*>(event)->serial = ++event_records;
  return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) {
  if (capturing != nullptr) return refuse_in_capture();  // not used in a capture by the backend
  return cudaSuccess;  // one emulated stream runs everything at once: nothing to wait for
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  const std::size_t serial = reinterpret_cast<Event*>(event)->serial;
  if (serial != 0) loadstar::test::event_wait_lags.push_back(event_records + 1 - serial);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<Event*>(event);
  return cudaSuccess;
}

cudaError_t cudaMemPoolCreate(cudaMemPool_t* memory_pool, const struct cudaMemPoolProps*) {
  *memory_pool = reinterpret_cast<cudaMemPool_t>(&pool_object);
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, enum cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t, enum cudaMemPoolAttr attribute, void* value) {
  if (attribute != cudaMemPoolAttrReservedMemCurrent) return cudaErrorInvalidValue;
  std::lock_guard lock(pool().mutex);
  *static_cast<std::uint64_t*>(value) = pool().reserved;
  return cudaSuccess;
}
cudaError_t cudaMemPoolDestroy(cudaMemPool_t) {
  return cudaSuccess;
}
cudaError_t cudaMallocFromPoolAsync(void** pointer, size_t size, cudaMemPool_t, cudaStream_t) {
  // A device would add an allocation node to the graph; the backend never allocates in a capture.
  if (capturing != nullptr) return refuse_in_capture();
  Pool& p = pool();
  std::lock_guard lock(p.mutex);
  if (const auto found = p.free_blocks.find(size); found != p.free_blocks.end()) {
    *pointer = found->second;
    p.free_blocks.erase(found);
    return cudaSuccess;
  }
  if (size > emulated_free_bytes) return cudaErrorMemoryAllocation;
  // 256-byte aligned, as the device's allocations are.
  *pointer = std::aligned_alloc(256, (size + 255) / 256 * 256);
  if (*pointer == nullptr) return cudaErrorMemoryAllocation;
  p.sizes.emplace(*pointer, size);
  p.reserved += size;
  return cudaSuccess;
}
cudaError_t cudaFreeAsync(void* pointer, cudaStream_t) {
  if (capturing != nullptr) return refuse_in_capture();
  Pool& p = pool();
  std::lock_guard lock(p.mutex);
  const auto found = p.sizes.find(pointer);
  if (found == p.sizes.end()) return cudaErrorInvalidValue;
  p.free_blocks.emplace(found->second, pointer);
  return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = emulated_free_bytes;
  *total_bytes = emulated_total_bytes;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** pointer, size_t size) {
  *pointer = std::aligned_alloc(256, (size + 255) / 256 * 256);
  return *pointer == nullptr ? cudaErrorMemoryAllocation : cudaSuccess;
}
cudaError_t cudaFree(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** pointer, size_t size) {
  return cudaMalloc(pointer, size);
}
cudaError_t cudaFreeHost(void* pointer) {
  std::free(pointer);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t count, cudaStream_t stream) {
  return submit(stream, [=] { std::memset(pointer, value, count); });
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t count,
                            enum cudaMemcpyKind kind, cudaStream_t stream) {
  // The backend copies from and to the host outside captures only (a graph would read the host
  // memory when it is launched, not when it is captured).
  if (capturing != nullptr && kind != cudaMemcpyDeviceToDevice) return refuse_in_capture();
  return submit(stream, [=] { std::memmove(destination, source, count); });
}
cudaError_t cudaMemcpy2DAsync(void* destination, size_t destination_pitch, const void* source,
                              size_t source_pitch, size_t width, size_t height, enum cudaMemcpyKind,
                              cudaStream_t stream) {
  if (width > destination_pitch || width > source_pitch) return cudaErrorInvalidValue;
  return submit(stream, [=] {
    for (size_t row = 0; row < height; ++row) {
      std::memcpy(static_cast<char*>(destination) + row * destination_pitch,
                  static_cast<const char*>(source) + row * source_pitch, width);
    }
  });
}

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = reinterpret_cast<cublasHandle_t>(&handle_object);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t, cudaStream_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) {
  return CUBLAS_STATUS_SUCCESS;
}
const char* cublasGetStatusName(cublasStatus_t) {
  return "CUBLAS_STATUS_EMULATED";
}
const char* cublasGetStatusString(cublasStatus_t) {
  return "emulated";
}

/// Column-major `C = alpha * op(A) * op(B) + beta * C`, as cuBLAS defines it (C is not read when
/// beta is 0).
cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t transa, cublasOperation_t transb,
                              int m, int n, int k, const float* alpha, const float* A, int lda,
                              const float* B, int ldb, const float* beta, float* C, int ldc) {
  if (m < 0 || n < 0 || k < 0 || lda < 1 || ldb < 1 || ldc < std::max(1, m))
    return CUBLAS_STATUS_INVALID_VALUE;
  if (lda < (transa == CUBLAS_OP_N ? m : k) || ldb < (transb == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
  // alpha and beta are host scalars, read when the call is made (or captured).
  const float alpha_value = *alpha, beta_value = *beta;
  submit_kernel(nullptr, [=] {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        double sum = 0.0;
        for (int p = 0; p < k; ++p) {
          const float a = transa == CUBLAS_OP_N ? A[i + p * lda] : A[p + i * lda];
          const float b = transb == CUBLAS_OP_N ? B[p + j * ldb] : B[j + p * ldb];
          sum += double(a) * double(b);
        }
        float& c = C[i + j * ldc];
        c = static_cast<float>(alpha_value * sum +
                               (beta_value == 0.0F ? 0.0 : double(beta_value) * c));
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

// --- cuBLASLt: the matmuls with an epilogue that CudaBackend plans (fp32) ------------------------

}  // extern "C"

namespace {
struct LtDesc {
  cublasOperation_t transa = CUBLAS_OP_N, transb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const float* bias = nullptr;
  /// The ReLU bit mask (RELU_AUX_BIAS writes it, DRELU_BGRAD reads it): element (i, j) of D is
  /// bit i % 8 of byte (j * aux_ld + i) / 8; cuBLASLt's own order is opaque to its callers.
  const void* aux = nullptr;
  std::int64_t aux_ld = 0;
};
struct LtLayout {
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  cudaDataType type = CUDA_R_32F;
};
/// Element `i` of a matrix of `type` (fp32, or fp16 or bf16 bits) as a float.
float lt_element(const void* data, cudaDataType type, std::uint64_t i) {
  using loadstar::keras::detail::HalfKind;
  if (type == CUDA_R_32F) return static_cast<const float*>(data)[i];
  const std::uint16_t bits = static_cast<const std::uint16_t*>(data)[i];
  return loadstar::keras::detail::half_float(
      bits, type == CUDA_R_16BF ? HalfKind::bfloat16 : HalfKind::float16);
}
/// The alignments (bytes) a preference says the A, B, C and D pointers have (256 by default).
struct LtPreference {
  std::uint32_t alignment[4] = {256, 256, 256, 256};
};
/// The alignment an emulated algorithm needs of every pointer: what the preference promises, at
/// most 16 bytes (the vector loads of a real kernel), kept in the algorithm's opaque data.
constexpr std::size_t algo_alignment_word = 0;
char lt_handle_object;
template <class T>
cublasStatus_t set_from(T& field, const void* buffer, size_t bytes) {
  if (buffer == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(&field, buffer, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}
}  // namespace

namespace loadstar::test {
/// The number of `cublasLtMatmul` calls so far.
std::size_t lt_matmuls = 0;
/// Of them, those whose A and B are fp16 or bf16 (tensor-core products).
std::size_t lt_half_matmuls = 0;
std::map<int, std::size_t> lt_epilogues;
/// The number of max pooling gradients carried through a ReLU (`launch_max_pool_backward`'s
/// `relu`) queued so far.
std::size_t relu_pool_gradients = 0;
/// The number of convolution weight gradients queued as one column reduction
/// (`launch_conv_weight_gradients`) so far.
std::size_t conv_weight_reductions = 0;
}  // namespace loadstar::test

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  *handle = reinterpret_cast<cublasLtHandle_t>(&lt_handle_object);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t) {
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  *desc = reinterpret_cast<cublasLtMatmulDesc_t>(new LtDesc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete reinterpret_cast<LtDesc*>(desc);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attribute,
                                              const void* buffer, size_t bytes) {
  auto& d = *reinterpret_cast<LtDesc*>(desc);
  switch (attribute) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
      return set_from(d.transa, buffer, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB:
      return set_from(d.transb, buffer, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      return set_from(d.epilogue, buffer, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      return set_from(d.bias, buffer, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      return set_from(d.aux, buffer, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      return set_from(d.aux_ld, buffer, bytes);
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (type != CUDA_R_32F && type != CUDA_R_16F && type != CUDA_R_16BF)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (ld < static_cast<int64_t>(std::max<uint64_t>(rows, 1))) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new LtLayout{rows, cols, ld, type});
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete reinterpret_cast<LtLayout*>(layout);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* preference) {
  *preference = reinterpret_cast<cublasLtMatmulPreference_t>(new LtPreference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t preference) {
  delete reinterpret_cast<LtPreference*>(preference);
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t preference,
                                                    cublasLtMatmulPreferenceAttributes_t attribute,
                                                    const void* buffer, size_t bytes) {
  if (buffer == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  auto& p = *reinterpret_cast<LtPreference*>(preference);
  switch (attribute) {
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      return set_from(p.alignment[0], buffer, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      return set_from(p.alignment[1], buffer, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      return set_from(p.alignment[2], buffer, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      return set_from(p.alignment[3], buffer, bytes);
    default:
      return CUBLAS_STATUS_SUCCESS;
  }
}
/// One algorithm for the epilogues CudaBackend uses, none for others (as a real heuristic may
/// find none), so that the fallback is exercised too.
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                              cublasLtMatmulPreference_t preference, int requested,
                                              cublasLtMatmulHeuristicResult_t results[],
                                              int* returned) {
  const auto& d = *reinterpret_cast<const LtDesc*>(desc);
  const auto& p = *reinterpret_cast<const LtPreference*>(preference);
  *returned = 0;
  if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
  switch (d.epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_RELU:
    case CUBLASLT_EPILOGUE_RELU_BIAS:
    case CUBLASLT_EPILOGUE_BGRADA:
    case CUBLASLT_EPILOGUE_RELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DRELU_BGRAD:
      // A bit mask's leading dimension must be a positive multiple of 128 bits.
      if ((d.epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS ||
           d.epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD) &&
          (d.aux_ld <= 0 || d.aux_ld % 128 != 0))
        return CUBLAS_STATUS_INVALID_VALUE;
      results[0] = cublasLtMatmulHeuristicResult_t{};
      results[0].state = CUBLAS_STATUS_SUCCESS;
      results[0].algo.data[algo_alignment_word] = std::min<std::uint32_t>(
          {p.alignment[0], p.alignment[1], p.alignment[2], p.alignment[3], 16});
      *returned = 1;
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_NOT_SUPPORTED;
  }
}
/// Column-major `D = alpha * op(A) * op(B) + beta * C` rounded to float, then the epilogue in
/// float: `+ bias[row]`, then `max(0, .)`, or the bias gradient (`op(A)`'s row sums written to
/// the bias pointer), as cuBLASLt defines them.
cublasStatus_t cublasLtMatmul(cublasLtHandle_t, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t a_layout, const void* B,
                              cublasLtMatrixLayout_t b_layout, const void* beta, const void* C,
                              cublasLtMatrixLayout_t c_layout, void* D,
                              cublasLtMatrixLayout_t d_layout, const cublasLtMatmulAlgo_t* algo,
                              void*, size_t, cudaStream_t stream) {
  ++loadstar::test::lt_matmuls;
  // An algorithm chosen for aligned pointers fails on others (as a real kernel's vector loads).
  if (algo != nullptr) {
    const std::uint64_t need = algo->data[algo_alignment_word];
    for (const void* pointer : {A, B, C, static_cast<const void*>(D)})
      if (need > 1 && reinterpret_cast<std::uintptr_t>(pointer) % need != 0)
        return CUBLAS_STATUS_INVALID_VALUE;
  }
  // The descriptors and scalars as they are when the call is made (or captured).
  const LtDesc d = *reinterpret_cast<const LtDesc*>(desc);
  ++loadstar::test::lt_epilogues[static_cast<int>(d.epilogue)];
  const LtLayout la = *reinterpret_cast<const LtLayout*>(a_layout);
  const LtLayout lb = *reinterpret_cast<const LtLayout*>(b_layout);
  const LtLayout lc = *reinterpret_cast<const LtLayout*>(c_layout);
  const LtLayout ld = *reinterpret_cast<const LtLayout*>(d_layout);
  const std::uint64_t m = ld.rows, n = ld.cols;
  const std::uint64_t k = d.transa == CUBLAS_OP_N ? la.cols : la.rows;
  if ((d.transa == CUBLAS_OP_N ? la.rows : la.cols) != m ||
      (d.transb == CUBLAS_OP_N ? lb.rows : lb.cols) != k ||
      (d.transb == CUBLAS_OP_N ? lb.cols : lb.rows) != n || lc.rows != m || lc.cols != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  // A and B of one type (fp32, fp16 or bf16: the products are exact in float); C and D fp32.
  if (la.type != lb.type || lc.type != CUDA_R_32F || ld.type != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (la.type != CUDA_R_32F) ++loadstar::test::lt_half_matmuls;
  const bool write_mask = d.epilogue == CUBLASLT_EPILOGUE_RELU_AUX_BIAS;
  const bool read_mask = d.epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD;
  const bool bias = d.epilogue == CUBLASLT_EPILOGUE_BIAS ||
                    d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS || write_mask;
  const bool relu = d.epilogue == CUBLASLT_EPILOGUE_RELU ||
                    d.epilogue == CUBLASLT_EPILOGUE_RELU_BIAS || write_mask;
  const bool bias_gradient = d.epilogue == CUBLASLT_EPILOGUE_BGRADA;
  if ((bias || bias_gradient || read_mask) && d.bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if ((write_mask || read_mask) &&
      (d.aux == nullptr || d.aux_ld < static_cast<std::int64_t>(m) || d.aux_ld % 128 != 0))
    return CUBLAS_STATUS_INVALID_VALUE;
  auto* mask = static_cast<unsigned char*>(const_cast<void*>(d.aux));
  const auto bit = [aux_ld = static_cast<std::uint64_t>(d.aux_ld)](std::uint64_t i,
                                                                   std::uint64_t j) {
    const std::uint64_t index = j * aux_ld + i;
    return std::pair<std::uint64_t, unsigned>{index / 8, static_cast<unsigned>(index % 8)};
  };
  const cudaDataType operands = la.type;
  const auto element = [operands](const void* m, std::uint64_t i) {
    return lt_element(m, operands, i);
  };
  const auto* c = static_cast<const float*>(C);
  auto* out = static_cast<float*>(D);
  const float a_scale = *static_cast<const float*>(alpha);
  const float c_scale = *static_cast<const float*>(beta);
  submit_kernel(stream, [=] {
    for (std::uint64_t j = 0; j < n; ++j) {
      for (std::uint64_t i = 0; i < m; ++i) {
        double sum = 0.0;
        for (std::uint64_t p = 0; p < k; ++p) {
          const float av = element(A, d.transa == CUBLAS_OP_N ? i + p * la.ld : p + i * la.ld);
          const float bv = element(B, d.transb == CUBLAS_OP_N ? p + j * lb.ld : j + p * lb.ld);
          sum += double(av) * double(bv);
        }
        float value = static_cast<float>(
            a_scale * sum + (c_scale == 0.0F ? 0.0 : double(c_scale) * c[i + j * lc.ld]));
        if (bias) value += d.bias[i];
        if (write_mask) {
          const auto [byte, shift] = bit(i, j);
          mask[byte] = static_cast<unsigned char>((mask[byte] & ~(1U << shift)) |
                                                  (value > 0.0F ? 1U << shift : 0U));
        }
        if (read_mask) {
          const auto [byte, shift] = bit(i, j);
          if ((mask[byte] >> shift & 1U) == 0) value = 0.0F;
        }
        if (relu) value = value > 0.0F ? value : 0.0F;
        out[i + j * ld.ld] = value;
      }
    }
    // DRELU_BGRAD's bias gradient: D's sums over its columns, one per row (written).
    for (std::uint64_t i = 0; read_mask && i < m; ++i) {
      double sum = 0.0;
      for (std::uint64_t j = 0; j < n; ++j)
        sum += out[i + j * ld.ld];
      const_cast<float*>(d.bias)[i] = static_cast<float>(sum);
    }
    // The bias gradient: op(A)'s sums over k, one per row of D (written).
    for (std::uint64_t i = 0; bias_gradient && i < m; ++i) {
      double sum = 0.0;
      for (std::uint64_t p = 0; p < k; ++p)
        sum += element(A, d.transa == CUBLAS_OP_N ? i + p * la.ld : p + i * la.ld);
      const_cast<float*>(d.bias)[i] = static_cast<float>(sum);
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"

// --- The launchers: each kernel's per-thread function over every thread -------------------------

namespace loadstar::cuda::detail {

namespace {

/// The column reductions of kernels.cuh: per-chunk partial sums, then the chunks in order.
template <class Value, class Finish>
void column_reduce(const Value& value, Finish finish, std::size_t rows, std::size_t columns,
                   double* partials) {
  const std::size_t chunks = reduction_chunks(rows);
  for (std::size_t chunk = 0; chunk < chunks; ++chunk)
    for (std::size_t j = 0; j < columns; ++j)
      partials[chunk * columns + j] = column_partial(value, rows, chunk, j);
  for (std::size_t j = 0; j < columns; ++j)
    finish(j, column_total(partials, chunks, columns, j));
}

}  // namespace

cudaError_t launch_fill(cudaStream_t stream, float* x, std::size_t n, float value) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      x[i] = value;
  });
}
cudaError_t launch_fill_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                             std::size_t elements, float value) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < elements; ++i)
      fill_flat(targets, count, value, i);
  });
}
cudaError_t launch_scale_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float alpha, const float* device_alpha) {
  return submit_kernel(stream, [=] {
    const float a = device_alpha != nullptr ? *device_alpha : alpha;
    for (std::size_t i = 0; i < elements; ++i)
      scale_flat(targets, count, a, i);
  });
}
cudaError_t launch_all_finite(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float* flag, double* record) {
  return submit_kernel(stream, [=] {
    *flag = 1.0F;
    record[0] = 1.0;
    for (std::size_t i = 0; i < elements; ++i) {
      if (!finite_flat(targets, count, i)) {
        *flag = 0.0F;
        record[0] = 0.0;
      }
    }
  });
}
cudaError_t launch_scale(cudaStream_t stream, float* x, std::size_t n, float alpha) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      x[i] *= alpha;
  });
}
cudaError_t launch_axpy(cudaStream_t stream, float alpha, const float* x, float* y, std::size_t n) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      y[i] += alpha * x[i];
  });
}
cudaError_t launch_add(cudaStream_t stream, const float* a, const float* b, float* out,
                       std::size_t n) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = a[i] + b[i];
  });
}
cudaError_t launch_bias_add(cudaStream_t stream, float* x, std::size_t n, const float* bias,
                            std::size_t width) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      x[i] += bias[i % width];
  });
}
cudaError_t launch_column_sums(cudaStream_t stream, const float* x, float* out, std::size_t rows,
                               std::size_t columns, float beta, double* scratch) {
  return submit_kernel(stream, [=] {
    column_reduce(
        ElementValue{x, columns},
        [&](std::size_t j, double sum) {
          out[j] = column_sum_value(sum, beta, beta == 0.0F ? 0.0F : out[j]);
        },
        rows, columns, scratch);
  });
}
cudaError_t launch_activation_forward(cudaStream_t stream, Activation kind, const float* x,
                                      float* y, std::size_t n) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      y[i] = activate(kind, x[i]);
  });
}
cudaError_t launch_activation_backward(cudaStream_t stream, Activation kind, const float* x,
                                       const float* y, const float* dy, float* dx, std::size_t n) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dx[i] = activation_gradient(kind, x == nullptr ? 0.0F : x[i], y[i], dy[i]);
  });
}
cudaError_t launch_relu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n,
                                float top, float slope, float threshold) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      y[i] = relu_value(x[i], top, slope, threshold);
  });
}
cudaError_t launch_relu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx,
                                 std::size_t n, float top, float slope, float threshold) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      dx[i] = relu_gradient(x[i], dy[i], top, slope, threshold);
  });
}
cudaError_t launch_softmax_forward(cudaStream_t stream, const float* x, float* y, std::size_t outer,
                                   std::size_t length, std::size_t inner) {
  return submit_kernel(stream, [=] {
    for (std::size_t line = 0; line < outer * inner; ++line)
      softmax_forward_line(x, y, length, inner, line);
  });
}
cudaError_t launch_softmax_backward(cudaStream_t stream, const float* y, const float* dy, float* dx,
                                    std::size_t outer, std::size_t length, std::size_t inner) {
  return submit_kernel(stream, [=] {
    for (std::size_t line = 0; line < outer * inner; ++line)
      softmax_backward_line(y, dy, dx, length, inner, line);
  });
}
cudaError_t launch_dropout(cudaStream_t stream, const float* x, float* y, std::size_t n,
                           double rate, float keep_scale, std::uint64_t key,
                           const std::uint64_t* device_key) {
  return submit_kernel(stream, [=] {
    const std::uint64_t k = device_key != nullptr ? *device_key : key;
    for (std::size_t i = 0; i < n; ++i)
      y[i] = dropout_value(x[i], k, i, rate, keep_scale);
  });
}
cudaError_t launch_im2col(cudaStream_t stream, const float* x, const Conv2DGeometry& g,
                          float* columns) {
  return submit_kernel(stream, [=] {
    with_conv_index(g, [&](const auto& index) {
      using Index = typename std::decay_t<decltype(index)>::index_type;
      const auto n = Index(g.batch * g.out_h * g.out_w * g.kernel_h * g.kernel_w * g.in_c);
      for (Index i = 0; i < n; ++i)
        columns[i] = im2col_value(x, index, i);
    });
  });
}
cudaError_t launch_col2im(cudaStream_t stream, const float* columns, const Conv2DGeometry& g,
                          float* dx) {
  return submit_kernel(stream, [=] {
    with_conv_index(g, [&](const auto& index) {
      using Index = typename std::decay_t<decltype(index)>::index_type;
      const auto n = Index(g.batch * g.in_h * g.in_w * g.in_c);
      for (Index i = 0; i < n; ++i)
        dx[i] = col2im_value(columns, index, i);
    });
  });
}
/// As the device: each column's partial sums over each chunk (one column at a time, where the
/// device takes four filters a thread: the same sums), then the totals.
cudaError_t launch_conv_weight_gradients(cudaStream_t stream, const float* x,
                                         const Conv2DGeometry& g, const float* dz,
                                         std::size_t filters, float* dkernel, float* dbias,
                                         bool accumulate, double* scratch) {
  ++loadstar::test::conv_weight_reductions;
  return submit_kernel(stream, [=] {
    with_conv_index(g, [&](const auto& index) {
      const std::size_t rows = g.batch * g.out_h * g.out_w;
      const std::size_t kernel_terms = g.kernel_h * g.kernel_w * g.in_c * filters;
      const std::size_t columns = kernel_terms + (dbias != nullptr ? filters : 0);
      const std::size_t chunks = reduction_chunks(rows);
      for (std::size_t chunk = 0; chunk < chunks; ++chunk)
        for (std::size_t j = 0; j < columns; ++j)
          conv_weight_partials<1>(x, index, dz, rows, filters, chunk, j,
                                  scratch + chunk * columns + j);
      const ConvWeightFinish finish{dkernel, dbias, kernel_terms, accumulate};
      for (std::size_t j = 0; j < columns; ++j)
        finish(j, column_total(scratch, chunks, columns, j));
    });
  });
}
/// The pooling kernels' work: forward over the output's elements, backward over the input's.
cudaError_t emulate_pool(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                         const float* dy, float* out, bool max, bool forward, bool relu = false) {
  return submit_kernel(stream, [=] {
    with_pool_index(g, [&](const auto& index) {
      using Index = typename std::decay_t<decltype(index)>::index_type;
      const auto n = Index(g.batch * (forward ? g.out_h * g.out_w : g.in_h * g.in_w) * g.channels);
      for (Index i = 0; i < n; ++i)
        out[i] = forward ? pool_forward_value(x, index, max, i)
                         : pool_input_gradient(x, index, dy, max, relu, i);
    });
  });
}
cudaError_t launch_max_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y) {
  return emulate_pool(stream, x, g, nullptr, y, true, true);
}
cudaError_t launch_max_pool_backward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                     const float* dy, float* dx, bool relu) {
  if (relu) ++loadstar::test::relu_pool_gradients;
  if (!pool_windows_disjoint(g)) return emulate_pool(stream, x, g, dy, dx, true, false, relu);
  // As the device: a fill where the windows leave positions out, then one thread per window.
  return submit_kernel(stream, [=] {
    if (!pool_windows_tile(g)) std::fill_n(dx, g.batch * g.in_h * g.in_w * g.channels, 0.0F);
    with_pool_index(g, [&](const auto& index) {
      using Index = typename std::decay_t<decltype(index)>::index_type;
      const auto n = Index(g.batch * g.out_h * g.out_w * g.channels);
      for (Index i = 0; i < n; ++i)
        max_pool_window_gradient(x, index, dy, dx, relu, i);
    });
  });
}
cudaError_t launch_avg_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y) {
  return emulate_pool(stream, x, g, nullptr, y, false, true);
}
cudaError_t launch_avg_pool_backward(cudaStream_t stream, const Pool2DGeometry& g, const float* dy,
                                     float* dx) {
  return emulate_pool(stream, nullptr, g, dy, dx, false, false);
}
cudaError_t launch_global_pool_forward(cudaStream_t stream, const float* x, bool max, float* y,
                                       std::size_t batch, std::size_t pixels,
                                       std::size_t channels) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < batch * channels; ++i)
      y[i] = global_pool_forward_value(x, max, pixels, channels, i);
  });
}
cudaError_t launch_global_pool_backward(cudaStream_t stream, const float* x, bool max,
                                        const float* dy, float* dx, std::size_t batch,
                                        std::size_t pixels, std::size_t channels) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < batch * channels; ++i)
      global_pool_backward_line(x, max, dy, dx, pixels, channels, i);
  });
}
cudaError_t launch_moments(cudaStream_t stream, const float* x, float* mean, float* variance,
                           std::size_t rows, std::size_t channels, double* scratch) {
  return submit_kernel(stream, [=] {
    double* mean_sums = scratch + reduction_chunks(rows) * channels;
    const auto n = static_cast<double>(rows);
    column_reduce(
        ElementValue{x, channels}, [&](std::size_t j, double sum) { mean_sums[j] = sum / n; }, rows,
        channels, scratch);
    column_reduce(
        SquaredDeviation{x, mean_sums, channels},
        [&](std::size_t j, double squares) {
          mean[j] = static_cast<float>(mean_sums[j]);
          variance[j] = static_cast<float>(squares / n);
        },
        rows, channels, scratch);
  });
}
cudaError_t launch_batch_norm_forward(cudaStream_t stream, const float* x, const float* mean,
                                      const float* variance, const float* gamma, const float* beta,
                                      float epsilon, float* y, std::size_t rows,
                                      std::size_t channels) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < rows * channels; ++i) {
      const std::size_t j = i % channels;
      y[i] = batch_norm_value(x[i], mean[j], variance[j], gamma == nullptr ? 1.0F : gamma[j],
                              beta == nullptr ? 0.0F : beta[j], epsilon);
    }
  });
}
cudaError_t launch_batch_norm_backward(cudaStream_t stream, const float* x, const float* mean,
                                       const float* variance, const float* gamma, float epsilon,
                                       bool training, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t rows, std::size_t channels,
                                       double* scratch) {
  return submit_kernel(stream, [=] {
    double* sum_dy = scratch + reduction_chunks(rows) * channels;
    double* sum_dy_xhat = sum_dy + channels;
    auto keep = [](double* sums, float* gradient) {
      return [sums, gradient](std::size_t j, double sum) {
        sums[j] = sum;
        if (gradient != nullptr) gradient[j] += static_cast<float>(sum);
      };
    };
    column_reduce(ElementValue{dy, channels}, keep(sum_dy, dbeta), rows, channels, scratch);
    column_reduce(DyXhat{x, mean, variance, dy, epsilon, channels}, keep(sum_dy_xhat, dgamma), rows,
                  channels, scratch);
    if (dx == nullptr) return;
    for (std::size_t i = 0; i < rows * channels; ++i) {
      const std::size_t j = i % channels;
      dx[i] = batch_norm_gradient(x[i], mean[j], variance[j], gamma == nullptr ? 1.0 : gamma[j],
                                  epsilon, training, dy[i], sum_dy[j], sum_dy_xhat[j],
                                  static_cast<double>(rows));
    }
  });
}
cudaError_t launch_attention_forward(cudaStream_t stream, const AttentionShape& shape,
                                     const AttentionCall& call, float scale, std::uint64_t key,
                                     const std::uint64_t* device_key, const float* q,
                                     const float* k, const float* v, float* probabilities,
                                     float* out) {
  return submit_kernel(stream, [=] {
    const std::uint64_t dropout_key = device_key != nullptr ? *device_key : key;
    for (std::size_t bh = 0; bh < shape.batch * shape.heads; ++bh)
      for (std::size_t i = 0; i < shape.query_steps; ++i)
        loadstar::keras::detail::attention_forward_row(shape, call, scale, dropout_key, q, k, v,
                                                       probabilities, out, bh / shape.heads,
                                                       bh % shape.heads, i);
  });
}
cudaError_t launch_attention_backward(cudaStream_t stream, const AttentionShape& shape,
                                      const AttentionCall& call, float scale, std::uint64_t key,
                                      const std::uint64_t* device_key, const float* q,
                                      const float* k, const float* v, const float* probabilities,
                                      const float* dout, const float* dprobabilities,
                                      float* scores_gradient, float* dq, float* dk, float* dv) {
  return submit_kernel(stream, [=] {
    namespace kd = loadstar::keras::detail;
    const std::uint64_t dropout_key = device_key != nullptr ? *device_key : key;
    const std::size_t heads = shape.heads;
    for (std::size_t bh = 0; bh < shape.batch * heads; ++bh)
      for (std::size_t i = 0; i < shape.query_steps; ++i)
        kd::attention_query_gradient_row(shape, call, scale, dropout_key, k, v, probabilities, dout,
                                         dprobabilities, scores_gradient, dq, bh / heads,
                                         bh % heads, i);
    for (std::size_t bh = 0; bh < shape.batch * heads; ++bh)
      for (std::size_t j = 0; j < shape.value_steps; ++j)
        kd::attention_key_gradient_row(shape, call, scale, dropout_key, q, probabilities, dout,
                                       scores_gradient, dk, dv, bh / heads, bh % heads, j);
  });
}
cudaError_t launch_layer_norm_forward(cudaStream_t stream, const float* x, const float* gamma,
                                      const float* beta, float epsilon, float* y, std::size_t lines,
                                      std::size_t width) {
  return submit_kernel(stream, [=] {
    for (std::size_t line = 0; line < lines; ++line)
      layer_norm_forward_line(x, gamma, beta, epsilon, y, width, line);
  });
}
cudaError_t launch_layer_norm_backward(cudaStream_t stream, const float* x, const float* gamma,
                                       float epsilon, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t lines, std::size_t width,
                                       double* scratch) {
  return submit_kernel(stream, [=] {
    double* stats = scratch + reduction_scratch(lines, width);
    for (std::size_t line = 0; line < lines; ++line)
      layer_norm_backward_line(x, gamma, epsilon, dy, dx, stats, width, line);
    const auto add_to = [](float* gradient) {
      return [gradient](std::size_t j, double sum) { gradient[j] += static_cast<float>(sum); };
    };
    if (dbeta != nullptr)
      column_reduce(ElementValue{dy, width}, add_to(dbeta), lines, width, scratch);
    if (dgamma != nullptr) {
      column_reduce(LayerNormDyXhat{x, dy, stats, width}, add_to(dgamma), lines, width, scratch);
    }
  });
}
cudaError_t launch_moving_average(cudaStream_t stream, float* moving, const float* value,
                                  std::size_t n, float momentum) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      moving[i] = moving_average_value(moving[i], value[i], momentum);
  });
}
cudaError_t launch_find_bad_index(cudaStream_t stream, const float* indices, std::size_t n,
                                  std::size_t rows, unsigned long long* first) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      if (!index_in_range(indices[i], rows) && i < *first) *first = i;
  });
}
cudaError_t launch_gather_rows(cudaStream_t stream, const std::uint64_t* rows, std::size_t count,
                               const float* source, std::size_t width, float* out) {
  return submit_kernel(stream, [=] {
    for (std::size_t r = 0; r < count; ++r)
      std::copy_n(source + rows[r] * width, width, out + r * width);
  });
}
cudaError_t launch_record_bad_index(cudaStream_t stream, const float* indices, double* record) {
  return submit_kernel(stream, [=] { record_bad_index(indices, record); });
}
cudaError_t launch_gather(cudaStream_t stream, const float* indices, std::size_t n,
                          const float* table, std::size_t rows, std::size_t width, float* out) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n * width; ++i)
      out[i] = gather_value(indices, table, rows, width, i);
  });
}
cudaError_t launch_scatter_add(cudaStream_t stream, const float* indices, std::size_t n,
                               const float* dy, std::size_t rows, std::size_t width,
                               float* table_gradient) {
  return submit_kernel(stream, [=] {
    for (std::size_t c = 0; c < width; ++c)
      scatter_add_column(indices, n, dy, rows, width, table_gradient, c);
  });
}
cudaError_t launch_clip_scales(cudaStream_t stream, const UpdateTarget* targets, std::size_t count,
                               std::size_t segments, double* partials, bool global,
                               double threshold, float* scales) {
  return submit_kernel(stream, [=] {
    for (std::size_t s = 0; s < segments; ++s)
      partials[s] = segment_squares(targets, count, s);
    clip_scales(targets, count, partials, global, threshold, scales);
  });
}
cudaError_t launch_optimizer_step(cudaStream_t stream, const UpdateTarget* targets,
                                  std::size_t count, std::size_t elements,
                                  const UpdateParams& params, const UpdateParams* device_params,
                                  const float* scales, const float* condition) {
  return submit_kernel(stream, [=] {
    if (condition != nullptr && *condition == 0.0F) return;
    const UpdateParams p = device_params != nullptr ? *device_params : params;
    for (std::size_t i = 0; i < elements; ++i)
      update_flat(targets, count, p, scales, i);
  });
}
cudaError_t launch_row_loss(cudaStream_t stream, const RowLossParams& params, const RowDims& dims,
                            const float* y_true, const float* y_pred, const float* weight,
                            float* gradient, double* terms, double* partials, double* record) {
  return submit_kernel(stream, [=] {
    auto* first_bad = reinterpret_cast<unsigned long long*>(record + 1);
    for (std::size_t j = 0; j < dims.values; ++j) {
      if (params.kind == RowLossKind::sparse_categorical_crossentropy &&
          !label_in_range(y_true[j * dims.true_size], dims.classes) && j < *first_bad) {
        *first_bad = j;
      }
      terms[j] = row_loss_term(params, dims, y_true, y_pred, weight, gradient, j);
    }
    column_reduce(
        DoubleElementValue{terms, 1},
        [&](std::size_t, double sum) { finish_row_loss(sum, y_true, dims.true_size, record); },
        dims.values, 1, partials);
  });
}
cudaError_t launch_mean_metric(cudaStream_t stream, MeanMetricKind kind, double threshold,
                               const RowDims& dims, const float* y_true, const float* y_pred,
                               const float* weight, double* terms, double* partials,
                               double* result) {
  return submit_kernel(stream, [=] {
    for (std::size_t j = 0; j < dims.values; ++j)
      metric_terms(kind, threshold, dims, y_true, y_pred, weight, terms, j);
    column_reduce(
        DoubleElementValue{terms, 2}, [&](std::size_t j, double sum) { result[j] = sum; },
        dims.values, 2, partials);
  });
}
cudaError_t launch_permute(cudaStream_t stream, const float* x, float* y, const PermuteDims& dims,
                           std::size_t n) {
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      y[i] = x[permute_offset(dims, i)];
  });
}
cudaError_t launch_recurrent(cudaStream_t stream, const RecurrentKernel& kernel,
                             const RecurrentTensors& tensors, std::size_t elements,
                             std::uint64_t key, const std::uint64_t* device_key) {
  return submit_kernel(stream, [=] {
    const std::uint64_t k = device_key != nullptr ? *device_key : key;
    // Thread by thread, as the device runs it (recurrent_element of each flat index).
    for (std::size_t i = 0; i < elements; ++i)
      loadstar::keras::detail::recurrent_element(kernel, tensors, k, i);
  });
}
cudaError_t launch_depthwise_forward(cudaStream_t stream, const float* x,
                                     const loadstar::keras::Conv2DGeometry& g, const float* kernel,
                                     const float* bias, float* z) {
  return submit_kernel(stream, [=] {
    const std::size_t n = g.batch * g.out_h * g.out_w * g.out_c;
    for (std::size_t i = 0; i < n; ++i)
      z[i] = depthwise_value(x, g, kernel, bias, i);
  });
}
cudaError_t launch_depthwise_backward(cudaStream_t stream, const float* x,
                                      const loadstar::keras::Conv2DGeometry& g, const float* kernel,
                                      const float* dz, float* dx, float* dkernel, float* dbias,
                                      double* scratch) {
  return submit_kernel(stream, [=] {
    const std::size_t n = g.batch * g.in_h * g.in_w * g.in_c;
    for (std::size_t i = 0; dx != nullptr && i < n; ++i)
      dx[i] = depthwise_input_gradient(dz, g, kernel, i);
    const std::size_t kernel_terms = dkernel != nullptr ? g.kernel_h * g.kernel_w * g.out_c : 0;
    const std::size_t columns = kernel_terms + (dbias != nullptr ? g.out_c : 0);
    column_reduce(DepthwiseWeightValue{x, dz, g, kernel_terms},
                  ConvWeightFinish{dkernel, dbias, kernel_terms, true}, g.batch * g.out_h * g.out_w,
                  columns, scratch);
  });
}
cudaError_t launch_to_half(cudaStream_t stream, const float* from, std::uint16_t* to, std::size_t n,
                           bool bfloat16) {
  const auto kind = bfloat16 ? loadstar::keras::detail::HalfKind::bfloat16
                             : loadstar::keras::detail::HalfKind::float16;
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      to[i] = loadstar::keras::detail::half_bits(from[i], kind);
  });
}
cudaError_t launch_layer(cudaStream_t stream, const LayerKernel& kernel,
                         const LayerTensors& tensors, std::size_t elements, std::uint64_t key,
                         const std::uint64_t* device_key) {
  return submit_kernel(stream, [=] {
    const std::uint64_t k = device_key != nullptr ? *device_key : key;
    // Thread by thread, as the device runs it (layer_element of each flat index).
    for (std::size_t i = 0; i < elements; ++i)
      loadstar::keras::detail::layer_element(kernel, tensors, k, i);
  });
}
cudaError_t launch_round_half(cudaStream_t stream, float* x, std::size_t n, bool bfloat16) {
  const auto kind = bfloat16 ? loadstar::keras::detail::HalfKind::bfloat16
                             : loadstar::keras::detail::HalfKind::float16;
  return submit_kernel(stream, [=] {
    for (std::size_t i = 0; i < n; ++i)
      x[i] = loadstar::keras::detail::round_half(x[i], kind);
  });
}

}  // namespace loadstar::cuda::detail
