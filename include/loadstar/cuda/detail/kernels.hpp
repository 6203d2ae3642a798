/// \file
/// The launchers of the CUDA backend's kernels, declared for host code: raw device pointers,
/// sizes and plain geometry structs, so that a host compiler sees no device code. They are
/// defined in kernels.cuh, compiled once by nvcc (src/cuda.cu, Meson's `loadstar_cuda` library).
/// Each queues its kernel on `stream` and returns the launch's status (`cudaGetLastError`).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "loadstar/cuda/detail/math.hpp"

namespace loadstar::cuda::detail {

cudaError_t launch_fill(cudaStream_t stream, float* x, std::size_t n, float value);
/// Every element of every target (`elements` in all, non-empty targets in flat order) set to
/// `value`, in one launch.
/// Every element of every target multiplied by `alpha`, or by `*device_alpha` when it is not null
/// (a replayed CUDA graph's loss scale), in one launch.
cudaError_t launch_scale_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float alpha, const float* device_alpha);
/// Whether every element of every target is finite: `*flag` set to 1 and `record[0]` to 1.0,
/// then each element that is not finite sets them to 0.
cudaError_t launch_all_finite(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                              std::size_t elements, float* flag, double* record);
cudaError_t launch_fill_many(cudaStream_t stream, const FillTarget* targets, std::size_t count,
                             std::size_t elements, float value);
cudaError_t launch_scale(cudaStream_t stream, float* x, std::size_t n, float alpha);
cudaError_t launch_axpy(cudaStream_t stream, float alpha, const float* x, float* y, std::size_t n);
cudaError_t launch_add(cudaStream_t stream, const float* a, const float* b, float* out,
                       std::size_t n);
cudaError_t launch_bias_add(cudaStream_t stream, float* x, std::size_t n, const float* bias,
                            std::size_t width);
cudaError_t launch_column_sums(cudaStream_t stream, const float* x, float* out, std::size_t rows,
                               std::size_t columns, float beta, double* scratch);

cudaError_t launch_activation_forward(cudaStream_t stream, Activation kind, const float* x,
                                      float* y, std::size_t n);
/// `x` may be null for kinds whose gradient reads only `y`.
cudaError_t launch_activation_backward(cudaStream_t stream, Activation kind, const float* x,
                                       const float* y, const float* dy, float* dx, std::size_t n);
cudaError_t launch_relu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n,
                                float top, float slope, float threshold);
cudaError_t launch_relu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx,
                                 std::size_t n, float top, float slope, float threshold);
cudaError_t launch_softmax_forward(cudaStream_t stream, const float* x, float* y, std::size_t outer,
                                   std::size_t length, std::size_t inner);
cudaError_t launch_softmax_backward(cudaStream_t stream, const float* y, const float* dy, float* dx,
                                    std::size_t outer, std::size_t length, std::size_t inner);
/// `device_key`, when not null, is read on the device instead of `key` (a replayed CUDA graph's
/// step-dependent scalar).
cudaError_t launch_dropout(cudaStream_t stream, const float* x, float* y, std::size_t n,
                           double rate, float keep_scale, std::uint64_t key,
                           const std::uint64_t* device_key);

cudaError_t launch_im2col(cudaStream_t stream, const float* x, const Conv2DGeometry& g,
                          float* columns);
cudaError_t launch_col2im(cudaStream_t stream, const float* columns, const Conv2DGeometry& g,
                          float* dx);
/// A convolution's kernel gradient (`patch x filters`) and bias gradient (`filters`; none where
/// null) from its input and its pre-activation gradient `dz` (`rows x filters`), written (or
/// added, `accumulate`) as one column reduction without unfolding the input
/// (`conv_weight_partials`); `scratch` holds `reduction_scratch(rows, columns)` doubles for the
/// `patch * filters` (+ `filters`) columns.
cudaError_t launch_conv_weight_gradients(cudaStream_t stream, const float* x,
                                         const Conv2DGeometry& g, const float* dz,
                                         std::size_t filters, float* dkernel, float* dbias,
                                         bool accumulate, double* scratch);
cudaError_t launch_max_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y);
/// With `relu`, `dx` goes on through the ReLU whose output `x` is (0 where `x` is not positive).
cudaError_t launch_max_pool_backward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                     const float* dy, float* dx, bool relu);
cudaError_t launch_avg_pool_forward(cudaStream_t stream, const float* x, const Pool2DGeometry& g,
                                    float* y);
