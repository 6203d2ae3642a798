// SequenceAdapter throughput on the workloads of `benchmarks/run data`: the cost of the machinery
// (hand-off), scaling of CPU-bound batches, and transport bandwidth of large batches, for 1, 2 and
// 3 workers (LOADSTAR_BENCH_WORKERS="1,2,4,8,16" names others; the count is chosen at run time,
// `dynamic_workers`). Without a peer: what the destructor costs with no batch in flight, with a
// 50 ms batch in flight (waited for; ended early by a `SequenceWithStopToken`), and what a
// restore costs at step 10^3 and 10^9 of 3 ranks. Names are "<workload>/<mode>/<workers>"; the
// throughput is the counter "rate", its unit the label.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <sstream>
#include <stop_token>
#include <string>
#include <thread>
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

// 4. Batch `slow` takes 50 ms, or ends as soon as its stop token asks (`stoppable`); the rest are
// free.
struct SlowSecond {
  bool stoppable = false;
  std::size_t slow = 1;
  std::shared_ptr<std::atomic<bool>> entered = std::make_shared<std::atomic<bool>>(false);
  std::size_t size() const { return 1000; }
  int operator[](std::size_t i) const { return get(i, {}); }
  int get(std::size_t i, std::stop_token stop) const {
    if (i != slow) return 0;
    entered->store(true);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < deadline && !(stoppable && stop.stop_requested()))
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    return 1;
  }
};

// Batch i is i.
struct Indices {
  std::size_t size() const { return 1000; }
  std::size_t operator[](std::size_t i) const { return i; }
};

template <class S, bool Multiprocess>
void run_batches(benchmark::State& state, S sequence, const char* unit, double bytes_per_batch,
                 std::size_t workers) {
  loadstar::SequenceAdapter<S, loadstar::dynamic_workers, Multiprocess> adapter(
      std::move(sequence), {.max_queue_size = 10, .workers = workers});
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

template <bool Multiprocess>
void register_all(std::size_t workers, std::size_t rounds, double memcpy_gbps) {
  const std::string mode = Multiprocess ? "processes" : "threads";
  const std::string suffix = "/" + mode + "/" + std::to_string(workers);
  benchmark::RegisterBenchmark(("hand-off" + suffix).c_str(), [workers](benchmark::State& s) {
    run_batches<HandOff, Multiprocess>(s, HandOff{}, "batches/s", 0, workers);
  })->UseRealTime();
  benchmark::RegisterBenchmark(("cpu-bound" + suffix).c_str(), [rounds,
                                                                workers](benchmark::State& s) {
    run_batches<CpuBound, Multiprocess>(s, CpuBound{rounds}, "batches/s", 0, workers);
  })->UseRealTime();
  benchmark::RegisterBenchmark(("large" + suffix).c_str(), [memcpy_gbps,
                                                            workers](benchmark::State& s) {
    const Large large;
    const auto bytes = static_cast<double>(large.source.bytes());
    run_batches<Large, Multiprocess>(s, large, "GB/s", bytes, workers);
    s.counters["memcpy"] = memcpy_gbps;
  })->UseRealTime();
}

// The destructor of an adapter of 2 worker threads: idle (`in_flight` false: no batch is being
// built), or while batch 1 (50 ms) is being built, 10 ms into it. Only the
// destructor is timed; "ms" is its mean.
void destruction(benchmark::State& state, bool in_flight, bool stoppable) {
  double seconds = 0.0;
  for (auto _ : state) {
    const SlowSecond sequence{stoppable, in_flight ? 1 : std::numeric_limits<std::size_t>::max()};
    auto adapter = std::make_unique<loadstar::SequenceAdapter<SlowSecond, 2>>(
        sequence, loadstar::AdapterOptions{.max_queue_size = 4});
    benchmark::DoNotOptimize(adapter->next());
    if (in_flight) {
      while (!sequence.entered->load())
        std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      // The free batches are built in microseconds: the workers are asleep by then.
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const auto start = std::chrono::steady_clock::now();
    adapter.reset();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(took);
    seconds += took;
  }
  const double iterations = static_cast<double>(state.iterations());
  state.counters["rate"] = iterations / seconds;
  state.counters["ms"] = seconds / iterations * 1e3;
  state.SetLabel("destructions/s");
}

// Restoring an adapter of 1000 batches from a state taken at `step` of 3 ranks, as rank 1 of 2,
// and taking its first batch.
void restore(benchmark::State& state, std::uint64_t step) {
  const loadstar::SamplerState saved{(step * 3) / 1000, (step * 3) % 1000, 7, 1000, 0, 3};
  for (auto _ : state) {
    loadstar::SequenceAdapter<Indices, 0> adapter(
        Indices{}, {.sampler = {.shuffle = true, .seed = 7, .rank = 1, .size = 2}}, saved);
    benchmark::DoNotOptimize(adapter.next());
  }
  state.counters["rate"] =
      benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel("restores/s");
}

// The worker counts to measure: LOADSTAR_BENCH_WORKERS ("1,2,4,8,16"), else 1, 2 and 3.
std::vector<std::size_t> worker_counts() {
  std::vector<std::size_t> out;
  if (const char* list = std::getenv("LOADSTAR_BENCH_WORKERS")) {
    std::stringstream in(list);
    for (std::string item; std::getline(in, item, ',');)
      out.push_back(static_cast<std::size_t>(std::stoul(item)));
  }
  if (out.empty()) out = {1, 2, 3};
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  const std::size_t rounds = calibrate_rounds();
  const double memcpy_gbps = memcpy_bandwidth(Large{}.source.bytes());
  for (const std::size_t workers : worker_counts()) {
    register_all<false>(workers, rounds, memcpy_gbps);
    register_all<true>(workers, rounds, memcpy_gbps);
  }
  benchmark::RegisterBenchmark("destroy-idle/threads/2", [](benchmark::State& s) {
    destruction(s, false, false);
  })->UseManualTime();
  benchmark::RegisterBenchmark("destroy-in-flight/threads/2", [](benchmark::State& s) {
    destruction(s, true, false);
  })->UseManualTime();
  benchmark::RegisterBenchmark("destroy-stoppable/threads/2", [](benchmark::State& s) {
    destruction(s, true, true);
  })->UseManualTime();
  benchmark::RegisterBenchmark("restore-1e3/inline/0",
                               [](benchmark::State& s) { restore(s, 1000); });
  benchmark::RegisterBenchmark("restore-1e9/inline/0",
                               [](benchmark::State& s) { restore(s, 1000000000); });
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
