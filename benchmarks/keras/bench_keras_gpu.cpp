// Training throughput of the Keras executor on the CUDA backend (`keras::cuda_backend(0)`): the
// MLP, the CNN, the MobileNet, the U-Net, the Transformer block and the bidirectional LSTM of
// bench_keras (workloads.hpp: same models, Adam(1e-3), cross-entropy from logits, synthetic data)
// at batch 32 and 256, and the ResNet at
// batch 128 and 512 in the "float32", "mixed_float16" and "mixed_bfloat16" dtype policies, beside
// PyTorch on the same GPU (benchmarks/peers/keras_torch.py --device cuda: eager and with the whole
// step in a CUDA graph, the mixed rows under torch.autocast with channels_last). Built only where
// Meson enables CUDA; `benchmarks/run keras --gpu` runs it.
//
// Names are "<workload>/<batch>/gpu" (the ResNet's "resnet/<batch>/gpu/<policy>"); the counter
// "rate" is samples per second, "peak_rss_mb" the process's peak resident memory and "device_mb"
// the device memory the backend's pool holds. Each iteration trains 50 steps (10 for the MobileNet
// and the U-Net, 2 for the ResNet) with fit from arrays kept in device memory
// (`backend.from_host`: each batch's rows are copied on the device), as PyTorch's peer keeps its
// batches on the device, and ends with the device synchronized, so that the timed region holds
// every kernel it queued. --host-arrays trains from host arrays instead (each batch converted
// into page-locked memory and copied to the device inside the step), to measure what keeping the
// arrays on the device brings.
//
// Every step of a shape after its second replays one CUDA graph (CudaOptions::graphs);
// --no-graphs launches each kernel instead, to measure what the graphs bring. The counter
// "graph_fallbacks" counts the timed steps that were to run as a graph but ran kernel by kernel,
// and stderr says why (CudaBackend::graph_stats). --cudnn runs the
// convolutions through cuDNN (CudaOptions::convolution = Convolution::cudnn) instead of im2col
// and cuBLASLt, to measure which is faster; a build without cuDNN says so in one line.
//
// Without a usable GPU the program prints the backend's own reason in one line ("bench_keras_gpu:
// cuda backend: no CUDA device is available: ...") and exits with 1 before any benchmark runs;
// --benchmark_list_tests answers without a GPU.

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <sys/resource.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <loadstar/cuda.hpp>
#include <loadstar/cuda/error.hpp>
#include <loadstar/keras.hpp>
#include <memory>
#include <string>
#include <string_view>

#include "workloads.hpp"

