// The CUDA backend on a GPU (skipped without one, see gpu_main.cpp; test_cuda_emulated runs the
// same cases on the host emulation of emulated_cuda.cpp): every Backend kernel against
// the CPU backend on random inputs, Dense and Conv2D models forward and backward, training steps
// of an MLP against the CPU, bitwise repeatability of two runs, and the memory pool that stops
// growing after the first batch. Tolerances: kernels that only move or select values, and those
// that follow the CPU backend's order of float operations, are compared bit for bit; GEMM and the
// device's transcendental functions within the stated relative tolerance.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iomanip>
#include <limits>
#include <loadstar/cuda.hpp>
#include <loadstar/cuda/detail/context.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keras/layer_cases.hpp"
#include "keras/unknown_axes_cases.hpp"
#include "keras/unknown_spatial_cases.hpp"
#include "random_tensor.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using loadstar::cuda::CudaBackend;

#if defined(LOADSTAR_CUDA_EMULATED)
namespace loadstar::test {
extern bool fail_next_stream;                     // emulated_cuda.cpp
extern std::size_t stream_syncs;                  // emulated_cuda.cpp
extern std::vector<std::size_t> event_wait_lags;  // emulated_cuda.cpp
extern std::size_t lt_matmuls;                    // emulated_cuda.cpp
extern std::size_t lt_half_matmuls;               // emulated_cuda.cpp, fp16 or bf16 A and B
extern std::map<int, std::size_t> lt_epilogues;   // emulated_cuda.cpp, by cublasLtEpilogue_t
extern std::size_t relu_pool_gradients;           // emulated_cuda.cpp
extern std::size_t conv_weight_reductions;        // emulated_cuda.cpp
}  // namespace loadstar::test
#endif

namespace {

using test_support::random_tensor;
using test_support::values;

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

/// `|a - e| <= tolerance * max(1, |e|)` element by element (bitwise for tolerance 0), reporting
/// the first mismatch's index, value and target.
void check_close(const Tensor<float>& expected, const Tensor<float>& actual, double tolerance) {
  REQUIRE(expected.shape() == actual.shape());
  std::size_t mismatches = 0, first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double e = expected.data()[i];
    const double a = actual.data()[i];
    const bool ok =
        tolerance == 0.0
            ? std::memcmp(&expected.data()[i], &actual.data()[i], sizeof(float)) == 0
            : (std::isnan(e) ? std::isnan(a)
                             : std::abs(a - e) <= tolerance * std::max(1.0, std::abs(e)));
    if (!ok && mismatches++ == 0) first = i;
  }
  INFO("first mismatch at index " << first << ": value " << std::setprecision(9)
                                  << actual.data()[first] << ", target " << expected.data()[first]
                                  << " (" << mismatches << " mismatches, tolerance " << tolerance
                                  << ")");
  CHECK(mismatches == 0);
}

/// A CPU backend and a CUDA backend side by side, with the conveniences the comparisons need.
struct Backends {
  CpuBackend cpu{1};
  std::shared_ptr<CudaBackend> gpu_owner = CudaBackend::create(0);
  CudaBackend& gpu = *gpu_owner;

  Tensor<float> up(const Tensor<float>& host) { return gpu.from_host(host); }
  Tensor<float> down(const Tensor<float>& device) { return gpu.to_host(device); }
};

/// Float GEMM and the device's `expf`, `tanhf`, `erff` differ from the host's in the last bits.
constexpr double tolerance = 1e-5;
/// nvcc contracts `a * b + c` into one fused multiply-add (`--fmad=true`), which rounds once where
/// the CPU may round twice: kernels with a multiply before an add match to this tolerance.
constexpr double fused = 1e-6;

keras::Conv2DGeometry conv_geometry(std::size_t in_h, std::size_t in_w, std::size_t in_c,
                                    std::size_t kernel, std::size_t stride, std::size_t dilation,
                                    bool same) {
  const auto h = axis_geometry(in_h, kernel, stride, dilation, same);
  const auto w = axis_geometry(in_w, kernel, stride, dilation, same);
  keras::Conv2DGeometry g;
  g.batch = 3;
  g.in_h = in_h;
  g.in_w = in_w;
  g.in_c = in_c;
  g.out_h = h.out;
  g.out_w = w.out;
  g.out_c = 4;
  g.kernel_h = g.kernel_w = kernel;
  g.stride_h = g.stride_w = stride;
  g.dilation_h = g.dilation_w = dilation;
  g.pad_top = h.pad_before;
  g.pad_left = w.pad_before;
  return g;
}

/// Compares `gpu`'s whole convolution of `g` (forward, then backward with the weight gradients
/// added to what is there or written over NaNs) with the CPU backend's, for each activation,
/// with and without a bias; the forward pass within `forward_tolerance`, the gradients within
/// 1e-4.
void check_convolution(CpuBackend& cpu, CudaBackend& gpu, const keras::Conv2DGeometry& g,
                       std::initializer_list<keras::Activation> activations,
                       double forward_tolerance) {
  const Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 13);
  const Tensor<float> kernel = random_tensor({g.patch_size(), g.out_c}, 18);
  const Tensor<float> bias = random_tensor({g.out_c}, 19);
  const Tensor<float> dy = random_tensor({g.batch, g.out_h, g.out_w, g.out_c}, 20);
  const Tensor<float> gx = gpu.from_host(x), gk = gpu.from_host(kernel), gdy = gpu.from_host(dy);
  for (const auto activation : activations) {
    for (const bool with_bias : {true, false}) {
      CAPTURE(static_cast<int>(activation));
      CAPTURE(with_bias);
      const Tensor<float> b_host = with_bias ? bias : Tensor<float>();
      const Tensor<float> gb = with_bias ? gpu.from_host(bias) : Tensor<float>();
      Tensor<float> y(dy.shape());
      const Tensor<float> gy = gpu.allocate(dy.shape());
      cpu.conv2d_forward(x, g, kernel, b_host, activation, y);
      gpu.conv2d_forward(gx, g, gk, gb, activation, gy);
      check_close(y, gpu.to_host(gy), forward_tolerance);
      for (const bool accumulate : {true, false}) {
        CAPTURE(accumulate);
        const Tensor<float> dkernel = test_support::gradient_start(kernel.shape(), 21, accumulate);
        const Tensor<float> dbias = test_support::gradient_start(bias.shape(), 22, accumulate);
        const Tensor<float> gdk = gpu.from_host(dkernel), gdb = gpu.from_host(dbias);
        Tensor<float> dx(x.shape());
        const Tensor<float> gdx =
            gpu.from_host(Tensor<float>(x.shape(), std::numeric_limits<float>::quiet_NaN()));
        cpu.conv2d_backward(x, g, kernel, b_host, activation, y, dy, dkernel,
                            with_bias ? dbias : Tensor<float>(), dx, accumulate);
        gpu.conv2d_backward(gx, g, gk, gb, activation, gy, gdy, gdk,
                            with_bias ? gdb : Tensor<float>(), gdx, accumulate);
        check_close(dkernel, gpu.to_host(gdk), 1e-4);
        if (with_bias) check_close(dbias, gpu.to_host(gdb), 1e-4);
        check_close(dx, gpu.to_host(gdx), 1e-4);
      }
    }
  }
}

keras::Pool2DGeometry pool_geometry(std::size_t in_h, std::size_t in_w, std::size_t pool,
                                    std::size_t stride, bool same) {
  const auto h = axis_geometry(in_h, pool, stride, 1, same);
  const auto w = axis_geometry(in_w, pool, stride, 1, same);
  keras::Pool2DGeometry g;
  g.batch = 3;
  g.in_h = in_h;
  g.in_w = in_w;
  g.channels = 5;
  g.out_h = h.out;
  g.out_w = w.out;
  g.pool_h = g.pool_w = pool;
  g.stride_h = g.stride_w = stride;
  g.pad_top = h.pad_before;
  g.pad_left = w.pad_before;
  return g;
}

/// Images `(n, 8, 8, 1)` and 3 classes decided by their quadrant sums.
struct Data {
  Tensor<float> x;
  Tensor<std::int64_t> y;
};

Data images(std::size_t n, std::uint64_t seed) {
  Data d{random_tensor({n, 8, 8, 1}, seed), Tensor<std::int64_t>({n})};
  for (std::size_t i = 0; i < n; ++i) {
    float top = 0, left = 0;
    for (std::size_t r = 0; r < 8; ++r) {
      for (std::size_t c = 0; c < 8; ++c) {
        top += r < 4 ? d.x(i, r, c, std::size_t{0}) : 0.0F;
        left += c < 4 ? d.x(i, r, c, std::size_t{0}) : 0.0F;
      }
    }
    d.y(i) = top > 0 ? 0 : left > 0 ? 1 : 2;
  }
  return d;
}

using ModelFactory = std::function<std::shared_ptr<Model>()>;

/// Trains the model `make` gives for three SGD steps of mean squared error on `x` and `y`, once
/// on the CPU and once on the CUDA backend, and checks that the losses, the weights and the
/// predictions agree.
void check_trains_as_on_cpu(const ModelFactory& make, const Tensor<float>& x,
                            const Tensor<float>& y) {
  std::vector<std::vector<Tensor<float>>> weights;
  std::vector<Tensor<float>> predictions;
  std::vector<double> losses;
  for (const bool gpu : {false, true}) {
    auto model = make();
    model->compile({.optimizer = "sgd",
                    .loss = "mse",
                    .backend = gpu ? keras::cuda_backend(0) : cpu_backend(1)});
    for (int i = 0; i < 3; ++i)
      losses.push_back(*model->train_on_batch(x, y).get("loss"));
    weights.push_back(model->get_weights());
    predictions.push_back(model->predict(x, {.verbose = 0}));
  }
  for (std::size_t i = 0; i < 3; ++i)
    CHECK(losses[i] == doctest::Approx(losses[i + 3]).epsilon(1e-5));
  REQUIRE(weights[0].size() == weights[1].size());
  for (std::size_t i = 0; i < weights[0].size(); ++i) {
    CAPTURE(i);
    check_close(weights[0][i], weights[1][i], 1e-4);
  }
  check_close(predictions[0], predictions[1], 1e-4);
}

std::shared_ptr<Model> mlp() {
  set_random_seed(11);
  return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({8, 8, 1}), Flatten(), Dense(32, {.activation = "relu"}), Dropout(0.25), Dense(3)});
}

std::shared_ptr<Model> cnn() {
  set_random_seed(12);
  auto in = Input({8, 8, 1});
  auto h = call(Conv2D(4, 3, {.padding = "same", .activation = "relu"}), in);
  h = call(BatchNormalization(), h);
  h = call(MaxPooling2D(), h);
  h = call(Conv2D(6, 3, {.activation = "tanh"}), h);
  auto a = call(GlobalAveragePooling2D(), h);
  auto b = call(Flatten(), h);
  auto out = call(Dense(3), call(Concatenate(), std::vector{a, b}));
  return std::make_shared<Model>(in, out);
}

struct Run {
  std::vector<Tensor<float>> weights;
  Tensor<float> predictions;
  callbacks::History history;
  std::size_t reserved_after_first_epoch = 0;
  std::size_t reserved_at_end = 0;
};

/// Trains the model from `make` (its initial weights set to `initial` when given) on `backend`
/// for `epochs` epochs of batches of 16, then predicts.
/// Adam normalises each step by the gradient's running scale, so that a gradient near zero whose
/// last bits differ between backends can move its weight by up to the learning rate: comparisons
/// across backends train with SGD, whose steps are proportional to the gradient.
enum class Optimizing { adam, sgd };

Run train(const ModelFactory& make, std::shared_ptr<Backend> backend, std::size_t epochs,
          const std::vector<Tensor<float>>& initial = {},
          Optimizing optimizing = Optimizing::adam) {
  const Data data = images(96, 7);
  auto model = make();
  if (!initial.empty()) model->set_weights(initial);
  std::shared_ptr<Optimizer> optimizer;
  if (optimizing == Optimizing::adam) {
    optimizer = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{.learning_rate = 0.01});
  } else {
    optimizer = std::make_shared<optimizers::SGD>(
        optimizers::SGDOptions{.learning_rate = 0.05, .momentum = 0.9});
  }
  model->compile({.optimizer = optimizer,
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"},
                  .backend = backend});
  Run run;
  auto* gpu = dynamic_cast<CudaBackend*>(backend.get());
  if (epochs > 0) {
    run.history =
        model->fit(data.x, data.y, {.epochs = 1, .batch_size = 16, .verbose = 0, .seed = 5});
    if (gpu != nullptr) run.reserved_after_first_epoch = gpu->reserved_bytes();
  }
  if (epochs > 1) {
    const auto more = model->fit(
        data.x, data.y,
        {.epochs = epochs, .batch_size = 16, .verbose = 0, .initial_epoch = 1, .seed = 5});
    for (const auto& [key, series] : more.history)
      run.history.history[key].insert(run.history.history[key].end(), series.begin(), series.end());
  }
  if (gpu != nullptr) run.reserved_at_end = gpu->reserved_bytes();
  run.predictions = model->predict(images(24, 8).x, {.batch_size = 8, .verbose = 0});
  run.weights = model->get_weights();
  return run;
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("CudaBackend allocates zero-filled device tensors and copies them both ways") {
    const auto gpu_owner = CudaBackend::create(0);
    CudaBackend& gpu = *gpu_owner;
    CHECK(gpu.device() == Device{"cuda", 0});
    CHECK(gpu.device().str() == "cuda:0");
    const Tensor<float> zeros = gpu.allocate({3, 4});
    CHECK(zeros.device() == gpu.device());
    CHECK_THROWS_AS(static_cast<void>(zeros.begin()), DeviceError);
    CHECK(gpu.to_host(zeros) == Tensor<float>({3, 4}));
    const Tensor<float> host = random_tensor({5, 7}, 1);
    const Tensor<float> device = gpu.from_host(host);
    CHECK(bitwise_equal(gpu.to_host(device), host));
    CHECK(gpu.to_host(device.slice_rows(2, 4)) == host.slice_rows(2, 4).clone());
    CHECK(gpu.allocate({0, 3}).empty());
    // Large uploads cross on the copy stream, through the upload slots' device buffers: more of
    // them than there are slots, of growing sizes, each into its own tensor.
    std::vector<Tensor<float>> hosts, devices;
    for (std::size_t i = 0; i < 2 * loadstar::cuda::detail::Context::upload_slots + 1; ++i) {
      hosts.push_back(random_tensor({64 + 16 * i, 512}, 100 + i));
      devices.push_back(gpu.allocate(hosts.back().shape()));
      gpu.copy_from_host(hosts.back(), devices.back());
    }
    for (std::size_t i = 0; i < hosts.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(gpu.to_host(devices[i]), hosts[i]));
    }
    CHECK_THROWS_WITH_AS(gpu.copy_from_host(device, device),
                         doctest::Contains("cuda backend: copy_from_host needs a host tensor"),
                         DeviceError);
    const Tensor<float> out = gpu.allocate({5, 7});
    CHECK_THROWS_WITH_AS(gpu.add(device, host, out),
                         "cuda backend: add was given a float32 tensor of shape (5, 7) on cpu but "
                         "expects cuda:0",
                         DeviceError);
  }

  TEST_CASE("CudaBackend reports the bytes asked for and free when device memory runs out") {
    const auto gpu_owner = CudaBackend::create(0);
    CudaBackend& gpu = *gpu_owner;
    std::size_t free_bytes = 0, total_bytes = 0;
    REQUIRE(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess);
    const std::size_t elements = total_bytes / sizeof(float) + (std::size_t{1} << 28U);
    const std::string message = "cuda:0: out of memory: cudaMallocFromPoolAsync of " +
                                std::to_string(elements * sizeof(float)) +
                                " bytes for a float32 tensor of shape (" +
                                std::to_string(elements) + ",) failed with ";
    CHECK_THROWS_WITH_AS(gpu.allocate({elements}), doctest::Contains(message.c_str()), CudaError);
    CHECK_THROWS_WITH_AS(gpu.allocate({elements}), doctest::Contains(" bytes free of "), CudaError);
    // The backend stays usable.
    const Tensor<float> small({2}, {1.0F, 2.0F});
    CHECK(gpu.to_host(gpu.from_host(small)) == small);
  }

#if defined(LOADSTAR_CUDA_EMULATED)
  TEST_CASE("CudaBackend names the device and the call when it cannot start") {
    loadstar::test::fail_next_stream = true;
    CHECK_THROWS_WITH_AS(CudaBackend::create(0),
                         "cuda backend on cuda:0: cannot start: cudaStreamCreate failed with error "
                         "46 (cudaErrorDevicesUnavailable: emulated error)",
                         CudaError);
    CHECK_NOTHROW(CudaBackend::create(0));
  }
