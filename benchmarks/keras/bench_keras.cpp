// Training throughput of the Keras executor: the Fashion-MNIST MLP (Flatten -> Dense(128, relu)
// -> Dense(10)) at batch 32 and 256 and a small CNN (Conv2D 32, MaxPooling2D, Conv2D 64,
// MaxPooling2D, Flatten, Dense 128, Dense 10) at batch 32 and 256, and a 1-D text CNN (Embedding
// 1000x32, Conv1D 64x5, MaxPooling1D 4, Conv1D 64x5, GlobalMaxPooling1D, Dense 10) on sequences of
// 100 token ids at batch 32, a Transformer encoder block (Embedding, MultiHeadAttention, Add,
// LayerNormalization, the Dense feed-forward, GlobalAveragePooling1D, Dense 10) on the same
// sequences at batch 32 and 256, a small MobileNet (depthwise-separable blocks with batch
// normalization and ReLU(6)) and a small U-Net (Conv2DTranspose and Concatenate skip connections,
// one logit per pixel) on 32x32x3 images at batch 32 and 256, three Conv2D (the second and third
// grouped, 4 and 8 groups), GlobalAveragePooling2D and Dense 10 on 32x32x3 images at batch 32 and
// 256, and a ResNet-shaped CNN (residual
// blocks of Conv2D, BatchNormalization and ReLU with Add skip connections) on 32x32x3 images at
// batch 128 and 512 in the "float32" and "mixed_bfloat16" dtype policies, Adam(1e-3), sparse
// categorical cross-entropy from logits (binary for the U-Net), on synthetic data (workloads.hpp,
// shared with bench_keras_gpu, which describes the models), with 1 and 2 threads. Each iteration
// trains a fixed number of steps with fit; names are "<workload>/<batch>/<threads>" (the ResNet's
// "resnet/<batch>/<threads>/<policy>"), the counter "rate" is samples per second (beside
// benchmarks/peers/keras_torch.py, same models and steps, the mixed rows under torch.autocast),
// "peak_rss_mb" the process's peak resident memory.
//
// The roofline: "flops_per_sample" counts the floating-point operations of one sample's training
// step (2 per multiply-add): forward, backward (the weight gradient and, except for the first
// layer, the input gradient) of every Dense, Conv1D, Conv2D, DepthwiseConv2D and Conv2DTranspose
// (not the attention layers'), of every LSTM and Bidirectional LSTM (each step multiplies each
// direction's input and recurrent kernels once), and Adam's 6 multiply-adds per parameter spread
// over the batch; "sgemm_gflops" is this machine's single-thread SGEMM peak, measured in the same
// process (CpuBackend(1).gemm on 512 x 512 x 512, the best of 10 runs), so that benchmarks/run
// reports GFLOP/s and their fraction of the peak per thread.
//
// The memory bound: "bytes_per_sample" counts the bytes one sample's training step moves at least
// when each layer is one pass over memory (no two layers fused): a layer's forward pass reads its
// inputs and writes its output, its backward pass reads the output's gradient and its inputs and
// writes the inputs' gradients (3 x inputs + 2 x output floats; Reshape, Flatten and the input
// move nothing), each weight is read twice (forward, backward) and its gradient written, and
// Adam reads 4 and writes 3 floats per parameter, the weights' part spread over the batch.
// "copy_gbs" is this machine's memory bandwidth with the benchmark's thread count, measured in
// the same process as STREAM's Copy does (each thread copies its share of two 64 MiB arrays,
// bytes read plus bytes written per second, the best of 10 copies), after the peak resident
// memory is read; benchmarks/run reports the rate this allows (copy_gbs / bytes_per_sample) and
// our rate's fraction of it.

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "workloads.hpp"

