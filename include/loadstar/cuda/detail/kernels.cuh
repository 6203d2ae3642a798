/// \file
/// The CUDA backend's kernels and the definitions of their launchers (kernels.hpp). Compiled by
/// nvcc in exactly one translation unit: src/cuda.cu, Meson's `loadstar_cuda` library.
///
/// Determinism: no kernel reduces floats with atomics. Every sum runs in a fixed order that
/// depends only on the sizes (one thread per output element looping in order, or per-chunk
/// partial sums in double added in chunk order), so that two runs give the same bits. Where the
/// CPU backend's order can be followed cheaply (col2im, pooling gradients, scatter_add, softmax),
/// it is, so that those results match it bit for bit apart from the device's `expf`.
#pragma once

#if !defined(__CUDACC__)
#error "loadstar/cuda/detail/kernels.cuh is compiled by nvcc only (src/cuda.cu)"
#endif

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "loadstar/cuda/detail/kernels.hpp"
#include "loadstar/cuda/detail/math.hpp"
#include "loadstar/keras/mixed_precision/detail/half_rounding.hpp"

namespace loadstar::cuda::detail {

namespace {

constexpr unsigned block_threads = 256;

/// Blocks for a grid-stride loop over `n` items.
inline unsigned blocks_for(std::size_t n) noexcept {
  const std::size_t blocks = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(blocks < 65536 ? (blocks == 0 ? 1 : blocks) : 65536);
}

#define LOADSTAR_GRID_STRIDE(i, n)                                                  \
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += std::size_t(gridDim.x) * blockDim.x)

/// Queues `kernel<<<blocks_for(n), block_threads>>>` unless `n` is 0, and returns the launch
/// status.
template <class... Parameters, class... Arguments>
cudaError_t launch(void (*kernel)(Parameters...), cudaStream_t stream, std::size_t n,
                   Arguments&&... arguments) {
  if (n == 0) return cudaSuccess;
  kernel<<<blocks_for(n), block_threads, 0, stream>>>(static_cast<Arguments&&>(arguments)...);
  return cudaGetLastError();
}

// --- Elementwise ------------------------------------------------------------------------------

__global__ void fill_kernel(float* x, std::size_t n, float value) {
  LOADSTAR_GRID_STRIDE(i, n) {
    x[i] = value;
  }
}

__global__ void fill_many_kernel(const FillTarget* targets, std::size_t count, std::size_t elements,
                                 float value) {
  LOADSTAR_GRID_STRIDE(i, elements) {
    fill_flat(targets, count, value, i);
  }
}

__global__ void scale_many_kernel(const FillTarget* targets, std::size_t count,
                                  std::size_t elements, float alpha, const float* device_alpha) {
  if (device_alpha != nullptr) alpha = *device_alpha;
  LOADSTAR_GRID_STRIDE(i, elements) {
    scale_flat(targets, count, alpha, i);
  }
}

__global__ void finite_start_kernel(float* flag, double* record) {
  *flag = 1.0F;
  record[0] = 1.0;
}

__global__ void all_finite_kernel(const FillTarget* targets, std::size_t count,
                                  std::size_t elements, float* flag, double* record) {
  LOADSTAR_GRID_STRIDE(i, elements) {
    if (!finite_flat(targets, count, i)) {
      *flag = 0.0F;  // every writer writes the same
      record[0] = 0.0;
    }
  }
}

__global__ void scale_kernel(float* x, std::size_t n, float alpha) {
  LOADSTAR_GRID_STRIDE(i, n) {
    x[i] *= alpha;
  }
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] += alpha * x[i];
  }
}

__global__ void add_kernel(const float* a, const float* b, float* out, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    out[i] = a[i] + b[i];
  }
}

__global__ void bias_add_kernel(float* x, std::size_t n, const float* bias, std::size_t width) {
  LOADSTAR_GRID_STRIDE(i, n) {
    x[i] += bias[i % width];
  }
}

__global__ void activation_forward_kernel(Activation kind, const float* x, float* y,
                                          std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] = activate(kind, x[i]);
  }
}

__global__ void activation_backward_kernel(Activation kind, const float* x, const float* y,
                                           const float* dy, float* dx, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    dx[i] = activation_gradient(kind, x == nullptr ? 0.0F : x[i], y[i], dy[i]);
  }
}

__global__ void relu_forward_kernel(const float* x, float* y, std::size_t n, float top, float slope,
                                    float threshold) {
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] = relu_value(x[i], top, slope, threshold);
  }
}

__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx, std::size_t n,
                                     float top, float slope, float threshold) {
  LOADSTAR_GRID_STRIDE(i, n) {
    dx[i] = relu_gradient(x[i], dy[i], top, slope, threshold);
  }
}

__global__ void dropout_kernel(const float* x, float* y, std::size_t n, double rate,
                               float keep_scale, std::uint64_t key,
                               const std::uint64_t* device_key) {
  if (device_key != nullptr) key = *device_key;
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] = dropout_value(x[i], key, i, rate, keep_scale);
  }
}

__global__ void moving_average_kernel(float* moving, const float* value, std::size_t n,
                                      float momentum) {
  LOADSTAR_GRID_STRIDE(i, n) {
    moving[i] = moving_average_value(moving[i], value[i], momentum);
  }
}

// --- Softmax ------------------------------------------------------------------------------------

