// cuBLASLt multiplications with fused epilogues, planned once per shape
// (loadstar/cuda/detail/lt_plans.hpp).

#include "loadstar/cuda/detail/lt_plans.hpp"

namespace loadstar::cuda::detail {

std::uint32_t LtPlans::alignment(std::initializer_list<const void*> pointers) noexcept {
  std::uintptr_t bits = 256;
  for (const void* p : pointers)
    bits |= reinterpret_cast<std::uintptr_t>(p);
  return static_cast<std::uint32_t>(bits & (~bits + 1));
}

LtPlans::~LtPlans() {
  for (auto& plan : plans_)
    destroy(plan);
}

const LtPlans::Plan* LtPlans::plan(const Key& key) {
  const Plan* found = find(key);
  return found != nullptr && found->usable ? found : nullptr;
}

void LtPlans::run(const Plan& plan_ref, const void* a, const void* b, const float* bias, float* d,
                  cudaStream_t stream, const void* aux, float alpha, float beta) const {
  const Plan* plan = &plan_ref;
  if (bias != nullptr) {
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof bias),
          "cublasLtMatmulDescSetAttribute (bias)");
  }
  if (aux != nullptr) {
    check(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                         &aux, sizeof aux),
          "cublasLtMatmulDescSetAttribute (aux)");
  }
  check(cublasLtMatmul(context_->cublas_lt, plan->desc, &alpha, a, plan->a, b, plan->b, &beta, d,
                       plan->d, d, plan->d, &plan->algo, context_->cublas_workspace,
                       cublas_workspace_bytes, stream),
        "cublasLtMatmul");
}

const LtPlans::Plan* LtPlans::find(const Key& key) {
  for (const auto& plan : plans_)
    if (plan.key == key) return &plan;
  Plan plan;
  plan.key = key;
  try {
    check(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
          "cublasLtMatmulDescCreate");
    const cublasOperation_t op_a = key.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    check(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a),
        "cublasLtMatmulDescSetAttribute (transa)");
    check(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b),
        "cublasLtMatmulDescSetAttribute (transb)");
    check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue,
                                         sizeof key.epilogue),
          "cublasLtMatmulDescSetAttribute (epilogue)");
    if (key.aux_ld != 0) {
      const auto aux_ld = static_cast<std::int64_t>(key.aux_ld);
      check(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                           sizeof aux_ld),
            "cublasLtMatmulDescSetAttribute (aux ld)");
    }
    const std::uint64_t a_rows = key.transpose_a ? key.k : key.m;
    const std::uint64_t a_cols = key.transpose_a ? key.m : key.k;
    check(cublasLtMatrixLayoutCreate(&plan.a, key.operands, a_rows, a_cols,
                                     static_cast<std::int64_t>(a_rows)),
          "cublasLtMatrixLayoutCreate");
    const std::uint64_t b_rows = key.transpose_b ? key.n : key.k;
    const std::uint64_t b_cols = key.transpose_b ? key.k : key.n;
    check(cublasLtMatrixLayoutCreate(&plan.b, key.operands, b_rows, b_cols,
                                     static_cast<std::int64_t>(b_rows)),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&plan.d, CUDA_R_32F, key.m, key.n,
                                     static_cast<std::int64_t>(key.m)),
          "cublasLtMatrixLayoutCreate");
    cublasLtMatmulPreference_t preference = nullptr;
    check(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
    const std::uint64_t workspace = cublas_workspace_bytes;
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace);
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      if (status == CUBLAS_STATUS_SUCCESS) {
        status = cublasLtMatmulPreferenceSetAttribute(preference, attribute, &key.alignment,
                                                      sizeof key.alignment);
      }
    }
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = cublasLtMatmulAlgoGetHeuristic(context_->cublas_lt, plan.desc, plan.a, plan.b,
                                              plan.d, plan.d, preference, 1, &result, &found);
    }
    static_cast<void>(cublasLtMatmulPreferenceDestroy(preference));
    // No algorithm (CUBLAS_STATUS_NOT_SUPPORTED, or none found): the caller falls back.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) check(status, "cublasLtMatmulAlgoGetHeuristic");
    plan.usable = status == CUBLAS_STATUS_SUCCESS && found > 0;
    if (plan.usable) plan.algo = result.algo;
  } catch (...) {
    destroy(plan);
    throw;
  }
  plans_.push_back(plan);
  return &plans_.back();
}

void LtPlans::destroy(Plan& plan) noexcept {
  if (plan.d != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.d));
  if (plan.b != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.b));
  if (plan.a != nullptr) static_cast<void>(cublasLtMatrixLayoutDestroy(plan.a));
  if (plan.desc != nullptr) static_cast<void>(cublasLtMatmulDescDestroy(plan.desc));
  plan = Plan{};
}

}  // namespace loadstar::cuda::detail
