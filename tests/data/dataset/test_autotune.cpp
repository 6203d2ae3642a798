// AUTOTUNE of map, interleave and prefetch: the budget is kept (counted with live objects and
// threads, not with the operators' own bookkeeping), the choice is reported, and the output and
// its exact resume do not depend on it. Nothing passes or fails on timing.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <numeric>
#include <thread>
#include <vector>

#include "resume_check.hpp"
#include "test_helpers.hpp"

using dataset_test::check_exact_resume;
using loadstar::AUTOTUNE;
using loadstar::AutotuneOptions;
using loadstar::ConfigError;
using loadstar::InterleaveOptions;
using test_support::drain;

namespace {

using I64 = std::int64_t;

// An element of 1000 bytes that counts the live ones (a moved-from one holds nothing).
struct Tracked {
  static inline std::atomic<long> live{0};
  static inline std::atomic<long> peak{0};
  static void count(long delta) {
    const long now = live.fetch_add(delta) + delta;
    long seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
  }
  static void reset_peak() { peak = live.load(); }

  explicit Tracked(I64 v = 0) : value(v), payload(1000, 'x') { count(1); }
  Tracked(const Tracked& o) : value(o.value), payload(o.payload) {
    if (!payload.empty()) count(1);
  }
  Tracked(Tracked&& o) noexcept : value(o.value), payload(std::move(o.payload)) {
    o.payload.clear();
  }
  Tracked& operator=(const Tracked& o) {
    if (this != &o) *this = Tracked(o);
    return *this;
  }
  Tracked& operator=(Tracked&& o) noexcept {
    if (!payload.empty()) count(-1);
    value = o.value;
    payload = std::move(o.payload);
    o.payload.clear();
    return *this;
  }
  ~Tracked() {
    if (!payload.empty()) count(-1);
  }
  std::size_t bytes() const { return payload.size(); }
  friend bool operator==(const Tracked& a, const Tracked& b) { return a.value == b.value; }

  I64 value;
  std::vector<char> payload;
};

std::size_t live_threads() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task"))
    ++n;
  return n;
}

// The most calls running at once, and the most threads of the process seen, by `Probe`.
struct Probe {
  std::atomic<int> running{0};
  std::atomic<int> most{0};
  std::atomic<std::size_t> threads{0};
  template <class F>
  auto operator()(F&& f) {
    const int now = ++running;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    const std::size_t t = live_threads();
    std::size_t t_seen = threads.load();
    while (t > t_seen && !threads.compare_exchange_weak(t_seen, t)) {
    }
    auto out = f();
    --running;
    return out;
  }
};

std::vector<I64> values(const std::vector<Tracked>& elements) {
  std::vector<I64> out;
  for (const auto& e : elements)
    out.push_back(e.value);
  return out;
}

void spin(std::chrono::microseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (std::chrono::steady_clock::now() < until) {
  }
}

}  // namespace

