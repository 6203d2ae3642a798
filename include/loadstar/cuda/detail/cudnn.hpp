/// \file
/// cuDNN's convolutions for `CudaBackend` (`CudaOptions::convolution = Convolution::cudnn`), in
/// builds where Meson found cuDNN (`LOADSTAR_CUDA_WITH_CUDNN`): one `CudnnConvolution` per
/// geometry holds the descriptors and the algorithms cuDNN's heuristic ranks first among the
/// deterministic ones in full fp32 (`CUDNN_FMA_MATH`: no TF32), chosen once, so that a step runs
/// the same algorithms every time (the same bits run to run) and can be captured in a CUDA graph.
/// Included by loadstar/cuda/detail/cuda_backend.hpp; do not include alone.
#pragma once

#include "loadstar/config.hpp"

#if LOADSTAR_CUDA_WITH_CUDNN

#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstar/cuda/error.hpp"
#include "loadstar/keras/backend/backend.hpp"

namespace loadstar::cuda {

/// The message of a failed cuDNN call: its status's name (`cudnnGetErrorString`) and cuDNN's
/// own account of the last error (`cudnnGetLastErrorString`) where it has one.
inline std::string error_message(std::string_view call, cudnnStatus_t status) {
  std::array<char, 512> detail{};
  cudnnGetLastErrorString(detail.data(), detail.size());
  const std::string_view text(detail.data());
  return error_message(call, static_cast<int>(status), cudnnGetErrorString(status),
                       text.empty() ? std::string_view("cuDNN") : text);
}

/// Throws `CudaError` naming `call` unless `status` is `CUDNN_STATUS_SUCCESS`.
inline void check(cudnnStatus_t status, std::string_view call) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  throw CudaError(error_message(call, status));
}

namespace detail {

/// The most workspace one convolution algorithm may ask for.
inline constexpr std::size_t cudnn_max_workspace_bytes = std::size_t{256} << 20U;

/// cuDNN's handle, made at the first convolution (loading cuDNN's libraries then, not before).
class CudnnHandle {
 public:
  CudnnHandle() = default;
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  ~CudnnHandle() {
    if (handle_ != nullptr) static_cast<void>(cudnnDestroy(handle_));
  }

  /// The handle, its work queued on `stream`.
  cudnnHandle_t get(cudaStream_t stream) {
    if (handle_ == nullptr) check(cudnnCreate(&handle_), "cudnnCreate");
    if (stream != stream_) {
      check(cudnnSetStream(handle_, stream), "cudnnSetStream");
      stream_ = stream;
    }
    return handle_;
  }

