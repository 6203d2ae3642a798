// Training throughput of the Keras executor: the Fashion-MNIST MLP (Flatten -> Dense(128, relu)
// -> Dense(10)) at batch 32 and 256 and a small CNN (Conv2D 32, MaxPooling2D, Conv2D 64,
// MaxPooling2D, Flatten, Dense 128, Dense 10) at batch 32 and 256, and a 1-D text CNN (Embedding
// 1000x32, Conv1D 64x5, MaxPooling1D 4, Conv1D 64x5, GlobalMaxPooling1D, Dense 10) on sequences of
// 100 token ids at batch 32, a Transformer encoder block (Embedding, MultiHeadAttention, Add,
// LayerNormalization, the Dense feed-forward, GlobalAveragePooling1D, Dense 10) on the same
// sequences at batch 32 and 256, Adam(1e-3), sparse categorical cross-entropy from logits, on
// synthetic data (workloads.hpp, shared with bench_keras_gpu), with 1 and 2 threads. Each iteration
// trains a fixed number of steps with fit; names are "<workload>/<batch>/<threads>", the counter
// "rate" is samples per second (beside benchmarks/peers/keras_torch.py, same models and steps),
// "peak_rss_mb" the process's peak resident memory.
//
// The roofline: "flops_per_sample" counts the floating-point operations of one sample's training
// step (2 per multiply-add): forward, backward (the weight gradient and, except for the first
// layer, the input gradient) of every Dense, Conv1D and Conv2D (not the attention layers'), and
// Adam's 6 multiply-adds per
// parameter spread over the batch; "sgemm_gflops" is this machine's single-thread SGEMM peak,
// measured in the same process (CpuBackend(1).gemm on 512 x 512 x 512, the best of 10 runs), so
// that benchmarks/run reports GFLOP/s and their fraction of the peak per thread.

#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <string>

#include "workloads.hpp"

namespace {

using namespace loadstar;
using namespace loadstar::keras;

using bench::make_model;
using bench::steps;

/// Floating-point operations of one sample's training step (see the file's comment).
double flops_per_sample(const Model& model, std::size_t batch) {
  double multiply_adds = 0.0;
  bool first = true;  // no layer with weights before: no input gradient
  for (const auto& layer : model.layers()) {
    const std::string kind = layer->class_name();
    if (kind != "Dense" && kind != "Conv1D" && kind != "Conv2D") {
      if (!layer->weights().empty()) first = false;
      continue;
    }
    const Shape& out = layer->built_output_shape();
    // Every output position multiplies the kernel once: positions x kernel elements.
    const double positions =
        static_cast<double>(out.elements()) / static_cast<double>(out[out.rank() - 1]);
    const double forward = positions * static_cast<double>(layer->weights()[0].value.size());
    multiply_adds += forward * (first ? 2.0 : 3.0);
    first = false;
  }
  multiply_adds += 6.0 * static_cast<double>(model.count_params()) / static_cast<double>(batch);
  return 2.0 * multiply_adds;
}

/// This machine's single-thread SGEMM peak in GFLOP/s (measured once per process).
double sgemm_gflops() {
  static const double peak = [] {
    constexpr std::size_t n = 512;
    CpuBackend backend(1);
    Tensor<float> a({n, n}), b({n, n}), c({n, n});
    std::fill(a.begin(), a.end(), 0.5F);
    std::fill(b.begin(), b.end(), 0.25F);
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

void train(benchmark::State& state, const std::string& workload) {
  const auto batch = static_cast<std::size_t>(state.range(0));
  const auto threads = static_cast<std::size_t>(state.range(1));
  const std::size_t rows = batch * steps;
  const auto [x, y] = bench::synthetic_data(workload, rows);
  auto model = make_model(workload, threads);
  const FitOptions options{.epochs = 1, .batch_size = batch, .verbose = 0, .shuffle = false};
  model->fit(x, y, options);  // warm-up: buffers allocated, optimizer slots created
  for (auto _ : state)
    model->fit(x, y, options);
  state.counters["rate"] = benchmark::Counter(static_cast<double>(state.iterations() * rows),
                                              benchmark::Counter::kIsRate);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_mb"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  state.counters["flops_per_sample"] = flops_per_sample(*model, batch);
  state.counters["sgemm_gflops"] = sgemm_gflops();
  state.SetLabel("samples/s");
}

void mlp(benchmark::State& state) {
  train(state, "mlp");
}
void cnn(benchmark::State& state) {
  train(state, "cnn");
}
void text(benchmark::State& state) {
  train(state, "text");
}
void transformer(benchmark::State& state) {
  train(state, "transformer");
}

}  // namespace

BENCHMARK(mlp)
    ->Name("mlp")
    ->Args({32, 1})
    ->Args({32, 2})
    ->Args({256, 1})
    ->Args({256, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(cnn)
    ->Name("cnn")
    ->Args({32, 1})
    ->Args({32, 2})
    ->Args({256, 1})
    ->Args({256, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK(text)
    ->Name("text")
    ->Args({32, 1})
    ->Args({32, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(transformer)
    ->Name("transformer")
    ->Args({32, 1})
    ->Args({32, 2})
    ->Args({256, 1})
    ->Args({256, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