__global__ void softmax_forward_kernel(const float* x, float* y, std::size_t lines,
                                       std::size_t length, std::size_t inner) {
  LOADSTAR_GRID_STRIDE(line, lines) {
    softmax_forward_line(x, y, length, inner, line);
  }
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx,
                                        std::size_t lines, std::size_t length, std::size_t inner) {
  LOADSTAR_GRID_STRIDE(line, lines) {
    softmax_backward_line(y, dy, dx, length, inner, line);
  }
}

// --- Column reductions ---------------------------------------------------------------------------

/// The threads a block of a column reduction takes for `n` columns (or groups of them): as many
/// as they need, in whole warps (a warp for a narrow matrix), so that a block per chunk keeps few
/// threads idle.
inline unsigned column_block_threads(std::size_t n) noexcept {
  return n >= block_threads ? block_threads : static_cast<unsigned>((n + 31) / 32 * 32);
}

/// Block `(x, y)`: columns `x * blockDim.x + threadIdx.x` of chunk `y`.
template <class Value>
__global__ void column_partials_kernel(Value value, std::size_t rows, std::size_t columns,
                                       double* partials) {
  const std::size_t j = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= columns) return;
  partials[std::size_t(blockIdx.y) * columns + j] = column_partial(value, rows, blockIdx.y, j);
}

/// One chunk: each column's partial sum is its total.
template <class Finish>
__global__ void column_finish_kernel(const double* partials, std::size_t columns, Finish finish) {
  LOADSTAR_GRID_STRIDE(j, columns) {
    finish(j, partials[j]);
  }
}

/// Several chunks: one block of `reduction_lanes` threads per column adds its partial sums by
/// lane, then the lanes in `column_total`'s tree.
template <class Finish>
__global__ void column_tree_finish_kernel(const double* partials, std::size_t chunks,
                                          std::size_t columns, Finish finish) {
  __shared__ double lanes[reduction_lanes];
  for (std::size_t j = blockIdx.x; j < columns; j += gridDim.x) {
    lanes[threadIdx.x] = column_lane_sum(partials, chunks, columns, j, threadIdx.x);
    __syncthreads();
    for (unsigned stride = reduction_lanes / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) lanes[threadIdx.x] += lanes[threadIdx.x + stride];
      __syncthreads();
    }
    if (threadIdx.x == 0) finish(j, lanes[0]);
    __syncthreads();
  }
}

/// Partial sums in groups of `Group` columns (`conv_weight_partials`): block `(x, y)` holds the
/// groups `x * blockDim.x + threadIdx.x` of chunk `y`.
template <std::size_t Group, class Index>
__global__ void conv_weight_partials_kernel(const float* x, ConvIndex<Index> g, const float* dz,
                                            std::size_t rows, std::size_t filters,
                                            std::size_t columns, double* partials) {
  const std::size_t j = (std::size_t(blockIdx.x) * blockDim.x + threadIdx.x) * Group;
  if (j >= columns) return;
  conv_weight_partials<Group>(x, g, dz, rows, filters, blockIdx.y, j,
                              partials + std::size_t(blockIdx.y) * columns + j);
}

/// The totals of `columns` columns' partial sums (`chunks` of them each), as `column_total`
/// adds them, handed to `finish`.
template <class Finish>
cudaError_t finish_columns(cudaStream_t stream, const double* partials, std::size_t chunks,
                           std::size_t columns, Finish finish) {
  if (chunks == 1)
    return launch(column_finish_kernel<Finish>, stream, columns, partials, columns, finish);
  static_assert(reduction_lanes == block_threads, "a block of threads per column's lanes");
  const auto blocks = static_cast<unsigned>(columns < 65535 ? columns : 65535);
  column_tree_finish_kernel<<<blocks, reduction_lanes, 0, stream>>>(partials, chunks, columns,
                                                                    finish);
  return cudaGetLastError();
}

