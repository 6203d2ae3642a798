// SequenceAdapter throughput on the workloads of `benchmarks/run data`: the cost of the machinery
// (hand-off), scaling of CPU-bound batches, and transport bandwidth of large batches. Names are
// "<workload>/<mode>/<workers>"; the throughput is the counter "rate", its unit the label.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/tensor.hpp>
#include <string>
#include <vector>

namespace {

using loadstar::Tensor;

// 1. A prebuilt 32x784 batch handed out as is: what remains is the machinery.
struct HandOff {
  Tensor<float> batch{{32, 784}, 1.f};
  std::size_t size() const { return 1000; }
  Tensor<float> operator[](std::size_t) const { return batch; }
};

// 2. About 1 ms of arithmetic per batch (calibrated once), returning a small tensor.
struct CpuBound {
  std::size_t rounds = 1;
  std::size_t size() const { return 1000; }
  Tensor<float> operator[](std::size_t index) const {
    double acc = static_cast<double>(index);
    for (std::size_t i = 0; i < rounds; ++i)
      acc += std::sin(acc + static_cast<double>(i));
    return Tensor<float>({1}, static_cast<float>(acc));
  }
};

// The rounds that take about 1 ms: the fastest of several probes (the machine is shared).
std::size_t calibrate_rounds() {
  constexpr std::size_t probe_rounds = 200000;
  const CpuBound probe{probe_rounds};
  double best = 1e9;
  for (std::size_t i = 0; i < 7; ++i) {
    const auto start = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(probe[i]);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return static_cast<std::size_t>(probe_rounds * (1e-3 / best));
}

// 3. 32x3x224x224 float batches: each batch is fresh memory (a copy of a prebuilt source), as a
// decoded batch would be; the peer does the same.
struct Large {
  Tensor<float> source{{32, 3, 224, 224}, 0.5f};
  std::size_t size() const { return 1000; }
  Tensor<float> operator[](std::size_t) const { return source.clone(); }
};

template <class S, std::size_t Workers, bool Multiprocess>
void run_batches(benchmark::State& state, S sequence, const char* unit, double bytes_per_batch) {
  loadstar::SequenceAdapter<S, Workers, Multiprocess> adapter(std::move(sequence),
                                                              {.max_queue_size = 10});
  for (int i = 0; i < 10; ++i)
    benchmark::DoNotOptimize(adapter.next());  // warm up
  for (auto _ : state)
    benchmark::DoNotOptimize(adapter.next());
  const double batches = static_cast<double>(state.iterations());
  state.counters["rate"] = benchmark::Counter(
      bytes_per_batch > 0 ? batches * bytes_per_batch / 1e9 : batches, benchmark::Counter::kIsRate);
  state.SetLabel(unit);
}

// The bandwidth of copying one large batch's bytes on this machine, in GB/s.
double memcpy_bandwidth(std::size_t bytes) {
  std::vector<char> from(bytes, 1);
  std::vector<char> to(bytes, 0);
  std::memcpy(to.data(), from.data(), bytes);  // touch both
  const auto start = std::chrono::steady_clock::now();
  int copies = 0;
  do {
    std::memcpy(to.data(), from.data(), bytes);
    benchmark::ClobberMemory();
    ++copies;
  } while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(300));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) * copies / seconds / 1e9;
}

template <std::size_t Workers, bool Multiprocess>
void register_all(std::size_t rounds, double memcpy_gbps) {
  const std::string mode = Multiprocess ? "processes" : "threads";
  const std::string suffix = "/" + mode + "/" + std::to_string(Workers);
  benchmark::RegisterBenchmark(("hand-off" + suffix).c_str(), [](benchmark::State& s) {
    run_batches<HandOff, Workers, Multiprocess>(s, HandOff{}, "batches/s", 0);
  })->UseRealTime();
  benchmark::RegisterBenchmark(("cpu-bound" + suffix).c_str(), [rounds](benchmark::State& s) {
    run_batches<CpuBound, Workers, Multiprocess>(s, CpuBound{rounds}, "batches/s", 0);
  })->UseRealTime();
  benchmark::RegisterBenchmark(("large" + suffix).c_str(), [memcpy_gbps](benchmark::State& s) {
    const Large large;
    const auto bytes = static_cast<double>(large.source.bytes());
    run_batches<Large, Workers, Multiprocess>(s, large, "GB/s", bytes);
    s.counters["memcpy"] = memcpy_gbps;
  })->UseRealTime();
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const std::size_t rounds = calibrate_rounds();
  const double memcpy_gbps = memcpy_bandwidth(Large{}.source.bytes());
  register_all<1, false>(rounds, memcpy_gbps);
  register_all<2, false>(rounds, memcpy_gbps);
  register_all<1, true>(rounds, memcpy_gbps);
  register_all<2, true>(rounds, memcpy_gbps);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
