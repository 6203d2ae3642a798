// The CUDA backend without a GPU: error messages, the backend refusing to start, and every
// kernel's per-thread work (loadstar/cuda/detail/math.hpp, the functions the kernels call) run on
// the host over all threads and compared with the CPU backend. Where the kernel follows the CPU
// backend's order of operations the comparison is bitwise; the chunked column reductions are
// bitwise with one chunk and within 1e-6 (relative) with several.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <limits>
#include <loadstar/cuda.hpp>
#include <loadstar/cuda/detail/cuda_backend.hpp>
#include <loadstar/cuda/detail/math.hpp>
#include <loadstar/cuda/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/random.hpp>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "random_tensor.hpp"

using namespace loadstar;
namespace kd = loadstar::cuda::detail;
using keras::Activation;
using keras::CpuBackend;

namespace {

using test_support::random_tensor;
using test_support::values;

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof(float)) == 0 || (std::isnan(a) && std::isnan(b));
}

/// Checks `actual` against the CPU backend's `expected` element by element: bitwise when
/// `tolerance` is 0, else `|a - e| <= tolerance * max(1, |e|)`; reports the first mismatch's
/// index, value and target and the number of mismatches.
void check_elements(const Tensor<float>& expected, std::span<const float> actual,
                    double tolerance = 0.0) {
  REQUIRE(expected.size() == actual.size());
  std::size_t mismatches = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const float e = expected.data()[i];
    const float a = actual[i];
    const bool ok = tolerance == 0.0
                        ? same_bits(a, e)
                        : (std::isnan(e) ? std::isnan(a)
                                         : std::abs(double(a) - double(e)) <=
                                               tolerance * std::max(1.0, std::abs(double(e))));
    if (!ok && mismatches++ == 0) first = i;
  }
  INFO("first mismatch at index " << first << ": value " << std::setprecision(9) << actual[first]
                                  << ", target " << expected.data()[first] << " (" << mismatches
                                  << " mismatches)");
  CHECK(mismatches == 0);
}

void check_elements(const Tensor<float>& expected, const Tensor<float>& actual,
                    double tolerance = 0.0) {
  check_elements(expected, actual.span(), tolerance);
}

/// What the column reductions of kernels.cuh compute, run on the host: the per-chunk partial
/// sums, then the chunks added in order.
template <class Value>
std::vector<double> column_reduce(const Value& value, std::size_t rows, std::size_t columns) {
  const std::size_t chunks = kd::reduction_chunks(rows);
  std::vector<double> partials(chunks * columns);
  for (std::size_t chunk = 0; chunk < chunks; ++chunk)
    for (std::size_t j = 0; j < columns; ++j)
      partials[chunk * columns + j] = kd::column_partial(value, rows, chunk, j);
  std::vector<double> totals(columns);
  for (std::size_t j = 0; j < columns; ++j)
    totals[j] = kd::column_total(partials.data(), chunks, columns, j);
  return totals;
}

constexpr Activation all_activations[] = {
    Activation::linear,      Activation::relu,         Activation::sigmoid,
    Activation::tanh,        Activation::elu,          Activation::selu,
    Activation::softplus,    Activation::softsign,     Activation::gelu,
    Activation::swish,       Activation::hard_sigmoid, Activation::exponential,
    Activation::relu6,       Activation::leaky_relu,   Activation::mish,
    Activation::hard_silu,   Activation::log_sigmoid,  Activation::hard_tanh,
    Activation::tanh_shrink, Activation::soft_shrink,  Activation::hard_shrink,
    Activation::squareplus,  Activation::sparse_plus,
};

/// Inputs over the interesting range of every activation, with the special values.
Tensor<float> activation_inputs() {
  std::vector<float> v;
  for (int i = -3000; i <= 3000; ++i)
    v.push_back(static_cast<float>(i) * 0.01F);
  for (float s : {0.0F, -0.0F, 1e-30F, -1e-30F, 88.0F, -88.0F, 100.0F, -100.0F, 1e-6F, -1e-6F,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()}) {
    v.push_back(s);
  }
  return Tensor<float>({v.size()}, std::span<const float>(v));
}

keras::Conv2DGeometry conv_geometry(std::size_t batch, std::size_t in_h, std::size_t in_w,
                                    std::size_t in_c, std::size_t kernel_h, std::size_t kernel_w,
                                    std::size_t stride_h, std::size_t stride_w,
                                    std::size_t dilation, bool same) {
  const auto h = keras::axis_geometry(in_h, kernel_h, stride_h, dilation, same);
  const auto w = keras::axis_geometry(in_w, kernel_w, stride_w, dilation, same);
  keras::Conv2DGeometry g;
  g.batch = batch;
  g.in_h = in_h;
  g.in_w = in_w;
  g.in_c = in_c;
  g.out_h = h.out;
  g.out_w = w.out;
  g.out_c = 2;
  g.kernel_h = kernel_h;
  g.kernel_w = kernel_w;
  g.stride_h = stride_h;
  g.stride_w = stride_w;
  g.dilation_h = dilation;
  g.dilation_w = dilation;
  g.pad_top = h.pad_before;
  g.pad_left = w.pad_before;
  return g;
}

