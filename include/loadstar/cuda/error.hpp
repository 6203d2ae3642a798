/// \file
/// `check`: turns a failing status of the CUDA runtime or cuBLAS into a `loadstar::CudaError`
/// whose message names the call, the numeric code, its name and its text.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "loadstar/error.hpp"

namespace loadstar::cuda {

/// `"<call> failed with error <code> (<name>: <text>)"`, the message of a failed CUDA call.
/// \code
/// error_message("cudaMalloc", 2, "cudaErrorMemoryAllocation", "out of memory");
/// // "cudaMalloc failed with error 2 (cudaErrorMemoryAllocation: out of memory)"
/// \endcode
inline std::string error_message(std::string_view call, int code, std::string_view name,
                                 std::string_view text) {
  std::string message(call);
  message += " failed with error ";
  message += std::to_string(code);
  message += " (";
  message += name;
  message += ": ";
  message += text;
  message += ')';
  return message;
}

/// The message of a failed CUDA runtime call (`cudaGetErrorName`, `cudaGetErrorString`).
inline std::string error_message(std::string_view call, cudaError_t status) {
  return error_message(call, static_cast<int>(status), cudaGetErrorName(status),
                       cudaGetErrorString(status));
}

/// The message of a failed cuBLAS call (`cublasGetStatusName`, `cublasGetStatusString`).
inline std::string error_message(std::string_view call, cublasStatus_t status) {
  return error_message(call, static_cast<int>(status), cublasGetStatusName(status),
                       cublasGetStatusString(status));
}

/// The message of an allocation the device could not satisfy: the bytes asked, what they were
/// for, and the bytes free of the device's total (`cudaMemGetInfo`).
/// \code
/// out_of_memory_message("cuda:0", "cudaMallocFromPoolAsync", 4096, "a float32 tensor",
///                       1024, 81559052288);
/// // "cuda:0: out of memory: cudaMallocFromPoolAsync of 4096 bytes for a float32 tensor
/// //  failed with 1024 bytes free of 81559052288"
/// \endcode
inline std::string out_of_memory_message(std::string_view device, std::string_view call,
                                         std::size_t bytes, std::string_view what,
                                         std::size_t free_bytes, std::size_t total_bytes) {
  std::string message(device);
  message += ": out of memory: ";
  message += call;
  message += " of ";
  message += std::to_string(bytes);
  message += " bytes for ";
  message += what;
  message += " failed with ";
  message += std::to_string(free_bytes);
  message += " bytes free of ";
  message += std::to_string(total_bytes);
  return message;
}

/// Throws `CudaError` naming `call` unless `status` is `cudaSuccess`. The runtime's last error is
/// cleared first, so that the next call does not report it again.
/// \code
/// check(cudaMalloc(&p, bytes), "cudaMalloc");
/// \endcode
inline void check(cudaError_t status, std::string_view call) {
  if (status == cudaSuccess) return;
  static_cast<void>(cudaGetLastError());
  throw CudaError(error_message(call, status));
}

/// Throws `CudaError` naming `call` unless `status` is `CUBLAS_STATUS_SUCCESS`.
inline void check(cublasStatus_t status, std::string_view call) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw CudaError(error_message(call, status));
}

}  // namespace loadstar::cuda