#endif

  TEST_CASE("CudaBackend host_kernel stages tensors and their views through the host") {
    const auto gpu_owner = CudaBackend::create(0);
    CudaBackend& gpu = *gpu_owner;
    const Tensor<float> x = gpu.from_host(random_tensor({4, 3}, 2));
    const Tensor<float> view = x.slice_rows(1, 3);
    Tensor<float> host({2}, {1.0F, 2.0F});
    gpu.on_host({x, view, host, Tensor<float>()}, [&](std::span<const Tensor<float>> t) {
      REQUIRE(t.size() == 4);
      CHECK(t[0].is_host());
      CHECK(t[1].data() == t[0].data() + 3);  // the view stays a view of the staged tensor
      CHECK(t[2].data() == host.data());
      CHECK(t[3].empty());
      for (float& v : t[1])
        v = 7.0F;
      t[2].data()[0] = t[0].data()[0];
    });
    const Tensor<float> back = gpu.to_host(x);
    for (std::size_t i = 3; i < 9; ++i)
      CHECK(back.data()[i] == 7.0F);
    CHECK(host.data()[0] == back.data()[0]);
    CHECK_THROWS_WITH_AS(gpu.on_host({x},
                                     [](std::span<const Tensor<float>>) {
                                       throw std::runtime_error("from the host kernel");
                                     }),
                         "from the host kernel", std::runtime_error);
  }

  TEST_CASE("CudaBackend gemm matches the CPU backend for every transposition") {
    Backends b;
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        CAPTURE(ta);
        CAPTURE(tb);
        const std::size_t m = 37, k = 53, n = 29;
        const Tensor<float> a = random_tensor(ta ? Shape{k, m} : Shape{m, k}, 3);
        const Tensor<float> bb = random_tensor(tb ? Shape{n, k} : Shape{k, n}, 4);
        for (const auto& [alpha, beta] :
             {std::pair{1.0F, 0.0F}, std::pair{0.5F, 1.0F}, std::pair{-2.0F, 0.25F}}) {
          Tensor<float> c_cpu = random_tensor({m, n}, 5);
          if (beta == 0.0F) c_cpu.data()[0] = std::numeric_limits<float>::quiet_NaN();  // ignored
          const Tensor<float> c_gpu = b.up(c_cpu);
          b.cpu.gemm(a, ta, bb, tb, c_cpu, alpha, beta);
          b.gpu.gemm(b.up(a), ta, b.up(bb), tb, c_gpu, alpha, beta);
          check_close(c_cpu, b.down(c_gpu), 1e-4);
        }
      }
    }
  }

  TEST_CASE("CudaBackend dense_forward fuses the bias and ReLU and matches the CPU layer path") {
    Backends b;
    const std::size_t rows = 19, features = 23, units = 11;
    const Tensor<float> x = random_tensor({rows, features}, 6);
    const Tensor<float> kernel = random_tensor({features, units}, 7);
    const Tensor<float> bias = random_tensor({units}, 8);
    const Tensor<float> no_bias;
    CHECK_FALSE(b.cpu.dense_forward(x, kernel, bias, keras::Activation::relu,
                                    Tensor<float>({rows, units})));
    for (const keras::Activation activation :
         {keras::Activation::linear, keras::Activation::relu, keras::Activation::sigmoid}) {
      for (const bool with_bias : {false, true}) {
        CAPTURE(static_cast<int>(activation));
        CAPTURE(with_bias);
        Tensor<float> expected({rows, units});
        b.cpu.gemm(x, false, kernel, false, expected, 1.0F, 0.0F);
        if (with_bias) b.cpu.bias_add(expected, bias);
        if (activation != keras::Activation::linear)
          b.cpu.activation_forward(activation, expected, expected);
        const Tensor<float> y = b.gpu.allocate({rows, units});
#if defined(LOADSTAR_CUDA_EMULATED)
        const std::size_t before = loadstar::test::lt_matmuls;
#endif
        REQUIRE(b.gpu.dense_forward(b.up(x), b.up(kernel), with_bias ? b.up(bias) : no_bias,
                                    activation, y));
#if defined(LOADSTAR_CUDA_EMULATED)
        CHECK(loadstar::test::lt_matmuls == before + 1);
#endif
        check_close(expected, b.down(y), 1e-4);
      }
    }
  }

  TEST_CASE("CudaBackend's cuBLASLt calls take views that start inside an allocation") {
    // Rows 1.. of a (rows + 1) x 23 matrix start 92 bytes in: cuBLASLt is told (its alignment
    // preferences), so that it picks an algorithm for such pointers.
    Backends b;
    const std::size_t rows = 19, features = 23, units = 11;
    const Tensor<float> x_all = random_tensor({rows + 1, features}, 71);
    const Tensor<float> dz_all = random_tensor({rows + 1, units}, 72);
    const Tensor<float> kernel = random_tensor({features, units}, 73);
    const Tensor<float> bias = random_tensor({units}, 74);
    const Tensor<float> x = x_all.slice_rows(1, rows + 1), dz = dz_all.slice_rows(1, rows + 1);
    const Tensor<float> gx = b.up(x_all).slice_rows(1, rows + 1);
    const Tensor<float> gdz = b.up(dz_all).slice_rows(1, rows + 1);
    REQUIRE(reinterpret_cast<std::uintptr_t>(gx.data()) % 8 != 0);
    Tensor<float> y({rows + 1, units});
    const Tensor<float> y_view = y.slice_rows(1, rows + 1);
    b.cpu.gemm(x, false, kernel, false, y_view, 1.0F, 0.0F);
    b.cpu.bias_add(y_view, bias);
    b.cpu.activation_forward(keras::Activation::relu, y_view, y_view);
    const Tensor<float> gy = b.gpu.allocate({rows + 1, units});
    const Tensor<float> gy_view = gy.slice_rows(1, rows + 1);
    REQUIRE(b.gpu.dense_forward(gx, b.up(kernel), b.up(bias), keras::Activation::relu, gy_view));
    check_close(y_view, b.down(gy_view), 1e-4);
    Tensor<float> dkernel({features, units}), dbias({units});
    b.cpu.gemm(x, true, dz, false, dkernel, 1.0F, 0.0F);
    b.cpu.column_sums(dz, dbias, 0.0F);
    const Tensor<float> gdk = b.gpu.allocate(dkernel.shape()), gdb = b.gpu.allocate(dbias.shape());
    if (b.gpu.dense_weight_gradients(gx, gdz, gdk, gdb)) {
      check_close(dkernel, b.down(gdk), 1e-4);
      check_close(dbias, b.down(gdb), 1e-4);
    }
  }

  TEST_CASE("CudaBackend dense_weight_gradients writes both gradients from one cuBLASLt call") {
    Backends b;
    const Tensor<float> no_bias;
    CHECK_FALSE(b.cpu.dense_weight_gradients(Tensor<float>({3, 2}), Tensor<float>({3, 4}),
                                             Tensor<float>({2, 4}), Tensor<float>({4})));
    // Rows from one to several thousand (the bias gradient's reduction over them), odd sizes.
    for (const auto& sizes :
         {std::array<std::size_t, 3>{1, 5, 3}, std::array<std::size_t, 3>{19, 23, 11},
          std::array<std::size_t, 3>{3000, 9, 17}}) {
      // Named one by one: Clang 14 cannot capture structured bindings (CAPTURE).
      const std::size_t rows = sizes[0], features = sizes[1], units = sizes[2];
      CAPTURE(rows);
      const Tensor<float> x = random_tensor({rows, features}, 61);
      const Tensor<float> dz = random_tensor({rows, units}, 62);
      Tensor<float> dkernel({features, units}), dbias({units});
      b.cpu.gemm(x, true, dz, false, dkernel, 1.0F, 0.0F);
      b.cpu.column_sums(dz, dbias, 0.0F);
      // Written over NaNs: nothing is read from the gradients.
      const Tensor<float> nan_kernel(dkernel.shape(), std::numeric_limits<float>::quiet_NaN());
      const Tensor<float> nan_bias(dbias.shape(), std::numeric_limits<float>::quiet_NaN());
      const Tensor<float> gdk = b.up(nan_kernel), gdb = b.up(nan_bias);
      CHECK_FALSE(b.gpu.dense_weight_gradients(b.up(x), b.up(dz), gdk, no_bias));
#if defined(LOADSTAR_CUDA_EMULATED)
      const std::size_t before = loadstar::test::lt_matmuls;
#endif
      const bool fused = b.gpu.dense_weight_gradients(b.up(x), b.up(dz), gdk, gdb);
#if defined(LOADSTAR_CUDA_EMULATED)
      REQUIRE(fused);
      CHECK(loadstar::test::lt_matmuls == before + 1);
#endif
      if (!fused) {
        MESSAGE(
            "cuBLASLt has no bias-gradient (BGRADA) algorithm for this shape: Dense runs "
            "gemm and column_sums");
        continue;
      }
      check_close(dkernel, b.down(gdk), 1e-4);
      check_close(dbias, b.down(gdb), 1e-4);
    }
    // Beyond max_bias_epilogue_rows the layer sums the bias gradient itself (column_sums).
    constexpr std::size_t many = loadstar::cuda::CudaBackend::max_bias_epilogue_rows + 1;
    CHECK_FALSE(b.gpu.dense_weight_gradients(b.gpu.allocate({many, 3}), b.gpu.allocate({many, 2}),
                                             b.gpu.allocate({3, 2}), b.gpu.allocate({2})));
  }

  TEST_CASE("CudaBackend carries a ReLU gradient through the next Dense layer's epilogue") {
    Backends b;
    std::unique_ptr<Backend::ReluMask> cpu_mask;
    CHECK_FALSE(b.cpu.dense_forward_relu_mask(Tensor<float>({3, 2}), Tensor<float>({2, 4}),
                                              Tensor<float>({4}), Tensor<float>({3, 4}), cpu_mask));
    CHECK(cpu_mask == nullptr);
    // Units below, at and past the mask's 128-bit rows; odd row counts.
    for (const auto& sizes :
         {std::array<std::size_t, 4>{1, 5, 3, 2}, std::array<std::size_t, 4>{37, 23, 130, 9},
          std::array<std::size_t, 4>{300, 64, 128, 10}}) {
      const std::size_t rows = sizes[0], features = sizes[1], units = sizes[2], next = sizes[3];
      CAPTURE(rows);
      CAPTURE(units);
      const Tensor<float> x = random_tensor({rows, features}, 71);
      const Tensor<float> kernel = random_tensor({features, units}, 72);
      const Tensor<float> bias = random_tensor({units}, 73);
      const Tensor<float> next_kernel = random_tensor({units, next}, 74);
      const Tensor<float> dz = random_tensor({rows, next}, 75);
      // The CPU layers' own calls: y = relu(x * kernel + bias); the next layer's input gradient
      // dz * next_kernel^T through the ReLU, and its column sums.
      Tensor<float> y({rows, units}), dy({rows, units}), dpre({rows, units}), dbias({units});
      b.cpu.gemm(x, false, kernel, false, y, 1.0F, 0.0F);
      b.cpu.bias_add(y, bias);
      b.cpu.activation_forward(keras::Activation::relu, y, y);
      b.cpu.gemm(dz, false, next_kernel, true, dy, 1.0F, 0.0F);
      b.cpu.activation_backward(keras::Activation::relu, Tensor<float>(), y, dy, dpre);
      b.cpu.column_sums(dpre, dbias, 0.0F);
      const Tensor<float> nan({rows, units}, std::numeric_limits<float>::quiet_NaN());
      const Tensor<float> gy = b.up(nan), gdx = b.up(nan);
      const Tensor<float> gdbias = b.up(Tensor<float>({units}, 7.0F));
      std::unique_ptr<Backend::ReluMask> mask;
      const bool forward =
          b.gpu.dense_forward_relu_mask(b.up(x), b.up(kernel), b.up(bias), gy, mask);
      const bool backward = forward && b.gpu.dense_input_gradient_relu(b.up(dz), b.up(next_kernel),
                                                                       *mask, gdx, gdbias);
#if defined(LOADSTAR_CUDA_EMULATED)
      REQUIRE(forward);
      REQUIRE(backward);
#endif
      if (!forward || !backward) {
        MESSAGE(
            "cuBLASLt has no RELU_AUX_BIAS or DRELU_BGRAD algorithm for this shape: the "
            "layers run their own calls");
        continue;
      }
      check_close(y, b.down(gy), 1e-4);
      check_close(dpre, b.down(gdx), 1e-4);
      check_close(dbias, b.down(gdbias), 1e-4);
    }
  }

  TEST_CASE("An MLP whose ReLU gradients ride the next layer's epilogue trains as on the CPU") {
    const auto make = [] {
      set_random_seed(13);
      return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
          Input({8, 8, 1}), Flatten(), Dense(32, {.activation = "relu"}),
          Dense(16, {.activation = "relu"}), Dense(3)});
    };
    const std::vector<Tensor<float>> initial = make()->get_weights();
#if defined(LOADSTAR_CUDA_EMULATED)
    const std::size_t before = loadstar::test::lt_epilogues[CUBLASLT_EPILOGUE_DRELU_BGRAD];
#endif
    const Run cpu = train(make, cpu_backend(1), 3, initial, Optimizing::sgd);
    const Run gpu = train(make, keras::cuda_backend(0), 3, initial, Optimizing::sgd);
#if defined(LOADSTAR_CUDA_EMULATED)
    // Two carried gradients per step queued kernel by kernel (a replayed graph runs the
    // captured calls without calling cuBLASLt again): the first steps of each shape.
    const std::size_t carried =
        loadstar::test::lt_epilogues[CUBLASLT_EPILOGUE_DRELU_BGRAD] - before;
    CHECK(carried >= 4);
    CHECK(carried % 2 == 0);