/// `finish(j, sum over rows of value(r, j))` for every column, in a fixed order of additions
/// (`column_partial`, `column_total`).
template <class Value, class Finish>
cudaError_t column_reduce(cudaStream_t stream, Value value, Finish finish, std::size_t rows,
                          std::size_t columns, double* partials) {
  if (columns == 0) return cudaSuccess;
  const std::size_t chunks = reduction_chunks(rows);
  const unsigned threads = column_block_threads(columns);
  const dim3 grid(static_cast<unsigned>((columns + threads - 1) / threads),
                  static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, threads, 0, stream>>>(value, rows, columns, partials);
  if (const cudaError_t status = cudaGetLastError(); status != cudaSuccess) return status;
  return finish_columns(stream, partials, chunks, columns, finish);
}

struct ColumnSumsFinish {
  float* out;
  float beta;
  __device__ void operator()(std::size_t j, double sum) const {
    out[j] = column_sum_value(sum, beta, beta == 0.0F ? 0.0F : out[j]);
  }
};

struct StoreMean {
  double* out;
  double rows;
  __device__ void operator()(std::size_t j, double sum) const { out[j] = sum / rows; }
};

struct MomentsFinish {
  const double* mean_sums;
  float* mean;
  float* variance;
  double rows;
  __device__ void operator()(std::size_t j, double squares) const {
    mean[j] = static_cast<float>(mean_sums[j]);
    variance[j] = static_cast<float>(squares / rows);
  }
};

/// Keeps the sum (for `dx`) and adds it to the weight gradient when there is one.
struct AccumulateFinish {
  double* sums;
  float* gradient;
  __device__ void operator()(std::size_t j, double sum) const {
    sums[j] = sum;
    if (gradient != nullptr) gradient[j] += static_cast<float>(sum);
  }
};

__global__ void attention_forward_kernel(AttentionShape s, AttentionCall call, float scale,
                                         std::uint64_t key, const std::uint64_t* device_key,
                                         const float* q, const float* k, const float* v,
                                         float* probabilities, float* out, std::size_t rows) {
  const std::uint64_t dropout_key = device_key != nullptr ? *device_key : key;
  LOADSTAR_GRID_STRIDE(r, rows) {
    const std::size_t i = r % s.query_steps, bh = r / s.query_steps;
    keras::detail::attention_forward_row(s, call, scale, dropout_key, q, k, v, probabilities, out,
                                         bh / s.heads, bh % s.heads, i);
  }
}

__global__ void attention_query_gradient_kernel(AttentionShape s, AttentionCall call, float scale,
                                                std::uint64_t key, const std::uint64_t* device_key,
                                                const float* k, const float* v,
                                                const float* probabilities, const float* dout,
                                                const float* dprobabilities, float* scores_gradient,
                                                float* dq, std::size_t rows) {
  const std::uint64_t dropout_key = device_key != nullptr ? *device_key : key;
  LOADSTAR_GRID_STRIDE(r, rows) {
    const std::size_t i = r % s.query_steps, bh = r / s.query_steps;
    keras::detail::attention_query_gradient_row(s, call, scale, dropout_key, k, v, probabilities,
                                                dout, dprobabilities, scores_gradient, dq,
                                                bh / s.heads, bh % s.heads, i);
  }
}

__global__ void attention_key_gradient_kernel(AttentionShape s, AttentionCall call, float scale,
                                              std::uint64_t key, const std::uint64_t* device_key,
                                              const float* q, const float* probabilities,
                                              const float* dout, const float* scores_gradient,
                                              float* dk, float* dv, std::size_t rows) {
  const std::uint64_t dropout_key = device_key != nullptr ? *device_key : key;
  LOADSTAR_GRID_STRIDE(r, rows) {
    const std::size_t j = r % s.value_steps, bh = r / s.value_steps;
    keras::detail::attention_key_gradient_row(s, call, scale, dropout_key, q, probabilities, dout,
                                              scores_gradient, dk, dv, bh / s.heads, bh % s.heads,
                                              j);
  }
}

__global__ void layer_norm_forward_kernel(const float* x, const float* gamma, const float* beta,
                                          float epsilon, float* y, std::size_t lines,
                                          std::size_t width) {
  LOADSTAR_GRID_STRIDE(line, lines) {
    layer_norm_forward_line(x, gamma, beta, epsilon, y, width, line);
  }
}

__global__ void layer_norm_backward_kernel(const float* x, const float* gamma, float epsilon,
                                           const float* dy, float* dx, double* stats,
                                           std::size_t lines, std::size_t width) {
  LOADSTAR_GRID_STRIDE(line, lines) {
    layer_norm_backward_line(x, gamma, epsilon, dy, dx, stats, width, line);
  }
}

__global__ void batch_norm_forward_kernel(const float* x, const float* mean, const float* variance,
                                          const float* gamma, const float* beta, float epsilon,
                                          float* y, std::size_t n, std::size_t channels) {
  LOADSTAR_GRID_STRIDE(i, n) {
    const std::size_t j = i % channels;
    y[i] = batch_norm_value(x[i], mean[j], variance[j], gamma == nullptr ? 1.0F : gamma[j],
                            beta == nullptr ? 0.0F : beta[j], epsilon);
  }
}

__global__ void batch_norm_dx_kernel(const float* x, const float* mean, const float* variance,
                                     const float* gamma, float epsilon, bool training,
                                     const float* dy, float* dx, const double* sum_dy,
                                     const double* sum_dy_xhat, std::size_t n, std::size_t channels,
                                     double rows) {
  LOADSTAR_GRID_STRIDE(i, n) {
    const std::size_t j = i % channels;
    dx[i] = batch_norm_gradient(x[i], mean[j], variance[j], gamma == nullptr ? 1.0 : gamma[j],
                                epsilon, training, dy[i], sum_dy[j], sum_dy_xhat[j], rows);
  }
}

// --- Convolution unfolding and pooling
// -------------------------------------------------------------

/// A grid-stride loop over `n` items with indices of type `Index` (32 bits where they fit: see
/// `Divisor`).
#define LOADSTAR_GRID_STRIDE_OF(Index, i, n)                            \
  for (Index i = Index(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += Index(gridDim.x) * blockDim.x)

template <class Index>
__global__ void im2col_kernel(const float* x, ConvIndex<Index> g, float* columns, Index n) {
  LOADSTAR_GRID_STRIDE_OF(Index, i, n) {
    columns[i] = im2col_value(x, g, i);
  }
}

template <class Index>
__global__ void col2im_kernel(const float* columns, ConvIndex<Index> g, float* dx, Index n) {
  LOADSTAR_GRID_STRIDE_OF(Index, i, n) {
    dx[i] = col2im_value(columns, g, i);
  }
}

template <class Index>
__global__ void pool_forward_kernel(const float* x, PoolIndex<Index> g, float* y, bool max,
                                    Index n) {
  LOADSTAR_GRID_STRIDE_OF(Index, i, n) {
    y[i] = pool_forward_value(x, g, max, i);
  }
}

template <class Index>
__global__ void max_pool_window_gradient_kernel(const float* x, PoolIndex<Index> g, const float* dy,
                                                float* dx, bool relu, Index n) {
  LOADSTAR_GRID_STRIDE_OF(Index, i, n) {
    max_pool_window_gradient(x, g, dy, dx, relu, i);
  }
}

template <class Index>
__global__ void pool_backward_kernel(const float* x, PoolIndex<Index> g, const float* dy, float* dx,
                                     bool max, bool relu, Index n) {
  LOADSTAR_GRID_STRIDE_OF(Index, i, n) {
    dx[i] = pool_input_gradient(x, g, dy, max, relu, i);
  }
}

__global__ void global_pool_forward_kernel(const float* x, bool max, float* y, std::size_t n,
                                           std::size_t pixels, std::size_t channels) {
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] = global_pool_forward_value(x, max, pixels, channels, i);
  }
}