namespace {

using namespace loadstar;
using namespace loadstar::keras;

/// The backend every benchmark trains on, made in main once the arguments are read.
std::shared_ptr<cuda::CudaBackend> backend;
/// Whether fit reads host arrays (--host-arrays) instead of arrays in device memory.
bool host_arrays = false;

/// Waits for every kernel and copy queued on the device.
void synchronize() {
  cuda::check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

/// The benchmark's name: "<workload>/<batch>/gpu", "resnet/<batch>/gpu/<policy>".
std::string row_name(const std::string& workload, std::size_t batch, const std::string& policy) {
  return workload + "/" + std::to_string(batch) + "/gpu" +
         (workload == "resnet" ? "/" + policy : "");
}

void train(benchmark::State& state, const std::string& workload, std::size_t batch,
           const std::string& policy) {
  const std::size_t rows = batch * bench::steps_of(workload);
  const auto [host_x, host_y] = bench::synthetic_data(workload, rows);
  // The unet workload's targets are its masks; the others', their labels.
  const Tensor<float> labels =
      workload == "unet" ? bench::synthetic_masks(host_x) : host_y.cast<float>();
  const Tensor<float> x = host_arrays ? host_x : backend->from_host(host_x);
  const Tensor<float> y = host_arrays ? labels : backend->from_host(labels);
  auto model = bench::make_model(workload, 1, backend, policy);
  const FitOptions options{.epochs = 1, .batch_size = batch, .verbose = 0, .shuffle = false};
  // Warm-up: weights on the device, buffers and optimizer slots allocated, cuBLAS's heuristics.
  model->fit(x, y, options);
  synchronize();
  const cuda::GraphStats before = backend->graph_stats();
  for (auto _ : state) {
    model->fit(x, y, options);
    synchronize();
  }
  state.counters["rate"] = benchmark::Counter(static_cast<double>(state.iterations() * rows),
                                              benchmark::Counter::kIsRate);
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_mb"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  state.counters["device_mb"] = static_cast<double>(backend->reserved_bytes()) / (1024.0 * 1024.0);
  // The timed steps that launched a graph (captured or replayed).
  const cuda::GraphStats& after = backend->graph_stats();
  // cuDNN convolutions queued or recorded so far (--cudnn; 0 where every geometry took im2col).
  state.counters["cudnn_calls"] = static_cast<double>(backend->cudnn_calls());
  state.counters["graph_steps"] =
      static_cast<double>(after.captured + after.replayed - before.captured - before.replayed);
  // Timed steps recorded for a graph that ran kernel by kernel after all, and why (stderr).
  state.counters["graph_fallbacks"] = static_cast<double>(after.fallbacks - before.fallbacks);
  if (after.fallbacks > before.fallbacks)
    std::fprintf(stderr, "bench_keras_gpu: %s: %zu steps ran kernel by kernel: %s\n",
                 row_name(workload, batch, policy).c_str(), after.fallbacks - before.fallbacks,
                 after.last_fallback.c_str());
  state.SetLabel("samples/s");
}

/// `train`, with a failure (a CUDA error, device memory exhausted) ending the program in one line
/// that names the benchmark, as benchmarks/run reports it.
void train_or_exit(benchmark::State& state, const std::string& workload, std::size_t batch,
                   const std::string& policy = "float32") {
  try {
    train(state, workload, batch, policy);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_keras_gpu: %s: %s\n", row_name(workload, batch, policy).c_str(),
                 error.what());
    std::exit(1);
  }
}

/// Takes our own `flag` (--no-graphs, --host-arrays) out of the arguments; whether it was there.
bool take_flag(int& argc, char** argv, std::string_view flag) {
  bool found = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == flag) {
      found = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  return found;
}

/// Whether the arguments ask only for the list of names (--benchmark_list_tests[=true]).
bool listing_only(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--benchmark_list_tests" || arg == "--benchmark_list_tests=true" ||
        arg == "--benchmark_list_tests=1")
      return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  for (const char* workload : {"mlp", "cnn", "mobilenet", "unet", "transformer", "bilstm"}) {
    for (const std::size_t batch : {32, 256}) {
      const std::string name = row_name(workload, batch, "float32");
      benchmark::RegisterBenchmark(
          name.c_str(),
          [workload, batch](benchmark::State& state) { train_or_exit(state, workload, batch); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  for (const std::size_t batch : {128, 512}) {
    for (const char* policy : {"float32", "mixed_float16", "mixed_bfloat16"}) {
      const std::string name = row_name("resnet", batch, policy);
      benchmark::RegisterBenchmark(name.c_str(),
                                   [batch, policy](benchmark::State& state) {
                                     train_or_exit(state, "resnet", batch, policy);
                                   })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  const bool graphs = !take_flag(argc, argv, "--no-graphs");
  host_arrays = take_flag(argc, argv, "--host-arrays");
  const bool cudnn = take_flag(argc, argv, "--cudnn");
  const bool listing = listing_only(argc, argv);  // before Initialize takes its flags out
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!listing) {
    try {
      backend = cuda::CudaBackend::create(
          0, cuda::CudaOptions{
                 .graphs = graphs,
                 .convolution = cudnn ? cuda::Convolution::cudnn : cuda::Convolution::im2col});
    } catch (const std::exception& error) {
      std::fprintf(stderr, "bench_keras_gpu: %s\n", error.what());
      return 1;
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  backend.reset();
  return 0;
}
