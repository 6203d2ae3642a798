/// \file
/// `LtPlans`: cuBLASLt multiplications with fused epilogues, planned once per shape. Internal to
/// the CUDA backend; defined in src/cuda/lt_plans.cpp.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <memory>

#include "loadstar/cuda/detail/context.hpp"

namespace loadstar::cuda::detail {

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
  /// applied from the bit mask), accumulated in fp32. `A` and `B` hold `operands`: fp32, or fp16
  /// or bf16 (a mixed-precision layer's products, on the tensor cores); `D`, the bias and the
  /// sums are fp32. `aux_ld` is the bit mask's leading dimension in bits (a multiple of 128, at
  /// least `m`; 0 without a mask).
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
    cudaDataType_t operands = CUDA_R_32F;
    bool operator==(const Key&) const = default;
  };

  /// The largest power of two, at most 256, that divides every address of `pointers`.
  static std::uint32_t alignment(std::initializer_list<const void*> pointers) noexcept;

  explicit LtPlans(std::shared_ptr<Context> context) : context_(std::move(context)) {}
  LtPlans(const LtPlans&) = delete;
  LtPlans& operator=(const LtPlans&) = delete;
  ~LtPlans();

  struct Plan;

  /// The plan of `key`, made at its first use (host calls only: nothing is queued), or null when
  /// cuBLASLt has no algorithm for it.
  const Plan* plan(const Key& key);

  /// Queues the multiplication of `plan` on `stream`; `bias` is the epilogue's vector (read by a
  /// bias epilogue, written by a bias-gradient one), `aux` its ReLU bit mask (written by
  /// `RELU_AUX_BIAS`, read by `DRELU_BGRAD`). `D = alpha * op(A) * op(B) + beta * D` before the
  /// epilogue.
  void run(const Plan& plan_ref, const void* a, const void* b, const float* bias, float* d,
           cudaStream_t stream, const void* aux = nullptr, float alpha = 1.0F,
           float beta = 0.0F) const;

  struct Plan {
    Key key{};
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool usable = false;
  };

 private:
  const Plan* find(const Key& key);

  static void destroy(Plan& plan) noexcept;

  std::shared_ptr<Context> context_;
  std::deque<Plan> plans_;  // stable addresses
};

}  // namespace loadstar::cuda::detail