__global__ void global_pool_backward_kernel(const float* x, bool max, const float* dy, float* dx,
                                            std::size_t n, std::size_t pixels,
                                            std::size_t channels) {
  LOADSTAR_GRID_STRIDE(i, n) {
    global_pool_backward_line(x, max, dy, dx, pixels, channels, i);
  }
}

// --- Indexing and layout -------------------------------------------------------------------------

__global__ void find_bad_index_kernel(const float* indices, std::size_t n, std::size_t rows,
                                      unsigned long long* first) {
  LOADSTAR_GRID_STRIDE(i, n) {
    if (!index_in_range(indices[i], rows)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

__global__ void record_bad_index_kernel(const float* indices, double* record) {
  if (blockIdx.x == 0 && threadIdx.x == 0) record_bad_index(indices, record);
}

__global__ void gather_kernel(const float* indices, const float* table, std::size_t rows,
                              std::size_t width, float* out, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    out[i] = gather_value(indices, table, rows, width, i);
  }
}

/// A block per row (striding over the rows), its threads over the row's elements.
__global__ void gather_rows_kernel(const std::uint64_t* rows, std::size_t count,
                                   const float* source, std::size_t width, float* out) {
  for (std::size_t r = blockIdx.x; r < count; r += gridDim.x) {
    const float* from = source + rows[r] * width;
    float* to = out + r * width;
    for (std::size_t c = threadIdx.x; c < width; c += blockDim.x)
      to[c] = from[c];
  }
}

/// One thread per column, so that each element's sum runs over the indices in order.
__global__ void scatter_add_kernel(const float* indices, std::size_t count, const float* dy,
                                   std::size_t rows, std::size_t width, float* table_gradient) {
  LOADSTAR_GRID_STRIDE(c, width) {
    scatter_add_column(indices, count, dy, rows, width, table_gradient, c);
  }
}

__global__ void permute_kernel(const float* x, float* y, PermuteDims d, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    y[i] = x[permute_offset(d, i)];
  }
}

__global__ void recurrent_kernel(RecurrentKernel k, RecurrentTensors t, std::size_t n,
                                 std::uint64_t key, const std::uint64_t* device_key) {
  const std::uint64_t mask_key = device_key != nullptr ? *device_key : key;
  LOADSTAR_GRID_STRIDE(i, n) {
    keras::detail::recurrent_element(k, t, mask_key, i);
  }
}

__global__ void layer_kernel(LayerKernel k, LayerTensors t, std::size_t n, std::uint64_t key,
                             const std::uint64_t* device_key) {
  const std::uint64_t noise_key = device_key != nullptr ? *device_key : key;
  LOADSTAR_GRID_STRIDE(i, n) {
    keras::detail::layer_element(k, t, noise_key, i);
  }
}

__global__ void round_half_kernel(float* x, std::size_t n, keras::detail::HalfKind kind) {
  LOADSTAR_GRID_STRIDE(i, n) {
    x[i] = keras::detail::round_half(x[i], kind);
  }
}

__global__ void depthwise_forward_kernel(const float* x, keras::Conv2DGeometry g,
                                         const float* kernel, const float* bias, float* z,
                                         std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    z[i] = depthwise_value(x, g, kernel, bias, i);
  }
}

__global__ void depthwise_input_gradient_kernel(const float* dz, keras::Conv2DGeometry g,
                                                const float* kernel, float* dx, std::size_t n) {
  LOADSTAR_GRID_STRIDE(i, n) {
    dx[i] = depthwise_input_gradient(dz, g, kernel, i);
  }
}

__global__ void to_half_kernel(const float* from, std::uint16_t* to, std::size_t n,
                               keras::detail::HalfKind kind) {
  LOADSTAR_GRID_STRIDE(i, n) {
    to[i] = keras::detail::half_bits(from[i], kind);
  }
}

// --- Optimizer steps, losses and metrics ------------------------------------------------------

__global__ void segment_squares_kernel(const UpdateTarget* targets, std::size_t count,
                                       std::size_t segments, double* partials) {
  LOADSTAR_GRID_STRIDE(s, segments) {
    partials[s] = segment_squares(targets, count, s);
  }
}

/// One thread: the additions in a fixed order (a few per segment; the segments did the work).
__global__ void clip_scales_kernel(const UpdateTarget* targets, std::size_t count,
                                   const double* partials, bool global, double threshold,
                                   float* scales) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    clip_scales(targets, count, partials, global, threshold, scales);
}

__global__ void optimizer_step_kernel(const UpdateTarget* targets, std::size_t count,
                                      std::size_t elements, UpdateParams params,
                                      const UpdateParams* device_params, const float* scales,
                                      const float* condition) {
  if (condition != nullptr && *condition == 0.0F) return;
  if (device_params != nullptr) params = *device_params;
  LOADSTAR_GRID_STRIDE(i, elements) {
    update_flat(targets, count, params, scales, i);
  }
}