keras::Pool2DGeometry pool_geometry(std::size_t batch, std::size_t in_h, std::size_t in_w,
                                    std::size_t channels, std::size_t pool, std::size_t stride,
                                    bool same) {
  const auto h = keras::axis_geometry(in_h, pool, stride, 1, same);
  const auto w = keras::axis_geometry(in_w, pool, stride, 1, same);
  keras::Pool2DGeometry g;
  g.batch = batch;
  g.in_h = in_h;
  g.in_w = in_w;
  g.channels = channels;
  g.out_h = h.out;
  g.out_w = w.out;
  g.pool_h = pool;
  g.pool_w = pool;
  g.stride_h = stride;
  g.stride_w = stride;
  g.pad_top = h.pad_before;
  g.pad_left = w.pad_before;
  return g;
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("error_message names the call the numeric code its name and its text") {
    CHECK(cuda::error_message("cudaMalloc", 2, "cudaErrorMemoryAllocation", "out of memory") ==
          "cudaMalloc failed with error 2 (cudaErrorMemoryAllocation: out of memory)");
    CHECK(cuda::error_message("cudaMalloc", cudaErrorMemoryAllocation) ==
          "cudaMalloc failed with error 2 (cudaErrorMemoryAllocation: out of memory)");
    CHECK(cuda::error_message("cudaMemcpyAsync", cudaErrorInvalidValue) ==
          "cudaMemcpyAsync failed with error 1 (cudaErrorInvalidValue: invalid argument)");
    const std::string cublas = cuda::error_message("cublasSgemm", CUBLAS_STATUS_EXECUTION_FAILED);
    CHECK(cublas.starts_with("cublasSgemm failed with error 13 (CUBLAS_STATUS_EXECUTION_FAILED: "));
    CHECK(
        cublas.size() >
        std::string("cublasSgemm failed with error 13 (CUBLAS_STATUS_EXECUTION_FAILED: )").size());
  }

  TEST_CASE("check throws CudaError for a failed CUDA or cuBLAS call") {
    CHECK_NOTHROW(cuda::check(cudaSuccess, "cudaStreamSynchronize"));
    CHECK_NOTHROW(cuda::check(CUBLAS_STATUS_SUCCESS, "cublasCreate"));
    CHECK_THROWS_WITH_AS(cuda::check(cudaErrorInvalidValue, "cudaMemcpyAsync (host to device)"),
                         "cudaMemcpyAsync (host to device) failed with error 1 "
                         "(cudaErrorInvalidValue: invalid argument)",
                         CudaError);
    CHECK_THROWS_WITH_AS(cuda::check(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate"),
                         doctest::Contains("cublasCreate failed with error 1 "
                                           "(CUBLAS_STATUS_NOT_INITIALIZED: "),
                         CudaError);
    // CudaError is one of loadstar's errors, so `catch (const loadstar::Error&)` sees it.
    CHECK_THROWS_AS(cuda::check(cudaErrorNoDevice, "cudaSetDevice"), loadstar::Error);
  }

  TEST_CASE("check throws CudaError naming a failed cuDNN call, where cuDNN is built") {
#if LOADSTAR_CUDA_WITH_CUDNN
    CHECK_NOTHROW(cuda::check(CUDNN_STATUS_SUCCESS, "cudnnCreate"));
    const std::string expected = "cudnnConvolutionForward failed with error " +
                                 std::to_string(CUDNN_STATUS_NOT_SUPPORTED) +
                                 " (CUDNN_STATUS_NOT_SUPPORTED";
    CHECK_THROWS_WITH_AS(cuda::check(CUDNN_STATUS_NOT_SUPPORTED, "cudnnConvolutionForward"),
                         doctest::Contains(expected.c_str()), CudaError);
#else
    MESSAGE("this build has no cuDNN");
#endif
  }

  TEST_CASE("out_of_memory_message gives the bytes asked and the bytes free") {
    CHECK(cuda::out_of_memory_message("cuda:0", "cudaMallocFromPoolAsync", 4096,
                                      "a float32 tensor of shape (32, 32)", 1024, 81559052288) ==
          "cuda:0: out of memory: cudaMallocFromPoolAsync of 4096 bytes for a float32 tensor of "
          "shape (32, 32) failed with 1024 bytes free of 81559052288");
  }

  TEST_CASE("CudaBackend refuses a negative device index") {
    CHECK_THROWS_WITH_AS(cuda::CudaBackend::create(-1),
                         "cuda backend: the device index must be at least 0 but is -1",
                         ConfigError);
  }

  TEST_CASE("cuda_backend throws CudaError without a GPU and gives a CudaBackend with one") {
    if (cuda::device_available()) {
      const auto backend = keras::cuda_backend(0);
      CHECK(dynamic_cast<cuda::CudaBackend*>(backend.get()) != nullptr);
      CHECK(backend->device() == Device{"cuda", 0});
      CHECK_FALSE(backend->is_host());
      CHECK_THROWS_WITH_AS(cuda::CudaBackend::create(4096),
                           doctest::Contains("cuda backend: device 4096 was asked for but"),
                           ConfigError);
      return;
    }
    const auto message = doctest::Contains(
        "cuda backend: no CUDA device is available: cudaGetDeviceCount failed with error ");
    CHECK_THROWS_WITH_AS(cuda::CudaBackend::create(0), message, CudaError);
    CHECK_THROWS_WITH_AS(keras::cuda_backend(0), message, CudaError);
    CHECK_THROWS_WITH_AS(cuda::cuda_backend(1), message, CudaError);
    // The failure comes before compile touches the model, which stays usable on the CPU.
    keras::set_random_seed(1);
    keras::Sequential model{keras::Input({4}), keras::layers::Dense(2)};
    CHECK_THROWS_AS(
        model.compile({.optimizer = "adam", .loss = "mse", .backend = keras::cuda_backend(0)}),
        CudaError);
    model.compile({.optimizer = "adam", .loss = "mse"});
    CHECK(model.predict(random_tensor({3, 4}, 1), {.verbose = 0}).shape() == Shape{3, 2});
  }

  TEST_CASE("plan_staging stages overlapping device tensors as one block") {
    // Stand-ins for device memory: aligned host memory labelled cuda:0, never dereferenced by the
    // plan.
    const Tensor<float> memory({1000});
    float* base = memory.data();
    auto device = [&](std::size_t offset, const Shape& shape) {
      return Tensor<float>::wrap(base + offset, shape, nullptr, Device{"cuda", 0});
    };
    const Tensor<float> a = device(0, {4, 10});          // [0, 40)
    const Tensor<float> view = a.slice_rows(1, 3);       // [10, 30): inside a
    const Tensor<float> overlapping = device(35, {10});  // [35, 45): overlaps a's end
    const Tensor<float> far = device(500, {3, 3});       // [500, 509): 2000 bytes in, 16 past 64
    const Tensor<float> host({5});
    const Tensor<float> tensors[] = {far, view, host, a, Tensor<float>(), overlapping, a};
    const auto plan = cuda::detail::plan_staging(tensors);
    REQUIRE(plan.blocks.size() == 2);
    CHECK(plan.blocks[0].begin == base);
    CHECK(plan.blocks[0].end == base + 45);
    CHECK(plan.blocks[0].offset == 0);
    CHECK(plan.blocks[1].begin == base + 500);
    CHECK(plan.blocks[1].floats() == 9);
    // Each staged address keeps its device address's offset from a 64-byte boundary.
    constexpr std::size_t align = LOADSTAR_TENSOR_ALIGNMENT / sizeof(float);
    CHECK(plan.blocks[1].offset == 48 + 4);
    CHECK(plan.floats == 48 + 16);
    for (const auto& t : {a, view, overlapping, far}) {
      const auto address = reinterpret_cast<std::uintptr_t>(t.data());
      CHECK(plan.offset_of(t.data()) % align ==
            address % LOADSTAR_TENSOR_ALIGNMENT / sizeof(float));
    }
    CHECK(plan.offset_of(a.data()) == 0);
    CHECK(plan.offset_of(view.data()) == 10);
    CHECK(plan.offset_of(overlapping.data()) == 35);
    CHECK(plan.offset_of(far.data() + 4) == 52 + 4);
    const Tensor<float> only_host[] = {host, Tensor<float>()};
    CHECK(cuda::detail::plan_staging(only_host).blocks.empty());
  }

  TEST_CASE("activate and activation_gradient compute the CPU backend's activations bit for bit") {
    CpuBackend cpu(1);
    const Tensor<float> x = activation_inputs();
    const Tensor<float> dy = random_tensor(x.shape(), 3, 2.0F);
    for (const Activation kind : all_activations) {
      CAPTURE(keras::activation_name(kind));
      Tensor<float> y(x.shape());
      cpu.activation_forward(kind, x, y);
      std::vector<float> mine(x.size());
      for (std::size_t i = 0; i < x.size(); ++i)
        mine[i] = kd::activate(kind, x.data()[i]);
      check_elements(y, mine);

      Tensor<float> dx(x.shape());
      cpu.activation_backward(kind, x, y, dy, dx);
      const bool needs_x = keras::activation_gradient_needs_input(kind);
      for (std::size_t i = 0; i < x.size(); ++i) {
        mine[i] =
            kd::activation_gradient(kind, needs_x ? x.data()[i] : 0.0F, y.data()[i], dy.data()[i]);
      }
      check_elements(dx, mine);
    }
  }

  TEST_CASE("relu_value and relu_gradient follow Keras's ReLU as the CPU backend does") {
    CpuBackend cpu(1);
    const Tensor<float> x = activation_inputs();
    const Tensor<float> dy = random_tensor(x.shape(), 4);
    struct Case {
      std::optional<float> max_value;
      float slope, threshold;
    };
    for (const Case& c :
         {Case{std::nullopt, 0.0F, 0.0F}, Case{6.0F, 0.0F, 0.0F}, Case{std::nullopt, 0.3F, 0.0F},
          Case{1.5F, 0.1F, 0.5F}, Case{0.0F, 0.2F, -1.0F}}) {
      CAPTURE(c.slope);
      CAPTURE(c.threshold);
      const float top = c.max_value.value_or(std::numeric_limits<float>::infinity());
      Tensor<float> y(x.shape()), dx(x.shape());
      cpu.relu_forward(x, y, c.max_value, c.slope, c.threshold);
      cpu.relu_backward(x, dy, dx, c.max_value, c.slope, c.threshold);
      std::vector<float> forward(x.size()), backward(x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        forward[i] = kd::relu_value(x.data()[i], top, c.slope, c.threshold);
        backward[i] = kd::relu_gradient(x.data()[i], dy.data()[i], top, c.slope, c.threshold);
      }
      check_elements(y, forward);
      check_elements(dx, backward);
    }
  }

  TEST_CASE("dropout_value draws the CPU backend's mask from the same counter hash") {
    CpuBackend cpu(1);
    const Tensor<float> x = random_tensor({50, 41}, 5);
    for (const float rate : {0.1F, 0.5F, 0.9F, 1.0F}) {
      for (const std::uint64_t key : {0ULL, 42ULL, 0xDEADBEEFCAFEULL}) {
        CAPTURE(rate);
        CAPTURE(key);
        Tensor<float> y(x.shape());
        cpu.dropout(x, y, rate, key);
        const float keep_scale = rate < 1.0F ? 1.0F / (1.0F - rate) : 0.0F;
        std::vector<float> mine(x.size());
        std::size_t dropped = 0;
        for (std::size_t i = 0; i < x.size(); ++i) {
          mine[i] = kd::dropout_value(x.data()[i], key, i, rate, keep_scale);
          dropped += kd::dropout_keeps(key, i, rate) ? 0 : 1;
        }
        check_elements(y, mine);
        // The mask is not trivial: about `rate` of the elements are dropped.
        CHECK(std::abs(double(dropped) / double(x.size()) - rate) < 0.05);
      }
    }
  }

  TEST_CASE("softmax lines give the CPU backend's softmax over every axis bit for bit") {
    CpuBackend cpu(1);
    const Tensor<float> x = random_tensor({4, 5, 6}, 6, 8.0F);
    const Tensor<float> dy = random_tensor({4, 5, 6}, 7);
    for (std::size_t axis = 0; axis < 3; ++axis) {
      CAPTURE(axis);
      Tensor<float> y(x.shape()), dx(x.shape());
      cpu.softmax_forward(x, y, axis);
      cpu.softmax_backward(y, dy, dx, axis);
      const auto v = keras::detail::axis_view(x.shape(), axis);
      Tensor<float> mine_y(x.shape()), mine_dx(x.shape());
      for (std::size_t line = 0; line < v.outer * v.inner; ++line) {
        kd::softmax_forward_line(x.data(), mine_y.data(), v.length, v.inner, line);
        kd::softmax_backward_line(y.data(), dy.data(), mine_dx.data(), v.length, v.inner, line);
      }
      check_elements(y, mine_y);
      check_elements(dx, mine_dx);
    }
  }

  TEST_CASE("column reductions in fixed chunks give the CPU backend's column sums") {
    CpuBackend cpu(1);
    CHECK(kd::reduction_chunks(0) == 1);
    CHECK(kd::reduction_chunks(512) == 1);
    CHECK(kd::reduction_chunks(513) == 9);  // 64 rows a chunk beyond one chunk of 512
    CHECK(kd::reduction_chunks(100000) == 1563);
    CHECK(kd::reduction_chunks(std::size_t{1} << 40U) <= 65535);
    CHECK(kd::reduction_scratch(1000, 7) == 16 * 7 + 2 * 7);
    // One chunk: the CPU backend's sequential double sum, bit for bit; several: within 1e-6.
    // (Clang 14 cannot capture a structured binding in CAPTURE's lambda.)
    for (const auto& sized :
         {std::pair<std::size_t, double>{300, 0.0}, std::pair<std::size_t, double>{5000, 1e-6},
          std::pair<std::size_t, double>{70000, 1e-6}}) {  // more chunks than lanes
      const std::size_t rows = sized.first;
      const double tolerance = sized.second;
      CAPTURE(rows);
      const Tensor<float> x = random_tensor({rows, 7}, 8, 3.0F);
      const auto sums = column_reduce(kd::ElementValue{x.data(), 7}, rows, 7);
      for (const float beta : {0.0F, 0.5F}) {
        Tensor<float> out = random_tensor({7}, 9);
        std::vector<float> mine(7);
        for (std::size_t j = 0; j < 7; ++j)
          mine[j] = kd::column_sum_value(sums[j], beta, beta == 0.0F ? 0.0F : out.data()[j]);
        cpu.column_sums(x, out, beta);
        check_elements(out, mine, tolerance);
      }
      // moments: the mean's sum, then the squared deviations from the double mean.
      Tensor<float> mean({7}), variance({7});
      cpu.moments(x, mean, variance);
      std::vector<double> mean_d(7);
      for (std::size_t j = 0; j < 7; ++j)
        mean_d[j] = sums[j] / static_cast<double>(rows);
      const auto squares = column_reduce(kd::SquaredDeviation{x.data(), mean_d.data(), 7}, rows, 7);
      std::vector<float> mine_mean(7), mine_variance(7);
      for (std::size_t j = 0; j < 7; ++j) {
        mine_mean[j] = static_cast<float>(mean_d[j]);
        mine_variance[j] = static_cast<float>(squares[j] / static_cast<double>(rows));
      }
      check_elements(mean, mine_mean, tolerance);
      check_elements(variance, mine_variance, tolerance);
    }
  }

  TEST_CASE("batch normalisation math gives the CPU backend's forward and backward") {
    CpuBackend cpu(1);
    const std::size_t rows = 40, c = 5;
    const float epsilon = 1e-3F;
    const Tensor<float> x = random_tensor({rows, c}, 10, 2.0F);
    const Tensor<float> dy = random_tensor({rows, c}, 11);
    Tensor<float> mean({c}), variance({c});
    cpu.moments(x, mean, variance);
    const Tensor<float> gamma = random_tensor({c}, 12);
    const Tensor<float> beta = random_tensor({c}, 13);
    for (const bool affine : {false, true}) {
      CAPTURE(affine);
      const Tensor<float> g = affine ? gamma : Tensor<float>();
      const Tensor<float> b = affine ? beta : Tensor<float>();
      Tensor<float> y({rows, c});
      cpu.batch_norm_forward(x, mean, variance, g, b, epsilon, y);
      std::vector<float> mine(rows * c);
      for (std::size_t i = 0; i < rows * c; ++i) {
        const std::size_t j = i % c;
        mine[i] =
            kd::batch_norm_value(x.data()[i], mean.data()[j], variance.data()[j],
                                 affine ? g.data()[j] : 1.0F, affine ? b.data()[j] : 0.0F, epsilon);
      }
      check_elements(y, mine);
      for (const bool training : {false, true}) {
        CAPTURE(training);
        Tensor<float> dx({rows, c}), dgamma = random_tensor({c}, 14),
                                     dbeta = random_tensor({c}, 15);
        Tensor<float> mine_dgamma = dgamma.clone(), mine_dbeta = dbeta.clone();
        cpu.batch_norm_backward(x, mean, variance, g, epsilon, training, dy, dx, dgamma, dbeta);
        const auto sum_dy = column_reduce(kd::ElementValue{dy.data(), c}, rows, c);
        const auto sum_dy_xhat = column_reduce(
            kd::DyXhat{x.data(), mean.data(), variance.data(), dy.data(), epsilon, c}, rows, c);
        for (std::size_t j = 0; j < c; ++j) {
          mine_dbeta.data()[j] += static_cast<float>(sum_dy[j]);
          mine_dgamma.data()[j] += static_cast<float>(sum_dy_xhat[j]);
        }
        for (std::size_t i = 0; i < rows * c; ++i) {
          const std::size_t j = i % c;
          mine[i] = kd::batch_norm_gradient(
              x.data()[i], mean.data()[j], variance.data()[j], affine ? g.data()[j] : 1.0, epsilon,
              training, dy.data()[i], sum_dy[j], sum_dy_xhat[j], static_cast<double>(rows));
        }
        check_elements(dx, mine);
        check_elements(dgamma, mine_dgamma);
        check_elements(dbeta, mine_dbeta);
      }
    }
    Tensor<float> moving = random_tensor({c}, 16);
    std::vector<float> mine(c);
    for (std::size_t j = 0; j < c; ++j)
      mine[j] = kd::moving_average_value(moving.data()[j], mean.data()[j], 0.99F);
    cpu.moving_average(moving, mean, 0.99F);
    check_elements(moving, mine);
  }

  TEST_CASE("Divisor<uint32_t> divides every index below 2^31 as the division operator does") {
    std::vector<std::uint32_t> divisors;
    for (std::uint32_t d = 1; d <= 1100; ++d)
      divisors.push_back(d);
    for (const std::uint32_t d :
         {4095U, 4096U, 4097U, 65535U, 65536U, 65537U, 1000003U, (1U << 30) - 1, 1U << 30,
          (1U << 30) + 1, (1U << 31) - 1, 1U << 31})
      divisors.push_back(d);
    std::uint64_t seed = 5;
    for (const std::uint32_t d : divisors) {
      CAPTURE(d);
      const kd::Divisor<std::uint32_t> divisor(d);
      std::vector<std::uint32_t> numerators = {0, 1, d - 1, d, (1U << 31) - 1, (1U << 31) - 2};
      if (d < (1U << 31)) numerators.push_back(d + 1);
      for (std::uint32_t k = 1; k < 64 && std::uint64_t{d} * k < (1U << 31); ++k) {
        numerators.push_back(d * k - 1);
        numerators.push_back(d * k);
      }
      for (int k = 0; k < 200; ++k) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        numerators.push_back(static_cast<std::uint32_t>(seed >> 33));  // below 2^31
      }
      for (const std::uint32_t n : numerators) {
        if (divisor.quotient(n) != n / d) {
          CAPTURE(n);
          CHECK(divisor.quotient(n) == n / d);
        }
      }
    }
    // Every numerator for small divisors, up to 2^20.
    for (std::uint32_t d = 1; d <= 40; ++d) {
      const kd::Divisor<std::uint32_t> divisor(d);
      std::uint32_t wrong = 0;
      for (std::uint32_t n = 0; n < (1U << 20); ++n)
        wrong += divisor.quotient(n) != n / d ? 1U : 0U;
      CHECK(wrong == 0);
    }
    CHECK(kd::fits_32bit_index((std::size_t{1} << 31) - 1));
    CHECK_FALSE(kd::fits_32bit_index(std::size_t{1} << 31));
    keras::Conv2DGeometry huge;  // 2^32 input elements: the 64-bit fallback
    huge.batch = std::size_t{1} << 20;
    huge.in_h = huge.in_w = huge.out_h = huge.out_w = 64;
    huge.in_c = 1;
    CHECK_FALSE(kd::conv_fits_32bit(huge));
    huge.batch = 8;
    CHECK(kd::conv_fits_32bit(huge));
  }

  TEST_CASE("im2col_value and col2im_value unfold and fold as the CPU backend does") {
    CpuBackend cpu(1);
    struct Case {
      std::size_t in_h, in_w, in_c, kh, kw, sh, sw, dilation;
      bool same;
    };
    for (const Case& c : {Case{8, 8, 1, 3, 3, 1, 1, 1, false}, Case{7, 9, 3, 3, 3, 1, 1, 1, true},
                          Case{9, 8, 2, 3, 3, 2, 2, 1, true}, Case{11, 10, 2, 3, 3, 1, 1, 2, true},
                          Case{10, 9, 2, 5, 3, 2, 1, 1, true}, Case{6, 6, 4, 1, 1, 1, 1, 1, false},
                          Case{12, 7, 1, 4, 2, 3, 2, 2, false}}) {
      CAPTURE(c.in_h);
      CAPTURE(c.kh);
      CAPTURE(c.sh);
      CAPTURE(c.dilation);
      CAPTURE(c.same);
      // 9 images: several chunks of rows for the weight gradients, starting inside an image.
      const auto g =
          conv_geometry(9, c.in_h, c.in_w, c.in_c, c.kh, c.kw, c.sh, c.sw, c.dilation, c.same);
      REQUIRE(g.out_h > 0);
      const keras::Conv2DGeometry& d = g;
      REQUIRE(kd::conv_fits_32bit(d));
      const Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 17);
      Tensor<float> columns({g.batch * g.out_h * g.out_w, g.patch_size()});
      cpu.im2col(x, g, columns);
      const Tensor<float> dcolumns = random_tensor(columns.shape(), 18);
      Tensor<float> dx(x.shape(), 7.0F);  // col2im overwrites
      cpu.col2im(dcolumns, g, dx);
      // The weight gradients of 4 filters: the unfolded columns' product and dz's column sums.
      const std::size_t rows = columns.rows(), filters = 4;
      const Tensor<float> dz = random_tensor({rows, filters}, 19);
      Tensor<float> dkernel({g.patch_size(), filters}), dbias({filters});
      cpu.gemm(columns, true, dz, false, dkernel, 1.0F, 0.0F);
      cpu.column_sums(dz, dbias, 0.0F);
      const std::size_t terms = (g.patch_size() + 1) * filters, chunks = kd::reduction_chunks(rows);
      // Both index widths: 32 bits (division by multiplication) and the 64-bit fallback.
      const auto check = [&](const auto& index) {
        using Index = typename std::decay_t<decltype(index)>::index_type;
        std::vector<float> mine(columns.size());
        for (std::size_t i = 0; i < mine.size(); ++i)
          mine[i] = kd::im2col_value(x.data(), index, Index(i));
        check_elements(columns, mine);
        std::vector<float> folded(dx.size());
        for (std::size_t i = 0; i < folded.size(); ++i)
          folded[i] = kd::col2im_value(dcolumns.data(), index, Index(i));
        check_elements(dx, folded);
        // The weight gradients as one column reduction, a column at a time and four at a time:
        // the same bits, and the CPU's product within float tolerance.
        std::vector<double> one(chunks * terms), four(chunks * terms);
        for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
          for (std::size_t j = 0; j < terms; ++j)
            kd::conv_weight_partials<1>(x.data(), index, dz.data(), rows, filters, chunk, j,
                                        &one[chunk * terms + j]);
          for (std::size_t j = 0; j < terms; j += 4)
            kd::conv_weight_partials<4>(x.data(), index, dz.data(), rows, filters, chunk, j,
                                        &four[chunk * terms + j]);
        }
        CHECK(one == four);
        std::vector<float> gradients(terms, 5.0F);
        const kd::ConvWeightFinish finish{gradients.data(), gradients.data() + dkernel.size(),
                                          dkernel.size(), false};
        for (std::size_t j = 0; j < terms; ++j)
          finish(j, kd::column_total(one.data(), chunks, terms, j));
        check_elements(dkernel, std::span<const float>(gradients).first(dkernel.size()), 1e-5);
        check_elements(dbias, std::span<const float>(gradients).subspan(dkernel.size()), 1e-5);
      };
      check(kd::ConvIndex<std::uint32_t>(d));
      check(kd::ConvIndex<std::size_t>(d));
    }
  }

  TEST_CASE("pooling values and gradients follow the CPU backend's windows bit for bit") {
    CpuBackend cpu(1);
    struct Case {
      std::size_t in_h, in_w, pool, stride;
      bool same;
    };
    for (const Case& c :
         {Case{8, 8, 2, 2, false}, Case{7, 7, 2, 2, false}, Case{7, 7, 2, 2, true},
          Case{6, 5, 3, 1, true}, Case{9, 8, 3, 2, true}, Case{5, 5, 2, 1, false},
          Case{4, 6, 3, 3, true}, Case{9, 9, 3, 3, false}, Case{8, 7, 2, 3, true}}) {
      CAPTURE(c.in_h);
      CAPTURE(c.pool);
      CAPTURE(c.stride);
      CAPTURE(c.same);
      const auto g = pool_geometry(2, c.in_h, c.in_w, 3, c.pool, c.stride, c.same);
      const keras::Pool2DGeometry& d = g;
      REQUIRE(kd::pool_fits_32bit(d));
      const kd::PoolIndex<std::uint32_t> narrow(d);
      const kd::PoolIndex<std::size_t> wide(d);
      // Values on a coarse grid, so that windows hold ties and the first maximum matters.
      Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.channels}, 19);
      for (float& v : x)
        v = std::round(v * 3.0F);
      const Tensor<float> dy = random_tensor({g.batch, g.out_h, g.out_w, g.channels}, 20);
      for (const bool max : {true, false}) {
        CAPTURE(max);
        Tensor<float> y(dy.shape()), dx(x.shape(), 5.0F);
        if (max) {
          cpu.max_pool_forward(x, g, y);
          cpu.max_pool_backward(x, g, dy, dx);
        } else {
          cpu.avg_pool_forward(x, g, y);
          cpu.avg_pool_backward(g, dy, dx);
        }
        std::vector<float> forward(y.size()), backward(dx.size());
        std::vector<float> wide_forward(y.size()), wide_backward(dx.size());
        for (std::size_t i = 0; i < forward.size(); ++i) {
          forward[i] = kd::pool_forward_value(x.data(), narrow, max, std::uint32_t(i));
          wide_forward[i] = kd::pool_forward_value(x.data(), wide, max, i);
        }
        const float* input = max ? x.data() : nullptr;
        for (std::size_t i = 0; i < backward.size(); ++i) {
          backward[i] = kd::pool_backward_value(input, narrow, dy.data(), max, std::uint32_t(i));
          wide_backward[i] = kd::pool_backward_value(input, wide, dy.data(), max, i);
        }
        check_elements(y, forward);
        check_elements(dx, backward);
        check_elements(y, wide_forward);
        check_elements(dx, wide_backward);
        if (max && kd::pool_windows_disjoint(d)) {
          // Window by window, over NaNs: a fill of zeros first unless the windows tile the input.
          std::vector<float> scattered(dx.size(), std::numeric_limits<float>::quiet_NaN());
          if (!kd::pool_windows_tile(d)) std::fill(scattered.begin(), scattered.end(), 0.0F);
          for (std::uint32_t i = 0; i < y.size(); ++i)
            kd::max_pool_window_gradient(x.data(), narrow, dy.data(), scattered.data(), false, i);
          check_elements(dx, scattered);
          // Carried on through the ReLU whose output x is: the CPU's ReLU gradient of dx.
          Tensor<float> relu_dx(x.shape());
          cpu.activation_backward(Activation::relu, Tensor<float>(), x, dx, relu_dx);
          std::vector<float> relu_scattered(dx.size(), 0.0F);
          for (std::uint32_t i = 0; i < y.size(); ++i)
            kd::max_pool_window_gradient(x.data(), narrow, dy.data(), relu_scattered.data(), true,
                                         i);
          check_elements(relu_dx, relu_scattered);
        }
      }
    }
  }

  TEST_CASE("global pooling lines give the CPU backend's global pooling") {
    CpuBackend cpu(1);
    Tensor<float> x = random_tensor({3, 4, 5, 6}, 21);
    for (float& v : x)
      v = std::round(v * 2.0F);  // ties: the first maximum takes the gradient
    const Tensor<float> dy = random_tensor({3, 6}, 22);
    for (const bool max : {true, false}) {
      CAPTURE(max);
      Tensor<float> y({3, 6}), dx(x.shape(), 9.0F);
      cpu.global_pool_forward(x, max, y);
      cpu.global_pool_backward(x, max, dy, dx);
      std::vector<float> forward(y.size());
      Tensor<float> backward(x.shape(), 9.0F);
      for (std::size_t i = 0; i < 3 * 6; ++i) {
        forward[i] = kd::global_pool_forward_value(x.data(), max, 20, 6, i);
        kd::global_pool_backward_line(x.data(), max, dy.data(), backward.data(), 20, 6, i);
      }
      check_elements(y, forward);
      check_elements(dx, backward);
    }
  }

  TEST_CASE("gather_value index_in_range and scatter_add_column index as the CPU backend does") {
    CpuBackend cpu(1);
    const Tensor<float> table = random_tensor({5, 3}, 23);
    const Tensor<float> indices({6}, {0.0F, 4.0F, 1.9F, -0.5F, 4.99F, 4.0F});
    Tensor<float> out({6, 3});
    CHECK_FALSE(cpu.gather(indices, table, out).has_value());
    std::vector<float> mine(out.size());
    for (std::size_t i = 0; i < mine.size(); ++i)
      mine[i] = kd::gather_value(indices.data(), table.data(), 5, 3, i);
    check_elements(out, mine);

    // The first bad index, as the device finds it (the smallest position that is out of range).
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (const auto& bad : {std::vector<float>{0, 1, 5, 7}, std::vector<float>{0, -1, 2, 9},
                            std::vector<float>{nan, 1, 2, 3}, std::vector<float>{0, 1, 2, 4}}) {
      const Tensor<float> i({4}, std::span<const float>(bad));
      Tensor<float> o({4, 3});
      const auto expected = cpu.gather(i, table, o);
      std::optional<std::size_t> first;
      for (std::size_t p = 0; p < 4 && !first; ++p)
        if (!kd::index_in_range(bad[p], 5)) first = p;
      REQUIRE(expected.has_value() == first.has_value());
      if (first) CHECK(expected->position == *first);
    }

    // The value of the first bad index, recorded after its position as the device records it;
    // a bad index gathers zeros.
    double record[3] = {0.0, 0.0, 0.0};
    const unsigned long long position = 3;
    std::memcpy(&record[1], &position, sizeof position);
    kd::record_bad_index(indices.data(), record);
    CHECK(record[2] == -0.5);
    const float outside[] = {1.0F, 5.0F};
    CHECK(kd::gather_value(outside, table.data(), 5, 3, 3 + 1) == 0.0F);
    CHECK(kd::gather_value(outside, table.data(), 5, 3, 1) == table.data()[3 + 1]);

    const Tensor<float> dy = random_tensor({6, 3}, 24);
    Tensor<float> gradient = random_tensor({5, 3}, 25);
    Tensor<float> mine_gradient = gradient.clone();
    cpu.scatter_add(indices, dy, gradient);
    for (std::size_t c = 0; c < 3; ++c)
      kd::scatter_add_column(indices.data(), 6, dy.data(), 5, 3, mine_gradient.data(), c);
    check_elements(gradient, mine_gradient);
  }

  TEST_CASE("permute_offset reads the element the CPU backend's permute moves") {
    CpuBackend cpu(1);
    struct Case {
      Shape shape;
      std::vector<std::size_t> axes;
    };
    for (const auto& c :
         {Case{{2, 3, 4, 5}, {0, 2, 3, 1}}, Case{{2, 3, 4, 5}, {3, 2, 1, 0}}, Case{{6, 7}, {1, 0}},
          Case{{3, 1, 4}, {0, 2, 1}}, Case{{2, 2, 2, 2, 2, 3}, {5, 0, 4, 1, 3, 2}}}) {
      CAPTURE(c.shape.str());
      const Tensor<float> x = random_tensor(c.shape, 26);
      std::vector<std::size_t> dims(c.axes.size());
      for (std::size_t i = 0; i < dims.size(); ++i)
        dims[i] = c.shape[c.axes[i]];
      const Shape y_shape(dims);
      Tensor<float> y(y_shape);
      cpu.permute(x, c.axes, y);
      const kd::PermuteDims d = kd::permute_dims(x.shape(), c.axes, y_shape);
      std::vector<float> mine(y.size());
      for (std::size_t i = 0; i < mine.size(); ++i)
        mine[i] = x.data()[kd::permute_offset(d, i)];
      check_elements(y, mine);
    }
  }
}