#endif
    REQUIRE(cpu.weights.size() == gpu.weights.size());
    for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
      CAPTURE(i);
      check_close(cpu.weights[i], gpu.weights[i], 2e-3);
    }
    check_close(cpu.predictions, gpu.predictions, 5e-3);
    // Bitwise repeatable, CUDA graphs and all.
    const Run again = train(make, keras::cuda_backend(0), 3, initial, Optimizing::sgd);
    for (std::size_t i = 0; i < gpu.weights.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(gpu.weights[i], again.weights[i]));
    }
    CHECK(bitwise_equal(gpu.predictions, again.predictions));
  }

  TEST_CASE("A CNN whose ReLU gradients ride max pooling's trains as with a separate ReLU layer") {
    // The same network twice: the convolutions' ReLUs fused (each max pooling layer carries the
    // ReLU gradient of the convolution before it), and as separate ReLU layers (nothing fused).
    const auto make = [](bool fused) {
      return [fused]() -> std::shared_ptr<Model> {
        set_random_seed(14);
        const std::string activation = fused ? "relu" : "linear";
        auto model = std::make_shared<Sequential>();
        model->add(Input({8, 8, 1}));
        model->add(Conv2D(4, 3, {.activation = activation}));
        if (!fused) model->add(ReLU());
        // Overlapping windows (each input gathers from several), then disjoint ones.
        model->add(MaxPooling2D({.pool_size = 3, .strides = 1, .padding = "same"}));
        model->add(Conv2D(6, 2, {.activation = activation}));
        if (!fused) model->add(ReLU());
        model->add(MaxPooling2D());
        model->add(Flatten());
        model->add(Dense(3));
        return model;
      };
    };
    const std::vector<Tensor<float>> initial = make(true)()->get_weights();
#if defined(LOADSTAR_CUDA_EMULATED)
    const std::size_t before = loadstar::test::relu_pool_gradients;
#endif
    const Run fused = train(make(true), keras::cuda_backend(0), 3, initial, Optimizing::sgd);
    const Run split = train(make(false), keras::cuda_backend(0), 3, initial, Optimizing::sgd);
    const Run cpu = train(make(true), cpu_backend(1), 3, initial, Optimizing::sgd);
#if defined(LOADSTAR_CUDA_EMULATED)
    // Two carried gradients per step queued kernel by kernel (the first steps of each shape).
    const std::size_t carried = loadstar::test::relu_pool_gradients - before;
    CHECK(carried >= 4);
    CHECK(carried % 2 == 0);
#endif
    REQUIRE(fused.weights.size() == split.weights.size());
    for (std::size_t i = 0; i < fused.weights.size(); ++i) {
      CAPTURE(i);
#if defined(LOADSTAR_CUDA_EMULATED)
      // One cuBLASLt, whatever the epilogue: the same bits.
      CHECK(bitwise_equal(fused.weights[i], split.weights[i]));
#else
      // cuBLASLt may take another algorithm for a GEMM without the ReLU in its epilogue.
      check_close(fused.weights[i], split.weights[i], 1e-4);
#endif
      check_close(cpu.weights[i], fused.weights[i], 2e-3);
    }
    check_close(cpu.predictions, fused.predictions, 5e-3);
    const Run again = train(make(true), keras::cuda_backend(0), 3, initial, Optimizing::sgd);
    for (std::size_t i = 0; i < fused.weights.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(fused.weights[i], again.weights[i]));
    }
    CHECK(bitwise_equal(fused.predictions, again.predictions));
  }

  TEST_CASE("CudaBackend elementwise kernels match the CPU backend") {
    Backends b;
    const Tensor<float> x = random_tensor({64, 33}, 6, 4.0F);
    const Tensor<float> z = random_tensor({64, 33}, 7);
    const Tensor<float> gx = b.up(x), gz = b.up(z);
    auto both = [&](const Tensor<float>& cpu_out, const Tensor<float>& gpu_out, double tol) {
      check_close(cpu_out, b.down(gpu_out), tol);
    };
    SUBCASE("fill copy scale axpy add") {
      Tensor<float> c = x.clone();
      const Tensor<float> g = b.up(x);
      b.cpu.scale(c, 0.3F);
      b.gpu.scale(g, 0.3F);
      both(c, g, 0.0);
      b.cpu.axpy(-1.5F, z, c);
      b.gpu.axpy(-1.5F, gz, g);
      both(c, g, fused);
      Tensor<float> sum(x.shape());
      const Tensor<float> gsum = b.gpu.allocate(x.shape());
      b.cpu.add(x, z, sum);
      b.gpu.add(gx, gz, gsum);
      both(sum, gsum, 0.0);
      b.gpu.add(gsum, gz, gsum);  // out may be an input
      b.cpu.add(sum, z, sum);
      both(sum, gsum, 0.0);
      Tensor<float> copy(x.shape());
      const Tensor<float> gcopy = b.gpu.allocate(x.shape());
      b.cpu.copy(x, copy);
      b.gpu.copy(gx, gcopy);
      both(copy, gcopy, 0.0);
      b.cpu.fill(copy, 2.5F);
      b.gpu.fill(gcopy, 2.5F);
      both(copy, gcopy, 0.0);
      // fill_many: tensors of other sizes (an empty one among them) in one kernel, its table
      // uploaded again when the tensors change, and a single tensor.
      std::vector<Tensor<float>> hosts{random_tensor({3, 5}, 40), Tensor<float>({0}),
                                       random_tensor({1500}, 41), random_tensor({2, 2, 2}, 42)};
      std::vector<Tensor<float>> devices;
      for (const auto& h : hosts)
        devices.push_back(b.up(h));
      for (const float value : {0.0F, -1.25F}) {
        b.cpu.fill_many(hosts, value);
        b.gpu.fill_many(devices, value);
        for (std::size_t i = 0; i < hosts.size(); ++i)
          both(hosts[i], devices[i], 0.0);
      }
      hosts.erase(hosts.begin());
      devices.erase(devices.begin());
      for (auto& h : hosts)
        h = random_tensor(h.shape(), 43);
      for (std::size_t i = 0; i < hosts.size(); ++i)
        devices[i] = b.up(hosts[i]);
      hosts.push_back(random_tensor({7}, 44));
      devices.push_back(b.up(hosts.back()));
      b.cpu.fill_many(hosts, 3.0F);
      b.gpu.fill_many(devices, 3.0F);
      for (std::size_t i = 0; i < hosts.size(); ++i)
        both(hosts[i], devices[i], 0.0);
      const std::vector<Tensor<float>> one{random_tensor({9}, 45)};
      const std::vector<Tensor<float>> one_device{b.up(one[0])};
      b.cpu.fill_many(one, 0.5F);
      b.gpu.fill_many(one_device, 0.5F);
      both(one[0], one_device[0], 0.0);
    }
    SUBCASE("bias_add and column_sums over one chunk and several") {
      const Tensor<float> bias = random_tensor({33}, 8);
      Tensor<float> c = x.clone();
      Tensor<float> g = b.up(x);
      b.cpu.bias_add(c, bias);
      b.gpu.bias_add(g, b.up(bias));
      both(c, g, 0.0);
      // One chunk, fewer chunks than reduction_lanes, more.
      for (const std::size_t rows : {64, 3000, 40000}) {
        const Tensor<float> big = random_tensor({rows, 33}, 9);
        for (const float beta : {0.0F, 1.0F}) {
          Tensor<float> out = random_tensor({33}, 10);
          const Tensor<float> gout = b.up(out);
          b.cpu.column_sums(big, out, beta);
          b.gpu.column_sums(b.up(big), gout, beta);
          both(out, gout, 1e-6);
        }
      }
    }
    SUBCASE("activations forward and backward") {
      for (const keras::Activation kind :
           {keras::Activation::linear,      keras::Activation::relu,
            keras::Activation::sigmoid,     keras::Activation::tanh,
            keras::Activation::softmax,     keras::Activation::elu,
            keras::Activation::selu,        keras::Activation::softplus,
            keras::Activation::softsign,    keras::Activation::gelu,
            keras::Activation::swish,       keras::Activation::hard_sigmoid,
            keras::Activation::exponential, keras::Activation::relu6,
            keras::Activation::leaky_relu,  keras::Activation::mish,
            keras::Activation::hard_silu,   keras::Activation::log_sigmoid,
            keras::Activation::hard_tanh,   keras::Activation::tanh_shrink,
            keras::Activation::soft_shrink, keras::Activation::hard_shrink,
            keras::Activation::squareplus,  keras::Activation::sparse_plus}) {
        CAPTURE(activation_name(kind));
        Tensor<float> y(x.shape()), dx(x.shape());
        const Tensor<float> gy = b.gpu.allocate(x.shape()), gdx = b.gpu.allocate(x.shape());
        b.cpu.activation_forward(kind, x, y);
        b.gpu.activation_forward(kind, gx, gy);
        both(y, gy, tolerance);
        b.cpu.activation_backward(kind, x, y, z, dx);
        b.gpu.activation_backward(kind, gx, gy, gz, gdx);
        both(dx, gdx, 1e-4);
      }
    }
    SUBCASE("relu variants") {
      for (const std::optional<float> top : {std::optional<float>{}, std::optional<float>{1.5F}}) {
        Tensor<float> y(x.shape()), dx(x.shape());
        const Tensor<float> gy = b.gpu.allocate(x.shape()), gdx = b.gpu.allocate(x.shape());
        b.cpu.relu_forward(x, y, top, 0.1F, 0.25F);
        b.gpu.relu_forward(gx, gy, top, 0.1F, 0.25F);
        b.cpu.relu_backward(x, z, dx, top, 0.1F, 0.25F);
        b.gpu.relu_backward(gx, gz, gdx, top, 0.1F, 0.25F);
        both(y, gy, 0.0);
        both(dx, gdx, 0.0);
      }
    }
    SUBCASE("softmax over every axis") {
      const Tensor<float> t = random_tensor({6, 7, 8}, 11, 5.0F);
      const Tensor<float> dt = random_tensor({6, 7, 8}, 12);
      for (std::size_t axis = 0; axis < 3; ++axis) {
        CAPTURE(axis);
        Tensor<float> y(t.shape()), dx(t.shape());
        const Tensor<float> gy = b.gpu.allocate(t.shape()), gdx = b.gpu.allocate(t.shape());
        b.cpu.softmax_forward(t, y, axis);
        b.gpu.softmax_forward(b.up(t), gy, axis);
        both(y, gy, tolerance);
        b.cpu.softmax_backward(y, dt, dx, axis);
        b.gpu.softmax_backward(b.up(y), b.up(dt), gdx, axis);
        both(dx, gdx, tolerance);
      }
    }
    SUBCASE("dropout draws the CPU backend's mask") {
      for (const float rate : {0.0F, 0.3F, 1.0F}) {
        Tensor<float> y(x.shape());
        const Tensor<float> gy = b.gpu.allocate(x.shape());
        b.cpu.dropout(x, y, rate, 77);
        b.gpu.dropout(gx, gy, rate, 77);
        both(y, gy, 0.0);
      }
    }
    SUBCASE("moving_average") {
      Tensor<float> m = z.clone();
      const Tensor<float> gm = b.up(z);
      b.cpu.moving_average(m, x, 0.9F);
      b.gpu.moving_average(gm, gx, 0.9F);
      both(m, gm, fused);
    }
  }

  TEST_CASE("CudaBackend convolution and pooling kernels match the CPU backend") {
    Backends b;
    for (const auto& g :
         {conv_geometry(9, 8, 3, 3, 1, 1, true), conv_geometry(11, 11, 2, 3, 2, 1, false),
          conv_geometry(10, 9, 2, 3, 1, 2, true), conv_geometry(7, 7, 4, 1, 1, 1, false)}) {
      CAPTURE(g.in_h);
      CAPTURE(g.kernel_h);
      const Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 13);
      Tensor<float> columns({g.batch * g.out_h * g.out_w, g.patch_size()});
      const Tensor<float> gcolumns = b.gpu.allocate(columns.shape());
      b.cpu.im2col(x, g, columns);
      b.gpu.im2col(b.up(x), g, gcolumns);
      check_close(columns, b.down(gcolumns), 0.0);
      const Tensor<float> dcolumns = random_tensor(columns.shape(), 14);
      Tensor<float> dx(x.shape());
      const Tensor<float> gdx = b.up(random_tensor(x.shape(), 15));  // overwritten
      b.cpu.col2im(dcolumns, g, dx);
      b.gpu.col2im(b.up(dcolumns), g, gdx);
      check_close(dx, b.down(gdx), 0.0);
      // The whole convolution: the GEMM with the bias and ReLU in its epilogue (or not), and its
      // backward pass with the temporaries in the backend's scratch.
      check_convolution(
          b.cpu, b.gpu, g,
          {keras::Activation::relu, keras::Activation::tanh, keras::Activation::linear}, 1e-5);
    }
    // Many output positions and few weights: the weight gradients as one column reduction over
    // the input (four filters a thread, or one where the filters do not divide into fours),
    // with padding, strides and dilation.
    keras::Conv2DGeometry tall = conv_geometry(30, 30, 1, 3, 1, 1, true);
    tall.batch = 12;  // 10,800 rows
    keras::Conv2DGeometry strided = conv_geometry(41, 41, 2, 3, 2, 2, false);
    strided.batch = 40;  // 19 x 19 x 40 = 14,440 rows
    strided.out_c = 3;
    for (const auto& g : {tall, strided}) {
      CAPTURE(g.out_c);
      REQUIRE(g.batch * g.out_h * g.out_w >= CudaBackend::min_reduction_rows);
#if defined(LOADSTAR_CUDA_EMULATED)
      const std::size_t before = loadstar::test::conv_weight_reductions;
#endif
      check_convolution(b.cpu, b.gpu, g, {keras::Activation::relu, keras::Activation::linear},
                        1e-5);
#if defined(LOADSTAR_CUDA_EMULATED)
      // Each backward pass: 2 activations x 2 biases x 2 (accumulated and written).
      CHECK(loadstar::test::conv_weight_reductions - before == 8);
#endif
      // Bitwise repeatable: the reduction's order of additions is fixed by the sizes.
      const Tensor<float> gx = b.up(random_tensor({g.batch, g.in_h, g.in_w, g.in_c}, 30));
      const Tensor<float> gk = b.up(random_tensor({g.patch_size(), g.out_c}, 31));
      const Tensor<float> gdy = b.up(random_tensor({g.batch, g.out_h, g.out_w, g.out_c}, 32));
      std::vector<Tensor<float>> runs;
      for (int run = 0; run < 2; ++run) {
        const Tensor<float> gdk = b.gpu.allocate(gk.shape()), gdb = b.gpu.allocate({g.out_c});
        b.gpu.conv2d_backward(gx, g, gk, Tensor<float>(), keras::Activation::linear,
                              Tensor<float>(), gdy, gdk, gdb, Tensor<float>(), false);
        runs.push_back(b.down(gdk));
        runs.push_back(b.down(gdb));
      }
      CHECK(bitwise_equal(runs[0], runs[2]));
      CHECK(bitwise_equal(runs[1], runs[3]));
    }
    for (const auto& g : {pool_geometry(8, 8, 2, 2, false), pool_geometry(7, 7, 2, 2, true),
                          pool_geometry(9, 6, 3, 2, true), pool_geometry(6, 6, 3, 1, true)}) {
      CAPTURE(g.in_h);
      CAPTURE(g.pool_h);
      Tensor<float> x = random_tensor({g.batch, g.in_h, g.in_w, g.channels}, 16);
      for (float& v : x)
        v = std::round(v * 3.0F);  // ties
      const Tensor<float> dy = random_tensor({g.batch, g.out_h, g.out_w, g.channels}, 17);
      const Tensor<float> gx = b.up(x), gdy = b.up(dy);
      for (const bool max : {true, false}) {
        CAPTURE(max);
        Tensor<float> y(dy.shape()), dx(x.shape());
        const Tensor<float> gy = b.gpu.allocate(dy.shape()), gdx = b.gpu.allocate(x.shape());
        if (max) {
          b.cpu.max_pool_forward(x, g, y);
          b.gpu.max_pool_forward(gx, g, gy);
          b.cpu.max_pool_backward(x, g, dy, dx);
          b.gpu.max_pool_backward(gx, g, gdy, gdx);
          // Carried on through the ReLU whose output x is (its negatives and zeros, and windows
          // whose maximum is 0, pass nothing): the CPU's two calls, bit for bit.
          Tensor<float> relu_dx(x.shape());
          b.cpu.activation_backward(keras::Activation::relu, Tensor<float>(), x, dx, relu_dx);
          const Tensor<float> grelu_dx = b.up(random_tensor(x.shape(), 20));  // overwritten
          REQUIRE(b.gpu.max_pool_backward_relu(gx, g, gdy, grelu_dx));
          check_close(relu_dx, b.down(grelu_dx), 0.0);
        } else {
          b.cpu.avg_pool_forward(x, g, y);
          b.gpu.avg_pool_forward(gx, g, gy);
          b.cpu.avg_pool_backward(g, dy, dx);
          b.gpu.avg_pool_backward(g, gdy, gdx);
        }
        check_close(y, b.down(gy), 0.0);
        check_close(dx, b.down(gdx), 0.0);
      }
    }
    Tensor<float> x = random_tensor({3, 5, 4, 6}, 18);
    for (float& v : x)
      v = std::round(v * 2.0F);
    const Tensor<float> dy = random_tensor({3, 6}, 19);
    for (const bool max : {true, false}) {
      Tensor<float> y({3, 6}), dx(x.shape());
      const Tensor<float> gy = b.gpu.allocate({3, 6}), gdx = b.gpu.allocate(x.shape());
      b.cpu.global_pool_forward(x, max, y);
      b.gpu.global_pool_forward(b.up(x), max, gy);
      b.cpu.global_pool_backward(x, max, dy, dx);
      b.gpu.global_pool_backward(b.up(x), max, b.up(dy), gdx);
      check_close(y, b.down(gy), 0.0);
      check_close(dx, b.down(gdx), 0.0);
    }
  }

  TEST_CASE("Convolution::cudnn computes convolutions as the CPU backend, where cuDNN is built") {
    using loadstar::cuda::Convolution;
    if constexpr (!loadstar::cuda::has_cudnn) {
      CHECK_THROWS_WITH_AS(CudaBackend::create(0, {.convolution = Convolution::cudnn}),
                           doctest::Contains("CudaOptions::convolution is Convolution::cudnn but "
                                             "this build has no cuDNN"),
                           ConfigError);
      return;
    }
    CpuBackend cpu{1};
    const auto gpu_owner = CudaBackend::create(0, {.convolution = Convolution::cudnn});
    CudaBackend& gpu = *gpu_owner;
    // Symmetric padding, strides, dilation, a 1x1 kernel; then TensorFlow's `same` padding with
    // an odd total that the last window reaches, which cuDNN cannot pad (im2col runs those).
    for (const auto& g :
         {conv_geometry(9, 8, 3, 3, 1, 1, true), conv_geometry(11, 11, 2, 3, 2, 1, false),
          conv_geometry(10, 9, 2, 3, 1, 2, true), conv_geometry(7, 7, 4, 1, 1, 1, false),
          conv_geometry(8, 8, 3, 2, 1, 1, true), conv_geometry(9, 9, 3, 4, 2, 1, true)}) {
      CAPTURE(g.in_h);
      CAPTURE(g.kernel_h);
      CAPTURE(g.stride_h);
      check_convolution(
          cpu, gpu, g,
          {keras::Activation::relu, keras::Activation::gelu, keras::Activation::linear}, 1e-4);
      // The first geometry (3x3, stride 1, `same`) is cuDNN's: one forward, then per backward
      // pass that writes one filter and one data gradient.
      if (g.in_h == 9 && g.kernel_h == 3 && g.stride_h == 1) CHECK(gpu.cudnn_calls() > 0);
    }
  }

  TEST_CASE("A CNN on cuDNN's convolutions trains as on the CPU and is bitwise repeatable") {
    using loadstar::cuda::Convolution;
    if constexpr (!loadstar::cuda::has_cudnn) {
      MESSAGE("this build has no cuDNN: Convolution::cudnn is not available");
      return;
    }
    const auto cudnn = [] {
      return CudaBackend::create(0, loadstar::cuda::CudaOptions{.convolution = Convolution::cudnn});
    };
    const std::vector<Tensor<float>> initial = cnn()->get_weights();
    const Run cpu = train(cnn, cpu_backend(1), 3, initial, Optimizing::sgd);
    const Run gpu = train(cnn, cudnn(), 3, initial, Optimizing::sgd);
    REQUIRE(cpu.weights.size() == gpu.weights.size());
    for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
      CAPTURE(i);
      check_close(cpu.weights[i], gpu.weights[i], 2e-3);
    }
    check_close(cpu.predictions, gpu.predictions, 5e-3);
    const Run again = train(cnn, cudnn(), 3, initial, Optimizing::sgd);
    for (std::size_t i = 0; i < gpu.weights.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(gpu.weights[i], again.weights[i]));
    }
    CHECK(bitwise_equal(gpu.predictions, again.predictions));
    CHECK(gpu.reserved_at_end == gpu.reserved_after_first_epoch);
  }

  TEST_CASE("CudaBackend normalisation kernels match the CPU backend") {
    Backends b;
    for (const std::size_t rows : {40, 3000}) {
      CAPTURE(rows);
      const std::size_t c = 6;
      const double tol = rows > 512 ? 1e-5 : 1e-6;
      const Tensor<float> x = random_tensor({rows, c}, 20, 3.0F);
      const Tensor<float> dy = random_tensor({rows, c}, 21);
      Tensor<float> mean({c}), variance({c});
      const Tensor<float> gmean = b.gpu.allocate({c}), gvariance = b.gpu.allocate({c});
      b.cpu.moments(x, mean, variance);
      b.gpu.moments(b.up(x), gmean, gvariance);
      check_close(mean, b.down(gmean), tol);
      check_close(variance, b.down(gvariance), tol);
      const Tensor<float> gamma = random_tensor({c}, 22), beta = random_tensor({c}, 23);
      for (const bool affine : {false, true}) {
        const Tensor<float> g = affine ? gamma : Tensor<float>();
        const Tensor<float> bb = affine ? beta : Tensor<float>();
        Tensor<float> y({rows, c});
        const Tensor<float> gy = b.gpu.allocate({rows, c});
        b.cpu.batch_norm_forward(x, mean, variance, g, bb, 1e-3F, y);
        b.gpu.batch_norm_forward(b.up(x), b.up(mean), b.up(variance),
                                 affine ? b.up(g) : Tensor<float>(),
                                 affine ? b.up(bb) : Tensor<float>(), 1e-3F, gy);
        check_close(y, b.down(gy), tol);
        for (const bool training : {false, true}) {
          CAPTURE(affine);
          CAPTURE(training);
          Tensor<float> dx({rows, c}), dgamma = random_tensor({c}, 24),
                                       dbeta = random_tensor({c}, 25);
          const Tensor<float> gdx = b.gpu.allocate({rows, c}), gdgamma = b.up(dgamma),
                              gdbeta = b.up(dbeta);
          b.cpu.batch_norm_backward(x, mean, variance, g, 1e-3F, training, dy, dx, dgamma, dbeta);
          b.gpu.batch_norm_backward(b.up(x), b.up(mean), b.up(variance),
                                    affine ? b.up(g) : Tensor<float>(), 1e-3F, training, b.up(dy),
                                    gdx, gdgamma, gdbeta);
          check_close(dx, b.down(gdx), tol);
          check_close(dgamma, b.down(gdgamma), tol);
          check_close(dbeta, b.down(gdbeta), tol);
        }
      }
    }
  }

  TEST_CASE("CudaBackend indexing and layout kernels match the CPU backend") {
    Backends b;
    const Tensor<float> table = random_tensor({7, 5}, 26);
    const Tensor<float> indices({9}, {0, 6, 3, 3, 1.5F, 0, 6, 2, 3});
    Tensor<float> out({9, 5});
    const Tensor<float> gout = b.gpu.allocate({9, 5});
    CHECK_FALSE(b.cpu.gather(indices, table, out).has_value());
    CHECK_FALSE(b.gpu.gather(b.up(indices), b.up(table), gout).has_value());
    check_close(out, b.down(gout), 0.0);
    const Tensor<float> bad({5}, {0, 9, 2, -3, 1});
    const auto found = b.gpu.gather(b.up(bad), b.up(table), b.gpu.allocate({5, 5}));
    REQUIRE(found.has_value());
    CHECK(found->position == 1);
    CHECK(found->value == 9.0F);

    const Tensor<float> dy = random_tensor({9, 5}, 27);
    Tensor<float> gradient = random_tensor({7, 5}, 28);
    const Tensor<float> ggradient = b.up(gradient);
    b.cpu.scatter_add(indices, dy, gradient);
    b.gpu.scatter_add(b.up(indices), b.up(dy), ggradient);
    check_close(gradient, b.down(ggradient), 0.0);

    const Tensor<float> p0 = random_tensor({2, 3, 4}, 29), p1 = random_tensor({2, 3, 1}, 30);
    for (std::size_t axis : {0, 1, 2}) {
      CAPTURE(axis);
      const Tensor<float> q1 = axis == 0   ? random_tensor({5, 3, 4}, 31)
                               : axis == 1 ? random_tensor({2, 5, 4}, 31)
                                           : p1;
      Shape joined = p0.shape();
      joined[axis] += q1.shape()[axis];
      const Tensor<float> parts[] = {p0, q1};
      const Tensor<float> gparts[] = {b.up(p0), b.up(q1)};
      Tensor<float> cat(joined);
      const Tensor<float> gcat = b.gpu.allocate(joined);
      b.cpu.concatenate(parts, axis, cat);
      b.gpu.concatenate(gparts, axis, gcat);
      check_close(cat, b.down(gcat), 0.0);
      const std::size_t extents[] = {p0.shape()[axis], q1.shape()[axis]};
      const Tensor<float> gback[] = {b.gpu.allocate(p0.shape()), Tensor<float>()};  // one skipped
      b.gpu.split(gcat, axis, extents, gback);
      check_close(p0, b.down(gback[0]), 0.0);
    }

    const Tensor<float> t = random_tensor({2, 3, 4, 5}, 32);
    for (const auto& axes :
         {std::vector<std::size_t>{0, 2, 3, 1}, std::vector<std::size_t>{3, 2, 1, 0}}) {
      Shape shape = t.shape();
      for (std::size_t i = 0; i < 4; ++i)
        shape[i] = t.shape()[axes[i]];
      Tensor<float> y(shape);
      const Tensor<float> gy = b.gpu.allocate(shape);
      b.cpu.permute(t, axes, y);
      b.gpu.permute(b.up(t), axes, gy);
      check_close(y, b.down(gy), 0.0);
    }
  }

  TEST_CASE("Dense and Conv2D models predict and train on the GPU as on the CPU") {
    for (const auto& entry : {std::pair<const char*, ModelFactory>{"mlp", mlp},
                              std::pair<const char*, ModelFactory>{"cnn", cnn}}) {
      // Named copies: Clang before 16 cannot capture structured bindings (CAPTURE's lambda).
      const char* const name = entry.first;
      const ModelFactory& make = entry.second;
      CAPTURE(name);
      const std::vector<Tensor<float>> initial = make()->get_weights();
      // Forward: predictions from the same weights before training.
      const Run cpu0 = train(make, cpu_backend(1), 0, initial);
      const Run gpu0 = train(make, keras::cuda_backend(0), 0, initial);
      check_close(cpu0.predictions, gpu0.predictions, 1e-3);
      // Forward and backward: three epochs of SGD with momentum (18 steps) stay within float
      // drift.
      const Run cpu = train(make, cpu_backend(1), 3, initial, Optimizing::sgd);
      const Run gpu = train(make, keras::cuda_backend(0), 3, initial, Optimizing::sgd);
      REQUIRE(cpu.weights.size() == gpu.weights.size());
      for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
        CAPTURE(i);
        check_close(cpu.weights[i], gpu.weights[i], 2e-3);
      }
      check_close(cpu.predictions, gpu.predictions, 5e-3);
      const auto& cpu_loss = cpu.history.history.at("loss");
      const auto& gpu_loss = gpu.history.history.at("loss");
      REQUIRE(cpu_loss.size() == gpu_loss.size());
      CHECK(std::abs(cpu_loss.back() - gpu_loss.back()) <
            1e-3 * std::max(1.0, std::abs(cpu_loss.back())));
    }
  }

  TEST_CASE("Training on the GPU is bitwise repeatable") {
    for (const ModelFactory& make : {ModelFactory(mlp), ModelFactory(cnn)}) {
      const Run first = train(make, keras::cuda_backend(0), 3);
      const Run second = train(make, keras::cuda_backend(0), 3);
      REQUIRE(first.weights.size() == second.weights.size());
      for (std::size_t i = 0; i < first.weights.size(); ++i) {
        CAPTURE(i);
        CHECK(bitwise_equal(first.weights[i], second.weights[i]));
      }
      CHECK(bitwise_equal(first.predictions, second.predictions));
    }
  }

  TEST_CASE("fit, evaluate and predict from arrays in device memory give the bits of host arrays") {
    const Data data = images(100, 7);
    Tensor<float> labels({100});
    Tensor<float> weights({100});
    for (std::size_t i = 0; i < 100; ++i) {
      labels(i) = static_cast<float>(data.y(i));
      weights(i) = 0.5F + static_cast<float>(i % 3);
    }
    const Data held_out = images(30, 9);
    struct Result {
      std::vector<Tensor<float>> weights;
      std::vector<double> losses;
      std::vector<double> val_losses;
      std::vector<double> evaluated;  // loss, accuracy
      Tensor<float> predictions;
    };
    // Batches of 16 over 100 rows: a short last batch of 4, shuffled or in order.
    for (const bool shuffle : {true, false}) {
      CAPTURE(shuffle);
      auto run = [&](bool on_device) {
        const auto backend = keras::cuda_backend(0);
        const auto place = [&](const Tensor<float>& t) {
          return on_device ? backend->from_host(t) : t;
        };
        const Tensor<float> x = place(data.x), y = place(labels), w = place(weights);
        const Tensor<float> val_x = place(held_out.x);
        auto model = mlp();
        model->compile({.optimizer = "adam",
                        .loss = losses::SparseCategoricalCrossentropy(true),
                        .metrics = {"accuracy"},
                        .backend = backend});
        Result r;
        const auto history = model->fit(x, y,
                                        {.epochs = 2,
                                         .batch_size = 16,
                                         .verbose = 0,
                                         .validation_split = 0.2,
                                         .shuffle = shuffle,
                                         .sample_weight = w,
                                         .seed = 5});
        r.losses = history.history.at("loss");
        r.val_losses = history.history.at("val_loss");
        const Logs logs =
            model->evaluate(val_x, place(Tensor<float>({30})), {.batch_size = 7, .verbose = 0});
        r.evaluated = {logs.get("loss").value_or(-1.0), logs.get("accuracy").value_or(-1.0)};
        r.predictions = model->predict(val_x, {.batch_size = 8, .verbose = 0});
        r.weights = model->get_weights();
        return r;
      };
      const Result host = run(false);
      const Result device = run(true);
      CHECK(host.losses == device.losses);
      CHECK(host.val_losses == device.val_losses);
      CHECK(host.evaluated == device.evaluated);
      CHECK(bitwise_equal(host.predictions, device.predictions));
      REQUIRE(host.weights.size() == device.weights.size());
      for (std::size_t i = 0; i < host.weights.size(); ++i) {
        CAPTURE(i);
        CHECK(bitwise_equal(host.weights[i], device.weights[i]));
      }
    }
  }

  TEST_CASE("Arrays in another device's memory, or not float32 there, raise DeviceError") {
    auto model = mlp();
    model->compile({.optimizer = "sgd",
                    .loss = losses::SparseCategoricalCrossentropy(true),
                    .backend = keras::cuda_backend(0)});
    const Data data = images(8, 3);
    const Tensor<float> labels({8});
    // Views that only carry a device: the check comes before anything reads them.
    const auto elsewhere =
        Tensor<float>::wrap(data.x.data(), data.x.shape(), nullptr, Device{"cuda", 7});
    CHECK_THROWS_WITH_AS(model->fit(elsewhere, labels, {.batch_size = 4, .verbose = 0}),
                         doctest::Contains("x is in cuda:7 memory but the model computes in "
                                           "cuda:0"),
                         DeviceError);
    const auto integers =
        Tensor<std::int64_t>::wrap(data.y.data(), data.y.shape(), nullptr, Device{"cuda", 0});
    CHECK_THROWS_WITH_AS(model->fit(data.x, integers, {.batch_size = 4, .verbose = 0}),
                         doctest::Contains("y is in cuda:0 memory with elements of type int64 but "
                                           "arrays in device memory must be float32"),
                         DeviceError);
  }

  TEST_CASE("CudaBackend allocates no device memory after the first epoch") {
    const Run run = train(cnn, keras::cuda_backend(0), 4);
    CHECK(run.reserved_after_first_epoch > 0);
    CHECK(run.reserved_at_end == run.reserved_after_first_epoch);
  }

  TEST_CASE("Embedding reports a bad index found by the GPU gather kernel") {
    Sequential model{Input({2}), Embedding(4, 3), Flatten(), Dense(1)};
    model.compile({.optimizer = "sgd", .loss = "mse", .backend = keras::cuda_backend(0)});
    const Tensor<float> x({2, 2}, {0, 1, 2, 7});
    CHECK_THROWS_WITH_AS(model.predict(x, {.verbose = 0}),
                         doctest::Contains("index 7 at position 3 is outside [0, input_dim) with "
                                           "input_dim 4"),
                         ConfigError);
    // Training reads the check with the step's loss; the other rows' steps train on.
    const Tensor<float> y({2, 1}, {0.5F, -0.5F});
    CHECK_THROWS_WITH_AS(model.fit(x, y, {.epochs = 1, .batch_size = 2, .verbose = 0}),
                         doctest::Contains("index 7 at position 3 is outside [0, input_dim)"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(model.evaluate(x, y, {.verbose = 0}),
                         doctest::Contains("index 7 at position 3 is outside [0, input_dim)"),
                         ConfigError);
    const Tensor<float> good({2, 2}, {0, 1, 2, 3});
    CHECK(std::isfinite(*model.train_on_batch(good, y).get("loss")));
  }
}

namespace {

using OptimizerFactory = std::function<std::shared_ptr<Optimizer>()>;

/// An MLP with a softmax output, for the step that must stay on the device.
std::shared_ptr<Model> softmax_mlp() {
  set_random_seed(13);
  return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({8, 8, 1}), Flatten(), Dense(16, {.activation = "relu"}),
      Dense(3, {.activation = "softmax"})});
}