__global__ void row_loss_kernel(RowLossParams params, RowDims dims, const float* y_true,
                                const float* y_pred, const float* weight, float* gradient,
                                double* terms, unsigned long long* first_bad) {
  LOADSTAR_GRID_STRIDE(j, dims.values) {
    if (params.kind == RowLossKind::sparse_categorical_crossentropy &&
        !label_in_range(y_true[j * dims.true_size], dims.classes)) {
      atomicMin(first_bad, static_cast<unsigned long long>(j));  // an integer minimum: any order
    }
    terms[j] = row_loss_term(params, dims, y_true, y_pred, weight, gradient, j);
  }
}

__global__ void metric_terms_kernel(MeanMetricKind kind, double threshold, RowDims dims,
                                    const float* y_true, const float* y_pred, const float* weight,
                                    double* terms) {
  LOADSTAR_GRID_STRIDE(j, dims.values) {
    metric_terms(kind, threshold, dims, y_true, y_pred, weight, terms, j);
  }
}

struct StoreSum {
  double* out;
  __device__ void operator()(std::size_t j, double sum) const { out[j] = sum; }
};

struct FinishRowLoss {
  double* record;
  const float* y_true;
  std::size_t true_size;
  __device__ void operator()(std::size_t, double sum) const {
    finish_row_loss(sum, y_true, true_size, record);
  }
};

#undef LOADSTAR_GRID_STRIDE

}  // namespace

cudaError_t launch_clip_scales(cudaStream_t stream, const UpdateTarget* targets, std::size_t count,
                               std::size_t segments, double* partials, bool global,
                               double threshold, float* scales) {
  if (const cudaError_t status =
          launch(segment_squares_kernel, stream, segments, targets, count, segments, partials);
      status != cudaSuccess) {
    return status;
  }
  clip_scales_kernel<<<1, 1, 0, stream>>>(targets, count, partials, global, threshold, scales);
  return cudaGetLastError();
}

cudaError_t launch_optimizer_step(cudaStream_t stream, const UpdateTarget* targets,
                                  std::size_t count, std::size_t elements,
                                  const UpdateParams& params, const UpdateParams* device_params,
                                  const float* scales, const float* condition) {
  return launch(optimizer_step_kernel, stream, elements, targets, count, elements, params,
                device_params, scales, condition);
}

cudaError_t launch_row_loss(cudaStream_t stream, const RowLossParams& params, const RowDims& dims,
                            const float* y_true, const float* y_pred, const float* weight,
                            float* gradient, double* terms, double* partials, double* record) {
  if (const cudaError_t status =
          launch(row_loss_kernel, stream, dims.values, params, dims, y_true, y_pred, weight,
                 gradient, terms, reinterpret_cast<unsigned long long*>(record + 1));
      status != cudaSuccess) {
    return status;
  }
  return column_reduce(stream, DoubleElementValue{terms, 1},
                       FinishRowLoss{record, y_true, dims.true_size}, dims.values, 1, partials);
}

cudaError_t launch_mean_metric(cudaStream_t stream, MeanMetricKind kind, double threshold,
                               const RowDims& dims, const float* y_true, const float* y_pred,
                               const float* weight, double* terms, double* partials,
                               double* result) {
  if (const cudaError_t status = launch(metric_terms_kernel, stream, dims.values, kind, threshold,
                                        dims, y_true, y_pred, weight, terms);
      status != cudaSuccess) {
    return status;
  }
  return column_reduce(stream, DoubleElementValue{terms, 2}, StoreSum{result}, dims.values, 2,
                       partials);
}

cudaError_t launch_fill(cudaStream_t stream, float* x, std::size_t n, float value) {
  return launch(fill_kernel, stream, n, x, n, value);
}

cudaError_t launch_fill_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                             std::size_t elements, float value) {
  return launch(fill_many_kernel, stream, elements, targets, count, elements, value);
}

cudaError_t launch_scale_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float alpha, const float* device_alpha) {
  return launch(scale_many_kernel, stream, elements, targets, count, elements, alpha, device_alpha);
}

cudaError_t launch_all_finite(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float* flag, double* record) {
  if (const cudaError_t status = launch(finite_start_kernel, stream, 1, flag, record);
      status != cudaSuccess)
    return status;
  return launch(all_finite_kernel, stream, elements, targets, count, elements, flag, record);
}

cudaError_t launch_scale(cudaStream_t stream, float* x, std::size_t n, float alpha) {
  return launch(scale_kernel, stream, n, x, n, alpha);
}

cudaError_t launch_axpy(cudaStream_t stream, float alpha, const float* x, float* y, std::size_t n) {
  return launch(axpy_kernel, stream, n, alpha, x, y, n);
}

cudaError_t launch_add(cudaStream_t stream, const float* a, const float* b, float* out,
                       std::size_t n) {
  return launch(add_kernel, stream, n, a, b, out, n);
}

cudaError_t launch_bias_add(cudaStream_t stream, float* x, std::size_t n, const float* bias,
                            std::size_t width) {
  return launch(bias_add_kernel, stream, n, x, n, bias, width);
}

cudaError_t launch_column_sums(cudaStream_t stream, const float* x, float* out, std::size_t rows,
                               std::size_t columns, float beta, double* scratch) {
  return column_reduce(stream, ElementValue{x, columns}, ColumnSumsFinish{out, beta}, rows, columns,
                       scratch);
}

cudaError_t launch_activation_forward(cudaStream_t stream, Activation kind, const float* x,
                                      float* y, std::size_t n) {
  return launch(activation_forward_kernel, stream, n, kind, x, y, n);
}

