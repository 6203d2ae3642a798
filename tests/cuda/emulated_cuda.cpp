// A host emulation of the CUDA runtime, cuBLAS and loadstar's kernel launchers, just enough for
// `CudaBackend` to run on a machine without a GPU: "device" memory is host memory, a stream runs
// every operation at once, and each launcher runs its kernel's per-thread function
// (loadstar/cuda/detail/math.hpp, the functions the device kernels call) over every thread on the
// host. Linked instead of cudart, cuBLAS and libloadstar_cuda into `test_cuda_emulated`, it runs
// the GPU test suite (test_cuda_backend.cpp) unchanged: the backend's own logic (staging, copies,
// the cuBLAS argument mapping, strided copies, scratch sizing, the gather check) and the model's
// use of it are tested here; what only a GPU shows (asynchrony, the device's math library, cuBLAS
// itself, launch configurations) is not.
#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <loadstar/cuda/detail/kernels.hpp>
#include <loadstar/cuda/detail/math.hpp>
#include <map>
#include <mutex>
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
char stream_object, event_object, pool_object, handle_object;

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
}  // namespace loadstar::test

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
  ++loadstar::test::stream_syncs;
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = reinterpret_cast<cudaEvent_t>(&event_object);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) {
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) {
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t) {
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
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t count, cudaStream_t) {
  std::memset(pointer, value, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t count,
                            enum cudaMemcpyKind, cudaStream_t) {
  std::memmove(destination, source, count);
  return cudaSuccess;
}
cudaError_t cudaMemcpy2DAsync(void* destination, size_t destination_pitch, const void* source,
                              size_t source_pitch, size_t width, size_t height, enum cudaMemcpyKind,
                              cudaStream_t) {
  if (width > destination_pitch || width > source_pitch) return cudaErrorInvalidValue;
  for (size_t row = 0; row < height; ++row) {
    std::memcpy(static_cast<char*>(destination) + row * destination_pitch,
                static_cast<const char*>(source) + row * source_pitch, width);
  }
  return cudaSuccess;
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
  for (int j = 0; j < n; ++j) {
    for (int i = 0; i < m; ++i) {
      double sum = 0.0;
      for (int p = 0; p < k; ++p) {
        const float a = transa == CUBLAS_OP_N ? A[i + p * lda] : A[p + i * lda];
        const float b = transb == CUBLAS_OP_N ? B[p + j * ldb] : B[j + p * ldb];
        sum += double(a) * double(b);
      }
      float& c = C[i + j * ldc];
      c = static_cast<float>(*alpha * sum + (*beta == 0.0F ? 0.0 : double(*beta) * c));
    }
  }
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

cudaError_t launch_fill(cudaStream_t, float* x, std::size_t n, float value) {
  for (std::size_t i = 0; i < n; ++i)
    x[i] = value;
  return cudaSuccess;
}
cudaError_t launch_scale(cudaStream_t, float* x, std::size_t n, float alpha) {
  for (std::size_t i = 0; i < n; ++i)
    x[i] *= alpha;
  return cudaSuccess;
}
cudaError_t launch_axpy(cudaStream_t, float alpha, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
  return cudaSuccess;
}
cudaError_t launch_add(cudaStream_t, const float* a, const float* b, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = a[i] + b[i];
  return cudaSuccess;
}
cudaError_t launch_bias_add(cudaStream_t, float* x, std::size_t n, const float* bias,
                            std::size_t width) {
  for (std::size_t i = 0; i < n; ++i)
    x[i] += bias[i % width];
  return cudaSuccess;
}
cudaError_t launch_column_sums(cudaStream_t, const float* x, float* out, std::size_t rows,
                               std::size_t columns, float beta, double* scratch) {
  column_reduce(
      ElementValue{x, columns},
      [&](std::size_t j, double sum) {
        out[j] = column_sum_value(sum, beta, beta == 0.0F ? 0.0F : out[j]);
      },
      rows, columns, scratch);
  return cudaSuccess;
}
cudaError_t launch_activation_forward(cudaStream_t, ActivationCode kind, const float* x, float* y,
                                      std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] = activate(kind, x[i]);
  return cudaSuccess;
}
cudaError_t launch_activation_backward(cudaStream_t, ActivationCode kind, const float* x,
                                       const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    dx[i] = activation_gradient(kind, x == nullptr ? 0.0F : x[i], y[i], dy[i]);
  return cudaSuccess;
}
cudaError_t launch_relu_forward(cudaStream_t, const float* x, float* y, std::size_t n, float top,
                                float slope, float threshold) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] = relu_value(x[i], top, slope, threshold);
  return cudaSuccess;
}
cudaError_t launch_relu_backward(cudaStream_t, const float* x, const float* dy, float* dx,
                                 std::size_t n, float top, float slope, float threshold) {
  for (std::size_t i = 0; i < n; ++i)
    dx[i] = relu_gradient(x[i], dy[i], top, slope, threshold);
  return cudaSuccess;
}
cudaError_t launch_softmax_forward(cudaStream_t, const float* x, float* y, std::size_t outer,
                                   std::size_t length, std::size_t inner) {
  for (std::size_t line = 0; line < outer * inner; ++line)
    softmax_forward_line(x, y, length, inner, line);
  return cudaSuccess;
}
cudaError_t launch_softmax_backward(cudaStream_t, const float* y, const float* dy, float* dx,
                                    std::size_t outer, std::size_t length, std::size_t inner) {
  for (std::size_t line = 0; line < outer * inner; ++line)
    softmax_backward_line(y, dy, dx, length, inner, line);
  return cudaSuccess;
}
cudaError_t launch_dropout(cudaStream_t, const float* x, float* y, std::size_t n, double rate,
                           float keep_scale, std::uint64_t key) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] = dropout_value(x[i], key, i, rate, keep_scale);
  return cudaSuccess;
}
cudaError_t launch_im2col(cudaStream_t, const float* x, const ConvDims& g, float* columns) {
  const std::size_t n = g.batch * g.out_h * g.out_w * g.kernel_h * g.kernel_w * g.in_c;
  for (std::size_t i = 0; i < n; ++i)
    columns[i] = im2col_value(x, g, i);
  return cudaSuccess;
}
cudaError_t launch_col2im(cudaStream_t, const float* columns, const ConvDims& g, float* dx) {
  const std::size_t n = g.batch * g.in_h * g.in_w * g.in_c;
  for (std::size_t i = 0; i < n; ++i)
    dx[i] = col2im_value(columns, g, i);
  return cudaSuccess;
}
cudaError_t launch_max_pool_forward(cudaStream_t, const float* x, const PoolDims& g, float* y) {
  for (std::size_t i = 0; i < g.batch * g.out_h * g.out_w * g.channels; ++i)
    y[i] = pool_forward_value(x, g, true, i);
  return cudaSuccess;
}
cudaError_t launch_max_pool_backward(cudaStream_t, const float* x, const PoolDims& g,
                                     const float* dy, float* dx) {
  for (std::size_t i = 0; i < g.batch * g.in_h * g.in_w * g.channels; ++i)
    dx[i] = pool_backward_value(x, g, dy, true, i);
  return cudaSuccess;
}
cudaError_t launch_avg_pool_forward(cudaStream_t, const float* x, const PoolDims& g, float* y) {
  for (std::size_t i = 0; i < g.batch * g.out_h * g.out_w * g.channels; ++i)
    y[i] = pool_forward_value(x, g, false, i);
  return cudaSuccess;
}
cudaError_t launch_avg_pool_backward(cudaStream_t, const PoolDims& g, const float* dy, float* dx) {
  for (std::size_t i = 0; i < g.batch * g.in_h * g.in_w * g.channels; ++i)
    dx[i] = pool_backward_value(nullptr, g, dy, false, i);
  return cudaSuccess;
}
cudaError_t launch_global_pool_forward(cudaStream_t, const float* x, bool max, float* y,
                                       std::size_t batch, std::size_t pixels,
                                       std::size_t channels) {
  for (std::size_t i = 0; i < batch * channels; ++i)
    y[i] = global_pool_forward_value(x, max, pixels, channels, i);
  return cudaSuccess;
}
cudaError_t launch_global_pool_backward(cudaStream_t, const float* x, bool max, const float* dy,
                                        float* dx, std::size_t batch, std::size_t pixels,
                                        std::size_t channels) {
  for (std::size_t i = 0; i < batch * channels; ++i)
    global_pool_backward_line(x, max, dy, dx, pixels, channels, i);
  return cudaSuccess;
}
cudaError_t launch_moments(cudaStream_t, const float* x, float* mean, float* variance,
                           std::size_t rows, std::size_t channels, double* scratch) {
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
  return cudaSuccess;
}
cudaError_t launch_batch_norm_forward(cudaStream_t, const float* x, const float* mean,
                                      const float* variance, const float* gamma, const float* beta,
                                      float epsilon, float* y, std::size_t rows,
                                      std::size_t channels) {
  for (std::size_t i = 0; i < rows * channels; ++i) {
    const std::size_t j = i % channels;
    y[i] = batch_norm_value(x[i], mean[j], variance[j], gamma == nullptr ? 1.0F : gamma[j],
                            beta == nullptr ? 0.0F : beta[j], epsilon);
  }
  return cudaSuccess;
}
cudaError_t launch_batch_norm_backward(cudaStream_t, const float* x, const float* mean,
                                       const float* variance, const float* gamma, float epsilon,
                                       bool training, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t rows, std::size_t channels,
                                       double* scratch) {
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
  if (dx == nullptr) return cudaSuccess;
  for (std::size_t i = 0; i < rows * channels; ++i) {
    const std::size_t j = i % channels;
    dx[i] =
        batch_norm_gradient(x[i], mean[j], variance[j], gamma == nullptr ? 1.0 : gamma[j], epsilon,
                            training, dy[i], sum_dy[j], sum_dy_xhat[j], static_cast<double>(rows));
  }
  return cudaSuccess;
}
cudaError_t launch_moving_average(cudaStream_t, float* moving, const float* value, std::size_t n,
                                  float momentum) {
  for (std::size_t i = 0; i < n; ++i)
    moving[i] = moving_average_value(moving[i], value[i], momentum);
  return cudaSuccess;
}
cudaError_t launch_find_bad_index(cudaStream_t, const float* indices, std::size_t n,
                                  std::size_t rows, unsigned long long* first) {
  for (std::size_t i = 0; i < n; ++i)
    if (!index_in_range(indices[i], rows) && i < *first) *first = i;
  return cudaSuccess;
}
cudaError_t launch_gather(cudaStream_t, const float* indices, std::size_t n, const float* table,
                          std::size_t width, float* out) {
  for (std::size_t i = 0; i < n * width; ++i)
    out[i] = gather_value(indices, table, width, i);
  return cudaSuccess;
}
cudaError_t launch_scatter_add(cudaStream_t, const float* indices, std::size_t n, const float* dy,
                               std::size_t width, float* table_gradient) {
  for (std::size_t c = 0; c < width; ++c)
    scatter_add_column(indices, n, dy, width, table_gradient, c);
  return cudaSuccess;
}
cudaError_t launch_clip_scales(cudaStream_t, const UpdateTarget* targets, std::size_t count,
                               std::size_t segments, double* partials, bool global,
                               double threshold, float* scales) {
  for (std::size_t s = 0; s < segments; ++s)
    partials[s] = segment_squares(targets, count, s);
  clip_scales(targets, count, partials, global, threshold, scales);
  return cudaSuccess;
}
cudaError_t launch_optimizer_step(cudaStream_t, const UpdateTarget* targets, std::size_t count,
                                  std::size_t elements, const UpdateParams& params,
                                  const float* scales) {
  for (std::size_t i = 0; i < elements; ++i)
    update_flat(targets, count, params, scales, i);
  return cudaSuccess;
}
cudaError_t launch_row_loss(cudaStream_t, const RowLossParams& params, const RowDims& dims,
                            const float* y_true, const float* y_pred, const float* weight,
                            float* gradient, double* terms, double* partials, double* result,
                            unsigned long long* first_bad) {
  for (std::size_t j = 0; j < dims.values; ++j) {
    if (params.kind == RowLossCode::sparse_categorical_crossentropy &&
        !label_in_range(y_true[j * dims.true_size], dims.classes) && j < *first_bad) {
      *first_bad = j;
    }
    terms[j] = row_loss_term(params, dims, y_true, y_pred, weight, gradient, j);
  }
  column_reduce(
      DoubleElementValue{terms, 1}, [&](std::size_t j, double sum) { result[j] = sum; },
      dims.values, 1, partials);
  return cudaSuccess;
}
cudaError_t launch_mean_metric(cudaStream_t, MeanMetricCode kind, double threshold,
                               const RowDims& dims, const float* y_true, const float* y_pred,
                               const float* weight, double* terms, double* partials,
                               double* result) {
  for (std::size_t j = 0; j < dims.values; ++j)
    metric_terms(kind, threshold, dims, y_true, y_pred, weight, terms, j);
  column_reduce(
      DoubleElementValue{terms, 2}, [&](std::size_t j, double sum) { result[j] = sum; },
      dims.values, 2, partials);
  return cudaSuccess;
}
cudaError_t launch_permute(cudaStream_t, const float* x, float* y, const PermuteDims& dims,
                           std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    y[i] = x[permute_offset(dims, i)];
  return cudaSuccess;
}

}  // namespace loadstar::cuda::detail