TEST_SUITE("autotune") {
  TEST_CASE("the thread tuner climbs while it helps and stays in the budget") {
    loadstar::detail::ThreadTuner tuner(AutotuneOptions{.cpu_budget = 4}, 100);
    CHECK(tuner.thread_limit() == 4);
    // Costs that keep falling: climbs to the budget and stops there.
    std::size_t t = 1;
    for (double cost : {8.0, 4.0, 2.0, 1.0, 0.5, 0.25}) {
      t = tuner.step(t, cost);
      CHECK(t <= 4);
    }
    CHECK(t == 4);
    CHECK(tuner.converged());
    // A step that does not help is taken back.
    loadstar::detail::ThreadTuner flat(AutotuneOptions{.cpu_budget = 8}, 100);
    t = flat.step(1, 1.0);
    CHECK(t == 2);
    t = flat.step(t, 0.5);
    CHECK(t == 3);
    t = flat.step(t, 0.48);
    CHECK(t == 2);
    CHECK(flat.converged());
    CHECK(flat.step(t, 0.1) == 2);
    // More threads than inputs never help.
    CHECK(loadstar::detail::ThreadTuner(AutotuneOptions{.cpu_budget = 8}, 3).thread_limit() == 3);
    CHECK(loadstar::detail::ThreadTuner(AutotuneOptions{}, 1000).cpu_budget() ==
          std::max<std::size_t>(1, std::thread::hardware_concurrency()));
  }

  TEST_CASE("element_bytes counts tensors, composites and strings") {
    CHECK(loadstar::element_bytes(loadstar::Tensor<float>(loadstar::Shape{4, 2})) == 32);
    CHECK(loadstar::element_bytes(std::tuple<loadstar::Tensor<double>, std::int32_t>(
              loadstar::Tensor<double>(loadstar::Shape{3}), 1)) == 28);
    CHECK(loadstar::element_bytes(std::string("abc")) == 3);
    CHECK(loadstar::element_bytes(std::vector<std::int64_t>{1, 2}) == 16);
    CHECK(loadstar::element_bytes(Tracked(1)) == 1000);
  }

  TEST_CASE("map with AUTOTUNE keeps its budget, reports its choice and resumes exactly") {
    Probe probe;
    auto make = [&](std::size_t threads, std::size_t ram) {
      return loadstar::range(300)
          .map([](I64 i) { return Tracked(i); })
          .map(
              [&probe](Tracked t) {
                return probe([&] {
                  spin(std::chrono::microseconds(50));
                  return Tracked(t.value * 2);
                });
              },
              {.num_parallel_calls = threads,
               .autotune = threads == AUTOTUNE ? AutotuneOptions{2, ram} : AutotuneOptions{}});
    };
    auto plain = make(1, 0);
    const auto expected = drain(plain);
    Tracked::reset_peak();
    const long before = Tracked::live.load();
    auto tuned = make(AUTOTUNE, 20 * 2000);
    std::vector<I64> got;
    while (auto e = tuned.next())
      got.push_back(e->value);
    CHECK(got == values(expected));
    // Inputs and outputs of a window within 40 000 bytes (20 elements of each), and the one
    // being handed over.
    CHECK(Tracked::peak.load() - before <= 40 + 1);
    CHECK(probe.most.load() <= 2);
    const auto report = tuned.autotune_report();
    CHECK(report["num_parallel_calls"].get<std::size_t>() >= 1);
    CHECK(report["num_parallel_calls"].get<std::size_t>() <= 2);
    CHECK(report["window"].get<std::size_t>() == 20);
    CHECK(report["cpu_budget"] == 2);
    CHECK(report["ram_budget"] == 40000);
    CHECK(report["peak_buffered_bytes"].get<std::size_t>() <= 40000);
    auto resumable = [] {
      return loadstar::range(200).shuffle(16, 3).map_with_seed(
          [](I64 i, std::uint64_t seed) { return i + static_cast<I64>(seed % 7); }, 5,
          {.num_parallel_calls = AUTOTUNE, .autotune = {.cpu_budget = 3, .ram_budget = 160}});
    };
    auto r = resumable();
    r.next();
    r.next();
    CHECK(r.state()["autotune"]["window"] == 10);  // 160 bytes / (8 in + 8 out).
    check_exact_resume(resumable, 3, 12);
    CHECK_THROWS_WITH_AS(
        loadstar::range(3).map([](I64 i) { return i; },
                               {.num_parallel_calls = AUTOTUNE, .window = 8}),
        "map: window is 8 but with num_parallel_calls AUTOTUNE the window is chosen within the "
        "memory budget; leave window 0",
        ConfigError);
    CHECK_THROWS_WITH_AS(
        loadstar::range(3).map([](I64 i) { return i; },
                               {.num_parallel_calls = 2, .autotune = {.cpu_budget = 2}}),
        "map: an autotune budget was given but num_parallel_calls is 2, not "
        "AUTOTUNE",
        ConfigError);
  }

  TEST_CASE("interleave with AUTOTUNE keeps its budget, reports its choice and resumes exactly") {
    Probe probe;
    const std::size_t threads_before = live_threads();
    auto make = [&](InterleaveOptions options) {
      return loadstar::range(12).interleave(
          [&probe](I64 x) {
            return loadstar::range(20).map([&probe, x](I64 y) {
              return probe([&] {
                spin(std::chrono::microseconds(20 * (y % 3)));
                return Tracked(x * 100 + y);
              });
            });
          },
          4, 2, options);
    };
    auto plain = make({});
    const auto expected = drain(plain);
    Tracked::reset_peak();
    const long before = Tracked::live.load();
    auto tuned = make(
        {.num_parallel_calls = AUTOTUNE, .autotune = {.cpu_budget = 3, .ram_budget = 5 * 1000}});
    std::vector<I64> got;
    while (auto e = tuned.next()) {
      got.push_back(e->value);
      spin(std::chrono::microseconds(10));
    }
    CHECK(got == values(expected));
    // Five elements read ahead or being read (each reserved within the budget), and the one
    // handed over.
    CHECK(Tracked::peak.load() - before <= 5 + 1);
    CHECK(probe.threads.load() <= threads_before + 3);
    const auto report = tuned.autotune_report();
    CHECK(report["num_parallel_calls"].get<std::size_t>() >= 1);
    CHECK(report["num_parallel_calls"].get<std::size_t>() <= 3);
    CHECK(report["ram_budget"] == 5000);
    CHECK(report["peak_buffered_bytes"].get<std::size_t>() <= 5000);
    check_exact_resume(
        [] {
          return loadstar::range(9).interleave(
              [](I64 x) { return loadstar::range(x * 10, x * 10 + 1 + x % 4); }, 3, 2,
              {.num_parallel_calls = AUTOTUNE, .autotune = {.cpu_budget = 2, .ram_budget = 64}});
        },
        3, 12);
    CHECK_THROWS_WITH_AS(make({.num_parallel_calls = 1, .autotune = {.ram_budget = 1}}),
                         "interleave: an autotune budget was given but num_parallel_calls is 1, "
                         "not AUTOTUNE",
                         ConfigError);
  }

  TEST_CASE("prefetch with AUTOTUNE keeps its budget, reports its choice and resumes exactly") {
    const std::size_t threads_before = live_threads();
    Probe probe;
    auto make = [&](std::size_t ram) {
      return loadstar::range(200)
          .map([&probe](I64 i) {
            return probe([&] {
              // Jitter: most elements are quick, every tenth is slow.
              spin(std::chrono::microseconds(i % 10 == 0 ? 400 : 5));
              return Tracked(i);
            });
          })
          .prefetch(AUTOTUNE, {.ram_budget = ram});
    };
    Tracked::reset_peak();
    const long before = Tracked::live.load();
    auto tuned = make(4 * 1000);
    std::vector<I64> got;
    while (auto e = tuned.next()) {
      got.push_back(e->value);
      spin(std::chrono::microseconds(60));
    }
    std::vector<I64> expected(200);
    std::iota(expected.begin(), expected.end(), I64{0});
    CHECK(got == expected);
    // Four buffered (one more only when the queue is empty) and the one handed over.
    CHECK(Tracked::peak.load() - before <= 4 + 1);
    CHECK(probe.threads.load() <= threads_before + 1);
    const auto report = tuned.autotune_report();
    CHECK(report["buffer_size"].get<std::size_t>() >= 1);
    CHECK(report["ram_budget"] == 4000);
    CHECK(report["peak_buffered_bytes"].get<std::size_t>() <= 4000);
    check_exact_resume(
        [] { return loadstar::range(30).shuffle(8, 2).prefetch(AUTOTUNE, {.ram_budget = 40}); }, 3,
        12);
    CHECK_THROWS_WITH_AS(loadstar::range(3).prefetch(2, AutotuneOptions{}),
                         "prefetch: an autotune budget was given but buffer_size is 2, not "
                         "AUTOTUNE",
                         ConfigError);
  }
}