cudaError_t launch_activation_backward(cudaStream_t stream, Activation kind, const float* x,
                                       const float* y, const float* dy, float* dx, std::size_t n) {
  return launch(activation_backward_kernel, stream, n, kind, x, y, dy, dx, n);
}

cudaError_t launch_relu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n,
                                float top, float slope, float threshold) {
  return launch(relu_forward_kernel, stream, n, x, y, n, top, slope, threshold);
}

cudaError_t launch_relu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx,
                                 std::size_t n, float top, float slope, float threshold) {
  return launch(relu_backward_kernel, stream, n, x, dy, dx, n, top, slope, threshold);
}

cudaError_t launch_softmax_forward(cudaStream_t stream, const float* x, float* y, std::size_t outer,
                                   std::size_t length, std::size_t inner) {
  return launch(softmax_forward_kernel, stream, outer * inner, x, y, outer * inner, length, inner);
}

cudaError_t launch_softmax_backward(cudaStream_t stream, const float* y, const float* dy, float* dx,
                                    std::size_t outer, std::size_t length, std::size_t inner) {
  return launch(softmax_backward_kernel, stream, outer * inner, y, dy, dx, outer * inner, length,
                inner);
}

cudaError_t launch_dropout(cudaStream_t stream, const float* x, float* y, std::size_t n,
                           double rate, float keep_scale, std::uint64_t key,
                           const std::uint64_t* device_key) {
  return launch(dropout_kernel, stream, n, x, y, n, rate, keep_scale, key, device_key);
}

cudaError_t launch_im2col(cudaStream_t stream, const float* x, const Conv2DGeometry& g,
                          float* columns) {
  const std::size_t n = g.batch * g.out_h * g.out_w * g.kernel_h * g.kernel_w * g.in_c;
  return with_conv_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    return launch(im2col_kernel<Index>, stream, n, x, index, columns, Index(n));
  });
}

cudaError_t launch_conv_weight_gradients(cudaStream_t stream, const float* x,
                                         const Conv2DGeometry& g, const float* dz,
                                         std::size_t filters, float* dkernel, float* dbias,
                                         bool accumulate, double* scratch) {
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const std::size_t patch = g.kernel_h * g.kernel_w * g.in_c;
  const std::size_t kernel_terms = patch * filters;
  const std::size_t columns = kernel_terms + (dbias != nullptr ? filters : 0);
  if (columns == 0) return cudaSuccess;
  const std::size_t chunks = reduction_chunks(rows);
  const ConvWeightFinish finish{dkernel, dbias, kernel_terms, accumulate};
  const cudaError_t status = with_conv_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    // Four filters a thread where they divide into fours: each input element read once for them.
    const auto queue = [&](auto group) {
      constexpr std::size_t Group = decltype(group)::value;
      const std::size_t threads = columns / Group;
      const unsigned block = column_block_threads(threads);
      const dim3 grid(static_cast<unsigned>((threads + block - 1) / block),
                      static_cast<unsigned>(chunks));
      conv_weight_partials_kernel<Group, Index>
          <<<grid, block, 0, stream>>>(x, index, dz, rows, filters, columns, scratch);
      return cudaGetLastError();
    };
    return filters % 4 == 0 ? queue(std::integral_constant<std::size_t, 4>{})
                            : queue(std::integral_constant<std::size_t, 1>{});
  });
  if (status != cudaSuccess) return status;
  return finish_columns(stream, scratch, chunks, columns, finish);
}

cudaError_t launch_col2im(cudaStream_t stream, const float* columns, const Conv2DGeometry& g,
                          float* dx) {
  const std::size_t n = g.batch * g.in_h * g.in_w * g.in_c;
  return with_conv_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    return launch(col2im_kernel<Index>, stream, n, columns, index, dx, Index(n));
  });
}

namespace {

/// Pooling forward (`max`, else average) over the output's elements.
cudaError_t pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g, float* y,
                         bool max) {
  const std::size_t n = g.batch * g.out_h * g.out_w * g.channels;
  return with_pool_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    return launch(pool_forward_kernel<Index>, stream, n, x, index, y, max, Index(n));
  });
}

/// Pooling backward (`max`, else average) over the input's elements.
cudaError_t pool_backward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                          const float* dy, float* dx, bool max, bool relu) {
  const std::size_t n = g.batch * g.in_h * g.in_w * g.channels;
  return with_pool_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    return launch(pool_backward_kernel<Index>, stream, n, x, index, dy, dx, max, relu, Index(n));
  });
}

}  // namespace

cudaError_t launch_max_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y) {
  return pool_forward(stream, x, g, y, true);
}

/// Disjoint windows (the usual pool size = stride): one thread per window writes the window's
/// gradients, after a fill of the positions no window covers; otherwise one thread per input
/// element gathers from every window that holds it. With `relu`, the gradient goes on through
/// the ReLU whose output `x` is.
cudaError_t launch_max_pool_backward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                     const float* dy, float* dx, bool relu) {
  if (!pool_windows_disjoint(g)) return pool_backward(stream, x, g, dy, dx, true, relu);
  if (!pool_windows_tile(g)) {
    const std::size_t bytes = g.batch * g.in_h * g.in_w * g.channels * sizeof(float);
    if (const cudaError_t status = cudaMemsetAsync(dx, 0, bytes, stream); status != cudaSuccess)
      return status;
  }
  const std::size_t n = g.batch * g.out_h * g.out_w * g.channels;
  return with_pool_index(g, [&](const auto& index) {
    using Index = typename std::decay_t<decltype(index)>::index_type;
    return launch(max_pool_window_gradient_kernel<Index>, stream, n, x, index, dy, dx, relu,
                  Index(n));
  });
}