 private:
  cudnnHandle_t handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

/// The three convolutions of one `Conv2DGeometry` on channels-last tensors: the input
/// `(batch, in_h, in_w, in_c)` and the output `(batch, out_h, out_w, out_c)` are cuDNN's NHWC
/// tensors, and the filter is cuDNN's NHWC filter `(out_c, kernel_h, kernel_w, in_c)`: the
/// transpose of Keras's `(kernel_h * kernel_w * in_c, out_c)` kernel. cuDNN pads both sides by
/// the same amount: a geometry whose output cuDNN sizes otherwise (TensorFlow's `same` with an
/// odd total padding, where the last window reaches the extra row) is not `usable`, and neither
/// is one without a deterministic algorithm for each direction.
class CudnnConvolution {
 public:
  CudnnConvolution(cudnnHandle_t handle, const keras::Conv2DGeometry& g) : geometry_(g) {
    try {
      check(cudnnCreateTensorDescriptor(&x_), "cudnnCreateTensorDescriptor");
      check(cudnnCreateTensorDescriptor(&y_), "cudnnCreateTensorDescriptor");
      check(cudnnCreateFilterDescriptor(&w_), "cudnnCreateFilterDescriptor");
      check(cudnnCreateConvolutionDescriptor(&conv_), "cudnnCreateConvolutionDescriptor");
      if (!fits_int(g)) return;
      check(cudnnSetTensor4dDescriptor(x_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, to_int(g.batch),
                                       to_int(g.in_c), to_int(g.in_h), to_int(g.in_w)),
            "cudnnSetTensor4dDescriptor (input)");
      check(cudnnSetTensor4dDescriptor(y_, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, to_int(g.batch),
                                       to_int(g.out_c), to_int(g.out_h), to_int(g.out_w)),
            "cudnnSetTensor4dDescriptor (output)");
      check(cudnnSetFilter4dDescriptor(w_, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, to_int(g.out_c),
                                       to_int(g.in_c), to_int(g.kernel_h), to_int(g.kernel_w)),
            "cudnnSetFilter4dDescriptor");
      check(cudnnSetConvolution2dDescriptor(conv_, to_int(g.pad_top), to_int(g.pad_left),
                                            to_int(g.stride_h), to_int(g.stride_w),
                                            to_int(g.dilation_h), to_int(g.dilation_w),
                                            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            "cudnnSetConvolution2dDescriptor");
      check(cudnnSetConvolutionMathType(conv_, CUDNN_FMA_MATH), "cudnnSetConvolutionMathType");
      int n = 0, c = 0, h = 0, w = 0;
      check(cudnnGetConvolution2dForwardOutputDim(conv_, x_, w_, &n, &c, &h, &w),
            "cudnnGetConvolution2dForwardOutputDim");
      if (n != to_int(g.batch) || c != to_int(g.out_c) || h != to_int(g.out_h) ||
          w != to_int(g.out_w))
        return;
      usable_ = choose_algorithms(handle);
    } catch (...) {
      destroy();
      throw;
    }
  }
  CudnnConvolution(const CudnnConvolution&) = delete;
  CudnnConvolution& operator=(const CudnnConvolution&) = delete;
  ~CudnnConvolution() { destroy(); }

  const keras::Conv2DGeometry& geometry() const noexcept { return geometry_; }
  bool usable() const noexcept { return usable_; }
  /// The workspace the largest of the three algorithms needs.
  std::size_t workspace_bytes() const noexcept { return workspace_bytes_; }

  /// `y = conv(x, filter)` (written).
  void forward(cudnnHandle_t handle, const float* x, const float* filter, float* y,
               void* workspace) const {
    const float one = 1.0F, zero = 0.0F;
    check(cudnnConvolutionForward(handle, &one, x_, x, w_, filter, conv_, forward_, workspace,
                                  workspace_bytes_, &zero, y_, y),
          "cudnnConvolutionForward");
  }
  /// `dx` = the input gradient of `dy` (written).
  void backward_data(cudnnHandle_t handle, const float* filter, const float* dy, float* dx,
                     void* workspace) const {
    const float one = 1.0F, zero = 0.0F;
    check(cudnnConvolutionBackwardData(handle, &one, w_, filter, y_, dy, conv_, backward_data_,
                                       workspace, workspace_bytes_, &zero, x_, dx),
          "cudnnConvolutionBackwardData");
  }
  /// `dfilter` = the filter gradient of `dy` (written).
  void backward_filter(cudnnHandle_t handle, const float* x, const float* dy, float* dfilter,
                       void* workspace) const {
    const float one = 1.0F, zero = 0.0F;
    check(cudnnConvolutionBackwardFilter(handle, &one, x_, x, y_, dy, conv_, backward_filter_,
                                         workspace, workspace_bytes_, &zero, w_, dfilter),
          "cudnnConvolutionBackwardFilter");
  }

 private:
  static bool fits_int(const keras::Conv2DGeometry& g) noexcept {
    constexpr std::size_t most = 1U << 30U;
    for (const std::size_t v :
         {g.batch, g.in_h, g.in_w, g.in_c, g.out_h, g.out_w, g.out_c, g.kernel_h, g.kernel_w,
          g.stride_h, g.stride_w, g.dilation_h, g.dilation_w, g.pad_top, g.pad_left})
      if (v >= most) return false;
    return true;
  }
  static int to_int(std::size_t v) noexcept { return static_cast<int>(v); }

  /// The first algorithm of cuDNN's ranking that succeeds, is deterministic, uses no tensor
  /// cores and fits the workspace limit, or false.
  template <class Perf, class Algorithm, class Rank>
  bool first_deterministic(Rank rank, Algorithm& chosen) {
    std::array<Perf, 16> results{};
    int returned = 0;
    check(rank(static_cast<int>(results.size()), &returned, results.data()),
          "cudnnGetConvolution*Algorithm_v7");
    for (int i = 0; i < returned; ++i) {
      const Perf& r = results[static_cast<std::size_t>(i)];
      if (r.status == CUDNN_STATUS_SUCCESS && r.determinism == CUDNN_DETERMINISTIC &&
          r.mathType != CUDNN_TENSOR_OP_MATH &&
          r.mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&
          r.memory <= cudnn_max_workspace_bytes) {
        chosen = r.algo;
        workspace_bytes_ = std::max(workspace_bytes_, r.memory);
        return true;
      }
    }
    return false;
  }

  /// The algorithms, then the workspace the largest of them asks for (cuDNN's own count, in
  /// case it differs from the ranking's).
  bool choose_algorithms(cudnnHandle_t handle) {
    if (!rank_algorithms(handle)) return false;
    std::size_t bytes = 0;
    check(cudnnGetConvolutionForwardWorkspaceSize(handle, x_, w_, conv_, y_, forward_, &bytes),
          "cudnnGetConvolutionForwardWorkspaceSize");
    workspace_bytes_ = std::max(workspace_bytes_, bytes);
    check(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, w_, y_, conv_, x_, backward_data_,
                                                       &bytes),
          "cudnnGetConvolutionBackwardDataWorkspaceSize");
    workspace_bytes_ = std::max(workspace_bytes_, bytes);
    check(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, x_, y_, conv_, w_,
                                                         backward_filter_, &bytes),
          "cudnnGetConvolutionBackwardFilterWorkspaceSize");
    workspace_bytes_ = std::max(workspace_bytes_, bytes);
    return workspace_bytes_ <= cudnn_max_workspace_bytes;
  }