cudaError_t launch_avg_pool_backward(cudaStream_t stream, const Pool2DGeometry& g, const float* dy,
                                     float* dx);
cudaError_t launch_global_pool_forward(cudaStream_t stream, const float* x, bool max, float* y,
                                       std::size_t batch, std::size_t pixels, std::size_t channels);
cudaError_t launch_global_pool_backward(cudaStream_t stream, const float* x, bool max,
                                        const float* dy, float* dx, std::size_t batch,
                                        std::size_t pixels, std::size_t channels);

cudaError_t launch_moments(cudaStream_t stream, const float* x, float* mean, float* variance,
                           std::size_t rows, std::size_t channels, double* scratch);
/// `gamma` and `beta` may be null (1 and 0).
cudaError_t launch_batch_norm_forward(cudaStream_t stream, const float* x, const float* mean,
                                      const float* variance, const float* gamma, const float* beta,
                                      float epsilon, float* y, std::size_t rows,
                                      std::size_t channels);
/// `gamma`, `dx`, `dgamma` and `dbeta` may be null.
cudaError_t launch_batch_norm_backward(cudaStream_t stream, const float* x, const float* mean,
                                       const float* variance, const float* gamma, float epsilon,
                                       bool training, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t rows, std::size_t channels,
                                       double* scratch);
/// Attention's query rows (`attention_forward_row`), one thread each. `device_key`, when not
/// null, is read on the device instead of `key` (a replayed CUDA graph's dropout key).
cudaError_t launch_attention_forward(cudaStream_t stream, const AttentionShape& shape,
                                     const AttentionCall& call, float scale, std::uint64_t key,
                                     const std::uint64_t* device_key, const float* q,
                                     const float* k, const float* v, float* probabilities,
                                     float* out);
/// Its backward pass: every query row (`attention_query_gradient_row`), then every key row
/// (`attention_key_gradient_row`).
cudaError_t launch_attention_backward(cudaStream_t stream, const AttentionShape& shape,
                                      const AttentionCall& call, float scale, std::uint64_t key,
                                      const std::uint64_t* device_key, const float* q,
                                      const float* k, const float* v, const float* probabilities,
                                      const float* dout, const float* dprobabilities,
                                      float* scores_gradient, float* dq, float* dk, float* dv);
/// `LayerNormalization` over `lines` lines of `width` values (`gamma`, `beta` may be null).
cudaError_t launch_layer_norm_forward(cudaStream_t stream, const float* x, const float* gamma,
                                      const float* beta, float epsilon, float* y, std::size_t lines,
                                      std::size_t width);
/// Its gradients: `dx` written, `dgamma` and `dbeta` added to (each may be null); `scratch`
/// holds `layer_norm_scratch(lines, width)` doubles.
cudaError_t launch_layer_norm_backward(cudaStream_t stream, const float* x, const float* gamma,
                                       float epsilon, const float* dy, float* dx, float* dgamma,
                                       float* dbeta, std::size_t lines, std::size_t width,
                                       double* scratch);
cudaError_t launch_moving_average(cudaStream_t stream, float* moving, const float* value,
                                  std::size_t n, float momentum);

/// Sets `*first` (initially all ones) to the smallest position of an index outside
/// `[0, rows)`; the minimum of integers is the same whatever the order of the atomics.
cudaError_t launch_find_bad_index(cudaStream_t stream, const float* indices, std::size_t n,
                                  std::size_t rows, unsigned long long* first);
/// `out[i, :] = source[rows[i], :]` for `i < count`, rows `width` elements wide (indices within
/// `source`, checked by the caller).
cudaError_t launch_gather_rows(cudaStream_t stream, const std::uint64_t* rows, std::size_t count,
                               const float* source, std::size_t width, float* out);
/// `record[2]` = the value of the bad index whose position `launch_find_bad_index` left in
/// `record[1]`'s bits (`record_bad_index`), one thread.
cudaError_t launch_record_bad_index(cudaStream_t stream, const float* indices, double* record);
/// `out[i, :] = table[indices[i], :]` (`table` `rows x width`), zeros for an index outside it.
cudaError_t launch_gather(cudaStream_t stream, const float* indices, std::size_t n,
                          const float* table, std::size_t rows, std::size_t width, float* out);
/// `table_gradient[indices[i], :] += dy[i, :]`, skipping an index outside the `rows` rows.
cudaError_t launch_scatter_add(cudaStream_t stream, const float* indices, std::size_t n,
                               const float* dy, std::size_t rows, std::size_t width,
                               float* table_gradient);
