// The CUDA backend's host code (loadstar/cuda/detail/cuda_backend.hpp): memory, copies, staging
// through the host, and the queuing of cuBLAS, cuBLASLt, cuDNN and loadstar's kernels; and
// `CudaBackend`, which forwards every call to it.

#include "loadstar/cuda/detail/cuda_backend.hpp"

#include <algorithm>
#include <bit>
#include <climits>
#include <limits>

#include "loadstar/cuda/cuda_backend.hpp"

namespace loadstar::cuda::detail {

CudaBackendImpl::CudaBackendImpl(int device, CudaOptions options) : options_(options) {
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

CudaBackendImpl::~CudaBackendImpl() {
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
  for (const auto& slot : half_slots_)
    if (slot.memory != nullptr) context_->free(slot.memory);
  if (cudnn_workspace_ != nullptr) context_->free(cudnn_workspace_);
}

std::size_t CudaBackendImpl::reserved_bytes() const {
  std::uint64_t bytes = 0;
  check(cudaMemPoolGetAttribute(context_->pool, cudaMemPoolAttrReservedMemCurrent, &bytes),
        "cudaMemPoolGetAttribute");
  return static_cast<std::size_t>(bytes);
}

Tensor<float> CudaBackendImpl::allocate(const Shape& shape) {
  const std::size_t elements = shape.elements();
  if (elements == 0) return Tensor<float>::wrap(nullptr, shape, nullptr, device());
  context_->activate();
  void* memory =
      context_->allocate(elements * sizeof(float), "a float32 tensor of shape " + shape.str());
  // If the control block cannot be allocated, shared_ptr calls the deleter itself.
  std::shared_ptr<void> owner(memory, [context = context_](void* p) noexcept { context->free(p); });
  return Tensor<float>::wrap(static_cast<float*>(memory), shape, std::move(owner), device());
}

void CudaBackendImpl::copy_from_host(const Tensor<float>& host, const Tensor<float>& tensor) {
  expect_host("copy_from_host", host);
  expect("copy_from_host", {&tensor});
  LOADSTAR_ASSERT(host.size() == tensor.size(), "copy_from_host: sizes differ");
  if (host.empty()) return;
  active_stream("an upload (copy_from_host)");
  context_->upload(tensor.data(), host.data(), host.bytes());
}

void CudaBackendImpl::upload(const Tensor<float>& staging, const Tensor<float>& tensor,
                             keras::HostKernelRef write) {
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

void CudaBackendImpl::copy_to_host(const Tensor<float>& tensor, const Tensor<float>& host) {
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

void CudaBackendImpl::synchronize() {
  check(cudaStreamSynchronize(active_stream("a wait (synchronize)")), "cudaStreamSynchronize");
}

void CudaBackendImpl::host_kernel(std::span<const Tensor<float>> tensors,
                                  keras::HostKernelRef kernel) {
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
    views.push_back(t.empty() || t.is_host() ? t
                                             : Tensor<float>::wrap(stage + plan.offset_of(t.data()),
                                                                   t.shape(), nullptr));
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

bool CudaBackendImpl::apply_optimizer_step(const keras::OptimizerStep& step,
                                           std::span<const keras::VariableSlots> variables) {
  table_.clear();  // keeps its capacity
  std::size_t elements = 0, segments = 0;
  expect("apply_optimizer_step", {&step.condition});
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
    t.decay = v.decay;
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
  const float* condition = or_null(step.condition);
  enqueue(
      {detail::word("optimizer_step"), detail::word(targets), detail::word(count),
       detail::word(elements), detail::word(device_params), detail::word(scales),
       detail::word(condition)},
      [this, targets, count, elements, params, device_params, scales, condition](cudaStream_t s) {
        launched(detail::launch_optimizer_step(s, targets, count, elements, params, device_params,
                                               scales, condition),
                 "optimizer_step");
      });
  return true;
}

std::optional<keras::Deferred<keras::RowLossResult>> CudaBackendImpl::row_loss(
    const keras::RowLossSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
    const Tensor<float>& weight, const Tensor<float>& gradient) {
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
  return keras::Deferred<keras::RowLossResult>(std::function<keras::RowLossResult()>(
      [cell = std::move(cell), ring = std::weak_ptr<detail::ResultRing>(results_)] {
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

std::optional<keras::Deferred<keras::MeanMetricSums>> CudaBackendImpl::mean_metric(
    const keras::MeanMetricSpec& spec, const Tensor<float>& y_true, const Tensor<float>& y_pred,
    const Tensor<float>& weight) {
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

void CudaBackendImpl::gemm(const Tensor<float>& a, bool transpose_a, const Tensor<float>& b,
                           bool transpose_b, const Tensor<float>& c, float alpha, float beta) {
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
  if (product_dtype_ != DType::float32 &&
      queue_matmul("gemm",
                   {.m = n,
                    .n = m,
                    .k = k,
                    .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                    .transpose_b = transpose_a,
                    .transpose_a = transpose_b},
                   b.data(), a.data(), nullptr, c.data(), nullptr, alpha, beta))
    return;
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

void CudaBackendImpl::bias_add(const Tensor<float>& x, const Tensor<float>& bias) {
  expect("bias_add", {&x, &bias});
  LOADSTAR_ASSERT(bias.size() > 0 && x.size() % bias.size() == 0, "bias_add: sizes do not fit");
  launch("bias_add", detail::launch_bias_add, x.data(), x.size(), bias.data(), bias.size());
}

void CudaBackendImpl::column_sums(const Tensor<float>& x, const Tensor<float>& out, float beta) {
  expect("column_sums", {&x, &out});
  const std::size_t n = out.size();
  LOADSTAR_ASSERT(n > 0 && x.size() % n == 0, "column_sums: sizes do not fit");
  const std::size_t rows = x.size() / n;
  double* scratch = reduction_scratch(rows, n);
  launch("column_sums", detail::launch_column_sums, x.data(), out.data(), rows, n, beta, scratch);
}

bool CudaBackendImpl::dense_forward(const Tensor<float>& x, const Tensor<float>& kernel,
                                    const Tensor<float>& bias, keras::Activation activation,
                                    const Tensor<float>& y) {
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

bool CudaBackendImpl::dense_weight_gradients(const Tensor<float>& x, const Tensor<float>& dz,
                                             const Tensor<float>& dkernel,
                                             const Tensor<float>& dbias) {
  expect("dense_weight_gradients", {&x, &dz, &dkernel, &dbias});
  const std::size_t rows = x.rows(), features = x.row_size(), units = dz.row_size();
  LOADSTAR_ASSERT(dz.rows() == rows && dkernel.size() == features * units &&
                      (dbias.empty() || dbias.size() == units),
                  "dense_weight_gradients: shapes do not fit");
  if (dbias.empty() || rows == 0 || units == 0 || features == 0) return false;
  if (rows > max_bias_epilogue_rows) return false;
  return queue_matmul("dense_weight_gradients",
                      {units, features, rows, CUBLASLT_EPILOGUE_BGRADA, true}, dz.data(), x.data(),
                      dbias.data(), dkernel.data());
}

std::uint64_t CudaBackendImpl::relu_mask_ld(std::size_t units) noexcept {
  return (units + 127) / 128 * 128;
}

bool CudaBackendImpl::dense_forward_relu_mask(const Tensor<float>& x, const Tensor<float>& kernel,
                                              const Tensor<float>& bias, const Tensor<float>& y,
                                              std::unique_ptr<ReluMask>& mask) {
  expect("dense_forward_relu_mask", {&x, &kernel, &bias, &y});
  const std::size_t rows = x.rows(), features = x.row_size(), units = kernel.row_size();
  LOADSTAR_ASSERT(kernel.rows() == features && y.rows() == rows && y.row_size() == units &&
                      bias.size() == units,
                  "dense_forward_relu_mask: shapes do not fit");
  const Shape shape = CudaReluMask::shape(rows, units);
  auto* own = dynamic_cast<CudaReluMask*>(mask.get());
  if (own == nullptr || own->storage.empty() || own->storage.rows() < rows ||
      own->storage.row_size() != shape[1] || own->storage.device() != device()) {
    auto fresh = std::make_unique<CudaReluMask>();
    fresh->storage = allocate(shape);
    own = fresh.get();
    mask = std::move(fresh);
  }
  own->bits = own->storage.slice_rows(0, rows);
  if (rows == 0 || units == 0 || features == 0) return false;
  return queue_matmul("dense_forward_relu_mask",
                      {.m = units,
                       .n = rows,
                       .k = features,
                       .epilogue = CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
                       .aux_ld = relu_mask_ld(units)},
                      kernel.data(), x.data(), bias.data(), y.data(), own->bits.data());
}

bool CudaBackendImpl::dense_input_gradient_relu(const Tensor<float>& dz,
                                                const Tensor<float>& kernel, const ReluMask& mask,
                                                const Tensor<float>& dx,
                                                const Tensor<float>& dbias) {
  const auto* own = dynamic_cast<const CudaReluMask*>(&mask);
  LOADSTAR_ASSERT(own != nullptr,
                  "dense_input_gradient_relu: the mask was not made by the CUDA backend");
  expect("dense_input_gradient_relu", {&dz, &kernel, &own->bits, &dx, &dbias});
  const std::size_t rows = dz.rows(), units = dz.row_size(), features = kernel.rows();
  LOADSTAR_ASSERT(kernel.row_size() == units && dx.rows() == rows && dx.row_size() == features &&
                      dbias.size() == features &&
                      own->bits.shape() == CudaReluMask::shape(rows, features),
                  "dense_input_gradient_relu: shapes do not fit");
  if (rows == 0 || units == 0 || features == 0) return false;
  return queue_matmul("dense_input_gradient_relu",
                      {.m = features,
                       .n = rows,
                       .k = units,
                       .epilogue = CUBLASLT_EPILOGUE_DRELU_BGRAD,
                       .transpose_a = true,
                       .aux_ld = relu_mask_ld(features)},
                      kernel.data(), dz.data(), dbias.data(), dx.data(), own->bits.data());
}

void CudaBackendImpl::fill(const Tensor<float>& x, float value) {
  expect("fill", {&x});
  launch("fill", detail::launch_fill, x.data(), x.size(), value);
}

void CudaBackendImpl::fill_many(std::span<const Tensor<float>> tensors, float value) {
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

const detail::FillTarget* CudaBackendImpl::flat_table(const char* call,
                                                      std::span<const Tensor<float>> tensors,
                                                      std::size_t& elements) {
  fill_table_.clear();  // keeps its capacity
  elements = 0;
  for (const auto& t : tensors) {
    expect(call, {&t});
    if (t.empty()) continue;
    fill_table_.push_back({t.data(), t.size(), elements});
    elements += t.size();
  }
  return elements == 0 ? nullptr : device_table(fill_tables_, fill_table_, "a table of tensors");
}

void CudaBackendImpl::scale_many(std::span<const Tensor<float>> tensors, float alpha) {
  std::size_t elements = 0;
  const detail::FillTarget* table = flat_table("scale_many", tensors, elements);
  if (table == nullptr) return;
  const std::size_t count = fill_table_.size();
  const float* device_alpha = context_->recording ? step_scalar(alpha) : nullptr;
  enqueue({detail::word("scale_many"), detail::word(table), detail::word(count),
           detail::word(elements), detail::word(device_alpha)},
          [this, table, count, elements, alpha, device_alpha](cudaStream_t s) {
            launched(detail::launch_scale_many(s, table, count, elements, alpha, device_alpha),
                     "scale_many");
          });
}

keras::Deferred<bool> CudaBackendImpl::all_finite(std::span<const Tensor<float>> tensors,
                                                  const Tensor<float>& flag) {
  expect("all_finite", {&flag});
  LOADSTAR_ASSERT(flag.size() == 1, "all_finite: the flag has one element");
  std::size_t elements = 0;
  const detail::FillTarget* table = flat_table("all_finite", tensors, elements);
  auto [ring_record, cell] = results_->acquire();
  double* record = step_result(ring_record);
  launch("all_finite", detail::launch_all_finite, table, fill_table_.size(), elements, flag.data(),
         record);
  return keras::Deferred<bool>(std::function<bool()>(
      [cell = std::move(cell), ring = std::weak_ptr<detail::ResultRing>(results_)] {
        return detail::ResultRing::values(cell, ring)[0] != 0.0;
      }));
}

void CudaBackendImpl::copy(const Tensor<float>& x, const Tensor<float>& y) {
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

void CudaBackendImpl::scale(const Tensor<float>& x, float alpha) {
  expect("scale", {&x});
  launch("scale", detail::launch_scale, x.data(), x.size(), alpha);
}

void CudaBackendImpl::axpy(float alpha, const Tensor<float>& x, const Tensor<float>& y) {
  expect("axpy", {&x, &y});
  LOADSTAR_ASSERT(x.size() == y.size(), "axpy: sizes differ");
  launch("axpy", detail::launch_axpy, alpha, x.data(), y.data(), x.size());
}

void CudaBackendImpl::add(const Tensor<float>& a, const Tensor<float>& b,
                          const Tensor<float>& out) {
  expect("add", {&a, &b, &out});
  LOADSTAR_ASSERT(a.size() == b.size() && a.size() == out.size(), "add: sizes differ");
  launch("add", detail::launch_add, a.data(), b.data(), out.data(), a.size());
}

void CudaBackendImpl::activation_forward(keras::Activation kind, const Tensor<float>& x,
                                         const Tensor<float>& y) {
  expect("activation_forward", {&x, &y});
  LOADSTAR_ASSERT(x.size() == y.size(), "activation_forward: sizes differ");
  if (kind == keras::Activation::softmax) {
    softmax_forward(x, y, x.rank() == 0 ? 0 : x.rank() - 1);
    return;
  }
  launch("activation_forward", detail::launch_activation_forward, kind, x.data(), y.data(),
         x.size());
}

void CudaBackendImpl::activation_backward(keras::Activation kind, const Tensor<float>& x,
                                          const Tensor<float>& y, const Tensor<float>& dy,
                                          const Tensor<float>& dx) {
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

void CudaBackendImpl::relu_forward(const Tensor<float>& x, const Tensor<float>& y,
                                   std::optional<float> max_value, float negative_slope,
                                   float threshold) {
  expect("relu_forward", {&x, &y});
  launch("relu_forward", detail::launch_relu_forward, x.data(), y.data(), x.size(),
         max_value.value_or(std::numeric_limits<float>::infinity()), negative_slope, threshold);
}

void CudaBackendImpl::relu_backward(const Tensor<float>& x, const Tensor<float>& dy,
                                    const Tensor<float>& dx, std::optional<float> max_value,
                                    float negative_slope, float threshold) {
  expect("relu_backward", {&x, &dy, &dx});
  launch("relu_backward", detail::launch_relu_backward, x.data(), dy.data(), dx.data(), x.size(),
         max_value.value_or(std::numeric_limits<float>::infinity()), negative_slope, threshold);
}

void CudaBackendImpl::softmax_forward(const Tensor<float>& x, const Tensor<float>& y,
                                      std::size_t axis) {
  expect("softmax_forward", {&x, &y});
  const auto v = keras::detail::axis_view(x.shape(), axis);
  launch("softmax_forward", detail::launch_softmax_forward, x.data(), y.data(), v.outer, v.length,
         v.inner);
}

void CudaBackendImpl::softmax_backward(const Tensor<float>& y, const Tensor<float>& dy,
                                       const Tensor<float>& dx, std::size_t axis) {
  expect("softmax_backward", {&y, &dy, &dx});
  const auto v = keras::detail::axis_view(y.shape(), axis);
  launch("softmax_backward", detail::launch_softmax_backward, y.data(), dy.data(), dx.data(),
         v.outer, v.length, v.inner);
}

void CudaBackendImpl::dropout(const Tensor<float>& x, const Tensor<float>& y, float rate,
                              std::uint64_t key) {
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

void CudaBackendImpl::conv2d_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                                     const Tensor<float>& kernel, const Tensor<float>& bias,
                                     keras::Activation activation, const Tensor<float>& y) {
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

void CudaBackendImpl::conv2d_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                                      const Tensor<float>& kernel, const Tensor<float>& bias,
                                      keras::Activation activation, const Tensor<float>& y,
                                      const Tensor<float>& dy, const Tensor<float>& dkernel,
                                      const Tensor<float>& dbias, const Tensor<float>& dx,
                                      bool accumulate) {
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
bool CudaBackendImpl::cudnn_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
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

bool CudaBackendImpl::cudnn_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                                     const Tensor<float>& kernel, const Tensor<float>& bias,
                                     keras::Activation activation, const Tensor<float>& y,
                                     const Tensor<float>& dy, const Tensor<float>& dkernel,
                                     const Tensor<float>& dbias, const Tensor<float>& dx) {
  const detail::CudnnConvolution* conv = cudnn_convolution(g);
  if (conv == nullptr) return false;
  expect("conv2d_backward", {&x, &kernel, &y, &dy, &dkernel});
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  Tensor<float> dz = dy.reshape({rows, g.out_c});
  const bool recompute =
      activation != keras::Activation::linear && keras::activation_gradient_needs_input(activation);
  // The filter, transposed once for the pre-activation's recomputation and the input gradient.
  const Tensor<float> filter = recompute || !dx.empty() ? cudnn_filter(kernel, g) : Tensor<float>();
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
bool CudaBackendImpl::cudnn_forward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                                    const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                                    keras::Activation /*activation*/, const Tensor<float>& /*y*/) {
  return false;
}

bool CudaBackendImpl::cudnn_backward(const Tensor<float>& /*x*/, const keras::Conv2DGeometry& /*g*/,
                                     const Tensor<float>& /*kernel*/, const Tensor<float>& /*bias*/,
                                     keras::Activation /*activation*/, const Tensor<float>& /*y*/,
                                     const Tensor<float>& /*dy*/, const Tensor<float>& /*dkernel*/,
                                     const Tensor<float>& /*dbias*/, const Tensor<float>& /*dx*/) {
  return false;
}

#endif
void CudaBackendImpl::im2col(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                             const Tensor<float>& columns) {
  expect("im2col", {&x, &columns});
  LOADSTAR_ASSERT(columns.size() == g.batch * g.out_h * g.out_w * g.patch_size(),
                  "im2col: columns have the wrong size");
  launch("im2col", detail::launch_im2col, x.data(), g, columns.data());
}

void CudaBackendImpl::col2im(const Tensor<float>& columns, const keras::Conv2DGeometry& g,
                             const Tensor<float>& dx) {
  expect("col2im", {&columns, &dx});
  launch("col2im", detail::launch_col2im, columns.data(), g, dx.data());
}

void CudaBackendImpl::max_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                                       const Tensor<float>& y) {
  expect("max_pool_forward", {&x, &y});
  launch("max_pool_forward", detail::launch_max_pool_forward, x.data(), g, y.data());
}

void CudaBackendImpl::max_pool_backward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                                        const Tensor<float>& dy, const Tensor<float>& dx) {
  expect("max_pool_backward", {&x, &dy, &dx});
  launch("max_pool_backward", detail::launch_max_pool_backward, x.data(), g, dy.data(), dx.data(),
         false);
}

bool CudaBackendImpl::max_pool_backward_relu(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                                             const Tensor<float>& dy, const Tensor<float>& dx) {
  expect("max_pool_backward_relu", {&x, &dy, &dx});
  launch("max_pool_backward_relu", detail::launch_max_pool_backward, x.data(), g, dy.data(),
         dx.data(), true);
  return true;
}

void CudaBackendImpl::avg_pool_forward(const Tensor<float>& x, const keras::Pool2DGeometry& g,
                                       const Tensor<float>& y) {
  expect("avg_pool_forward", {&x, &y});
  launch("avg_pool_forward", detail::launch_avg_pool_forward, x.data(), g, y.data());
}

void CudaBackendImpl::avg_pool_backward(const keras::Pool2DGeometry& g, const Tensor<float>& dy,
                                        const Tensor<float>& dx) {
  expect("avg_pool_backward", {&dy, &dx});
  launch("avg_pool_backward", detail::launch_avg_pool_backward, g, dy.data(), dx.data());
}

void CudaBackendImpl::global_pool_forward(const Tensor<float>& x, bool max,
                                          const Tensor<float>& y) {
  expect("global_pool_forward", {&x, &y});
  const std::size_t channels = x.shape()[x.rank() - 1];
  launch("global_pool_forward", detail::launch_global_pool_forward, x.data(), max, y.data(),
         x.rows(), x.row_size() / channels, channels);
}

void CudaBackendImpl::global_pool_backward(const Tensor<float>& x, bool max,
                                           const Tensor<float>& dy, const Tensor<float>& dx) {
  expect("global_pool_backward", {&x, &dy, &dx});
  const std::size_t channels = x.shape()[x.rank() - 1];
  launch("global_pool_backward", detail::launch_global_pool_backward, x.data(), max, dy.data(),
         dx.data(), x.rows(), x.row_size() / channels, channels);
}

void CudaBackendImpl::moments(const Tensor<float>& x, const Tensor<float>& mean,
                              const Tensor<float>& variance) {
  expect("moments", {&x, &mean, &variance});
  const std::size_t c = mean.size();
  const std::size_t n = x.size() / c;
  double* scratch = reduction_scratch(n, c);
  launch("moments", detail::launch_moments, x.data(), mean.data(), variance.data(), n, c, scratch);
}

void CudaBackendImpl::batch_norm_forward(const Tensor<float>& x, const Tensor<float>& mean,
                                         const Tensor<float>& variance, const Tensor<float>& gamma,
                                         const Tensor<float>& beta, float epsilon,
                                         const Tensor<float>& y) {
  expect("batch_norm_forward", {&x, &mean, &variance, &gamma, &beta, &y});
  const std::size_t c = mean.size();
  launch("batch_norm_forward", detail::launch_batch_norm_forward, x.data(), mean.data(),
         variance.data(), or_null(gamma), or_null(beta), epsilon, y.data(), x.size() / c, c);
}

void CudaBackendImpl::batch_norm_backward(const Tensor<float>& x, const Tensor<float>& mean,
                                          const Tensor<float>& variance, const Tensor<float>& gamma,
                                          float epsilon, bool training, const Tensor<float>& dy,
                                          const Tensor<float>& dx, const Tensor<float>& dgamma,
                                          const Tensor<float>& dbeta) {
  expect("batch_norm_backward", {&x, &mean, &variance, &gamma, &dy, &dx, &dgamma, &dbeta});
  const std::size_t c = mean.size();
  const std::size_t n = x.size() / c;
  double* scratch = reduction_scratch(n, c);
  launch("batch_norm_backward", detail::launch_batch_norm_backward, x.data(), mean.data(),
         variance.data(), or_null(gamma), epsilon, training, dy.data(), or_null(dx),
         or_null(dgamma), or_null(dbeta), n, c, scratch);
}

namespace {
/// `call` with its mask pointers from `masks` (the query's, value's and key's and the attention
/// mask, empty where none).
keras::detail::AttentionCall with_masks(keras::detail::AttentionCall call,
                                        std::span<const Tensor<float>> masks) {
  const auto pointer = [](const Tensor<float>& t) -> const float* {
    return t.empty() ? nullptr : t.data();
  };
  call.query_mask = pointer(masks[0]);
  call.value_mask = pointer(masks[1]);
  call.key_mask = pointer(masks[2]);
  call.attention_mask = pointer(masks[3]);
  return call;
}
}  // namespace

bool CudaBackendImpl::attention_forward(const keras::detail::AttentionShape& shape,
                                        const keras::detail::AttentionCall& call, float scale,
                                        std::span<const Tensor<float>> tensors) {
  LOADSTAR_ASSERT(tensors.size() == 9, "attention_forward: q, k, v, probabilities, out, 4 masks");
  for (const auto& t : tensors)
    if (!t.empty()) expect("attention_forward", {&t});
  keras::detail::AttentionCall c = with_masks(call, tensors.subspan(5));
  // The dropout's key changes from step to step: a recorded step reads it from device memory.
  const std::uint64_t* device_key = c.drops() && context_->recording ? step_scalar(c.key) : nullptr;
  // Without dropout the key is not read: the signature holds none.
  const std::uint64_t key = c.drops() ? c.key : 0;
  c.key = 0;
  launch("attention_forward", detail::launch_attention_forward, shape, c, scale,
         device_key != nullptr ? std::uint64_t{0} : key, device_key, tensors[0].data(),
         tensors[1].data(), tensors[2].data(), tensors[3].data(), or_null(tensors[4]));
  return true;
}

bool CudaBackendImpl::attention_backward(const keras::detail::AttentionShape& shape,
                                         const keras::detail::AttentionCall& call, float scale,
                                         std::span<const Tensor<float>> tensors) {
  LOADSTAR_ASSERT(tensors.size() == 13,
                  "attention_backward: q, k, v, probabilities, dout, dq, dk, dv, 4 masks, "
                  "dprobabilities");
  for (const auto& t : tensors)
    if (!t.empty()) expect("attention_backward", {&t});
  keras::detail::AttentionCall c = with_masks(call, tensors.subspan(8, 4));
  const std::uint64_t* device_key = c.drops() && context_->recording ? step_scalar(c.key) : nullptr;
  // Without dropout the key is not read: the signature holds none.
  const std::uint64_t key = c.drops() ? c.key : 0;
  c.key = 0;
  const Tensor<float> scores_gradient = scratch_tensor(0, {shape.probabilities()});
  fill_many(tensors.subspan(5, 3), 0.0F);  // the rows' kernels add into them
  launch("attention_backward", detail::launch_attention_backward, shape, c, scale,
         device_key != nullptr ? std::uint64_t{0} : key, device_key, tensors[0].data(),
         tensors[1].data(), tensors[2].data(), tensors[3].data(), tensors[4].data(),
         static_cast<const float*>(or_null(tensors[12])), scores_gradient.data(),
         or_null(tensors[5]), or_null(tensors[6]), or_null(tensors[7]));
  return true;
}

void CudaBackendImpl::layer_norm_forward(const Tensor<float>& x, std::size_t width,
                                         const Tensor<float>& gamma, const Tensor<float>& beta,
                                         float epsilon, const Tensor<float>& y) {
  expect("layer_norm_forward", {&x, &gamma, &beta, &y});
  if (x.empty() || width == 0) return;
  launch("layer_norm_forward", detail::launch_layer_norm_forward, x.data(), or_null(gamma),
         or_null(beta), epsilon, y.data(), x.size() / width, width);
}

void CudaBackendImpl::layer_norm_backward(const Tensor<float>& x, std::size_t width,
                                          const Tensor<float>& gamma, float epsilon,
                                          const Tensor<float>& dy, const Tensor<float>& dx,
                                          const Tensor<float>& dgamma, const Tensor<float>& dbeta) {
  expect("layer_norm_backward", {&x, &gamma, &dy, &dx, &dgamma, &dbeta});
  if (x.empty() || width == 0) return;
  const std::size_t lines = x.size() / width;
  double* scratch = scratch_doubles(detail::layer_norm_scratch(lines, width));
  launch("layer_norm_backward", detail::launch_layer_norm_backward, x.data(), or_null(gamma),
         epsilon, dy.data(), or_null(dx), or_null(dgamma), or_null(dbeta), lines, width, scratch);
}

void CudaBackendImpl::moving_average(const Tensor<float>& moving, const Tensor<float>& value,
                                     float momentum) {
  expect("moving_average", {&moving, &value});
  launch("moving_average", detail::launch_moving_average, moving.data(), value.data(),
         moving.size(), momentum);
}

std::optional<keras::BadIndex> CudaBackendImpl::gather(const Tensor<float>& indices,
                                                       const Tensor<float>& table,
                                                       const Tensor<float>& out) {
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
    check(
        cudaMemcpyAsync(value, indices.data() + position, sizeof(float), cudaMemcpyDeviceToHost, s),
        "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    return keras::BadIndex{position, *value};
  }
  launched(detail::launch_gather(s, indices.data(), indices.size(), table.data(), table.rows(),
                                 table.row_size(), out.data()),
           "gather");
  return std::nullopt;
}

keras::Deferred<std::optional<keras::BadIndex>> CudaBackendImpl::gather_deferred(
    const Tensor<float>& indices, const Tensor<float>& table, const Tensor<float>& out) {
  expect("gather", {&indices, &table, &out});
  if (indices.empty()) return std::optional<keras::BadIndex>();
  // The first bad index's position (bits, all ones for none) and value go to a result record,
  // as a row loss's first bad label: read when the step's results are.
  auto [ring_record, cell] = results_->acquire();
  double* record = step_result(ring_record);
  enqueue({detail::word("gather: clear the first bad index"), detail::word(record)},
          [record](cudaStream_t s) {
            check(cudaMemsetAsync(record + 1, 0xFF, sizeof(double), s), "cudaMemsetAsync");
          });
  // The record's second double holds the position's bits (record_bad_index reads them so).
  auto* first = reinterpret_cast<unsigned long long*>(record + 1);
  launch("gather", detail::launch_find_bad_index, indices.data(), indices.size(), table.rows(),
         first);
  launch("gather", detail::launch_record_bad_index, indices.data(), record);
  launch("gather", detail::launch_gather, indices.data(), indices.size(), table.data(),
         table.rows(), table.row_size(), out.data());
  return keras::Deferred<std::optional<keras::BadIndex>>(
      std::function<std::optional<keras::BadIndex>()>(
          [cell = std::move(cell), ring = std::weak_ptr<detail::ResultRing>(results_)] {
            const auto& v = detail::ResultRing::values(cell, ring);
            unsigned long long bad = 0;
            std::memcpy(&bad, &v[1], sizeof bad);
            if (bad == ~0ULL) return std::optional<keras::BadIndex>();
            return std::optional<keras::BadIndex>(
                keras::BadIndex{static_cast<std::size_t>(bad), static_cast<float>(v[2])});
          }));
}

void CudaBackendImpl::copy_rows(const Tensor<float>& source, std::span<const std::size_t> rows,
                                std::size_t offset, const Tensor<float>& target) {
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

void CudaBackendImpl::scatter_add(const Tensor<float>& indices, const Tensor<float>& dy,
                                  const Tensor<float>& table_gradient) {
  expect("scatter_add", {&indices, &dy, &table_gradient});
  launch("scatter_add", detail::launch_scatter_add, indices.data(), indices.size(), dy.data(),
         table_gradient.rows(), table_gradient.row_size(), table_gradient.data());
}

void CudaBackendImpl::concatenate(std::span<const Tensor<float>> parts, std::size_t axis,
                                  const Tensor<float>& out) {
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

void CudaBackendImpl::split(const Tensor<float>& x, std::size_t axis,
                            std::span<const std::size_t> extents,
                            std::span<const Tensor<float>> parts) {
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

void CudaBackendImpl::permute(const Tensor<float>& x, std::span<const std::size_t> axes,
                              const Tensor<float>& y) {
  expect("permute", {&x, &y});
  LOADSTAR_ASSERT(axes.size() == x.rank() && x.rank() == y.rank() && x.size() == y.size(),
                  "permute: shapes and axes do not fit");
  const detail::PermuteDims d = detail::permute_dims(x.shape(), axes, y.shape());
  launch("permute", detail::launch_permute, x.data(), y.data(), d, y.size());
}

void CudaBackendImpl::depthwise_forward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                                        const Tensor<float>& kernel, const Tensor<float>& bias,
                                        const Tensor<float>& z) {
  expect("depthwise_forward", {&x, &kernel, &bias, &z});
  LOADSTAR_ASSERT(
      g.in_c > 0 && g.out_c % g.in_c == 0 && z.size() == g.batch * g.out_h * g.out_w * g.out_c,
      "depthwise_forward: shapes do not fit");
  launch("depthwise_forward", detail::launch_depthwise_forward, x.data(), g, kernel.data(),
         or_null(bias), z.data());
}

void CudaBackendImpl::depthwise_backward(const Tensor<float>& x, const keras::Conv2DGeometry& g,
                                         const Tensor<float>& kernel, const Tensor<float>& dz,
                                         const Tensor<float>& dx, const Tensor<float>& dkernel,
                                         const Tensor<float>& dbias) {
  expect("depthwise_backward", {&x, &kernel, &dz, &dx, &dkernel, &dbias});
  LOADSTAR_ASSERT(g.in_c > 0 && g.out_c % g.in_c == 0, "depthwise_backward: shapes do not fit");
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const std::size_t columns =
      (dkernel.empty() ? 0 : g.kernel_h * g.kernel_w * g.out_c) + (dbias.empty() ? 0 : g.out_c);
  double* scratch = reduction_scratch(rows, std::max<std::size_t>(columns, 1));
  launch("depthwise_backward", detail::launch_depthwise_backward, x.data(), g, kernel.data(),
         dz.data(), or_null(dx), or_null(dkernel), or_null(dbias), scratch);
}

void CudaBackendImpl::round_to(const Tensor<float>& x, DType dtype) {
  if (dtype == DType::float32 || x.empty()) return;
  LOADSTAR_ASSERT(dtype == DType::float16 || dtype == DType::bfloat16,
                  "round_to: float16 or bfloat16");
  expect("round_to", {&x});
  launch("round_to", detail::launch_round_half, x.data(), x.size(), dtype == DType::bfloat16);
}

void CudaBackendImpl::recurrent_kernel(const keras::detail::RecurrentKernel& kernel,
                                       std::span<const Tensor<float>> tensors, std::size_t elements,
                                       std::uint64_t key) {
  LOADSTAR_ASSERT(tensors.size() <= keras::detail::RecurrentTensors::max,
                  "recurrent_kernel: more tensors than a kernel takes");
  keras::detail::RecurrentTensors pointers;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].empty()) continue;
    expect("recurrent_kernel", {&tensors[i]});
    pointers.t[i] = tensors[i].data();
  }
  // Dropout's key changes from step to step: a recorded step reads it from device memory, and
  // the signature holds no key.
  const bool keyed = kernel.op == keras::detail::RecurrentOp::dropout_masks;
  const std::uint64_t* device_key = keyed && context_->recording ? step_scalar(key) : nullptr;
  launch("recurrent_kernel", detail::launch_recurrent, kernel, pointers, elements,
         device_key != nullptr || !keyed ? std::uint64_t{0} : key, device_key);
}

void CudaBackendImpl::layer_kernel(const keras::detail::LayerKernel& kernel,
                                   std::span<const Tensor<float>> tensors, std::size_t elements,
                                   std::uint64_t key) {
  LOADSTAR_ASSERT(tensors.size() <= keras::detail::LayerTensors::max,
                  "layer_kernel: more tensors than a kernel takes");
  if (elements == 0) return;
  keras::detail::LayerTensors pointers;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].empty()) continue;
    expect("layer_kernel", {&tensors[i]});
    pointers.t[i] = tensors[i].data();
  }
  // The noise's key changes from step to step: a recorded step reads it from device memory, and
  // the signature holds no key.
  const bool keyed = keras::detail::layer_op_keyed(kernel.op);
  const std::uint64_t* device_key = keyed && context_->recording ? step_scalar(key) : nullptr;
  launch("layer_kernel", detail::launch_layer, kernel, pointers, elements,
         device_key != nullptr || !keyed ? std::uint64_t{0} : key, device_key);
}

cudaStream_t CudaBackendImpl::active_stream(const char* call) {
  if (context_->recording) flush_recording(call);
  context_->activate();
  return context_->stream;
}

bool CudaBackendImpl::queue_matmul(const char* name, detail::LtPlans::Key key, const float* a,
                                   const float* b, const float* bias, float* d, const void* aux,
                                   float alpha, float beta) {
  const bool half = product_dtype_ == DType::float16 || product_dtype_ == DType::bfloat16;
  const void* a_operand = a;
  const void* b_operand = b;
  if (half) {
    key.operands = product_dtype_ == DType::bfloat16 ? CUDA_R_16BF : CUDA_R_16F;
    // The plan first (cuBLASLt may have none), then the conversions it reads.
    auto* a_half = half_scratch(0, key.m * key.k);
    auto* b_half = half_scratch(1, key.k * key.n);
    key.alignment = detail::LtPlans::alignment({a_half, b_half, d, bias, aux});
    if (const detail::LtPlans::Plan* plan = lt_->plan(key); plan != nullptr) {
      const bool bfloat16 = product_dtype_ == DType::bfloat16;
      launch("to_half", detail::launch_to_half, a, a_half, key.m * key.k, bfloat16);
      launch("to_half", detail::launch_to_half, b, b_half, key.k * key.n, bfloat16);
      a_operand = a_half;
      b_operand = b_half;
      enqueue({detail::word(name), detail::word(plan), detail::word(a_operand),
               detail::word(b_operand), detail::word(bias), detail::word(d), detail::word(aux),
               detail::word(alpha), detail::word(beta)},
              [this, plan, a_operand, b_operand, bias, d, aux, alpha, beta](cudaStream_t s) {
                lt_->run(*plan, a_operand, b_operand, bias, d, s, aux, alpha, beta);
              });
      return true;
    }
    key.operands = CUDA_R_32F;  // no half-precision algorithm: fp32, as other layers
  }
  key.alignment = detail::LtPlans::alignment({a, b, d, bias, aux});
  const detail::LtPlans::Plan* plan = lt_->plan(key);
  if (plan == nullptr) return false;
  enqueue(
      {detail::word(name), detail::word(plan), detail::word(a), detail::word(b), detail::word(bias),
       detail::word(d), detail::word(aux), detail::word(alpha), detail::word(beta)},
      [this, plan, a, b, bias, d, aux, alpha, beta](cudaStream_t s) {
        lt_->run(*plan, a, b, bias, d, s, aux, alpha, beta);
      });
  return true;
}

std::uint16_t* CudaBackendImpl::half_scratch(std::size_t slot, std::size_t n) {
  auto& scratch = half_slots_[slot];
  return static_cast<std::uint16_t*>(grow(scratch.memory, scratch.bytes,
                                          std::max<std::size_t>(n, 1) * sizeof(std::uint16_t),
                                          "half-precision operands"));
}

void CudaBackendImpl::expect(const char* kernel,
                             std::initializer_list<const Tensor<float>*> tensors) const {
  const Device mine = device();
  for (const auto* t : tensors) {
    if (t->empty() || t->device() == mine) continue;
    throw DeviceError("cuda backend: " + std::string(kernel) + " was given a " + t->description() +
                      " on " + t->device().str() + " but expects " + mine.str());
  }
}

void CudaBackendImpl::expect_host(const char* call, const Tensor<float>& host) {
  if (!host.is_host()) {
    throw DeviceError("cuda backend: " + std::string(call) + " needs a host tensor but the " +
                      host.description() + " lives on " + host.device().str());
  }
}

void CudaBackendImpl::launched(cudaError_t status, const char* kernel) const {
  if (status != cudaSuccess) check(status, context_->name + ": " + kernel + " kernel launch");
}

void CudaBackendImpl::strided_copy(float* to, std::size_t to_pitch, const float* from,
                                   std::size_t from_pitch, std::size_t width, std::size_t rows) {
  enqueue({detail::word("strided_copy"), detail::word(to), detail::word(to_pitch),
           detail::word(from), detail::word(from_pitch), detail::word(width), detail::word(rows)},
          [=](cudaStream_t s) {
            check(cudaMemcpy2DAsync(to, to_pitch * sizeof(float), from, from_pitch * sizeof(float),
                                    width * sizeof(float), rows, cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpy2DAsync");
          });
}

int CudaBackendImpl::to_int(std::size_t value, const char* call) {
  if (value > static_cast<std::size_t>(INT_MAX)) {
    throw ShapeError("cuda backend: " + std::string(call) + " dimension " + std::to_string(value) +
                     " exceeds cuBLAS's limit of " + std::to_string(INT_MAX));
  }
  return static_cast<int>(value);
}

float* CudaBackendImpl::or_null(const Tensor<float>& t) noexcept {
  return t.empty() ? nullptr : t.data();
}

double* CudaBackendImpl::reduction_scratch(std::size_t rows, std::size_t columns) {
  return scratch_doubles(detail::reduction_scratch(rows, columns));
}

double* CudaBackendImpl::scratch_doubles(std::size_t doubles) {
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

void* CudaBackendImpl::grow(void*& memory, std::size_t& capacity, std::size_t bytes,
                            const char* what) {
  if (bytes <= capacity && memory != nullptr) return memory;
  const std::size_t grown = std::max(bytes, capacity * 2);
  context_->activate();
  void* fresh = context_->allocate(grown, what);
  if (memory != nullptr) context_->free(memory);
  memory = fresh;
  capacity = grown;
  return memory;
}

Tensor<float> CudaBackendImpl::scratch_tensor(std::size_t slot, const Shape& shape) {
  const std::size_t bytes = shape.elements() * sizeof(float);
  void* memory = grow(scratch_slots_[slot].memory, scratch_slots_[slot].bytes,
                      std::max<std::size_t>(bytes, 1), "convolution scratch");
  return Tensor<float>::wrap(static_cast<float*>(memory), shape, nullptr, device());
}

#if LOADSTAR_CUDA_WITH_CUDNN
const detail::CudnnConvolution* CudaBackendImpl::cudnn_convolution(const keras::Conv2DGeometry& g) {
  if (options_.convolution != Convolution::cudnn) return nullptr;
  if (!cudnn_) cudnn_ = std::make_unique<detail::CudnnConvolutions>();
  if (!cudnn_->known(g)) active_stream("a cuDNN convolution's first use");
  context_->activate();
  return cudnn_->find(g, context_->stream);
}

Tensor<float> CudaBackendImpl::cudnn_filter(const Tensor<float>& kernel,
                                            const keras::Conv2DGeometry& g) {
  const Tensor<float> filter = scratch_tensor(0, {g.out_c, g.patch_size()});
  constexpr std::array<std::size_t, 2> swap{1, 0};
  permute(kernel.reshape({g.patch_size(), g.out_c}), swap, filter);
  return filter;
}

void CudaBackendImpl::queue_cudnn(const char* name, const detail::CudnnConvolution* conv,
                                  CudnnRun run, const float* a, const float* b, float* out) {
  void* workspace = conv->workspace_bytes() == 0 ? nullptr
                                                 : grow(cudnn_workspace_, cudnn_workspace_bytes_,
                                                        conv->workspace_bytes(), "cuDNN workspace");
  ++cudnn_calls_;
  enqueue({detail::word(name), detail::word(conv), detail::word(a), detail::word(b),
           detail::word(out), detail::word(workspace)},
          [this, conv, a, b, out, workspace, run](cudaStream_t s) {
            (conv->*run)(cudnn_->handle(s), a, b, out, workspace);
          });
}

#endif
void* CudaBackendImpl::step_scratch(std::size_t bytes) {
  return grow(step_scratch_, step_scratch_bytes_, bytes, "optimizer, loss and metric scratch");
}

double* CudaBackendImpl::reduction_terms(std::size_t rows, std::size_t columns) {
  const std::size_t doubles = rows * columns + detail::reduction_chunks(rows) * columns;
  return static_cast<double*>(step_scratch(doubles * sizeof(double)));
}

}  // namespace loadstar::cuda::detail

namespace loadstar::cuda {

std::shared_ptr<CudaBackend> CudaBackend::create(int device, CudaOptions options) {
  return std::make_shared<detail::CudaBackendImpl>(device, options);
}

std::shared_ptr<keras::Backend> cuda_backend(int device, CudaOptions options) {
  return CudaBackend::create(device, options);
}

}  // namespace loadstar::cuda