cudaError_t launch_avg_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y) {
  return pool_forward(stream, x, g, y, false);
}

cudaError_t launch_avg_pool_backward(cudaStream_t stream, const Pool2DGeometry& g, const float* dy,
                                     float* dx) {
  return pool_backward(stream, nullptr, g, dy, dx, false, false);
}

cudaError_t launch_global_pool_forward(cudaStream_t stream, const float* x, bool max, float* y,
                                       std::size_t batch, std::size_t pixels,
                                       std::size_t channels) {
  return launch(global_pool_forward_kernel, stream, batch * channels, x, max, y, batch * channels,
                pixels, channels);
}

cudaError_t launch_global_pool_backward(cudaStream_t stream, const float* x, bool max,
                                        const float* dy, float* dx, std::size_t batch,
                                        std::size_t pixels, std::size_t channels) {
  return launch(global_pool_backward_kernel, stream, batch * channels, x, max, dy, dx,
                batch * channels, pixels, channels);
}

cudaError_t launch_moments(cudaStream_t stream, const float* x, float* mean, float* variance,
                           std::size_t rows, std::size_t channels, double* scratch) {
  double* partials = scratch;
  double* mean_sums = scratch + reduction_chunks(rows) * channels;
  const auto n = static_cast<double>(rows);
  if (const cudaError_t status = column_reduce(stream, ElementValue{x, channels},
                                               StoreMean{mean_sums, n}, rows, channels, partials);
      status != cudaSuccess) {
    return status;
  }
  return column_reduce(stream, SquaredDeviation{x, mean_sums, channels},
                       MomentsFinish{mean_sums, mean, variance, n}, rows, channels, partials);
}

cudaError_t launch_batch_norm_forward(cudaStream_t stream, const float* x, const float* mean,
                                      const float* variance, const float* gamma, const float* beta,
                                      float epsilon, float* y, std::size_t rows,
                                      std::size_t channels) {
  const std::size_t n = rows * channels;
  return launch(batch_norm_forward_kernel, stream, n, x, mean, variance, gamma, beta, epsilon, y, n,
                channels);
}

cudaError_t launch_batch_norm_backward(cudaStream_t stream, const float* x, const float* mean,
                                       const float* variance, const float* gamma, float epsilon,
                                       bool training, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t rows, std::size_t channels,
                                       double* scratch) {
  double* partials = scratch;
  double* sum_dy = scratch + reduction_chunks(rows) * channels;
  double* sum_dy_xhat = sum_dy + channels;
  if (const cudaError_t status =
          column_reduce(stream, ElementValue{dy, channels}, AccumulateFinish{sum_dy, dbeta}, rows,
                        channels, partials);
      status != cudaSuccess) {
    return status;
  }
  if (const cudaError_t status =
          column_reduce(stream, DyXhat{x, mean, variance, dy, epsilon, channels},
                        AccumulateFinish{sum_dy_xhat, dgamma}, rows, channels, partials);
      status != cudaSuccess) {
    return status;
  }
  if (dx == nullptr) return cudaSuccess;
  const std::size_t n = rows * channels;
  return launch(batch_norm_dx_kernel, stream, n, x, mean, variance, gamma, epsilon, training, dy,
                dx, static_cast<const double*>(sum_dy), static_cast<const double*>(sum_dy_xhat), n,
                channels, static_cast<double>(rows));
}

cudaError_t launch_attention_forward(cudaStream_t stream, const AttentionShape& shape,
                                     const AttentionCall& call, float scale, std::uint64_t key,
                                     const std::uint64_t* device_key, const float* q,
                                     const float* k, const float* v, float* probabilities,
                                     float* out) {
  const std::size_t rows = shape.batch * shape.heads * shape.query_steps;
  return launch(attention_forward_kernel, stream, rows, shape, call, scale, key, device_key, q, k,
                v, probabilities, out, rows);
}

cudaError_t launch_attention_backward(cudaStream_t stream, const AttentionShape& shape,
                                      const AttentionCall& call, float scale, std::uint64_t key,
                                      const std::uint64_t* device_key, const float* q,
                                      const float* k, const float* v, const float* probabilities,
                                      const float* dout, const float* dprobabilities,
                                      float* scores_gradient, float* dq, float* dk, float* dv) {
  const std::size_t query_rows = shape.batch * shape.heads * shape.query_steps;
  if (const cudaError_t status = launch(attention_query_gradient_kernel, stream, query_rows, shape,
                                        call, scale, key, device_key, k, v, probabilities, dout,
                                        dprobabilities, scores_gradient, dq, query_rows);
      status != cudaSuccess) {
    return status;
  }
  const std::size_t key_rows = shape.batch * shape.heads * shape.value_steps;
  return launch(attention_key_gradient_kernel, stream, key_rows, shape, call, scale, key,
                device_key, q, probabilities, dout, static_cast<const float*>(scores_gradient), dk,
                dv, key_rows);
}

cudaError_t launch_layer_norm_forward(cudaStream_t stream, const float* x, const float* gamma,
                                      const float* beta, float epsilon, float* y, std::size_t lines,
                                      std::size_t width) {
  return launch(layer_norm_forward_kernel, stream, lines, x, gamma, beta, epsilon, y, lines, width);
}