cudaError_t launch_permute(cudaStream_t stream, const float* x, float* y, const PermuteDims& dims,
                           std::size_t n);
/// One of the recurrent layers' element-wise kernels over `elements` elements
/// (keras/detail/recurrent_kernels.hpp). `device_key`, when not null, is read on the device
/// instead of `key` (a replayed CUDA graph's dropout key).
cudaError_t launch_recurrent(cudaStream_t stream, const RecurrentKernel& kernel,
                             const RecurrentTensors& tensors, std::size_t elements,
                             std::uint64_t key, const std::uint64_t* device_key);
/// One of the shape, activation and noise layers' element-wise kernels over `elements` elements
/// (keras/detail/layer_kernels.hpp). `device_key`, when not null, is read on the device instead
/// of `key` (a replayed CUDA graph's noise key).
cudaError_t launch_layer(cudaStream_t stream, const LayerKernel& kernel,
                         const LayerTensors& tensors, std::size_t elements, std::uint64_t key,
                         const std::uint64_t* device_key);
/// Rounds `x[0..n)` in place to float16 (`bfloat16` false) or bfloat16 values, to nearest even
/// (keras/mixed_precision/detail/half_rounding.hpp).
cudaError_t launch_round_half(cudaStream_t stream, float* x, std::size_t n, bool bfloat16);
/// A depthwise convolution (`Backend::depthwise_forward`): a thread per output element
/// (`depthwise_value`).
cudaError_t launch_depthwise_forward(cudaStream_t stream, const float* x,
                                     const keras::Conv2DGeometry& g, const float* kernel,
                                     const float* bias, float* z);
/// Its backward pass (`Backend::depthwise_backward`): `dx` written a thread per input element
/// (`depthwise_input_gradient`), skipped when null; the kernel's and the bias's gradients added
/// into `dkernel` and `dbias` (each skipped when null) by one column reduction over the output
/// positions (`DepthwiseWeightValue`) in `scratch`.
cudaError_t launch_depthwise_backward(cudaStream_t stream, const float* x,
                                      const keras::Conv2DGeometry& g, const float* kernel,
                                      const float* dz, float* dx, float* dkernel, float* dbias,
                                      double* scratch);
/// `to[0..n)` the float16 (`bfloat16` false) or bfloat16 bits of `from[0..n)` rounded to nearest
/// even (`half_bits`): a half-precision matrix product's operand.
cudaError_t launch_to_half(cudaStream_t stream, const float* from, std::uint16_t* to, std::size_t n,
                           bool bfloat16);

/// The per-variable clipping scales of a fused optimizer step: squared norms of the gradients'
/// segments into `partials` (one double per segment), then one thread adds them in a fixed order
/// (`clip_scales`) and writes `scales` (one float per target).
cudaError_t launch_clip_scales(cudaStream_t stream, const UpdateTarget* targets, std::size_t count,
                               std::size_t segments, double* partials, bool global,
                               double threshold, float* scales);
/// One optimizer step over every element of every target (`elements` in all), one launch.
/// `scales` may be null (no norm clipping). `device_params`, when not null, are read on the
/// device instead of `params` (a replayed CUDA graph's step-dependent learning rate and bias
/// corrections). `condition`, when not null, is read when the step runs: where it holds 0,
/// nothing is updated (a loss-scaled step whose gradients are not finite).
cudaError_t launch_optimizer_step(cudaStream_t stream, const UpdateTarget* targets,
                                  std::size_t count, std::size_t elements,
                                  const UpdateParams& params, const UpdateParams* device_params,
                                  const float* scales, const float* condition);

/// A row loss: the per-row terms into `terms` (one double per row) and the gradient (when `g` is
/// not null), then the result record (`finish_row_loss`): `record[0]` their sum in a fixed order,
/// `record[1]` the first position of a label out of range of the sparse loss, as bits (set to
/// `no_bad_label` before the launch), `record[2]` that label.
cudaError_t launch_row_loss(cudaStream_t stream, const RowLossParams& params, const RowDims& dims,
                            const float* y_true, const float* y_pred, const float* weight,
                            float* gradient, double* terms, double* partials, double* record);
/// A mean metric's batch: `result[0]` the sum of value times weight, `result[1]` the weights.
cudaError_t launch_mean_metric(cudaStream_t stream, MeanMetricKind kind, double threshold,
                               const RowDims& dims, const float* y_true, const float* y_pred,
                               const float* weight, double* terms, double* partials,
                               double* result);

}  // namespace loadstar::cuda::detail
