// AUTOTUNE of map, interleave and prefetch: the budget is kept, an operator's own or one shared
// by a pipeline (counted with live objects and threads, not with the operators' own
// bookkeeping), the choice is reported, and the output and its exact resume do not depend on it.
// Two cases measure convergence in wall-clock time, against a generous bound (10 s, for what
// takes 0.2 s to climb and 3 s to give back here).
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "resume_check.hpp"
#include "test_helpers.hpp"

using dataset_test::check_exact_resume;
using loadstar::AUTOTUNE;
using loadstar::AutotuneBudget;
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
    loadstar::detail::ThreadTuner tuner(4, 100);
    CHECK(tuner.thread_limit() == 4);
    // Costs that keep falling: climbs to the budget and stops there.
    std::size_t t = 1;
    for (double cost : {8.0, 4.0, 2.0, 1.0}) {
      t = tuner.step(t, cost);
      CHECK(t <= 4);
    }
    CHECK(t == 4);
    CHECK(tuner.converged());
    // A step that does not help is taken back.
    loadstar::detail::ThreadTuner flat(8, 100);
    t = flat.step(1, 1.0);
    CHECK(t == 2);
    t = flat.step(t, 0.5);
    CHECK(t == 3);
    t = flat.step(t, 0.48);
    CHECK(t == 2);
    CHECK(flat.converged());
    CHECK(flat.step(t, 0.5) == 2);  // Steady: the next probe waits a period.
    // More threads than inputs never help.
    CHECK(loadstar::detail::ThreadTuner(8, 3).thread_limit() == 3);
    CHECK(AutotuneBudget().cpu_budget() ==
          std::max<std::size_t>(1, std::thread::hardware_concurrency()));
    CHECK(AutotuneBudget().ram_budget() == std::size_t{256} << 20U);
  }

  TEST_CASE("the thread tuner gives threads back to a slow consumer and takes them again") {
    // A model pipeline: `work` seconds per element over the threads, a consumer that spends
    // `consumer` per element; the wall time per element is the slower of the two.
    double consumer = 0;
    const auto cost = [&](std::size_t threads) {
      return std::max(consumer, 8.0 / static_cast<double>(threads));
    };
    loadstar::detail::ThreadTuner tuner(4, 100);
    std::size_t t = 1;
    std::vector<std::size_t> counts;
    const auto run = [&](int periods) {
      counts.clear();
      for (int p = 0; p < periods; ++p) {
        t = tuner.step(t, cost(t));
        REQUIRE(t >= 1);
        REQUIRE(t <= 4);
        counts.push_back(t);
      }
    };
    run(60);
    CHECK(counts[2] == 4);  // Climbed in three periods.
    // Then it stays, but for its probes of one fewer, which back off: at 4 in most periods.
    CHECK(std::count(counts.begin(), counts.end(), std::size_t{4}) >= 50);
    consumer = 10;  // Threads no longer help: it gives them back, one a probe.
    run(40);
    const auto at_one = std::find(counts.begin(), counts.end(), std::size_t{1});
    REQUIRE(at_one != counts.end());
    CHECK(at_one - counts.begin() < 8);
    // And stays at one but for probes of one more, which back off too.
    CHECK(std::count(at_one, counts.end(), std::size_t{1}) >= (counts.end() - at_one) * 3 / 4);
    consumer = 0;  // The consumer is quick again: a probe of one more helps, and it climbs.
    run(40);
    const auto back = std::find(counts.begin(), counts.end(), std::size_t{4});
    REQUIRE(back != counts.end());
    CHECK(back - counts.begin() < 24);
    // A thread the budget refuses is not asked for again at once.
    loadstar::detail::ThreadTuner refused(4, 100);
    t = refused.step(1, 8.0);
    REQUIRE(t == 2);
    refused.refused(8.0);
    CHECK(refused.converged());
    CHECK(refused.step(1, 8.0) == 1);
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

  TEST_CASE("AutotuneBudget shared by two maps and a prefetch bounds them together" *
            doctest::timeout(120)) {
    Probe calls;  // The calls of both maps.
    const auto make = [&calls](const std::shared_ptr<AutotuneBudget>& budget, I64 n) {
      const AutotuneOptions shared{.pipeline = budget};
      return loadstar::range(n)
          .map([](I64 i) { return Tracked(i); })
          .map(
              [&calls](Tracked t) {
                return calls([&] {
                  spin(std::chrono::microseconds(50));
                  return Tracked(t.value * 2);
                });
              },
              {.num_parallel_calls = AUTOTUNE, .autotune = shared})
          .map(
              [&calls](Tracked t) {
                return calls([&] {
                  spin(std::chrono::microseconds(20));
                  return Tracked(t.value + 1);
                });
              },
              {.num_parallel_calls = AUTOTUNE, .autotune = shared})
          .prefetch(AUTOTUNE, shared);
    };
    auto budget = std::make_shared<AutotuneBudget>(4, 30 * 1000);
    Tracked::reset_peak();
    const long before = Tracked::live.load();
    {
      auto ds = make(budget, 400);
      // Each autotuned operator holds one thread from the start.
      CHECK(budget->operators() == 3);
      CHECK(budget->threads_held() == 3);
      std::vector<I64> got;
      while (auto e = ds.next())
        got.push_back(e->value);
      std::vector<I64> expected(400);
      for (I64 i = 0; i < 400; ++i)
        expected[static_cast<std::size_t>(i)] = i * 2 + 1;
      CHECK(got == expected);
      // Bytes, counted with the live elements: 30 within the budget, one more for each map's
      // window (input and output) and for the prefetch when the others hold the rest (so that
      // the pipeline never stalls), and the one handed over.
      MESSAGE("most elements alive at once: " << Tracked::peak.load() - before);
      CHECK(Tracked::peak.load() - before <= 30 + 2 + 2 + 1 + 1);
      // Threads: three held from the start leave one to add, for one map at a time.
      CHECK(calls.most.load() <= 2);
      CHECK(budget->peak_threads_held() <= 4);
      // The budget's own count: the same allowance, in bytes.
      CHECK(budget->peak_bytes_held() <= 30000 + 2000 + 2000 + 1000);
      CHECK(budget->peak_bytes_held() > 0);
      const auto report = ds.autotune_report();
      CHECK(report["ram_budget"] == 30000);
      CHECK(report["pipeline_budget"] == true);
      CHECK(report["peak_buffered_bytes"].get<std::size_t>() <= 30000);
    }
    // Given back when the pipeline is destroyed.
    CHECK(budget->threads_held() == 0);
    CHECK(budget->bytes_held() == 0);
    CHECK(budget->operators() == 0);
    CHECK(Tracked::live.load() == before);
    // Exact resume with a shared budget (a new one for each pipeline).
    check_exact_resume(
        [&make] {
          auto b = std::make_shared<AutotuneBudget>(3, 12 * 1000);
          return make(b, 60);
        },
        2, 8);
  }

  TEST_CASE("AutotuneBudget refuses what it cannot keep with the object and the value named") {
    const auto id = [](I64 i) { return i; };
    auto budget = std::make_shared<AutotuneBudget>(1, 100);
    CHECK_THROWS_WITH_AS(
        loadstar::range(3).map(id, {.num_parallel_calls = 2, .autotune = {.pipeline = budget}}),
        "map: an autotune budget was given but num_parallel_calls is 2, not AUTOTUNE", ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).prefetch(2, {.pipeline = budget}),
                         "prefetch: an autotune budget was given but buffer_size is 2, not "
                         "AUTOTUNE",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        loadstar::range(3).interleave(
            [](I64 x) { return loadstar::range(x); }, 2, 1,
            {.num_parallel_calls = AUTOTUNE, .autotune = {.cpu_budget = 2, .pipeline = budget}}),
        "interleave: autotune has a pipeline budget and cpu_budget 2; the pipeline budget sets "
        "both, leave cpu_budget and ram_budget 0",
        ConfigError);
    CHECK_THROWS_WITH_AS(std::make_shared<AutotuneBudget>(AUTOTUNE, 0),
                         "autotune budget: cpu_budget is AUTOTUNE, which only the tuned values "
                         "accept; give a number (0 means the default)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        loadstar::range(3).map(
            id, {.num_parallel_calls = AUTOTUNE, .autotune = {.ram_budget = AUTOTUNE}}),
        "map: ram_budget is AUTOTUNE, which only the tuned values accept; give a number (0 means "
        "the default)",
        ConfigError);
    CHECK(budget->threads_held() == 0);  // Nothing held by the refused operators.
    // A budget of one thread has room for one autotuned operator; a copy is a second one.
    auto one = loadstar::range(3).map(
        id, {.num_parallel_calls = AUTOTUNE, .autotune = {.pipeline = budget}});
    CHECK(budget->threads_held() == 1);
    const std::string full =
        ": the pipeline autotune budget has no thread left (cpu_budget 1, all held by other "
        "operators); each autotuned operator holds at least one";
    CHECK_THROWS_WITH_AS(std::move(one).prefetch(AUTOTUNE, {.pipeline = budget}),
                         ("prefetch" + full).c_str(), ConfigError);
    auto two = loadstar::range(3).map(
        id, {.num_parallel_calls = AUTOTUNE, .autotune = {.cpu_budget = 1, .ram_budget = 100}});
    auto three = loadstar::range(3).map(
        id, {.num_parallel_calls = AUTOTUNE, .autotune = {.pipeline = budget}});
    CHECK_THROWS_WITH_AS([&] { auto copy = three; }(), ("map" + full).c_str(), ConfigError);
    auto copy = two;  // A budget of its own each: no refusal.
    CHECK(drain(copy) == std::vector<I64>{0, 1, 2});
  }

  TEST_CASE("map with AUTOTUNE reaches its budget within seconds and gives a thread back" *
            doctest::timeout(120)) {
    using Clock = std::chrono::steady_clock;
    Probe calls;
    auto budget = std::make_shared<AutotuneBudget>(2, 16 * 16);  // Windows of 16 elements.
    auto ds = loadstar::range(1'000'000).map(
        [&calls](I64 i) {
          return calls([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
            return i * 3;
          });
        },
        {.num_parallel_calls = AUTOTUNE, .autotune = {.pipeline = budget}});
    I64 index = 0;
    const auto take = [&] {
      auto e = ds.next();
      REQUIRE(e);
      REQUIRE(*e == index * 3);
      ++index;
    };
    // A quick consumer: two calls at once halve the time per element.
    const auto start = Clock::now();
    while (calls.most.load() < 2 && Clock::now() - start < std::chrono::seconds(10))
      take();
    const double climbed = std::chrono::duration<double>(Clock::now() - start).count();
    MESSAGE("map: two calls at once after " << climbed << " s");
    CHECK(calls.most.load() == 2);
    CHECK(climbed < 10);
    // A consumer slower than one thread: the second goes back to the budget.
    const auto slow = Clock::now();
    while (budget->threads_held() > 1 && Clock::now() - slow < std::chrono::seconds(10)) {
      take();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const double gave_back = std::chrono::duration<double>(Clock::now() - slow).count();
    MESSAGE("map: one thread given back after " << gave_back << " s");
    CHECK(budget->threads_held() == 1);
    CHECK(gave_back < 10);
    CHECK(calls.most.load() <= 2);
    CHECK(budget->peak_threads_held() == 2);
  }

  TEST_CASE("interleave with AUTOTUNE reaches its budget within seconds and gives threads back" *
            doctest::timeout(120)) {
    using Clock = std::chrono::steady_clock;
    auto budget = std::make_shared<AutotuneBudget>(4, 1 << 20);
    const AutotuneOptions shared{.pipeline = budget};
    const std::size_t threads_before = live_threads();
    auto ds = loadstar::range(8)
                  .interleave(
                      [](I64 x) {
                        return loadstar::range(1'000'000).map([x](I64 y) {
                          std::this_thread::sleep_for(std::chrono::milliseconds(2));
                          return x * 1'000'000 + y;
                        });
                      },
                      8, 1, {.num_parallel_calls = AUTOTUNE, .autotune = shared})
                  .prefetch(AUTOTUNE, shared);
    I64 index = 0;
    std::size_t most_threads = 0;
    const auto threads = [&] { return live_threads() - threads_before; };
    const auto take = [&] {
      auto e = ds.next();
      REQUIRE(e);
      // One element of each of the eight ranges in turn: the order of one thread.
      REQUIRE(*e == (index % 8) * 1'000'000 + index / 8);
      ++index;
      most_threads = std::max(most_threads, threads());
    };
    // A quick consumer: each reader adds 500 elements a second, so the three readers the budget
    // leaves beside the prefetch's producer all help. Counted as threads of the process.
    const auto start = Clock::now();
    while (threads() < 4 && Clock::now() - start < std::chrono::seconds(10))
      take();
    const double climbed = std::chrono::duration<double>(Clock::now() - start).count();
    MESSAGE("interleave: 4 threads after " << climbed << " s, " << index << " elements");
    CHECK(threads() == 4);
    CHECK(climbed < 10);
    CHECK(budget->threads_held() == 4);
    // A consumer slower than one reader: the readers go back one by one, down to one.
    const auto slow = Clock::now();
    while (threads() > 2 && Clock::now() - slow < std::chrono::seconds(10)) {
      take();
      std::this_thread::sleep_for(std::chrono::milliseconds(6));
    }
    const double gave_back = std::chrono::duration<double>(Clock::now() - slow).count();
    MESSAGE("interleave: back to one reader after " << gave_back << " s");
    CHECK(threads() == 2);
    CHECK(gave_back < 10);
    CHECK(budget->threads_held() <= 3);
    CHECK(most_threads <= 4);
  }
}