/// `softmax_mlp` compiled as a classifier trains: Adam, sparse cross-entropy and accuracy.
std::shared_ptr<Model> classifier_on(std::shared_ptr<Backend> backend) {
  auto model = softmax_mlp();
  model->compile({.optimizer = "adam",
                  .loss = "sparse_categorical_crossentropy",
                  .metrics = {"accuracy"},
                  .backend = std::move(backend)});
  return model;
}

struct StepRun {
  std::vector<Tensor<float>> weights;
  std::vector<Tensor<float>> slots;
  std::vector<double> losses, accuracies;
  std::size_t host_kernel_calls = 0;
};

/// Two epochs of batches of 16 (12 steps) of `make`'s model from `initial`, with `optimizer` and
/// sparse cross-entropy from probabilities, on `backend`.
StepRun train_steps(const ModelFactory& make, const std::vector<Tensor<float>>& initial,
                    const OptimizerFactory& optimizer, std::shared_ptr<Backend> backend) {
  const Data data = images(96, 7);
  auto model = make();
  model->set_weights(initial);
  auto opt = optimizer();
  model->compile({.optimizer = opt,
                  .loss = losses::SparseCategoricalCrossentropy(),
                  .metrics = {"accuracy"},
                  .backend = backend});
  const auto history =
      model->fit(data.x, data.y, {.epochs = 2, .batch_size = 16, .verbose = 0, .seed = 5});
  StepRun run;
  run.weights = model->get_weights();
  for (const auto& slot : opt->variables())
    run.slots.push_back(backend->to_host(slot.value));
  run.losses = history.history.at("loss");
  run.accuracies = history.history.at("accuracy");
  if (const auto* gpu = dynamic_cast<const CudaBackend*>(backend.get()))
    run.host_kernel_calls = gpu->host_kernel_calls();
  return run;
}

struct OptimizerCase {
  const char* name;
  OptimizerFactory make;
};

std::vector<OptimizerCase> optimizer_cases() {
  namespace o = optimizers;
  return {
      {"SGD", [] { return std::make_shared<o::SGD>(o::SGDOptions{.learning_rate = 0.05}); }},
      {"SGD with Nesterov momentum",
       [] {
         return std::make_shared<o::SGD>(
             o::SGDOptions{.learning_rate = 0.05, .momentum = 0.9, .nesterov = true});
       }},
      {"Adam", [] { return std::make_shared<o::Adam>(o::AdamOptions{.learning_rate = 1e-3}); }},
      {"Adam with amsgrad and global_clipnorm",
       [] {
         return std::make_shared<o::Adam>(
             o::AdamOptions{.learning_rate = 1e-3, .amsgrad = true, .global_clipnorm = 0.5});
       }},
      {"AdamW with clipvalue",
       [] {
         return std::make_shared<o::AdamW>(
             o::AdamWOptions{.learning_rate = 1e-3, .weight_decay = 0.01, .clipvalue = 0.05});
       }},
      {"RMSprop centered with momentum and clipnorm",
       [] {
         return std::make_shared<o::RMSprop>(o::RMSpropOptions{
             .learning_rate = 1e-3, .momentum = 0.5, .centered = true, .clipnorm = 0.5});
       }},
      {"Adagrad",
       [] { return std::make_shared<o::Adagrad>(o::AdagradOptions{.learning_rate = 0.05}); }},
      {"Adadelta",
       [] { return std::make_shared<o::Adadelta>(o::AdadeltaOptions{.learning_rate = 1.0}); }},
      {"Nadam with weight_decay",
       [] {
         return std::make_shared<o::Nadam>(
             o::NadamOptions{.learning_rate = 2e-3, .weight_decay = 0.05});
       }},
      {"Adamax with clipnorm",
       [] {
         return std::make_shared<o::Adamax>(
             o::AdamaxOptions{.learning_rate = 2e-3, .clipnorm = 0.5});
       }},
      {"Lion with weight_decay",
       [] {
         return std::make_shared<o::Lion>(
             o::LionOptions{.learning_rate = 1e-4, .weight_decay = 0.1});
       }},
      {"Ftrl with regularization",
       [] {
         return std::make_shared<o::Ftrl>(
             o::FtrlOptions{.learning_rate = 0.05,
                            .l1_regularization_strength = 1e-4,
                            .l2_regularization_strength = 1e-3,
                            .l2_shrinkage_regularization_strength = 1e-3,
                            .beta = 0.1});
       }},
      {"SGD with momentum and weight_decay",
       [] {
         return std::make_shared<o::SGD>(
             o::SGDOptions{.learning_rate = 0.05, .momentum = 0.9, .weight_decay = 0.01});
       }},
      // A decay large enough that applying it to the excluded kernels (about 5% over the
      // steps) would show beyond the tolerance.
      {"AdamW with its kernels excluded from weight decay",
       [] {
         auto adamw = std::make_shared<o::AdamW>(
             o::AdamWOptions{.learning_rate = 1e-3, .weight_decay = 4.0});
         adamw->exclude_from_weight_decay({}, {"kernel"});
         return adamw;
       }},
  };
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("Each optimizer's fused step trains an MLP on the GPU as on the CPU and repeatably") {
    const std::vector<Tensor<float>> initial = softmax_mlp()->get_weights();
    for (const auto& c : optimizer_cases()) {
      const std::string name = c.name;
      CAPTURE(name);
      const StepRun cpu = train_steps(softmax_mlp, initial, c.make, cpu_backend(1));
      const StepRun gpu = train_steps(softmax_mlp, initial, c.make, keras::cuda_backend(0));
      const StepRun again = train_steps(softmax_mlp, initial, c.make, keras::cuda_backend(0));
      REQUIRE(cpu.weights.size() == gpu.weights.size());
      REQUIRE(cpu.slots.size() == gpu.slots.size());
      CHECK(gpu.host_kernel_calls == 0);  // the fused step, the loss and the metric on the device
      // GEMMs accumulate in another order on the device (the emulation sums in double), so the
      // gradients differ in their last bits; twelve steps keep the weights within 1e-3.
      for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
        CAPTURE(i);
        check_close(cpu.weights[i], gpu.weights[i], 1e-3);
        CHECK(bitwise_equal(gpu.weights[i], again.weights[i]));
      }
      for (std::size_t i = 0; i < cpu.slots.size(); ++i) {
        CAPTURE(i);
        check_close(cpu.slots[i], gpu.slots[i], 1e-3);
        CHECK(bitwise_equal(gpu.slots[i], again.slots[i]));
      }
      REQUIRE(cpu.losses.size() == gpu.losses.size());
      for (std::size_t e = 0; e < cpu.losses.size(); ++e) {
        CHECK(std::abs(cpu.losses[e] - gpu.losses[e]) < 1e-4 * std::max(1.0, cpu.losses[e]));
        // A prediction near a tie may go the other way on a GPU: at most one of 96 samples.
        CHECK(std::abs(cpu.accuracies[e] - gpu.accuracies[e]) <= 1.5 / 96);
        CHECK(gpu.losses[e] == again.losses[e]);
      }
    }
  }

  TEST_CASE("A CUDA training step of a softmax MLP with Adam makes no host_kernel call") {
    auto backend = CudaBackend::create(0);
    const Data data = images(64, 3);
    auto model = classifier_on(backend);
    const auto before = backend->host_kernel_calls();
    const auto history =
        model->fit(data.x, data.y, {.epochs = 2, .batch_size = 16, .verbose = 0, .seed = 1});
    CHECK(backend->host_kernel_calls() == before);
    CHECK(std::isfinite(history.history.at("loss").back()));
    // Binary cross-entropy from probabilities with the regression metrics: kernels too.
    Sequential binary{Input({8, 8, 1}), Flatten(), Dense(4, {.activation = "relu"}),
                      Dense(1, {.activation = "sigmoid"})};
    binary.compile({.optimizer = "adam",
                    .loss = "binary_crossentropy",
                    .metrics = {"mae", "mse"},
                    .backend = backend});
    Tensor<float> binary_labels({64, 1});
    for (std::size_t i = 0; i < 64; ++i)
      binary_labels.data()[i] = data.y(i) == 0 ? 1.0F : 0.0F;
    const auto binary_history =
        binary.fit(data.x, binary_labels, {.epochs = 1, .batch_size = 16, .verbose = 0});
    CHECK(backend->host_kernel_calls() == before);
    CHECK(binary_history.history.at("mae").back() > 0.0);
    // The count sees a host computation: a layer without a kernel (RepeatVector) stages.
    Sequential staged{Input({3}), RepeatVector(2), Flatten(), Dense(1)};
    staged.compile({.optimizer = "sgd", .loss = "mse", .backend = backend});
    static_cast<void>(staged.predict(Tensor<float>({2, 3}), {.verbose = 0}));
    CHECK(backend->host_kernel_calls() > before);
  }