  bool rank_algorithms(cudnnHandle_t handle) {
    return first_deterministic<cudnnConvolutionFwdAlgoPerf_t>(
               [&](int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* results) {
                 return cudnnGetConvolutionForwardAlgorithm_v7(handle, x_, w_, conv_, y_, n,
                                                               returned, results);
               },
               forward_) &&
           first_deterministic<cudnnConvolutionBwdDataAlgoPerf_t>(
               [&](int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* results) {
                 return cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, w_, y_, conv_, x_, n,
                                                                    returned, results);
               },
               backward_data_) &&
           first_deterministic<cudnnConvolutionBwdFilterAlgoPerf_t>(
               [&](int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* results) {
                 return cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, x_, y_, conv_, w_, n,
                                                                      returned, results);
               },
               backward_filter_);
  }

  void destroy() noexcept {
    if (conv_ != nullptr) static_cast<void>(cudnnDestroyConvolutionDescriptor(conv_));
    if (w_ != nullptr) static_cast<void>(cudnnDestroyFilterDescriptor(w_));
    if (y_ != nullptr) static_cast<void>(cudnnDestroyTensorDescriptor(y_));
    if (x_ != nullptr) static_cast<void>(cudnnDestroyTensorDescriptor(x_));
    conv_ = nullptr;
    w_ = nullptr;
    y_ = x_ = nullptr;
  }

  keras::Conv2DGeometry geometry_;
  cudnnTensorDescriptor_t x_ = nullptr, y_ = nullptr;
  cudnnFilterDescriptor_t w_ = nullptr;
  cudnnConvolutionDescriptor_t conv_ = nullptr;
  cudnnConvolutionFwdAlgo_t forward_{};
  cudnnConvolutionBwdDataAlgo_t backward_data_{};
  cudnnConvolutionBwdFilterAlgo_t backward_filter_{};
  std::size_t workspace_bytes_ = 0;
  bool usable_ = false;
};

/// Whether two geometries are the same convolution.
inline bool same_geometry(const keras::Conv2DGeometry& a, const keras::Conv2DGeometry& b) noexcept {
  return a.batch == b.batch && a.in_h == b.in_h && a.in_w == b.in_w && a.in_c == b.in_c &&
         a.out_h == b.out_h && a.out_w == b.out_w && a.out_c == b.out_c &&
         a.kernel_h == b.kernel_h && a.kernel_w == b.kernel_w && a.stride_h == b.stride_h &&
         a.stride_w == b.stride_w && a.dilation_h == b.dilation_h && a.dilation_w == b.dilation_w &&
         a.pad_top == b.pad_top && a.pad_left == b.pad_left;
}

/// The handle and one `CudnnConvolution` per geometry met, made at its first use (host calls
/// only: nothing is queued).
class CudnnConvolutions {
 public:
  /// The convolution of `g`, or null where cuDNN cannot run it as the im2col path does.
  const CudnnConvolution* find(const keras::Conv2DGeometry& g, cudaStream_t stream) {
    for (const auto& c : convolutions_)
      if (same_geometry(c->geometry(), g)) return c->usable() ? c.get() : nullptr;
    convolutions_.push_back(std::make_unique<CudnnConvolution>(handle_.get(stream), g));
    return convolutions_.back()->usable() ? convolutions_.back().get() : nullptr;
  }
  cudnnHandle_t handle(cudaStream_t stream) { return handle_.get(stream); }
  /// Whether `g` has been met before (then `find` makes nothing).
  bool known(const keras::Conv2DGeometry& g) const {
    for (const auto& c : convolutions_)
      if (same_geometry(c->geometry(), g)) return true;
    return false;
  }

 private:
  CudnnHandle handle_;
  std::vector<std::unique_ptr<CudnnConvolution>> convolutions_;
};

}  // namespace detail
}  // namespace loadstar::cuda

#endif  // LOADSTAR_CUDA_WITH_CUDNN
