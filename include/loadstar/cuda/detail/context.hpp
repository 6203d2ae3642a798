/// \file
/// `Context`: what every tensor of a CUDA backend keeps alive (the device, its streams, the memory
/// pool, the cuBLAS and cuBLASLt handles, the page-locked upload buffers). Internal to the CUDA
/// backend; defined in src/cuda/context.cpp.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loadstar/cuda/error.hpp"

namespace loadstar::cuda::detail {

/// The bytes cuBLAS may use as workspace: preset, so that GEMMs never allocate (and can be
/// captured in a CUDA graph); 32 MiB is what cuBLAS asks for on Hopper.
inline constexpr std::size_t cublas_workspace_bytes = std::size_t{32} << 20U;

/// Page-locked host memory that grows and is reused, for staging copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  /// At least `bytes` of pinned memory; the caller has made sure no copy still uses the old one.
  void* reserve(std::size_t bytes);

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

  explicit Context(int index);

  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context() { release_all(); }

  /// Copies `bytes` of host memory to `device` through the next of the page-locked upload
  /// buffers, in stream order, without waiting for the copy.
  void upload(void* device, const void* host, std::size_t bytes);

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
  std::array<UploadSlot*, 2 * upload_slots> all_upload_slots() noexcept;

  /// Makes this context's device the calling thread's current device.
  void activate() const;

  /// Throws the `CudaError` of `call` failing for want of device memory: the bytes asked for
  /// `what` and those free.
  [[noreturn]] void throw_out_of_memory(const char* call, std::size_t bytes,
                                        const std::string& what) const;

  /// Zero-filled device memory for `what` (a tensor's description, for the error message).
  void* allocate(std::size_t bytes, const std::string& what);

  /// Gives `memory` back to the pool in stream order (after the kernels queued so far that may
  /// use it). Never throws: it runs in a tensor's deleter.
  void free(void* memory) noexcept;

 private:
  void release_all() noexcept;
};

/// The number of CUDA devices, or a `CudaError` saying why there is none.
int device_count();

}  // namespace loadstar::cuda::detail