#if defined(LOADSTAR_CUDA_EMULATED)
  TEST_CASE("A CUDA training step does not wait for the device: the logs wait when read") {
    auto backend = CudaBackend::create(0);
    const Data data = images(64, 3);
    auto model = classifier_on(backend);
    // The first epoch uploads the optimizer's table; the next two are the steady state.
    static_cast<void>(
        model->fit(data.x, data.y, {.epochs = 1, .batch_size = 16, .verbose = 0, .seed = 1}));
    const std::size_t before = loadstar::test::stream_syncs;
    loadstar::test::event_wait_lags.clear();
    static_cast<void>(
        model->fit(data.x, data.y,
                   {.epochs = 3, .batch_size = 16, .verbose = 0, .initial_epoch = 1, .seed = 1}));
    const std::size_t waits = loadstar::test::stream_syncs - before;
    MESSAGE("waits in 2 epochs of 4 steps: " << waits);
    CHECK(waits <= 2);  // one read-back of the losses and metrics per epoch, for its logs
    // Each upload waits only for the copy of `upload_slots` uploads before it (two per step): the
    // host may queue the next batches while the device computes.
    REQUIRE_FALSE(loadstar::test::event_wait_lags.empty());
    for (const std::size_t lag : loadstar::test::event_wait_lags)
      CHECK(lag >= loadstar::cuda::detail::Context::upload_slots);
  }

  TEST_CASE("A callback that reads the logs of every batch makes each step wait") {
    auto backend = CudaBackend::create(0);
    const Data data = images(64, 3);
    auto model = classifier_on(backend);
    FitOptions options{.epochs = 1, .batch_size = 16, .verbose = 0, .seed = 1};
    options.callbacks = {std::make_shared<callbacks::LambdaCallback>(
        callbacks::LambdaCallbackOptions{.on_batch_end = [](std::size_t, const Logs& logs) {
          CHECK(logs.get("loss").has_value());
        }})};
    const std::size_t before = loadstar::test::stream_syncs;
    static_cast<void>(model->fit(data.x, data.y, options));
    CHECK(loadstar::test::stream_syncs - before >= 4);
  }
#endif

  TEST_CASE("Logs read at every batch or only at the epoch's end are the same, bit for bit") {
    // The losses and metrics of steps nobody read are added in order when read: the same sums.
    const Data data = images(80, 5);
    const auto run = [&](bool read_every_batch) {
      auto model = classifier_on(CudaBackend::create(0));
      FitOptions options{.epochs = 3, .batch_size = 16, .verbose = 0, .seed = 7};
      std::vector<double> batch_losses;
      if (read_every_batch) {
        options.callbacks = {std::make_shared<callbacks::LambdaCallback>(
            callbacks::LambdaCallbackOptions{.on_batch_end = [&](std::size_t, const Logs& logs) {
              batch_losses.push_back(*logs.get("loss"));
            }})};
      }
      const auto history = model->fit(data.x, data.y, options);
      if (read_every_batch) CHECK(batch_losses.size() == 15);
      return history.history;
    };
    const auto deferred = run(false);
    const auto eager = run(true);
    REQUIRE(deferred.count("loss") == 1);
    REQUIRE(deferred.count("accuracy") == 1);
    CHECK(deferred.at("loss") == eager.at("loss"));
    CHECK(deferred.at("accuracy") == eager.at("accuracy"));
  }

  TEST_CASE("A label out of range in fit on the GPU raises ConfigError by the epoch's end") {
    Data data = images(64, 3);
    data.y(21) = 3;  // batch 1, row 5
    auto model = classifier_on(CudaBackend::create(0));
    const FitOptions options{.epochs = 2, .batch_size = 16, .verbose = 0, .shuffle = false};
    CHECK_THROWS_WITH_AS(
        static_cast<void>(model->fit(data.x, data.y, options)),
        doctest::Contains("batch 1 since the metrics were reset (its loss was computed on the "
                          "device and read after its step; rows counted within the batch): "
                          "sparse_categorical_crossentropy: label 3 at row 5 is outside [0, 3)"),
        ConfigError);
  }

  TEST_CASE("CudaBackend row_loss and mean_metric match the CPU losses and metrics") {
    Backends b;
    constexpr std::size_t rows = 21, classes = 5;
    Tensor<float> logits = random_tensor({rows, classes}, 31, 3.0F);
    Tensor<float> probabilities({rows, classes});
    b.cpu.softmax_forward(logits, probabilities, 1);
    Tensor<float> sparse({rows}), one_hot({rows, classes});
    for (std::size_t r = 0; r < rows; ++r) {
      sparse.data()[r] = static_cast<float>((r * 3 + 2) % classes);
      one_hot.data()[r * classes + (r * 3 + 2) % classes] = 1.0F;
    }
    Tensor<float> weight = random_tensor({rows}, 33);
    for (auto& w : weight.span())
      w = std::abs(w);
    struct Case {
      const char* name;
      std::function<std::shared_ptr<Loss>()> make;
      const Tensor<float>* y_true;
      const Tensor<float>* y_pred;
    };
    const Case cases[] = {
        {"sparse from logits",
         [] { return std::make_shared<losses::SparseCategoricalCrossentropy>(true); }, &sparse,
         &logits},
        {"sparse from probabilities",
         [] { return std::make_shared<losses::SparseCategoricalCrossentropy>(false); }, &sparse,
         &probabilities},
        {"categorical from logits",
         [] { return std::make_shared<losses::CategoricalCrossentropy>(true, 0.2); }, &one_hot,
         &logits},
        {"categorical from probabilities",
         [] { return std::make_shared<losses::CategoricalCrossentropy>(false); }, &one_hot,
         &probabilities},
        {"mean squared error",
         [] { return std::make_shared<losses::MeanSquaredError>(Reduction::sum); }, &one_hot,
         &logits},
        {"binary from logits",
         [] { return std::make_shared<losses::BinaryCrossentropy>(true, 0.1); }, &one_hot, &logits},
        {"binary from probabilities", [] { return std::make_shared<losses::BinaryCrossentropy>(); },
         &one_hot, &probabilities},
        {"mean absolute error", [] { return std::make_shared<losses::MeanAbsoluteError>(); },
         &one_hot, &logits},
        {"huber", [] { return std::make_shared<losses::Huber>(0.5); }, &one_hot, &logits},
        {"kl divergence", [] { return std::make_shared<losses::KLDivergence>(); }, &one_hot,
         &probabilities},
    };
    for (const auto& c : cases) {
      for (const bool weighted : {false, true}) {
        const std::string name = c.name;
        CAPTURE(name);
        CAPTURE(weighted);
        Tensor<float> gradient({rows, classes});
        const float expected =
            c.make()->compute(b.cpu, *c.y_true, *c.y_pred, weighted ? &weight : nullptr, gradient);
        const Tensor<float> device_gradient = b.gpu.allocate({rows, classes});
        const Tensor<float> device_weight = b.up(weight);
        const float actual =
            c.make()->compute(b.gpu, b.up(*c.y_true), b.up(*c.y_pred),
                              weighted ? &device_weight : nullptr, device_gradient);
        // In double on both sides; the device's exp and log may differ in the last bit.
        CHECK(std::abs(double(actual) - expected) <=
              1e-6 * std::max(1.0, std::abs(double(expected))));
        check_close(gradient, b.down(device_gradient), 1e-6);
      }
    }
    metrics::SparseCategoricalAccuracy cpu_accuracy, gpu_accuracy;
    metrics::Mean cpu_mean, gpu_mean;
    const Tensor<float> device_weight = b.up(weight);
    for (int batch = 0; batch < 2; ++batch) {
      cpu_accuracy.update_state(b.cpu, sparse, logits, nullptr);
      gpu_accuracy.update_state(b.gpu, b.up(sparse), b.up(logits), nullptr);
      cpu_mean.update_state(b.cpu, sparse, logits, &weight);
      gpu_mean.update_state(b.gpu, b.up(sparse), b.up(logits), &device_weight);
    }
    CHECK(gpu_accuracy.result() == cpu_accuracy.result());
    CHECK(cpu_accuracy.result() > 0.0);
    CHECK(std::abs(gpu_mean.result() - cpu_mean.result()) <= 1e-12);
    // The regression metrics, weighted.
    metrics::MeanSquaredError cpu_mse, gpu_mse;
    metrics::MeanAbsoluteError cpu_mae, gpu_mae;
    cpu_mse.update_state(b.cpu, one_hot, logits, &weight);
    gpu_mse.update_state(b.gpu, b.up(one_hot), b.up(logits), &device_weight);
    cpu_mae.update_state(b.cpu, one_hot, logits, &weight);
    gpu_mae.update_state(b.gpu, b.up(one_hot), b.up(logits), &device_weight);
    CHECK(gpu_mse.pending());  // read back when read
    CHECK(std::abs(gpu_mse.result() - cpu_mse.result()) <= 1e-12 * cpu_mse.result());
    CHECK(std::abs(gpu_mae.result() - cpu_mae.result()) <= 1e-12 * cpu_mae.result());
    CHECK(cpu_mae.result() > 0.0);
  }

  TEST_CASE("Sparse cross-entropy on the GPU reports a label out of range as on the CPU") {
    Backends b;
    const Tensor<float> labels({3}, {0, 2, 3});
    const Tensor<float> y_pred = random_tensor({3, 3}, 41);
    losses::SparseCategoricalCrossentropy loss(true);
    CHECK_THROWS_WITH_AS(
        static_cast<void>(loss.compute(b.cpu, labels, y_pred, nullptr, Tensor<float>())),
        "sparse_categorical_crossentropy: label 3 at row 2 is outside [0, 3)", ConfigError);
    CHECK_THROWS_WITH_AS(static_cast<void>(loss.compute(b.gpu, b.up(labels), b.up(y_pred), nullptr,
                                                        Tensor<float>())),
                         "sparse_categorical_crossentropy: label 3 at row 2 is outside [0, 3)",
                         ConfigError);
  }
}

namespace {

/// What a run with CUDA graphs on or off leaves: the weights, the history, the predictions and
/// the backend's step counts.
struct GraphRun {
  std::vector<Tensor<float>> weights;
  callbacks::History history;
  std::map<std::string, double> evaluation;
  Tensor<float> predictions;
  loadstar::cuda::GraphStats stats;
};

/// `epochs` epochs of `make`'s model on `samples` images in batches of 16 (the last partial when
/// `samples` is no multiple of 16), with Adam on a decaying learning rate, validation on 40
/// images in batches of 16, then an evaluation and a prediction, on a CUDA backend with graphs
/// on or off.
GraphRun train_with_graphs(const ModelFactory& make, bool graphs, std::size_t samples,
                           std::size_t epochs,
                           const std::function<void(Model&)>& between_epochs = {}) {
  auto backend = CudaBackend::create(0, loadstar::cuda::CudaOptions{.graphs = graphs});
  const Data data = images(samples, 7);
  const Data validation = images(40, 9);
  auto model = make();
  model->compile({.optimizer = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{
                      .learning_rate = optimizers::schedules::ExponentialDecay(0.01, 4, 0.8)}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"},
                  .backend = backend});
  GraphRun run;
  for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
    if (epoch > 0 && between_epochs) between_epochs(*model);
    FitOptions options{
        .epochs = epoch + 1, .batch_size = 16, .verbose = 0, .initial_epoch = epoch, .seed = 5};
    options.validation_data = {validation.x, validation.y};
    const auto more = model->fit(data.x, data.y, options);
    for (const auto& [key, series] : more.history)
      run.history.history[key].insert(run.history.history[key].end(), series.begin(), series.end());
  }
  for (const auto& [key, value] :
       model->evaluate(validation.x, validation.y, {.batch_size = 16, .verbose = 0}))
    run.evaluation[std::string(key)] = value;
  run.predictions = model->predict(images(24, 8).x, {.batch_size = 8, .verbose = 0});
  run.weights = model->get_weights();
  run.stats = backend->graph_stats();
  return run;
}

/// Two runs agree bit for bit.
void check_same_run(const GraphRun& eager, const GraphRun& graphs) {
  REQUIRE(eager.weights.size() == graphs.weights.size());
  for (std::size_t i = 0; i < eager.weights.size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(eager.weights[i], graphs.weights[i]));
  }
  CHECK(eager.history.history == graphs.history.history);
  CHECK(eager.evaluation == graphs.evaluation);
  CHECK(bitwise_equal(eager.predictions, graphs.predictions));
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("Steps replayed from CUDA graphs give the bits of steps launched kernel by kernel") {
    // The MLP has Dropout (its key changes every step) and Adam on a decaying learning rate (its
    // scalars change every step); the CNN has batch normalisation, pooling and concatenation.
    for (const auto& entry : {std::pair<const char*, ModelFactory>{"mlp", mlp},
                              std::pair<const char*, ModelFactory>{"cnn", cnn}}) {
      const char* const name = entry.first;
      CAPTURE(name);
      // 100 samples: 6 batches of 16 and one of 4 per epoch, each shape its own graph.
      const GraphRun eager = train_with_graphs(entry.second, false, 100, 3);
      const GraphRun graphs = train_with_graphs(entry.second, true, 100, 3);
      check_same_run(eager, graphs);
      CHECK(eager.stats.captured == 0);
      CHECK(eager.stats.replayed == 0);
      // Training: 18 steps of 16 rows and 3 of 4; validation (3 epochs) and evaluation: 8 steps
      // of 16 rows and 4 of 8; prediction: 3 steps of 8 rows. Each shape's first step runs
      // kernel by kernel, its second is captured, the others replay its graph.
      const auto& s = graphs.stats;
      INFO("last fallback: " << s.last_fallback);
      CHECK(s.fallbacks == 0);
      CHECK(s.eager == 5);
      CHECK(s.captured == 5);
      CHECK(s.replayed == (18 - 2) + (3 - 2) + (8 - 2) + (4 - 2) + (3 - 2));
    }
  }

  TEST_CASE("A step whose buffers change is captured again, and gives the same bits") {
    // A new optimizer between epochs: new slot variables, so the optimizer's step reads other
    // buffers than the graph holds; the step is captured again.
    const auto swap_optimizer = [](Model& model) {
      model.set_optimizer(std::make_shared<optimizers::SGD>(
          optimizers::SGDOptions{.learning_rate = 0.05, .momentum = 0.9}));
    };
    const GraphRun eager = train_with_graphs(mlp, false, 96, 2, swap_optimizer);
    const GraphRun graphs = train_with_graphs(mlp, true, 96, 2, swap_optimizer);
    check_same_run(eager, graphs);
    // The new optimizer's first step allocates its slots: that step runs kernel by kernel, the
    // next one is captured.
    CHECK(graphs.stats.fallbacks == 1);
    CHECK(graphs.stats.last_fallback == "an allocation of a float32 tensor of shape (64, 32)");
    // Training before and after the swap (its step reads the new optimizer's table), validation
    // of 16 and of 8 rows, prediction.
    CHECK(graphs.stats.captured == 5);
  }

  TEST_CASE("A step that computes on the host runs kernel by kernel, then is no longer recorded") {
    // RepeatVector has no kernel: its step stages tensors through the host, which a graph cannot
    // hold.
    const ModelFactory staged = [] {
      set_random_seed(14);
      return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
          Input({8, 8, 1}), Flatten(), Dense(8, {.activation = "relu"}), RepeatVector(2), Flatten(),
          Dense(3)});
    };
    const GraphRun eager = train_with_graphs(staged, false, 96, 2);
    const GraphRun graphs = train_with_graphs(staged, true, 96, 2);
    check_same_run(eager, graphs);
    CHECK(graphs.stats.captured == 0);
    CHECK(graphs.stats.replayed == 0);
    // Four shapes (training's 16 rows, validation's 16 and 8, prediction's 8): each is recorded
    // twice, falls back twice, and runs unrecorded from then on.
    CHECK(graphs.stats.fallbacks == 2 * 4);
    CHECK(graphs.stats.last_fallback == "a host computation (host_kernel)");
  }
}