namespace {

using namespace loadstar;
using namespace loadstar::keras;

using bench::make_model;

/// Floating-point operations of one sample's training step (see the file's comment).
double flops_per_sample(const Model& model, std::size_t batch) {
  double multiply_adds = 0.0;
  bool first = true;  // no layer with weights before: no input gradient
  for (const auto& layer : model.layers()) {
    const std::string kind = layer->class_name();
    if (kind == "LSTM" || kind == "Bidirectional") {
      // The kernels are the rank-2 weights; the biases (one vector per direction) only add.
      double kernels = 0.0;
      for (const auto& w : layer->weights())
        if (w.value.shape().rank() == 2) kernels += static_cast<double>(w.value.size());
      const double steps = static_cast<double>(layer->built_input_shapes()[0][0]);
      multiply_adds += steps * kernels * (first ? 2.0 : 3.0);
      first = false;
      continue;
    }
    if (kind != "Dense" && kind != "Conv1D" && kind != "Conv2D" && kind != "DepthwiseConv2D" &&
        kind != "Conv2DTranspose") {
      if (!layer->weights().empty()) first = false;
      continue;
    }
    // Every output position multiplies the kernel once: positions x kernel elements (a
    // depthwise kernel holds one tap per output channel; a transposed convolution multiplies its
    // kernel once per input position).
    const Shape& out =
        kind == "Conv2DTranspose" ? layer->built_input_shapes()[0] : layer->built_output_shape();
    const double positions =
        static_cast<double>(out.elements()) / static_cast<double>(out[out.rank() - 1]);
    const double forward = positions * static_cast<double>(layer->weights()[0].value.size());
    multiply_adds += forward * (first ? 2.0 : 3.0);
    first = false;
  }
  multiply_adds += 6.0 * static_cast<double>(model.count_params()) / static_cast<double>(batch);
  return 2.0 * multiply_adds;
}

/// Bytes one sample's training step moves at least, layer by layer (see the file's comment).
double bytes_per_sample(const Model& model, std::size_t batch) {
  double floats = 0.0;
  for (const auto& layer : model.layers()) {
    const std::string kind = layer->class_name();
    if (kind == "InputLayer" || kind == "Reshape" || kind == "Flatten") continue;
    double inputs = 0.0;
    for (const Shape& in : layer->built_input_shapes())
      inputs += static_cast<double>(in.elements());
    floats += 3.0 * inputs + 2.0 * static_cast<double>(layer->built_output_shape().elements());
    double weights = 0.0;
    for (const auto& w : layer->weights())
      weights += static_cast<double>(w.value.size());
    floats += (3.0 + 7.0) * weights / static_cast<double>(batch);
  }
  return 4.0 * floats;
}

/// This machine's memory bandwidth in GB/s with `threads` threads, as STREAM's Copy measures it.
double copy_gbs(std::size_t threads) {
  constexpr std::size_t bytes = std::size_t{64} << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const auto copy = [&] {
    std::vector<std::thread> workers;
    for (std::size_t t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        const std::size_t begin = bytes * t / threads, end = bytes * (t + 1) / threads;
        std::memcpy(to.data() + begin, from.data() + begin, end - begin);
      });
    }
    for (auto& worker : workers)
      worker.join();
    benchmark::ClobberMemory();
  };
  double best = 0.0;
  for (int run = 0; run < 11; ++run) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    if (run > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / took.count() / 1e9);
  }
  return best;
}

/// This machine's single-thread SGEMM peak in GFLOP/s (measured once per process).
double sgemm_gflops() {
  static const double peak = [] {
    constexpr std::size_t n = 512;
    CpuBackend backend(1);
    Tensor<float> a({n, n}), b({n, n}), c({n, n});
    // Not bfloat16 values, so that the product is float32's SGEMM (CpuBackend::bfloat16_products).
    std::fill(a.begin(), a.end(), 0.3F);
    std::fill(b.begin(), b.end(), 0.7F);
    double best = 0.0;
    for (int run = 0; run < 11; ++run) {
      const auto start = std::chrono::steady_clock::now();
      backend.gemm(a, false, b, false, c, 1.0F, 0.0F);
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
      if (run > 0) best = std::max(best, 2.0 * n * n * n / took.count() / 1e9);
    }
    return best;
  }();
  return peak;
}

void train(benchmark::State& state, const std::string& workload, std::size_t batch,
           std::size_t threads, const std::string& policy) {
  const std::size_t rows = batch * bench::steps_of(workload);
  const auto [x, y] = bench::synthetic_data(workload, rows);
  const Tensor<float> masks = workload == "unet" ? bench::synthetic_masks(x) : Tensor<float>();
  auto model = make_model(workload, threads, nullptr, policy);
  const FitOptions options{.epochs = 1, .batch_size = batch, .verbose = 0, .shuffle = false};
  // Warm-up: buffers allocated, optimizer slots created.
  bench::fit_pass(*model, workload, x, y, masks, options);
  for (auto _ : state)
    bench::fit_pass(*model, workload, x, y, masks, options);
  state.counters["rate"] = benchmark::Counter(static_cast<double>(state.iterations() * rows),
                                              benchmark::Counter::kIsRate);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_mb"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  state.counters["flops_per_sample"] = flops_per_sample(*model, batch);
  state.counters["sgemm_gflops"] = sgemm_gflops();
  state.counters["bytes_per_sample"] = bytes_per_sample(*model, batch);
  state.counters["copy_gbs"] = copy_gbs(threads);
  state.SetLabel("samples/s");
}

}  // namespace

int main(int argc, char** argv) {
  // "<workload>/<batch>/<threads>": every workload at batch 32 and 256 (the text CNN at 32) with
  // 1 and 2 threads.
  for (const char* workload :
       {"mlp", "cnn", "text", "transformer", "bilstm", "mobilenet", "unet", "grouped"}) {
    auto* b = benchmark::RegisterBenchmark(workload, [workload](benchmark::State& state) {
      train(state, workload, static_cast<std::size_t>(state.range(0)),
            static_cast<std::size_t>(state.range(1)), "float32");
    });
    for (const std::int64_t batch : {32, 256}) {
      if (batch == 256 && std::string(workload) == "text") continue;
      b->Args({batch, 1})->Args({batch, 2});
    }
    b->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  // "resnet/<batch>/<threads>/<policy>": the ResNet at batch 128 and 512 with 1 and 2 threads, in
  // float32 and mixed_bfloat16.
  for (const std::size_t batch : {128, 512}) {
    for (const std::size_t threads : {1, 2}) {
      for (const char* policy : {"float32", "mixed_bfloat16"}) {
        const std::string name =
            "resnet/" + std::to_string(batch) + "/" + std::to_string(threads) + "/" + policy;
        benchmark::RegisterBenchmark(name.c_str(),
                                     [batch, threads, policy](benchmark::State& state) {
                                       train(state, "resnet", batch, threads, policy);
                                     })
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
