// The CPU backend's bfloat16 matrix products: a GEMM whose operands are all bfloat16 values (a
// mixed_bfloat16 layer's inputs, weights and output gradients) runs on oneDNN's bfloat16 matmul
// where the processor has AVX-512 BF16 or AMX (CpuBackend::bfloat16_products), with float32 sums
// and result: the float32 product of the same values but for the order of the sums. Elsewhere,
// and for any operand that is not bfloat16, the float32 SGEMM computes it. The mixed precision
// tests against PyTorch (test_mixed_precision.cpp) run in this executable on whichever path this
// machine takes, and again as 'keras_mixed_precision_float32_products' with oneDNN held to
// AVX-512 without BF16 (ONEDNN_MAX_CPU_ISA=AVX512_CORE), the float32 path.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;

namespace {

/// The bfloat16 products computed in this process so far (0 in a build without oneDNN).
std::uint64_t bfloat16_products_so_far() {
#if LOADSTAR_WITH_DNNL
  return keras::detail::bfloat16_gemm_count().load();
#else
  return 0;
#endif
}

/// A `rows` x `columns` tensor of values in [-2, 2) from a fixed sequence, rounded to bfloat16
/// when `rounded`.
Tensor<float> products_operand(std::size_t rows, std::size_t columns, std::uint64_t seed,
                               bool rounded) {
  Tensor<float> out(Shape{rows, columns});
  for (auto& v : out) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 22) - 2.0F;
    if (rounded) v = static_cast<float>(bfloat16(v));
  }
  return out;
}

/// `alpha * op(a) * op(b) + beta * c` in double.
std::vector<double> products_reference(const Tensor<float>& a, bool transpose_a,
                                       const Tensor<float>& b, bool transpose_b,
                                       const Tensor<float>& c, float alpha, float beta) {
  const std::size_t m = c.rows(), n = c.row_size();
  const std::size_t k = transpose_a ? a.rows() : a.row_size();
  std::vector<double> out(m * n);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (std::size_t p = 0; p < k; ++p) {
        const double x = transpose_a ? a.data()[p * m + i] : a.data()[i * k + p];
        const double y = transpose_b ? b.data()[j * k + p] : b.data()[p * n + j];
        sum += x * y;
      }
      out[i * n + j] = alpha * sum + beta * static_cast<double>(c.data()[i * n + j]);
    }
  }
  return out;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("CpuBackend multiplies bfloat16 values in bfloat16 where the processor has it") {
    INFO("bfloat16 products on this machine: ", CpuBackend::bfloat16_products());
    for (const std::size_t threads : {1, 2}) {
      CpuBackend backend(threads);
      for (const bool transpose_a : {false, true}) {
        for (const bool transpose_b : {false, true}) {
          // Not a structured binding: INFO captures them, which Clang 14 cannot.
          for (const auto& scales : {std::pair{1.0F, 0.0F}, {0.5F, 1.0F}, {1.0F, -0.25F}}) {
            const float alpha = scales.first, beta = scales.second;
            const std::size_t m = 70, n = 33, k = 129;
            const Tensor<float> a =
                transpose_a ? products_operand(k, m, 1, true) : products_operand(m, k, 1, true);
            const Tensor<float> b =
                transpose_b ? products_operand(n, k, 2, true) : products_operand(k, n, 2, true);
            Tensor<float> c = products_operand(m, n, 3, false);
            const auto expected =
                products_reference(a, transpose_a, b, transpose_b, c, alpha, beta);
            const std::uint64_t before = bfloat16_products_so_far();
            backend.gemm(a, transpose_a, b, transpose_b, c, alpha, beta);
            INFO(threads, " threads, transposes ", transpose_a, transpose_b, ", alpha ", alpha,
                 ", beta ", beta);
            CHECK((bfloat16_products_so_far() > before) == CpuBackend::bfloat16_products());
            // float32 sums of exact products: within k roundings of the largest partial sum.
            double worst = 0;
            for (std::size_t i = 0; i < c.size(); ++i)
              worst = std::max(worst, std::abs(c.data()[i] - expected[i]));
            CHECK(worst <= 1e-4);
          }
        }
      }
    }
  }

  TEST_CASE("CpuBackend multiplies an operand that is not bfloat16 in float32") {
    CpuBackend backend(2);
    const Tensor<float> a = products_operand(40, 50, 4, true);
    const Tensor<float> b = products_operand(50, 30, 5, false);
    Tensor<float> c(Shape{40, 30});
    const std::uint64_t before = bfloat16_products_so_far();
    backend.gemm(a, false, b, false, c, 1.0F, 0.0F);
    backend.gemm(b, true, a, true, Tensor<float>(Shape{30, 40}), 1.0F, 0.0F);
    CHECK(bfloat16_products_so_far() == before);
    const auto expected = products_reference(a, false, b, false, c, 1.0F, 0.0F);
    for (std::size_t i = 0; i < c.size(); ++i)
      CHECK(c.data()[i] == doctest::Approx(expected[i]).epsilon(1e-5));
  }

  TEST_CASE("Dense and Conv2D under mixed_bfloat16 take the bfloat16 products, float32 does not") {
    const auto products_of = [](const std::string& policy) {
      const mixed_precision::PolicyScope scope(policy);
      set_random_seed(5);
      Sequential model{
          Input({6, 6, 2}), layers::Conv2D(8, 3, {.padding = "same", .activation = "relu"}),
          layers::Flatten(), layers::Dense(16, {.activation = "relu"}), layers::Dense(3)};
      model.compile({.optimizer = "adam", .loss = "mse", .threads = 2});
      const Tensor<float> x = products_operand(4, 72, 6, false).reshape({4, 6, 6, 2});
      const Tensor<float> y = products_operand(4, 3, 7, false);
      const std::uint64_t before = bfloat16_products_so_far();
      model.train_on_batch(x, y);
      return bfloat16_products_so_far() - before;
    };
    // The products of the forward pass, the kernels' and the inputs' gradients (Conv2D's in tiles
    // of images).
    CHECK((products_of("mixed_bfloat16") > 0) == CpuBackend::bfloat16_products());
    CHECK(products_of("float32") == 0);
  }
}