#if defined(LOADSTAR_CUDA_EMULATED)
namespace loadstar::test {
extern std::size_t direct_operations;  // emulated_cuda.cpp
extern std::size_t graph_launches;     // emulated_cuda.cpp
}  // namespace loadstar::test

TEST_SUITE("cuda") {
  TEST_CASE("A replayed training step launches one graph and no kernel of its own") {
    auto backend = CudaBackend::create(0);
    const Data data = images(16, 3);
    auto model = classifier_on(backend);
    const auto step = [&] {
      const std::size_t operations = loadstar::test::direct_operations;
      const std::size_t launches = loadstar::test::graph_launches;
      const double loss = *model->train_step(std::pair{data.x, data.y}).get("loss");
      CHECK(std::isfinite(loss));
      return std::pair{loadstar::test::direct_operations - operations,
                       loadstar::test::graph_launches - launches};
    };
    const auto [first_operations, first_launches] = step();  // kernel by kernel
    CHECK(first_launches == 0);
    const auto [second_operations, second_launches] = step();  // captured, then launched
    CHECK(second_launches == 1);
    const auto [third_operations, third_launches] = step();  // replayed
    CHECK(third_launches == 1);
    // Outside the graph: the batch's two uploads, the step's scalars and the copy of its loss
    // and metric results into the result ring (and the read-back of the loss).
    MESSAGE("stream operations: " << first_operations << " kernel by kernel, " << third_operations
                                  << " replayed");
    CHECK(third_operations <= 5);
    CHECK(first_operations > third_operations + 5);
    CHECK(backend->graph_stats().replayed == 1);
  }
}
#endif

TEST_SUITE("cuda") {
  TEST_CASE("A recorded step that throws queues what it had recorded, and training goes on") {
    // The third step's labels have the wrong shape: its loss throws after its forward pass was
    // recorded. That work is queued kernel by kernel, the error reaches the caller, and later
    // steps train as they do without graphs.
    const Data data = images(16, 3);
    const Tensor<float> wrong_labels({16, 5});
    const auto run = [&](bool graphs) {
      auto backend = CudaBackend::create(0, loadstar::cuda::CudaOptions{.graphs = graphs});
      auto model = classifier_on(backend);
      std::vector<double> losses;
      for (int step = 0; step < 6; ++step) {
        if (step == 2) {
          CHECK_THROWS_AS(model->train_step(std::pair{data.x, wrong_labels}), ShapeError);
          continue;
        }
        losses.push_back(*model->train_step(std::pair{data.x, data.y}).get("loss"));
      }
      if (graphs) {
        // The throwing step had been recorded (its shape's third), so its work was queued when
        // it was abandoned.
        CHECK(backend->graph_stats().fallbacks == 1);
        CHECK(backend->graph_stats().last_fallback == "an exception");
      }
      return std::pair{losses, model->get_weights()};
    };
    const auto [eager_losses, eager_weights] = run(false);
    const auto [graph_losses, graph_weights] = run(true);
    CHECK(eager_losses == graph_losses);
    REQUIRE(eager_weights.size() == graph_weights.size());
    for (std::size_t i = 0; i < eager_weights.size(); ++i)
      CHECK(bitwise_equal(eager_weights[i], graph_weights[i]));
  }
}

namespace {

/// `make`'s model trained 3 epochs on `(x, y)` in batches of 8 (`seed` shuffles), with Adam and
/// sparse cross-entropy from logits, then predicting `x`, on CUDA backends with graphs and
/// without, and on the CPU: no step stages tensors through the host, the graphs' `train_steps`
/// and `predict_steps` (each shape captured once, replayed after) give the bits of the steps run
/// kernel by kernel, and the CPU's losses, weights and predictions agree.
void check_device_alone(const ModelFactory& make, const Tensor<float>& x, const Tensor<float>& y,
                        std::uint64_t seed, std::size_t train_steps, std::size_t predict_steps) {
  std::vector<std::vector<Tensor<float>>> weights;
  std::vector<std::vector<double>> losses;
  std::vector<Tensor<float>> predictions;
  const FitOptions options{.epochs = 3, .batch_size = 8, .verbose = 0, .seed = seed};
  const auto train = [&](std::shared_ptr<Backend> backend) {
    auto model = make();
    model->compile({.optimizer = "adam",
                    .loss = losses::SparseCategoricalCrossentropy(true),
                    .backend = std::move(backend)});
    losses.push_back(model->fit(x, y, options).history.at("loss"));
    weights.push_back(model->get_weights());
    predictions.push_back(model->predict(x, {.batch_size = 8, .verbose = 0}));
  };
  for (const bool graphs : {false, true}) {
    auto backend = CudaBackend::create(0, loadstar::cuda::CudaOptions{.graphs = graphs});
    train(backend);
    CHECK(backend->host_kernel_calls() == 0);
    if (!graphs) continue;
    const auto& stats = backend->graph_stats();
    INFO("last fallback: " << stats.last_fallback);
    CHECK(stats.fallbacks == 0);
    CHECK(stats.captured == 2);
    CHECK(stats.replayed == (train_steps - 2) + (predict_steps - 2));
  }
  CHECK(losses[0] == losses[1]);
  for (std::size_t i = 0; i < weights[0].size(); ++i) {
    CAPTURE(i);
    CHECK(bitwise_equal(weights[0][i], weights[1][i]));
  }
  CHECK(bitwise_equal(predictions[0], predictions[1]));
  train(cpu_backend(1));
  for (std::size_t i = 0; i < losses[0].size(); ++i)
    CHECK(losses[0][i] == doctest::Approx(losses[2][i]).epsilon(1e-5));
  for (std::size_t i = 0; i < weights[2].size(); ++i) {
    CAPTURE(i);
    check_close(weights[2][i], weights[0][i], 1e-4);
  }
  check_close(predictions[2], predictions[0], 1e-4);
}

}  // namespace