// --- Optimizer steps, losses and metrics -----------------------------------------------------

namespace {

/// An optimizer whose `device_step` (what a device backend is handed) the test can call.
template <class O>
struct StepProbe : O {
  using O::device_step;
  using O::O;
};

/// What `OptimizerBase::apply_gradients` adds to the step: the clipping of the options.
template <class Options>
void fill_clipping(const Options& options, keras::OptimizerStep& step) {
  if (options.clipnorm && *options.clipnorm > 0) {
    step.clipping = keras::GradientClipping::by_norm;
    step.clip_threshold = *options.clipnorm;
  } else if (options.global_clipnorm && *options.global_clipnorm > 0) {
    step.clipping = keras::GradientClipping::by_global_norm;
    step.clip_threshold = *options.global_clipnorm;
  } else if (options.clipvalue && *options.clipvalue > 0) {
    step.clipping = keras::GradientClipping::by_value;
    step.clip_threshold = *options.clipvalue;
  }
}

/// The variables' sizes: one spans two norm segments, one is a single element.
constexpr std::size_t probe_sizes[] = {5, kd::norm_segment + 276, 1, 7};

/// Trains the variables of `probe_sizes` for three steps with `cpu` (the host optimizer, its
/// `apply_gradients`) and with the per-thread functions of the fused kernels given `probe`'s
/// `device_step` (`update_flat` over every element, `segment_squares` and `clip_scales` for norm
/// clipping), then compares values and slots: bitwise where `tolerance` is 0.
template <class O, class Options>
void check_fused_step(const Options& options, float slot_initial, double tolerance) {
  O cpu(options);
  StepProbe<O> probe(options);
  std::vector<keras::Variable> variables;
  std::vector<std::vector<float>> values_e;
  for (std::size_t v = 0; v < std::size(probe_sizes); ++v) {
    const auto value = random_tensor({probe_sizes[v]}, 100 + v);
    variables.push_back({"w" + std::to_string(v), value.clone(), Tensor<float>({probe_sizes[v]})});
    values_e.emplace_back(value.span().begin(), value.span().end());
  }
  std::vector<keras::Variable*> pointers;
  for (auto& v : variables)
    pointers.push_back(&v);
  std::vector<std::vector<std::vector<float>>> slots_e(std::size(probe_sizes));
  std::size_t slots_per_variable = 0;
  for (int step = 0; step < 3; ++step) {
    for (std::size_t v = 0; v < variables.size(); ++v) {
      const auto g = random_tensor({probe_sizes[v]}, 1000 + 10 * step + v, 3.0F);
      std::memcpy(variables[v].gradient.data(), g.data(), g.bytes());
    }
    // The fused step first, from the gradients the CPU step is about to use.
    probe.set_iterations(step);
    std::optional<keras::OptimizerStep> s =
        probe.device_step(static_cast<float>(probe.learning_rate()));
    REQUIRE(s.has_value());
    fill_clipping(options, *s);
    const kd::UpdateParams params = kd::update_params(*s);
    if (step == 0) {
      cpu.build(pointers);
      slots_per_variable = cpu.variables().size() / variables.size();
      for (std::size_t v = 0; v < variables.size(); ++v)
        for (std::size_t k = 0; k < slots_per_variable; ++k)
          slots_e[v].emplace_back(probe_sizes[v], slot_initial);
    }
    std::vector<kd::UpdateTarget> table;
    std::size_t elements = 0, segments = 0;
    for (std::size_t v = 0; v < variables.size(); ++v) {
      kd::UpdateTarget t;
      t.value = values_e[v].data();
      t.gradient = variables[v].gradient.data();
      for (std::size_t k = 0; k < slots_per_variable; ++k)
        t.slots[k] = slots_e[v][k].data();
      t.size = probe_sizes[v];
      t.begin = elements;
      t.segment_begin = segments;
      elements += t.size;
      segments += kd::norm_segments(t.size);
      table.push_back(t);
    }
    std::vector<float> scales(table.size(), 1.0F);
    const bool by_norm = s->clipping == keras::GradientClipping::by_norm ||
                         s->clipping == keras::GradientClipping::by_global_norm;
    if (by_norm) {
      std::vector<double> partials(segments);
      for (std::size_t i = 0; i < segments; ++i)
        partials[i] = kd::segment_squares(table.data(), table.size(), i);
      kd::clip_scales(table.data(), table.size(), partials.data(),
                      s->clipping == keras::GradientClipping::by_global_norm, s->clip_threshold,
                      scales.data());
    }
    for (std::size_t i = 0; i < elements; ++i)
      kd::update_flat(table.data(), table.size(), params, by_norm ? scales.data() : nullptr, i);
    cpu.apply_gradients(pointers);
  }
  for (std::size_t v = 0; v < variables.size(); ++v) {
    CAPTURE(v);
    check_elements(variables[v].value, values_e[v], tolerance);
    for (std::size_t k = 0; k < slots_per_variable; ++k) {
      CAPTURE(k);
      check_elements(cpu.variables()[v * slots_per_variable + k].value, slots_e[v][k], tolerance);
    }
  }
}

}  // namespace