cudaError_t launch_layer_norm_backward(cudaStream_t stream, const float* x, const float* gamma,
                                       float epsilon, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t lines, std::size_t width,
                                       double* scratch) {
  double* partials = scratch;
  double* sums = scratch + reduction_chunks(lines) * width;
  double* stats = scratch + reduction_scratch(lines, width);
  if (const cudaError_t status = launch(layer_norm_backward_kernel, stream, lines, x, gamma,
                                        epsilon, dy, dx, stats, lines, width);
      status != cudaSuccess) {
    return status;
  }
  if (dbeta != nullptr) {
    if (const cudaError_t status = column_reduce(
            stream, ElementValue{dy, width}, AccumulateFinish{sums, dbeta}, lines, width, partials);
        status != cudaSuccess) {
      return status;
    }
  }
  if (dgamma == nullptr) return cudaSuccess;
  return column_reduce(stream, LayerNormDyXhat{x, dy, stats, width},
                       AccumulateFinish{sums + width, dgamma}, lines, width, partials);
}

cudaError_t launch_moving_average(cudaStream_t stream, float* moving, const float* value,
                                  std::size_t n, float momentum) {
  return launch(moving_average_kernel, stream, n, moving, value, n, momentum);
}

cudaError_t launch_find_bad_index(cudaStream_t stream, const float* indices, std::size_t n,
                                  std::size_t rows, unsigned long long* first) {
  return launch(find_bad_index_kernel, stream, n, indices, n, rows, first);
}

cudaError_t launch_record_bad_index(cudaStream_t stream, const float* indices, double* record) {
  return launch(record_bad_index_kernel, stream, 1, indices, record);
}

cudaError_t launch_gather(cudaStream_t stream, const float* indices, std::size_t n,
                          const float* table, std::size_t rows, std::size_t width, float* out) {
  const std::size_t total = n * width;
  return launch(gather_kernel, stream, total, indices, table, rows, width, out, total);
}

cudaError_t launch_gather_rows(cudaStream_t stream, const std::uint64_t* rows, std::size_t count,
                               const float* source, std::size_t width, float* out) {
  if (count == 0 || width == 0) return cudaSuccess;
  const auto blocks = static_cast<unsigned>(std::min<std::size_t>(count, 65536));
  gather_rows_kernel<<<blocks, block_threads, 0, stream>>>(rows, count, source, width, out);
  return cudaGetLastError();
}

cudaError_t launch_scatter_add(cudaStream_t stream, const float* indices, std::size_t n,
                               const float* dy, std::size_t rows, std::size_t width,
                               float* table_gradient) {
  return launch(scatter_add_kernel, stream, width, indices, n, dy, rows, width, table_gradient);
}

cudaError_t launch_permute(cudaStream_t stream, const float* x, float* y, const PermuteDims& dims,
                           std::size_t n) {
  return launch(permute_kernel, stream, n, x, y, dims, n);
}

cudaError_t launch_recurrent(cudaStream_t stream, const RecurrentKernel& kernel,
                             const RecurrentTensors& tensors, std::size_t elements,
                             std::uint64_t key, const std::uint64_t* device_key) {
  return launch(recurrent_kernel, stream, elements, kernel, tensors, elements, key, device_key);
}

cudaError_t launch_layer(cudaStream_t stream, const LayerKernel& kernel,
                         const LayerTensors& tensors, std::size_t elements, std::uint64_t key,
                         const std::uint64_t* device_key) {
  return launch(layer_kernel, stream, elements, kernel, tensors, elements, key, device_key);
}

cudaError_t launch_round_half(cudaStream_t stream, float* x, std::size_t n, bool bfloat16) {
  return launch(round_half_kernel, stream, n, x, n,
                bfloat16 ? keras::detail::HalfKind::bfloat16 : keras::detail::HalfKind::float16);
}

cudaError_t launch_depthwise_forward(cudaStream_t stream, const float* x,
                                     const keras::Conv2DGeometry& g, const float* kernel,
                                     const float* bias, float* z) {
  const std::size_t n = g.batch * g.out_h * g.out_w * g.out_c;
  return launch(depthwise_forward_kernel, stream, n, x, g, kernel, bias, z, n);
}

cudaError_t launch_depthwise_backward(cudaStream_t stream, const float* x,
                                      const keras::Conv2DGeometry& g, const float* kernel,
                                      const float* dz, float* dx, float* dkernel, float* dbias,
                                      double* scratch) {
  if (dx != nullptr) {
    const std::size_t n = g.batch * g.in_h * g.in_w * g.in_c;
    if (const cudaError_t status =
            launch(depthwise_input_gradient_kernel, stream, n, dz, g, kernel, dx, n);
        status != cudaSuccess)
      return status;
  }
  const std::size_t kernel_terms = dkernel != nullptr ? g.kernel_h * g.kernel_w * g.out_c : 0;
  const std::size_t columns = kernel_terms + (dbias != nullptr ? g.out_c : 0);
  return column_reduce(stream, DepthwiseWeightValue{x, dz, g, kernel_terms},
                       ConvWeightFinish{dkernel, dbias, kernel_terms, true},
                       g.batch * g.out_h * g.out_w, columns, scratch);
}

cudaError_t launch_to_half(cudaStream_t stream, const float* from, std::uint16_t* to, std::size_t n,
                           bool bfloat16) {
  return launch(to_half_kernel, stream, n, from, to, n,
                bfloat16 ? keras::detail::HalfKind::bfloat16 : keras::detail::HalfKind::float16);
}

}  // namespace loadstar::cuda::detail