TEST_SUITE("cuda") {
  TEST_CASE("Models that share a CUDA backend replay graphs of their own") {
    // Two models trained by turns on one backend, one step each at a time: each model's steps
    // replay its own graph, with the bits of steps launched kernel by kernel.
    const Data data = images(16, 3);
    const auto run = [&](bool graphs) {
      auto backend = CudaBackend::create(0, loadstar::cuda::CudaOptions{.graphs = graphs});
      auto first = classifier_on(backend);
      auto second = classifier_on(backend);
      std::vector<double> losses;
      for (int step = 0; step < 5; ++step) {
        for (auto* model : {first.get(), second.get()})
          losses.push_back(*model->train_step(std::pair{data.x, data.y}).get("loss"));
      }
      if (graphs) {
        const auto& s = backend->graph_stats();
        CHECK(s.fallbacks == 0);
        CHECK(s.captured == 2);
        CHECK(s.replayed == 2 * 3);
      }
      return losses;
    };
    CHECK(run(false) == run(true));
  }

  TEST_CASE("A CUDA backend that trains model after model keeps graphs of the recent ones") {
    auto backend = CudaBackend::create(0);
    const Data data = images(16, 3);
    for (int m = 0; m < 70; ++m) {
      auto model = classifier_on(backend);
      for (int step = 0; step < 3; ++step)
        static_cast<void>(model->train_step(std::pair{data.x, data.y}));
    }
    // Every model's second step is captured and its third replayed, the oldest shapes forgotten.
    CHECK(backend->graph_stats().captured == 70);
    CHECK(backend->graph_stats().replayed == 70);
    CHECK(backend->graph_stats().fallbacks == 0);
  }

  TEST_CASE("The issue 34 layers match the PyTorch reference values on the CUDA backend") {
    // tests/keras/generate_layers_34.py: cropping, padding and up-sampling of 1 to 3 axes, PReLU,
    // ELU, ThresholdedReLU, ReLU, Dot, UnitNormalization, Rescaling and GroupNormalization, with
    // their inputs, weights and gradients in device memory.
    Backends b;
    const auto reference = layer_cases::load("layers_34.json");
    REQUIRE_FALSE(reference["cases"].empty());
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
  }

  TEST_CASE("A model of the issue 34 layers trains on the CUDA backend as on the CPU") {
    const auto make = [] {
      set_random_seed(34);
      auto in = Input({6, 6, 2});
      auto h = call(ZeroPadding2D(1), in);
      h = call(Cropping2D({{{1, 0}, {0, 1}}}), h);
      h = call(Conv2D(4, 3, {.activation = "linear"}), h);
      h = call(PReLU({.shared_axes = {1, 2}}), h);
      h = call(GroupNormalization({.groups = 2}), h);
      h = call(UpSampling2D(2), h);
      h = call(Flatten(), h);
      h = call(Dense(3), h);
      return std::make_shared<Model>(in, call(ELU({.alpha = 0.5F}), h));
    };
    const Tensor<float> x = random_tensor({8, 6, 6, 2}, 41);
    const Tensor<float> y = random_tensor({8, 3}, 42);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("Normalization Resizing and CenterCrop match the PyTorch reference values on CUDA") {
    // tests/keras/generate_preprocessing_34.py, with inputs, statistics and gradients in device
    // memory.
    Backends b;
    // Held in a variable: a range-for over a member of a temporary would read freed memory.
    const auto reference = layer_cases::load("preprocessing_34.json");
    REQUIRE(reference["cases"].size() == 37);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
  }

  TEST_CASE("A model behind Normalization Resizing and CenterCrop trains on CUDA as on the CPU") {
    const auto make = [] {
      set_random_seed(35);
      auto in = Input({5, 7, 2});
      auto h = call(Normalization(), in);
      h = call(Normalization({.mean = {0.5, -0.5}, .variance = {2.0, 0.5}}), h);
      h = call(Resizing(9, 8), h);
      h = call(CenterCrop(6, 6), h);
      h = call(Resizing(8, 8, {.interpolation = "nearest", .crop_to_aspect_ratio = true}), h);
      h = call(Conv2D(3, 3, {.activation = "linear"}), h);
      h = call(Flatten(), h);
      return std::make_shared<Model>(in, call(Dense(3), h));
    };
    const Tensor<float> x = random_tensor({8, 5, 7, 2}, 43);
    const Tensor<float> y = random_tensor({8, 3}, 44);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("The recurrent layers match the PyTorch reference values on the CUDA backend") {
    // tests/keras/generate_recurrent.py: SimpleRNN, LSTM, GRU (reset_after true and false) and
    // Bidirectional over 1 to 5 steps in both directions, with their inputs, weights and
    // gradients in device memory.
    Backends b;
    // Held in a variable: a range-for over a member of a temporary would read freed memory.
    const auto reference = layer_cases::load("recurrent.json");
    REQUIRE(reference["cases"].size() == 93);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
  }

  TEST_CASE("A model of recurrent layers trains on the CUDA backend as on the CPU") {
    const auto make = [] {
      set_random_seed(33);
      auto in = Input({5, 3});
      auto h = call(LSTM(4, {.return_sequences = true}), in);
      h = call(Bidirectional(GRU(3, {.return_sequences = true}), MergeMode::ave), h);
      h = call(SimpleRNN(2, {.go_backwards = true}), h);
      return std::make_shared<Model>(in, call(Dense(2), h));
    };
    const Tensor<float> x = random_tensor({6, 5, 3}, 43);
    const Tensor<float> y = random_tensor({6, 2}, 44);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("Recurrent models train on the device alone and replay their steps from CUDA graphs") {
    // Sequences with padding at the end: float steps of zeros (Masking's mask) or token ids of 0
    // (Embedding's). The LSTM's dropout masks change every step (a step scalar); the GRU without
    // reset_after and go_backwards; Bidirectional's merges; the stacked cells reading the
    // reversed mask; GlobalAveragePooling1D over the mask.
    Tensor<float> tokens({24, 7}), steps({24, 7, 3}), y({24});
    for (std::size_t r = 0; r < 24; ++r) {
      const std::size_t length = 2 + r % 6;
      for (std::size_t s = 0; s < 7; ++s) {
        tokens.data()[r * 7 + s] = s < length ? static_cast<float>(1 + (r * 5 + s * 3) % 11) : 0.0F;
        for (std::size_t f = 0; f < 3; ++f)
          steps.data()[(r * 7 + s) * 3 + f] =
              s < length ? static_cast<float>((r * 7 + s * 3 + f * 5) % 13) / 13.0F - 0.4F : 0.0F;
      }
      y.data()[r] = static_cast<float>(r % 3);
    }
    const auto make = [](int variant) {
      return [variant] {
        set_random_seed(41);
        auto in = Input(variant == 0 ? Shape{7, 3} : Shape{7});
        auto h =
            variant == 0 ? call(Masking(), in) : call(Embedding(12, 4, {.mask_zero = true}), in);
        if (variant == 0) {
          h = call(Bidirectional(LSTM(5, {.return_sequences = true,
                                          .dropout = 0.25,
                                          .recurrent_dropout = 0.2,
                                          .seed = 3})),
                   h);
          h = call(GRU(4, {.reset_after = false, .return_sequences = true, .go_backwards = true}),
                   h);
          h = call(Bidirectional(SimpleRNN(3, {.return_sequences = true}), MergeMode::mul), h);
          h = call(
              Bidirectional(GRU(3, {.dropout = 0.1, .recurrent_dropout = 0.1}), MergeMode::ave), h);
        } else {
          h = call(StackedRNN({{.kind = CellKind::lstm, .units = 4},
                               {.kind = CellKind::gru, .units = 3},
                               {.kind = CellKind::simple_rnn, .units = 3}},
                              {.return_sequences = true, .go_backwards = true}),
                   h);
          h = call(Bidirectional(LSTM(3, {.return_sequences = true}), MergeMode::sum), h);
          h = call(GlobalAveragePooling1D(), h);
        }
        return std::make_shared<Model>(in, call(Dense(3), h));
      };
    };
    for (const int variant : {0, 1}) {
      CAPTURE(variant);
      // Training's batches of 8 (9 steps) and prediction's (3), each shape captured once.
      check_device_alone(make(variant), variant == 0 ? steps : tokens, y, 2, 9, 3);
    }
  }

  TEST_CASE("The shape activation and normalization layers of issue 34 train on the device alone") {
    // Padding, cropping and nearest up-sampling of 1 to 3 axes (channels_first among them), ELU,
    // ThresholdedReLU, PReLU with and without shared axes, Rescaling and UnitNormalization over
    // the last axis and over two, forward and backward on the CUDA backend's own kernels.
    const auto make = [](int variant) {
      return [variant] {
        set_random_seed(43);
        if (variant == 0) {
          auto in = Input({6, 6, 2});
          auto h = call(ZeroPadding2D({0, 1, 1, 0}), in);
          h = call(Cropping2D({{{1, 0}, {0, 1}}}), h);
          h = call(Conv2D(3, 3, {.activation = "linear"}), h);
          h = call(PReLU({.alpha_initializer = Initializer::constant(0.2F), .shared_axes = {1, 2}}),
                   h);
          h = call(UpSampling2D({2, 1}), h);
          h = call(ELU({.alpha = 0.5F}), h);
          h = call(ThresholdedReLU({.theta = 0.05F}), h);
          h = call(Rescaling(0.5F, {.offset = 0.1F}), h);
          h = call(UnitNormalization({.axis = {1, 3}}), h);
          return std::make_shared<Model>(in, call(Dense(3), call(Flatten(), h)));
        }
        if (variant == 1) {
          auto in = Input({6, 2});
          auto h = call(ZeroPadding1D({1, 2}), in);
          h = call(Cropping1D({2, 0}), h);
          h = call(UpSampling1D(2), h);
          h = call(PReLU({.alpha_initializer = Initializer::constant(0.1F)}), h);
          h = call(UnitNormalization(), h);
          return std::make_shared<Model>(in, call(Dense(3), call(Flatten(), h)));
        }
        auto in = Input({2, 3, 4, 2});
        auto h =
            call(ZeroPadding3D({{{1, 0}, {0, 1}, {1, 1}}}, {.data_format = "channels_first"}), in);
        h = call(Cropping3D({{{0, 1}, {1, 0}, {0, 2}}}), h);
        h = call(UpSampling3D({1, 2, 2}, {.data_format = "channels_first"}), h);
        h = call(PReLU({.alpha_initializer = Initializer::constant(0.3F), .shared_axes = {1, 3}}),
                 h);
        return std::make_shared<Model>(in, call(Dense(3), call(Flatten(), h)));
      };
    };
    const std::array<Shape, 3> shapes{Shape{24, 6, 6, 2}, Shape{24, 6, 2}, Shape{24, 2, 3, 4, 2}};
    Tensor<float> y({24});
    for (std::size_t r = 0; r < 24; ++r)
      y.data()[r] = static_cast<float>(r % 3);
    for (const int variant : {0, 1, 2}) {
      CAPTURE(variant);
      const Tensor<float> x = random_tensor(shapes[variant], 50 + variant);
      check_device_alone(make(variant), x, y, 4, 9, 3);
    }
  }

  TEST_CASE("The noise layers and Dropout with a noise_shape train on the device alone") {
    // Each step draws new noise from its key, a step scalar of the replayed graphs: GaussianNoise,
    // SpatialDropout2D (channels_last and channels_first), GaussianDropout, Dropout with a
    // noise_shape shared over the batch and over axes, AlphaDropout with and without one.
    const auto make = [] {
      set_random_seed(44);
      auto in = Input({5, 5, 2});
      auto h = call(GaussianNoise(0.1F, {.seed = 3}), in);
      h = call(Conv2D(4, 3, {.activation = "linear"}), h);
      h = call(SpatialDropout2D(0.3, {.seed = 4}), h);
      h = call(SpatialDropout2D(0.2, {.data_format = "channels_first", .seed = 5}), h);
      h = call(GaussianDropout(0.2, {.seed = 6}), h);
      h = call(Dropout(0.25, {.noise_shape = nlohmann::json::array({nullptr, 1, 3, 4})}), h);
      h = call(Dropout(0.2, {.noise_shape = nlohmann::json::array({1, nullptr, 1, nullptr})}), h);
      h = call(AlphaDropout(0.2, {.noise_shape = nlohmann::json::array({nullptr, 3, 1, 1})}), h);
      h = call(Flatten(), h);
      h = call(AlphaDropout(0.1, {.seed = 7}), h);
      return std::make_shared<Model>(in, call(Dense(3), h));
    };
    Tensor<float> y({24});
    for (std::size_t r = 0; r < 24; ++r)
      y.data()[r] = static_cast<float>(r % 3);
    check_device_alone(make, random_tensor({24, 5, 5, 2}, 53), y, 6, 9, 3);
  }

  TEST_CASE("LayerNormalization over its trailing axes trains on the device as on the CPU") {
    // Over the last axis, over the last two, without scale or center; the axes before them of
    // any length.
    const auto make = [] {
      set_random_seed(43);
      auto in = Input({5, 4, 3});
      auto h = call(LayerNormalization(), in);
      h = call(LayerNormalization({.axis = {-2, -1}, .epsilon = 1e-2F}), h);
      h = call(Dense(6), h);
      h = call(LayerNormalization({.center = false}), h);
      h = call(LayerNormalization({.scale = false}), h);
      return std::make_shared<Model>(in, call(Dense(2), call(Flatten(), h)));
    };
    const Tensor<float> x = random_tensor({6, 5, 4, 3}, 45);
    const Tensor<float> y = random_tensor({6, 2}, 46);
    check_trains_as_on_cpu(make, x, y);
    auto backend = CudaBackend::create(0);
    auto model = make();
    model->compile({.optimizer = "adam", .loss = "mse", .backend = backend});
    CHECK(std::isfinite(*model->train_on_batch(x, y).get("loss")));
    CHECK(backend->host_kernel_calls() == 0);
  }

  TEST_CASE("The issue 34 convolutions match the PyTorch reference values on CUDA") {
    // tests/keras/generate_conv_34.py: DepthwiseConv1D/2D, SeparableConv1D/2D and
    // Conv1DTranspose/Conv2DTranspose, and Conv1D/Conv2D with groups, with strides, dilation,
    // valid, same and causal padding,
    // output padding, depth multipliers and both data formats, with their inputs, weights and
    // gradients in device memory.
    Backends b;
    // Held in a variable: a range-for over a member of a temporary would read freed memory.
    const auto reference = layer_cases::load("conv_34.json");
    REQUIRE(reference["cases"].size() == 47);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
  }

  TEST_CASE("A model of the issue 34 convolutions trains on CUDA as on the CPU") {
    const auto make = [] {
      set_random_seed(35);
      auto in = Input({6, 6, 3});
      auto h = call(Conv2D(6, 3, {.padding = "same", .groups = 3}), in);
      h = call(DepthwiseConv2D(3, {.padding = "same", .depth_multiplier = 2}), h);
      h = call(SeparableConv2D(4, 3, {.strides = 2, .padding = "same", .activation = "relu"}), h);
      h = call(DepthwiseConv2D(2, {.data_format = "channels_first", .activation = "tanh"}), h);
      h = call(Reshape({2, 9}), h);
      h = call(SeparableConv1D(3, 2, {.padding = "causal", .activation = "swish"}), h);
      h = call(DepthwiseConv1D(2), h);
      h = call(Conv1DTranspose(2, 2, {.strides = 2, .padding = "same"}), h);
      h = call(Conv2DTranspose(2, 3, {.strides = 2, .output_padding = Size2(1, 0)}),
               call(Reshape({2, 1, 2}), h));
      h = call(Flatten(), h);
      return std::make_shared<Model>(in, call(Dense(2), h));
    };
    const Tensor<float> x = random_tensor({8, 6, 6, 3}, 43);
    const Tensor<float> y = random_tensor({8, 2}, 44);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("Grouped convolutions train on the device alone and replay their steps from graphs") {
    // Conv2D with 2 and 4 groups (ReLU, channels_first with dilation) and Conv1D with 2
    // (causal, swish, no bias), convolved group by group on the device: no host_kernel call, the
    // CPU's values.
    Tensor<float> x = random_tensor({24, 6, 6, 4}, 47), y({24});
    for (std::size_t r = 0; r < 24; ++r)
      y.data()[r] = static_cast<float>(r % 3);
    const auto make = [] {
      set_random_seed(47);
      auto in = Input({6, 6, 4});
      auto h = call(Conv2D(8, 3, {.padding = "same", .groups = 2, .activation = "relu"}), in);
      h = call(Conv2D(8, 2,
                      {.data_format = "channels_first",
                       .dilation_rate = 2,
                       .groups = 4,
                       .activation = "tanh"}),
               call(Permute({3, 1, 2}), h));
      h = call(Reshape({8, 16}), h);
      h = call(Conv1D(6, 2,
                      {.padding = "causal", .groups = 2, .activation = "swish", .use_bias = false}),
               h);
      h = call(GlobalAveragePooling1D(), h);
      return std::make_shared<Model>(in, call(Dense(3), h));
    };
    check_device_alone(make, x, y, 3, 9, 3);
  }

  TEST_CASE("A model of the 3-D convolutions and poolings trains on CUDA as on the CPU") {
    const auto make = [] {
      set_random_seed(37);
      auto in = Input({4, 4, 4, 2});
      auto h = call(Conv3D(3, {2, 2, 2}, {.padding = "same", .activation = "relu"}), in);
      h = call(
          Conv3DTranspose(2, {2, 1, 2}, {.strides = {2, 1, 1}, .data_format = "channels_first"}),
          h);
      h = call(MaxPooling3D({.pool_size = {2, 2, 1}}), h);
      h = call(
          AveragePooling3D({.pool_size = {2, 2, 2}, .strides = Size3{1, 1, 2}, .padding = "same"}),
          h);
      auto pooled = call(GlobalMaxPooling3D(), h);
      auto averaged = call(GlobalAveragePooling3D(), h);
      return std::make_shared<Model>(
          in, call(Dense(2), call(Concatenate(), std::vector{pooled, averaged})));
    };
    const Tensor<float> x = random_tensor({8, 4, 4, 4, 2}, 45);
    const Tensor<float> y = random_tensor({8, 2}, 46);
    check_trains_as_on_cpu(make, x, y);
  }
}

TEST_SUITE("cuda") {
  TEST_CASE("Adafactor and moving averages of the weights train on the GPU as on the CPU") {
    // Adafactor's step reads whole variables and the moving averages are a host step: both run
    // through host_kernel on the device's tensors, and must match the CPU.
    namespace o = optimizers;
    const std::vector<Tensor<float>> initial = softmax_mlp()->get_weights();
    const std::vector<OptimizerCase> cases = {
        {"Adafactor with weight_decay",
         [] {
           return std::make_shared<o::Adafactor>(
               o::AdafactorOptions{.learning_rate = 1e-2, .weight_decay = 0.01});
         }},
        {"Adam with use_ema",
         [] {
           return std::make_shared<o::Adam>(o::AdamOptions{.learning_rate = 1e-3,
                                                           .use_ema = true,
                                                           .ema_momentum = 0.9,
                                                           .ema_overwrite_frequency = 5});
         }},
    };
    for (const auto& c : cases) {
      const std::string name = c.name;
      CAPTURE(name);
      const StepRun cpu = train_steps(softmax_mlp, initial, c.make, cpu_backend(1));
      const StepRun gpu = train_steps(softmax_mlp, initial, c.make, keras::cuda_backend(0));
      REQUIRE(cpu.weights.size() == gpu.weights.size());
      REQUIRE(cpu.slots.size() == gpu.slots.size());
      for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
        CAPTURE(i);
        check_close(cpu.weights[i], gpu.weights[i], 1e-3);
        // The weights moved from the start.
        CHECK_FALSE(bitwise_equal(cpu.weights[i], initial[i]));
      }
      for (std::size_t i = 0; i < cpu.slots.size(); ++i) {
        CAPTURE(i);
        check_close(cpu.slots[i], gpu.slots[i], 1e-3);
      }
    }
  }

  TEST_CASE("fit ends with the moving averages of the weights with use_ema on the GPU") {
    auto optimizer = std::make_shared<optimizers::SGD>(
        optimizers::SGDOptions{.learning_rate = 0.05, .use_ema = true, .ema_momentum = 0.5});
    const std::vector<Tensor<float>> initial = softmax_mlp()->get_weights();
    auto backend = keras::cuda_backend(0);
    const StepRun run = train_steps(
        softmax_mlp, initial, [&] { return std::shared_ptr<Optimizer>(optimizer); }, backend);
    // The averages are the optimizer's last slots, one per weight, and fit copied them in.
    REQUIRE(run.slots.size() == run.weights.size());
    for (std::size_t i = 0; i < run.weights.size(); ++i) {
      CAPTURE(i);
      CHECK(bitwise_equal(run.weights[i], run.slots[i]));
    }
  }

  TEST_CASE("Penalties and constraints train on the CUDA backend as the PyTorch reference") {
    // tests/keras/generate_regularizers_34.py: weight and activity penalties in the loss of
    // training and evaluation, their gradients, and constraints after each SGD step, computed
    // inside the step on the device's tensors.
    const nlohmann::json reference = layer_cases::load("regularizers_34.json")["training"];
    const auto values = [](const nlohmann::json& v, Shape shape) {
      const auto floats = v.get<std::vector<float>>();
      return Tensor<float>(shape, std::span<const float>(floats));
    };
    const auto make = [&] {
      auto in = Input({4});
      auto first = std::make_shared<Dense>(3, DenseOptions{.activation = "tanh"});
      first->set_regularizer("kernel", std::make_shared<regularizers::L2>(0.05));
      first->set_regularizer("bias", std::make_shared<regularizers::L1>(0.02));
      first->set_activity_regularizer(std::make_shared<regularizers::L1L2>(0.01, 0.03));
      first->set_constraint("kernel", std::make_shared<constraints::MaxNorm>(0.8));
      auto second = std::make_shared<Dense>(2);
      second->set_regularizer(
          "kernel", std::make_shared<regularizers::OrthogonalRegularizer>(0.1, "columns"));
      second->set_constraint("bias", std::make_shared<constraints::NonNeg>());
      auto h = call(ActivityRegularization(0.02, 0.01), call(first, in));
      auto model = std::make_shared<Model>(in, call(second, h));
      const nlohmann::json& w = reference["initial"];
      model->set_weights({values(w["k1"], {4, 3}), values(w["b1"], {3}), values(w["k2"], {3, 2}),
                          values(w["b2"], {2})});
      return model;
    };
    const Tensor<float> x = values(reference["x"], {5, 4}), y = values(reference["y"], {5, 2});
    auto model = make();
    model->compile({.optimizer = std::make_shared<optimizers::SGD>(
                        optimizers::SGDOptions{.learning_rate = 0.1}),
                    .loss = "mse",
                    .backend = keras::cuda_backend(0)});
    for (std::size_t step = 0; step < 2; ++step) {
      CAPTURE(step);
      const Logs logs = model->train_on_batch(x, y);
      CHECK(*logs.get("loss") ==
            doctest::Approx(reference["steps"][step]["loss"].get<double>()).epsilon(1e-5));
      const auto weights = model->get_weights();
      const nlohmann::json& target = reference["steps"][step]["weights"];
      check_close(values(target["k1"], {4, 3}), weights[0], 1e-4);
      check_close(values(target["b1"], {3}), weights[1], 1e-4);
      check_close(values(target["k2"], {3, 2}), weights[2], 1e-4);
      check_close(values(target["b2"], {2}), weights[3], 1e-4);
    }
    const Logs evaluated = model->evaluate(values(reference["x_eval"], {3, 4}),
                                           values(reference["y_eval"], {3, 2}), {.verbose = 0});
    CHECK(*evaluated.get("loss") ==
          doctest::Approx(reference["evaluate_loss"].get<double>()).epsilon(1e-5));
  }

  TEST_CASE("AlphaDropout and Dropout with a noise_shape train on the CUDA backend as on the CPU") {
    const auto make = [] {
      set_random_seed(35);
      auto in = Input({3, 4});
      auto h = call(
          Dropout(0.3, {.noise_shape = nlohmann::json::array({nullptr, 1, 4}), .seed = 5}), in);
      h = call(AlphaDropout(0.2, {.seed = 6}), h);
      h = call(Flatten(), h);
      return std::make_shared<Model>(in, call(Dense(2), h));
    };
    const Tensor<float> x = random_tensor({6, 3, 4}, 51);
    const Tensor<float> y = random_tensor({6, 2}, 52);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("An activity penalty on a ReLU Dense layer keeps its gradient out of the fused path") {
    // A Dense ReLU layer followed by a Dense layer carries its ReLU gradient through the next
    // layer's epilogue on the GPU; an activity regularizer adds to that layer's output gradient,
    // so the pair is not fused, and the GPU trains as the CPU.
    const auto make = [] {
      set_random_seed(36);
      auto in = Input({6});
      auto hidden = std::make_shared<Dense>(8, DenseOptions{.activation = "relu"});
      hidden->set_activity_regularizer(std::make_shared<regularizers::L2>(0.5));
      return std::make_shared<Model>(in, call(Dense(3), call(hidden, in)));
    };
    const Tensor<float> x = random_tensor({10, 6}, 61);
    const Tensor<float> y = random_tensor({10, 3}, 62);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("TimeDistributed matches PyTorch and trains on the CUDA backend as on the CPU") {
    // tests/keras/generate_time_distributed.py: Dense, Conv2D and Flatten applied step by step.
    Backends b;
    const auto reference = layer_cases::load("time_distributed.json");
    REQUIRE(reference["cases"].size() == 4);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
    const auto make = [] {
      set_random_seed(37);
      auto in = Input({4, 3, 3, 2});
      auto h = call(TimeDistributed(Conv2D(3, 2, {.activation = "relu"})), in);
      h = call(TimeDistributed(Flatten()), h);
      h = call(LSTM(3), call(TimeDistributed(Dense(4, {.activation = "tanh"})), h));
      return std::make_shared<Model>(in, call(Dense(2), h));
    };
    const Tensor<float> x = random_tensor({6, 4, 3, 3, 2}, 71);
    const Tensor<float> y = random_tensor({6, 2}, 72);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("Text models on Input(None) train on batches of any length as PyTorch on CUDA") {
    // tests/keras/generate_unknown_axes.py: each length settles the model's shapes again, and the
    // CUDA backend records one step graph per length.
    auto cases = unknown_axes_cases::all_cases();
    for (const auto& c : unknown_axes_cases::nested_cases())
      cases.push_back(c);  // again with part of the model nested
    for (const auto& c : cases) {
      auto model = c.make();
      unknown_axes_cases::check_training(*model, unknown_axes_cases::case_named(c.name), c.loss,
                                         keras::cuda_backend(0));
    }
  }

  TEST_CASE("A fully convolutional model trains on images of any size as PyTorch on CUDA") {
    // tests/keras/generate_unknown_spatial.py: each image size settles the convolutions' geometry
    // again, and the CUDA backend records one step graph per size.
    auto model = unknown_spatial_cases::fully_convolutional();
    unknown_spatial_cases::check_training(*model, keras::cuda_backend(0));
  }

  TEST_CASE("A model with a nested model trains on the CUDA backend as on the CPU") {
    // A nested Sequential (Dense, BatchNormalization, Dense) called on a tensor, and a frozen
    // nested model whose BatchNormalization normalizes with its moving statistics.
    const auto make = [] {
      set_random_seed(37);
      auto base = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
          Input({6}), Dense(8, {.activation = "relu"}), BatchNormalization(), Dense(5)});
      auto frozen = std::make_shared<ModelLayer>(std::make_shared<Sequential>(
          std::initializer_list<SequentialItem>{Input({5}), BatchNormalization(),
                                                Dense(4, {.activation = "tanh"})},
          "frozen"));
      frozen->set_trainable(false);
      auto in = Input({6});
      auto h = call(std::shared_ptr<Model>(base), in);
      return std::make_shared<Model>(in, call(Dense(3), call(frozen, h)));
    };
    const Tensor<float> x = random_tensor({10, 6}, 63);
    const Tensor<float> y = random_tensor({10, 3}, 64);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("CudaBackend round_to rounds to float16 and bfloat16 as the CPU backend") {
    Backends b;
    Tensor<float> x = random_tensor({1000}, 71);
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] *= std::pow(10.0F, static_cast<float>(i % 13) - 6.0F);
    x.data()[0] = 70000.0F;
    for (const DType dtype : {DType::float16, DType::bfloat16}) {
      CAPTURE(dtype_name(dtype));
      Tensor<float> host = x.clone();
      b.cpu.round_to(host, dtype);
      const Tensor<float> device = b.gpu.from_host(x);
      b.gpu.round_to(device, dtype);
      CHECK(bitwise_equal(host, b.gpu.to_host(device)));
      CHECK_FALSE(bitwise_equal(host, x));
    }
  }

  TEST_CASE(
      "Models under mixed_bfloat16 and mixed_float16 train on the CUDA backend as on the CPU") {
    // Their Dense and Conv2D products run on cuBLASLt's half-precision kernels (the operands
    // converted to the compute dtype, exactly: they hold its values), float32's do not.
    for (const char* policy : {"mixed_bfloat16", "mixed_float16", "float32"}) {
      CAPTURE(policy);
#if defined(LOADSTAR_CUDA_EMULATED)
      const std::size_t half_before = loadstar::test::lt_half_matmuls;
      const std::size_t all_before = loadstar::test::lt_matmuls;
#endif
      const auto make_mlp = [policy] {
        mixed_precision::PolicyScope scope(policy);
        set_random_seed(36);
        auto in = Input({6});
        auto h = call(Dense(8, {.activation = "relu"}), in);
        return std::make_shared<Model>(in, call(Dense(3), h));
      };
      check_trains_as_on_cpu(make_mlp, random_tensor({10, 6}, 63), random_tensor({10, 3}, 64));
      const auto make_cnn = [policy] {
        mixed_precision::PolicyScope scope(policy);
        set_random_seed(37);
        auto in = Input({6, 6, 2});
        auto h = call(Conv2D(4, 3, {.activation = "relu"}), in);
        h = call(MaxPooling2D(), h);
        h = call(Flatten(), h);
        return std::make_shared<Model>(in, call(Dense(3), h));
      };
      check_trains_as_on_cpu(make_cnn, random_tensor({8, 6, 6, 2}, 65), random_tensor({8, 3}, 66));
#if defined(LOADSTAR_CUDA_EMULATED)
      // Every cuBLASLt product of the mixed models (the CPU's run makes none) in half precision.
      const std::size_t half = loadstar::test::lt_half_matmuls - half_before;
      const std::size_t all = loadstar::test::lt_matmuls - all_before;
      CHECK(all >= 20);
      CHECK(half == (std::string_view(policy) == "float32" ? 0 : all));
#endif
    }
  }

  TEST_CASE("A loss-scaled mixed_float16 step runs on the device alone and skips as on the CPU") {
    // A scale far too large for float16 at first: the first steps' output gradients overflow
    // (the step skipped, the scale halved), then the scale doubles after every third finite step
    // until it overflows again. The finite check runs on the device and the optimizer's fused
    // step reads it there, so the step is one graph whatever the scale.
    const Tensor<float> x = random_tensor({8, 6}, 68);
    const Tensor<float> y = random_tensor({8, 3}, 69);
    constexpr int steps = 24;
    struct Run {
      std::vector<float> scales;
      std::vector<std::int64_t> iterations;
      std::vector<double> losses;
      std::vector<Tensor<float>> weights;
    };
    const auto run = [&](const std::shared_ptr<Backend>& backend) {
      std::shared_ptr<Model> model;
      {
        mixed_precision::PolicyScope scope("mixed_float16");
        set_random_seed(38);
        auto in = Input({6});
        auto h = call(Dense(8, {.activation = "relu"}), in);
        model = std::make_shared<Model>(in, call(Dense(3), h));
      }
      auto scaling = std::make_shared<optimizers::LossScaleOptimizer>(
          std::make_shared<optimizers::Adam>(), std::ldexp(1.0, 24), 3);
      model->compile({.optimizer = scaling, .loss = "mse", .backend = backend});
      Run r;
      for (int step = 0; step < steps; ++step) {
        model->reset_metrics();
        r.losses.push_back(*model->train_step(std::tie(x, y)).get("loss"));
        r.scales.push_back(scaling->loss_scale());
        r.iterations.push_back(model->optimizer().iterations());
      }
      r.weights = model->get_weights();
      return r;
    };
    const Run cpu = run(cpu_backend(1));
    std::size_t halved = 0, doubled = 0;
    for (std::size_t i = 1; i < cpu.scales.size(); ++i) {
      halved += cpu.scales[i] < cpu.scales[i - 1] ? 1 : 0;
      doubled += cpu.scales[i] > cpu.scales[i - 1] ? 1 : 0;
    }
    CHECK(halved >= 4);
    CHECK(doubled >= 2);
    CHECK(cpu.iterations.back() < steps);
    std::vector<Run> gpu;
    for (const bool graphs : {false, true}) {
      CAPTURE(graphs);
      auto backend = CudaBackend::create(0, loadstar::cuda::CudaOptions{.graphs = graphs});
      gpu.push_back(run(backend));
      CHECK(backend->host_kernel_calls() == 0);
      const auto& stats = backend->graph_stats();
      if (graphs) {
        INFO("last fallback: " << stats.last_fallback);
        CHECK(stats.fallbacks == 0);
        CHECK(stats.captured == 1);
        CHECK(stats.replayed == steps - 2);
      }
      const Run& g = gpu.back();
      CHECK(g.scales == cpu.scales);
      CHECK(g.iterations == cpu.iterations);
      for (std::size_t i = 0; i < cpu.losses.size(); ++i) {
        CAPTURE(i);
        CHECK(g.losses[i] == doctest::Approx(cpu.losses[i]).epsilon(1e-4));
      }
      REQUIRE(g.weights.size() == cpu.weights.size());
      for (std::size_t i = 0; i < cpu.weights.size(); ++i) {
        CAPTURE(i);
        check_close(g.weights[i], cpu.weights[i], 1e-3);
      }
    }
    CHECK(gpu[0].losses == gpu[1].losses);
    for (std::size_t i = 0; i < gpu[0].weights.size(); ++i)
      CHECK(bitwise_equal(gpu[0].weights[i], gpu[1].weights[i]));
  }

  TEST_CASE("The attention layers match the PyTorch reference values on the CUDA backend") {
    // tests/keras/generate_attention.py: MultiHeadAttention (self, cross with a key, causal, two
    // attention axes, an attention_mask), Attention (dot and concat) and AdditiveAttention, with
    // their inputs, weights and gradients in device memory (the attention itself is staged
    // through the host).
    Backends b;
    // Held in a variable: a range-for over a member of a temporary would read freed memory.
    const auto reference = layer_cases::load("attention.json");
    REQUIRE(reference["cases"].size() == 17);
    for (const auto& c : reference["cases"])
      layer_cases::run_case(c, b.gpu);
  }

  TEST_CASE("Masks run through a nested model on the CUDA backend as in the PyTorch reference") {
    // tests/keras/generate_nested_masks.py: the mask made by an Embedding inside a nested
    // Sequential, read by its LSTM and carried out to a GlobalAveragePooling1D.
    const auto reference = layer_cases::load("nested_masks.json");
    const auto& c = reference["cases"][0];
    REQUIRE(c["name"] == "inner_mask");
    auto encoder = std::make_shared<Sequential>(
        std::initializer_list<SequentialItem>{Input(Shape{5}), Embedding(9, 3, {.mask_zero = true}),
                                              LSTM(4, {.return_sequences = true})},
        "encoder");
    auto tokens = Input(Shape{5});
    Model model(tokens, call(Dense(1), call(GlobalAveragePooling1D(), call(encoder, tokens))));
    model.compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.5}),
                   .loss = "mse",
                   .backend = keras::cuda_backend(0)});
    std::vector<Tensor<float>> weights;
    for (std::size_t i = 0; i < c["weights"].size(); ++i)
      weights.push_back(
          layer_cases::tensor_of(c["weights"][i], layer_cases::shape_of(c["shapes"][i])));
    model.set_weights(weights);
    const Tensor<float> x = layer_cases::tensor_of(c["tokens"], Shape{4, 5});
    layer_cases::check_close("predictions", model.predict(x, {.verbose = 0}), c["predictions"]);
    const double loss =
        *model.train_on_batch(x, layer_cases::tensor_of(c["targets"], Shape{4, 1})).get("loss");
    CHECK(loss == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
    const auto after = model.get_weights();
    REQUIRE(after.size() == c["updated"].size());
    for (std::size_t i = 0; i < after.size(); ++i)
      layer_cases::check_close("updated weight " + std::to_string(i), after[i], c["updated"][i]);
  }

  TEST_CASE("A nested model of two inputs and three outputs trains on the CUDA backend") {
    // tests/keras/generate_nested_multi.py's multi_io: PyTorch's predictions and SGD step.
    const auto reference = layer_cases::load("nested_multi.json");
    const auto& c = reference["cases"][0];
    REQUIRE(c["name"] == "multi_io");
    auto a = Input({4}, "a");
    auto b = Input({3}, "b");
    auto ha = call(Dense(5, {.activation = "tanh", .name = "ha"}), a);
    auto sum = call(Add({.name = "s"}), {ha, call(Dense(5, {.name = "gb"}), b)});
    auto pair = std::make_shared<Model>(
        std::vector{a, b}, std::vector{call(Dense(2, {.name = "d1"}), sum), sum, a}, "pair");
    auto x = Input({4}, "x");
    auto y = Input({3}, "y");
    auto outputs =
        call_outputs(pair, {call(Dense(4, {.activation = "tanh", .name = "pre"}), x), y});
    Model model(std::vector{x, y},
                std::vector{call(Dense(1, {.name = "head"}),
                                 call(Concatenate(), {outputs[0], outputs[1], outputs[2]}))},
                "multi_io");
    model.compile({.optimizer = optimizers::SGD(optimizers::SGDOptions{.learning_rate = 0.5}),
                   .loss = "mse",
                   .backend = keras::cuda_backend(0)});
    // The weights keyed "<layer>/<variable>", in the model's order.
    const auto keyed = [&](const nlohmann::json& values, std::vector<std::string>& keys) {
      std::vector<Tensor<float>> out;
      for (const auto& layer : model.layers()) {
        for (const auto& w : layer->weights()) {
          keys.push_back(layer->name() + "/" + w.name);
          const auto& entry = values.at(keys.back());
          out.push_back(layer_cases::tensor_of(entry.contains("values") ? entry["values"] : entry,
                                               w.value.shape()));
        }
      }
      return out;
    };
    std::vector<std::string> keys;
    model.set_weights(keyed(c["weights"], keys));
    std::vector<Tensor<float>> in;
    for (const auto& input : c["inputs"])
      in.push_back(layer_cases::tensor_of(input["values"], layer_cases::shape_of(input["shape"])));
    layer_cases::check_close("predictions", model.predict_outputs(in, {.verbose = 0}).front(),
                             c["predictions"]);
    const Tensor<float> targets = layer_cases::tensor_of(
        c["targets"]["values"], layer_cases::shape_of(c["targets"]["shape"]));
    const double loss = *model.train_on_batch(in, targets).get("loss");
    CHECK(loss == doctest::Approx(c["loss"].get<double>()).epsilon(1e-5));
    keys.clear();
    const auto updated = keyed(c["updated"], keys);
    const auto after = model.get_weights();
    REQUIRE(after.size() == updated.size());
    for (std::size_t i = 0; i < after.size(); ++i)
      layer_cases::check_close("updated " + keys[i], after[i], c["updated"][keys[i]]);
  }

  TEST_CASE("A model of attention layers trains on the CUDA backend as on the CPU") {
    const auto make = [] {
      set_random_seed(37);
      auto in = Input({5, 4});
      auto h = call(
          std::make_shared<MultiHeadAttention>(
              2, 3, MultiHeadAttentionOptions{.dropout = 0.2F, .seed = 3, .use_causal_mask = true}),
          {in, in});
      h = call(LayerNormalization({.epsilon = 1e-6F}), call(Add(), {in, h}));
      h = call(Attention({.use_scale = true, .score_mode = "concat", .dropout = 0.1F}), {h, in});
      h = call(AdditiveAttention(), {h, in, h});
      return std::make_shared<Model>(in, call(Dense(2), call(GlobalAveragePooling1D(), h)));
    };
    const Tensor<float> x = random_tensor({6, 5, 4}, 71);
    const Tensor<float> y = random_tensor({6, 2}, 72);
    check_trains_as_on_cpu(make, x, y);
  }

  TEST_CASE("Keras's default Attention trains on the device alone as on the CPU") {
    // Dot-product scores without a scale weight: with dropout and the values as keys, then with
    // a key input and the causal mask; the queries' and values' masks from Embedding.
    Tensor<float> tokens({12, 5});
    for (std::size_t r = 0; r < 12; ++r)
      for (std::size_t s = 0; s < 5; ++s)
        tokens.data()[r * 5 + s] = s < 2 + r % 4 ? static_cast<float>(1 + (r + s * 3) % 7) : 0.0F;
    const Tensor<float> y = random_tensor({12, 2}, 48);
    const auto make = [] {
      set_random_seed(49);
      auto in = Input({5});
      auto x = call(Embedding(8, 4, {.mask_zero = true}), in);
      auto q = call(Dense(4), x);
      auto h = call(Attention({.dropout = 0.2F, .seed = 7}), {q, x});
      h = call(Attention({.use_causal_mask = true}), {h, x, call(Dense(4), x)});
      return std::make_shared<Model>(in, call(Dense(2), call(GlobalAveragePooling1D(), h)));
    };
    check_trains_as_on_cpu(make, tokens, y);
    auto backend = CudaBackend::create(0);
    auto model = make();
    model->compile({.optimizer = "sgd", .loss = "mse", .backend = backend});
    CHECK(std::isfinite(*model->train_on_batch(tokens, y).get("loss")));
    CHECK(backend->host_kernel_calls() == 0);
  }

  TEST_CASE("Depthwise and separable convolutions train on the device alone from graphs") {
    // The mobilenet workload's blocks in small (DepthwiseConv2D, BatchNormalization, ReLU(6),
    // a pointwise Conv2D), with a depth multiplier, strides, dilation, "valid" padding, a bias
    // and a fused activation, and a SeparableConv2D and a DepthwiseConv1D.
    Tensor<float> x = random_tensor({16, 9, 9, 3}, 83), y({16});
    for (std::size_t r = 0; r < 16; ++r)
      y.data()[r] = static_cast<float>(r % 3);
    const auto make = [] {
      set_random_seed(49);
      auto in = Input({9, 9, 3});
      auto h = call(Conv2D(4, 3, {.strides = 2, .padding = "same", .use_bias = false}), in);
      h = call(DepthwiseConv2D(3, {.padding = "same", .depth_multiplier = 2, .use_bias = false}),
               h);
      h = call(ReLU({.max_value = 6.0F}), call(BatchNormalization(), h));
      h = call(Conv2D(6, 1, {.use_bias = false}), h);
      h = call(DepthwiseConv2D(
                   3, {.strides = 2, .padding = "same", .activation = "relu", .use_bias = true}),
               h);
      auto d = call(DepthwiseConv2D(2, {.padding = "same", .dilation_rate = 2}), h);
      h = call(SeparableConv2D(5, 2, {.padding = "valid", .depth_multiplier = 2}), d);
      auto pooled = call(GlobalAveragePooling2D(), h);
      auto line = call(Reshape({3, 5}), call(Dense(15), pooled));
      line = call(GlobalAveragePooling1D(), call(DepthwiseConv1D(2, {.padding = "same"}), line));
      return std::make_shared<Model>(in, call(Dense(3), call(Concatenate(), {pooled, line})));
    };
    check_device_alone(make, x, y, 6, 6, 2);
  }

  TEST_CASE("A residual CNN under mixed precision trains on the device alone from graphs") {
    // The resnet workload's shape in small: Conv2D without bias, BatchNormalization, ReLU, an Add
    // with a projection, pooling and a Dense head. Under mixed_float16 compile wraps Adam in a
    // LossScaleOptimizer, whose finite check and skip run in the step's graph; the products run
    // in the compute dtype.
    Tensor<float> x = random_tensor({16, 6, 6, 3}, 81), y({16});
    for (std::size_t r = 0; r < 16; ++r)
      y.data()[r] = static_cast<float>(r % 3);
    for (const char* policy : {"mixed_float16", "mixed_bfloat16"}) {
      CAPTURE(policy);
      const auto make = [policy] {
        mixed_precision::PolicyScope scope(policy);
        set_random_seed(48);
        auto in = Input({6, 6, 3});
        auto h = call(Conv2D(4, 3, {.padding = "same", .use_bias = false}), in);
        h = call(ReLU(), call(BatchNormalization(), h));
        auto r = call(Conv2D(8, 3, {.strides = 2, .padding = "same", .use_bias = false}), h);
        r = call(BatchNormalization(), r);
        auto p =
            call(BatchNormalization(), call(Conv2D(8, 1, {.strides = 2, .use_bias = false}), h));
        h = call(ReLU(), call(Add(), {r, p}));
        return std::make_shared<Model>(in, call(Dense(3), call(GlobalAveragePooling2D(), h)));
      };
#if defined(LOADSTAR_CUDA_EMULATED)
      const std::size_t half_before = loadstar::test::lt_half_matmuls;
#endif
      check_device_alone(make, x, y, 5, 6, 2);
#if defined(LOADSTAR_CUDA_EMULATED)
      CHECK(loadstar::test::lt_half_matmuls > half_before);
#endif
    }
  }

  TEST_CASE("A Transformer block trains on the device alone and replays its steps from graphs") {
    // Token ids with padding (Embedding's mask reaches the attention's keys and the pooling),
    // MultiHeadAttention with dropout (its key changes every step) and a causal mask,
    // LayerNormalization, and the scores returned and read by the loss's other output.
    Tensor<float> tokens({16, 6}), y({16});
    for (std::size_t r = 0; r < 16; ++r) {
      for (std::size_t s = 0; s < 6; ++s)
        tokens.data()[r * 6 + s] =
            s < 2 + r % 5 ? static_cast<float>(1 + (r * 3 + s * 7) % 9) : 0.0F;
      y.data()[r] = static_cast<float>(r % 2);
    }
    const auto make = [] {
      set_random_seed(47);
      auto in = Input({6});
      auto x = call(Embedding(10, 8, {.mask_zero = true}), in);
      auto h = call(std::make_shared<MultiHeadAttention>(
                        2, 4, MultiHeadAttentionOptions{.dropout = 0.25F, .seed = 5}),
                    {x, x});
      h = call(LayerNormalization(), call(Add(), {x, h}));
      auto f = call(Dense(8), call(Dense(16, {.activation = "relu"}), h));
      h = call(LayerNormalization({.epsilon = 1e-6F}), call(Add(), {h, f}));
      h = call(std::make_shared<MultiHeadAttention>(
                   2, 3, MultiHeadAttentionOptions{.use_causal_mask = true}),
               {h, h});
      return std::make_shared<Model>(in, call(Dense(2), call(GlobalAveragePooling1D(), h)));
    };
    check_device_alone(make, tokens, y, 4, 6, 2);
  }
}
