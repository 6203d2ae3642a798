// What a trial checkpoint costs: writing one (the Keras model file with the optimizer's slots,
// metadata.json and state.cbor, each flushed to disk, renamed into place) and reading it back for
// a resume, for the Fashion-MNIST MLP (Flatten -> Dense(128, relu) -> Dense(10)) and a small CNN
// (Conv2D 32, MaxPooling2D, Conv2D 64, MaxPooling2D, Flatten, Dense 128, Dense 10), Adam, one
// thread: the models of benchmarks/keras/workloads.hpp. Counters: "bytes" the checkpoint folder's
// size, "model_bytes" the .h5 file's, "train_steps" the checkpoint's time in training steps of
// batch 32 (measured beside it).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <loadstar/keras.hpp>
#include <loadstar/trial/checkpoint.hpp>
#include <memory>
#include <string>

#include "../keras/workloads.hpp"

namespace {

using namespace loadstar;
using namespace loadstar::keras;

struct Setup {
  std::unique_ptr<Model> model;
  nlohmann::json metadata;
  nlohmann::json state;
  double step_seconds = 0;
  std::filesystem::path dir;
};

Setup setup(const std::string& workload) {
  Setup s;
  s.model = bench::make_model(workload, 1);
  constexpr std::size_t rows = 60000;
  constexpr std::size_t batch = 32;
  Tensor<float> x({rows, 28, 28});
  Tensor<std::int64_t> y({rows});
  std::uint64_t seed = 7;
  for (auto& v : x) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 24);
  }
  for (std::size_t i = 0; i < rows; ++i)
    y(i) = static_cast<std::int64_t>(i % 10);
  auto data = s.model->make_data_iterator(x, y, {.batch_size = batch, .seed = 3});
  data.start_epoch(0);
  s.model->train_step(*data.next());  // optimizer slots exist, buffers allocated
  constexpr int steps = 20;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i)
    s.model->train_step(*data.next());
  s.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / steps;
  s.metadata = {
      {"format", trial::checkpoint_format}, {"experiment_id", 1}, {"trial_id", 1}, {"batches", 21}};
  s.state = {{"data", data.state()},
             {"training_metrics", s.model->training_metrics().state()},
             {"iterations", s.model->optimizer().iterations()}};
  s.dir = std::filesystem::temp_directory_path() /
          ("loadstar-bench-checkpoint-" + std::to_string(::getpid()) + "-" + workload);
  std::filesystem::remove_all(s.dir);
  return s;
}

std::uintmax_t folder_bytes(const std::filesystem::path& dir) {
  std::uintmax_t total = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) total += entry.file_size();
  }
  return total;
}

void write(benchmark::State& state, const std::string& workload) {
  Setup s = setup(workload);
  std::filesystem::path path;
  double seconds = 0;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    path = trial::write_checkpoint(s.dir, "ckpt", *s.model, s.metadata, s.state);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  state.counters["bytes"] = static_cast<double>(folder_bytes(path));
  state.counters["model_bytes"] =
      static_cast<double>(std::filesystem::file_size(path / trial::checkpoint_model_file));
  state.counters["train_steps"] =
      seconds / static_cast<double>(state.iterations()) / s.step_seconds;
  std::filesystem::remove_all(s.dir);
}

void restore(benchmark::State& state, const std::string& workload) {
  Setup s = setup(workload);
  const auto path = trial::write_checkpoint(s.dir, "ckpt", *s.model, s.metadata, s.state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(trial::read_checkpoint_metadata(path, {1, 1}));
    benchmark::DoNotOptimize(trial::read_checkpoint_state(path));
    trial::load_checkpoint_model(*s.model, path);
  }
  state.counters["bytes"] = static_cast<double>(folder_bytes(path));
  std::filesystem::remove_all(s.dir);
}

void mlp_write(benchmark::State& state) {
  write(state, "mlp");
}
void cnn_write(benchmark::State& state) {
  write(state, "cnn");
}
void mlp_restore(benchmark::State& state) {
  restore(state, "mlp");
}
void cnn_restore(benchmark::State& state) {
  restore(state, "cnn");
}

}  // namespace

BENCHMARK(mlp_write)->Name("checkpoint_write/mlp")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(cnn_write)->Name("checkpoint_write/cnn")->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(mlp_restore)
    ->Name("checkpoint_restore/mlp")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(cnn_restore)
    ->Name("checkpoint_restore/cnn")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
