// Dataset pipeline throughput on the workloads of `benchmarks/run data`: the per-element cost of
// a map -> batch(32) -> prefetch pipeline over in-memory rows ("pipeline"), and the scaling of a
// parallel map with a CPU-bound function ("parallel-map"). Names are "<workload>/<mode>/<workers>";
// the throughput is the counter "rate" (elements/s), its unit the label.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <loadstar/data/dataset.hpp>
#include <loadstar/tensor.hpp>
#include <numeric>
#include <string>
#include <tuple>

namespace {

using loadstar::Tensor;

constexpr std::size_t rows = 60000;
constexpr std::size_t features = 32;

// 60000 rows of 32 floats and an int64 label: small rows, so that the pipeline's own cost per
// element is measured rather than the memory bandwidth of copying rows into batches (with
// 784-float rows, four fifths of the time is that copy, on both sides).
struct Rows {
  Tensor<float> x{{rows, features}, 0.5f};
  Tensor<std::int64_t> y{{rows}, std::int64_t{3}};
};

// About `target` seconds of scalar arithmetic per element (calibrated once, as the peer does).
struct CpuBound {
  std::size_t rounds = 1;
  double operator()(std::int64_t index) const {
    double acc = static_cast<double>(index);
    for (std::size_t i = 0; i < rounds; ++i)
      acc += std::sin(acc + static_cast<double>(i));
    return acc;
  }
};

std::size_t calibrate_rounds(double target) {
  constexpr std::size_t probe_rounds = 100000;
  const CpuBound probe{probe_rounds};
  double best = 1e9;
  for (int i = 0; i < 7; ++i) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(probe(i));
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return std::max<std::size_t>(1, static_cast<std::size_t>(probe_rounds * (target / best)));
}

// Elements per second of a pipeline restarted at every epoch's end.
template <class Make>
void run_elements(benchmark::State& state, Make make, std::size_t elements_per_item) {
  auto pipeline = make();
  std::size_t items = 0;
  for (auto _ : state) {
    auto item = pipeline.next();
    if (!item) {
      pipeline.reset();
      item = pipeline.next();
    }
    benchmark::DoNotOptimize(item);
    ++items;
  }
  state.counters["rate"] = benchmark::Counter(static_cast<double>(items * elements_per_item),
                                              benchmark::Counter::kIsRate);
  state.SetLabel("elements/s");
}

void register_pipeline(const Rows& data) {
  // The map passes rows through, so that what is measured is the pipeline's own cost per
  // element: slicing a row, calling the map, stacking it into a batch, handing the batch off.
  auto shift = [](Tensor<float> x, Tensor<std::int64_t> y) {
    return std::tuple{std::move(x), std::move(y)};
  };
  benchmark::RegisterBenchmark("pipeline/threads/0", [&data, shift](benchmark::State& s) {
    run_elements(
        s, [&] { return loadstar::from_tensor_slices(data.x, data.y).map(shift).batch(32); }, 32);
  })->UseRealTime();
  benchmark::RegisterBenchmark("pipeline/threads/1", [&data, shift](benchmark::State& s) {
    run_elements(
        s,
        [&] {
          return loadstar::from_tensor_slices(data.x, data.y).map(shift).batch(32).prefetch(2);
        },
        32);
  })->UseRealTime();
}

void register_parallel_map(std::size_t rounds) {
  for (std::size_t threads : {1u, 2u, 4u}) {
    const std::string name = "parallel-map/threads/" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), [rounds, threads](benchmark::State& s) {
      run_elements(
          s,
          [&] {
            return loadstar::range(1 << 30)
                .map(CpuBound{rounds}, loadstar::MapOptions{.num_parallel_calls = threads})
                .batch(32);
          },
          32);
    })->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const Rows data;
  register_pipeline(data);
  register_parallel_map(calibrate_rounds(100e-6));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