TEST_SUITE("cuda") {
  // Within 2e-6 relative (about 16 float ulps): the same formula, rounded differently. GCC
  // contracts `a * b + c` into fused multiply-adds where the target has them (its default for
  // C++, -march=native here), in Eigen's vectorised CPU step and in these host calls alike but
  // not always at the same places; Eigen may vectorise RMSprop's and Adagrad's `rsqrt` as an
  // approximation refined by a Newton step; and it sums a gradient's squared norm in another
  // order than the segments (the clipping scale may differ in its last bit). The kernels round
  // every operation (`mul_rn`, `add_rn`), so the device's results do not depend on contraction.
  constexpr double rounding = 2e-6;

  TEST_CASE("update_element applies each optimizer's update_step") {
    namespace o = keras::optimizers;
    SUBCASE("SGD") {
      check_fused_step<o::SGD>(o::SGDOptions{.learning_rate = 0.1}, 0.0F, rounding);
    }
    SUBCASE("SGD with momentum") {
      check_fused_step<o::SGD>(o::SGDOptions{.learning_rate = 0.1, .momentum = 0.9}, 0.0F,
                               rounding);
    }
    SUBCASE("SGD with Nesterov momentum") {
      check_fused_step<o::SGD>(
          o::SGDOptions{.learning_rate = 0.1, .momentum = 0.8, .nesterov = true}, 0.0F, rounding);
    }
    SUBCASE("Adam") {
      check_fused_step<o::Adam>(o::AdamOptions{.learning_rate = 0.01}, 0.0F, rounding);
    }
    SUBCASE("Adam with amsgrad") {
      check_fused_step<o::Adam>(o::AdamOptions{.learning_rate = 0.01, .amsgrad = true}, 0.0F,
                                rounding);
    }
    SUBCASE("AdamW") {
      check_fused_step<o::AdamW>(o::AdamWOptions{.learning_rate = 0.01, .weight_decay = 0.05}, 0.0F,
                                 rounding);
    }
    SUBCASE("RMSprop") {
      check_fused_step<o::RMSprop>(o::RMSpropOptions{.learning_rate = 0.01}, 0.0F, rounding);
    }
    SUBCASE("RMSprop with momentum and centered") {
      check_fused_step<o::RMSprop>(
          o::RMSpropOptions{.learning_rate = 0.01, .momentum = 0.5, .centered = true}, 0.0F,
          rounding);
    }
    SUBCASE("RMSprop centered") {
      check_fused_step<o::RMSprop>(o::RMSpropOptions{.learning_rate = 0.01, .centered = true}, 0.0F,
                                   rounding);
    }
    SUBCASE("Adagrad") {
      check_fused_step<o::Adagrad>(o::AdagradOptions{.learning_rate = 0.1}, 0.1F, rounding);
    }
    SUBCASE("Adadelta") {
      check_fused_step<o::Adadelta>(o::AdadeltaOptions{.learning_rate = 1.0}, 0.0F, rounding);
    }
  }

  TEST_CASE("update_flat clips gradients by value by norm and by global norm as the CPU does") {
    namespace o = keras::optimizers;
    SUBCASE("clipvalue") {
      check_fused_step<o::Adam>(o::AdamOptions{.learning_rate = 0.01, .clipvalue = 0.5}, 0.0F,
                                rounding);
    }
    SUBCASE("clipnorm") {
      check_fused_step<o::SGD>(
          o::SGDOptions{.learning_rate = 0.1, .momentum = 0.9, .clipnorm = 1.0}, 0.0F, rounding);
    }
    SUBCASE("global_clipnorm") {
      check_fused_step<o::Adam>(o::AdamOptions{.learning_rate = 0.01, .global_clipnorm = 2.0}, 0.0F,
                                rounding);
    }
  }

  TEST_CASE("row_loss_term gives each loss's value and gradient bit for bit") {
    struct Case {
      const char* name;
      std::shared_ptr<keras::Loss> loss;
      keras::RowLossSpec spec;
      bool sparse;
      bool probabilities;
    };
    using keras::RowLossKind;
    namespace l = keras::losses;
    const Case cases[] = {
        {"sparse from logits",
         std::make_shared<l::SparseCategoricalCrossentropy>(true),
         {RowLossKind::sparse_categorical_crossentropy, true},
         true,
         false},
        {"sparse from probabilities",
         std::make_shared<l::SparseCategoricalCrossentropy>(false),
         {RowLossKind::sparse_categorical_crossentropy, false},
         true,
         true},
        {"categorical from logits smoothed",
         std::make_shared<l::CategoricalCrossentropy>(true, 0.1),
         {RowLossKind::categorical_crossentropy, true, 0.1},
         false,
         false},
        {"categorical from probabilities",
         std::make_shared<l::CategoricalCrossentropy>(false),
         {RowLossKind::categorical_crossentropy, false},
         false,
         true},
        {"mean squared error",
         std::make_shared<l::MeanSquaredError>(),
         {RowLossKind::mean_squared_error},
         false,
         false},
        {"mean squared error summed",
         std::make_shared<l::MeanSquaredError>(keras::Reduction::sum),
         {RowLossKind::mean_squared_error},
         false,
         false},
        {"binary from logits",
         std::make_shared<l::BinaryCrossentropy>(true, 0.1),
         {RowLossKind::binary_crossentropy, true, 0.1},
         false,
         false},
        {"binary from probabilities",
         std::make_shared<l::BinaryCrossentropy>(),
         {RowLossKind::binary_crossentropy},
         false,
         true},
        {"mean absolute error",
         std::make_shared<l::MeanAbsoluteError>(),
         {RowLossKind::mean_absolute_error},
         false,
         false},
        {"huber",
         std::make_shared<l::Huber>(0.5),
         {RowLossKind::huber, false, 0.0, 0.5},
         false,
         false},
        {"kl divergence",
         std::make_shared<l::KLDivergence>(),
         {RowLossKind::kl_divergence},
         false,
         true},
    };
    constexpr std::size_t rows = 37, classes = 6;
    for (const auto& c : cases) {
      for (const bool weighted : {false, true}) {
        const std::string name = c.name;
        CAPTURE(name);
        CAPTURE(weighted);
        Tensor<float> y_pred = random_tensor({rows, classes}, 5, 4.0F);
        if (c.probabilities) {
          CpuBackend cpu(1);
          cpu.softmax_forward(y_pred, y_pred, 1);
          y_pred.data()[3] = 0.0F;  // clipped by epsilon: no gradient there
        }
        Tensor<float> y_true = c.sparse ? Tensor<float>({rows}) : Tensor<float>({rows, classes});
        for (std::size_t r = 0; r < rows; ++r) {
          const std::size_t label = (r * 7 + 3) % classes;
          if (c.sparse) {
            y_true.data()[r] = static_cast<float>(label);
          } else if (c.spec.kind == RowLossKind::mean_squared_error ||
                     c.spec.kind == RowLossKind::mean_absolute_error ||
                     c.spec.kind == RowLossKind::huber) {
            for (std::size_t k = 0; k < classes; ++k)
              y_true.data()[r * classes + k] = values(1, r * classes + k)[0];
          } else {
            y_true.data()[r * classes + label] = 1.0F;
          }
        }
        Tensor<float> weight = random_tensor({rows}, 9);
        for (auto& w : weight.span())
          w = std::abs(w);
        Tensor<float> gradient({rows, classes});
        const float expected =
            c.loss->compute(y_true, y_pred, weighted ? &weight : nullptr, gradient);

        kd::RowLossParams p = {c.spec.kind, c.spec.from_logits, c.spec.label_smoothing,
                               c.loss->reduction() == keras::Reduction::sum ? 1.0 : double(rows)};
        p.delta = c.spec.delta;
        const kd::RowDims d{rows, classes, c.sparse ? std::size_t{1} : classes, 1};
        std::vector<double> terms(rows);
        std::vector<float> g(rows * classes);
        for (std::size_t j = 0; j < rows; ++j) {
          terms[j] = kd::row_loss_term(p, d, y_true.data(), y_pred.data(),
                                       weighted ? weight.data() : nullptr, g.data(), j);
        }
        const double total = column_reduce(kd::DoubleElementValue{terms.data(), 1}, rows, 1)[0];
        CHECK(same_bits(expected, static_cast<float>(total / p.denominator)));
        check_elements(gradient, g);
      }
    }
  }

  TEST_CASE("row_loss_term flags a sparse label out of range") {
    const kd::RowDims d{2, 3, 1, 1};
    const float y_true[] = {1.0F, 3.0F};
    const float y_pred[6] = {};
    CHECK(kd::label_in_range(y_true[0], 3));
    CHECK_FALSE(kd::label_in_range(y_true[1], 3));
    CHECK_FALSE(kd::label_in_range(-0.5F, 3));
    CHECK_FALSE(kd::label_in_range(std::numeric_limits<float>::quiet_NaN(), 3));
    const kd::RowLossParams p{keras::RowLossKind::sparse_categorical_crossentropy, true, 0.0, 2.0};
    CHECK(kd::row_loss_term(p, d, y_true, y_pred, nullptr, nullptr, 1) == 0.0);
  }

  TEST_CASE("metric_terms give each accuracy's and Mean's running mean") {
    constexpr std::size_t rows = 29, classes = 4;
    Tensor<float> y_pred = random_tensor({rows, classes}, 21);
    Tensor<float> one_hot({rows, classes}), sparse({rows}), binary({rows, classes});
    for (std::size_t r = 0; r < rows; ++r) {
      const std::size_t label = (r * 5 + 1) % classes;
      one_hot.data()[r * classes + label] = 1.0F;
      sparse.data()[r] = static_cast<float>(label);
      for (std::size_t k = 0; k < classes; ++k)
        binary.data()[r * classes + k] = (r + k) % 3 == 0 ? 1.0F : 0.0F;
    }
    Tensor<float> exact = y_pred.clone();  // `Accuracy` compares values: some equal
    for (std::size_t i = 0; i < exact.size(); i += 3)
      exact.data()[i] = binary.data()[i];
    Tensor<float> weight = random_tensor({rows}, 23);
    for (auto& w : weight.span())
      w = std::abs(w);
    using keras::MeanMetricKind;
    namespace m = keras::metrics;
    struct Case {
      const char* name;
      std::shared_ptr<keras::Metric> metric;
      MeanMetricKind kind;
      double threshold;
      const Tensor<float>* y_true;
      const Tensor<float>* y_pred;
    };
    const Case cases[] = {
        {"accuracy", std::make_shared<m::Accuracy>(), MeanMetricKind::accuracy, 0.5, &binary,
         &exact},
        {"binary_accuracy", std::make_shared<m::BinaryAccuracy>("b", 0.1),
         MeanMetricKind::binary_accuracy, 0.1, &binary, &y_pred},
        {"categorical_accuracy", std::make_shared<m::CategoricalAccuracy>(),
         MeanMetricKind::categorical_accuracy, 0.5, &one_hot, &y_pred},
        {"sparse_categorical_accuracy", std::make_shared<m::SparseCategoricalAccuracy>(),
         MeanMetricKind::sparse_categorical_accuracy, 0.5, &sparse, &y_pred},
        {"mean", std::make_shared<m::Mean>(), MeanMetricKind::mean, 0.5, &sparse, &y_pred},
        {"mean_squared_error", std::make_shared<m::MeanSquaredError>(),
         MeanMetricKind::mean_squared_error, 0.5, &one_hot, &y_pred},
        {"mean_absolute_error", std::make_shared<m::MeanAbsoluteError>(),
         MeanMetricKind::mean_absolute_error, 0.5, &one_hot, &y_pred},
    };
    for (const auto& c : cases) {
      for (const bool weighted : {false, true}) {
        const std::string name = c.name;
        CAPTURE(name);
        CAPTURE(weighted);
        c.metric->reset_state();
        c.metric->update_state(*c.y_true, *c.y_pred, weighted ? &weight : nullptr);
        const bool elementwise =
            c.kind == MeanMetricKind::accuracy || c.kind == MeanMetricKind::mean;
        kd::RowDims d;
        d.classes = elementwise ? 1 : classes;
        d.values = c.y_pred->size() / d.classes;
        d.true_size = c.kind == MeanMetricKind::sparse_categorical_accuracy ? 1 : d.classes;
        d.per_row = d.values / rows;
        std::vector<double> terms(2 * d.values);
        for (std::size_t j = 0; j < d.values; ++j) {
          kd::metric_terms(c.kind, c.threshold, d,
                           c.kind == MeanMetricKind::mean ? nullptr : c.y_true->data(),
                           c.y_pred->data(), weighted ? weight.data() : nullptr, terms.data(), j);
        }
        const auto sums = column_reduce(kd::DoubleElementValue{terms.data(), 2}, d.values, 2);
        // The CPU adds value * weight to its running total one row at a time, the kernel sums
        // the batch first: the same terms, associated differently (exact for 0/1 values and unit
        // weights).
        const double result = sums[0] / sums[1];
        if (weighted || c.kind == MeanMetricKind::mean ||
            c.kind == MeanMetricKind::mean_squared_error ||
            c.kind == MeanMetricKind::mean_absolute_error) {
          CHECK(std::abs(result - c.metric->result()) <= 1e-12 * std::abs(c.metric->result()));
        } else {
          CHECK(result == c.metric->result());
        }
        CHECK(result > 0.0);
      }
    }
  }
}
