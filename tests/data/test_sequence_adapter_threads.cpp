#include <doctest/doctest.h>

#include "adapter_grid.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <loadstar/data/sampler.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

using loadstar::AdapterOptions;
using loadstar::CheckpointError;
using loadstar::ConfigError;
using loadstar::Sampler;
using loadstar::SamplerState;
using loadstar::SequenceAdapter;
using loadstar::WorkerError;

namespace {

using adapter_grid::adapter_stream;
using adapter_grid::CpuAffinity;
using adapter_grid::IndexSequence;
using adapter_grid::length;
using adapter_grid::sampler_stream;
using adapter_grid::seed;
using adapter_grid::workers;

// Fails with a message on one index.
struct FailingSequence {
  std::size_t failing = 7;
  std::size_t size() const { return 20; }
  std::size_t operator[](std::size_t i) const {
    if (i == failing) throw std::runtime_error("cannot decode image " + std::to_string(i));
    return i;
  }
};

// Slow batches, to fill the queue while workers are busy.
struct SlowSequence {
  std::chrono::milliseconds delay{20};
  std::size_t size() const { return 50; }
  loadstar::Tensor<float> operator[](std::size_t i) const {
    std::this_thread::sleep_for(delay);
    return loadstar::Tensor<float>({4, 4}, static_cast<float>(i));
  }
};

// Counts epochs in on_epoch_end and derives each batch from (seed, epoch, index), as an
// augmentation would; on_epoch_end must never run while a batch is being built.
struct AugmentingSequence {
  std::uint64_t epoch = 0;
  std::shared_ptr<std::atomic<int>> building = std::make_shared<std::atomic<int>>(0);
  std::shared_ptr<std::atomic<int>> overlaps = std::make_shared<std::atomic<int>>(0);
  std::size_t size() const { return 10; }
  std::pair<std::uint64_t, std::uint64_t> operator[](std::size_t i) const {
    building->fetch_add(1);
    const std::pair<std::uint64_t, std::uint64_t> batch{epoch,
                                                        loadstar::batch_seed(seed, epoch, i)};
    building->fetch_sub(1);
    return batch;
  }
  void on_epoch_end() {
    if (building->load() != 0) overlaps->fetch_add(1);
    ++epoch;
  }
};

// Batch `stuck` sleeps for `delay`, then reads the sequence's own vector (freed memory, were the
// sequence destroyed under it) and counts itself in `finished`.
struct StuckSequence {
  std::size_t stuck = 1;
  std::chrono::milliseconds delay{0};
  std::shared_ptr<std::atomic<int>> finished;
  std::vector<std::size_t> values = std::vector<std::size_t>(20);
  std::size_t size() const { return values.size(); }
  std::size_t operator[](std::size_t i) const {
    if (i == stuck) {
      std::this_thread::sleep_for(delay);
      finished->fetch_add(values[i] + 1);
    }
    return i + values[i];
  }
};

// What the calls of a sequence did: how many are inside, how many ended early when asked to stop,
// and how many returned after the adapter's destructor had returned (`destroyed`).
struct CallLog {
  std::atomic<int> inside{0};
  std::atomic<int> stopped{0};
  std::atomic<int> late{0};
  std::atomic<std::int64_t> destroyed_at{std::numeric_limits<std::int64_t>::max()};
  void destroyed(std::chrono::steady_clock::time_point when) {
    destroyed_at.store(when.time_since_epoch().count());
  }
  void returned() {
    if (std::chrono::steady_clock::now().time_since_epoch().count() > destroyed_at.load())
      late.fetch_add(1);
    inside.fetch_sub(1);
  }
};

// Batch `slow` waits up to `delay` for its stop token; the others return at once.
struct StoppableSequence {
  std::shared_ptr<CallLog> log;
  std::size_t slow = 1;
  std::chrono::milliseconds delay{0};
  std::size_t size() const { return 20; }
  std::size_t operator[](std::size_t i) const { return get(i, {}); }
  std::size_t get(std::size_t i, std::stop_token stop) const {
    log->inside.fetch_add(1);
    if (i == slow) {
      const auto deadline = std::chrono::steady_clock::now() + delay;
      while (!stop.stop_requested() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (stop.stop_requested()) log->stopped.fetch_add(1);
    }
    log->returned();
    return i;
  }
};

// Random delays of up to 20 ms (ended early on a stop request when `stoppable`) and a failure
// on every seventh batch.
struct RandomSequence {
  std::shared_ptr<CallLog> log;
  std::uint64_t seed = 0;
  bool stoppable = false;
  std::size_t size() const { return 40; }
  std::size_t operator[](std::size_t i) const { return get(i, {}); }
  std::size_t get(std::size_t i, std::stop_token stop) const {
    log->inside.fetch_add(1);
    struct Return {
      CallLog& log;
      ~Return() { log.returned(); }
    } on_return{*log};
    const auto delay = std::chrono::microseconds(loadstar::batch_seed(seed, 0, i) % 20000);
    const auto deadline = std::chrono::steady_clock::now() + delay;
    while (std::chrono::steady_clock::now() < deadline) {
      if (stoppable && stop.stop_requested()) throw std::runtime_error("stopped");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (i % 7 == 3) throw std::runtime_error("cannot decode " + std::to_string(i));
    return i;
  }
};

// Waits up to 10 s for `done()`.
template <class F>
void wait_until(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!done() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// The threads of this process.
std::size_t thread_count() {
  std::size_t count = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    (void)entry;
    ++count;
  }
  return count;
}

// The abandoned call ends on its own, reading its sequence after the adapter is gone (under
// AddressSanitizer, a freed sequence would be reported), and its thread exits.
void check_abandoned_call_ends(const std::atomic<int>& finished, std::size_t threads_before) {
  wait_until([&] { return finished.load() == 1 && thread_count() == threads_before; });
  CHECK(finished.load() == 1);
  CHECK(thread_count() == threads_before);
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE_TEMPLATE("SequenceAdapter on threads yields the sampler's stream across the grid" *
                         doctest::timeout(60),
                     W, workers<0>, workers<1>, workers<2>, workers<5>) {
    adapter_grid::for_each_grid_point([](const AdapterOptions& o, std::size_t count) {
      CHECK(adapter_stream<W::value>(o, count) == sampler_stream(o, count));
    });
  }

  TEST_CASE_TEMPLATE(
      "SequenceAdapter on threads makes one finite validation pass" * doctest::timeout(30), W,
      workers<0>, workers<1>, workers<5>) {
    for (std::size_t rank = 0; rank < 3; ++rank) {
      SequenceAdapter<IndexSequence, W::value> adapter(
          IndexSequence{}, {.sampler = {.rank = rank, .size = 3, .repeat = false}});
      std::vector<std::size_t> got;
      for (std::size_t batch : adapter)
        got.push_back(batch);
      std::vector<std::size_t> expected;
      for (std::size_t i = rank; i < length; i += 3)
        expected.push_back(i);
      CHECK(got == expected);
      CHECK(got.size() == adapter.pass_length());
      CHECK(!adapter.next());
    }
  }

  TEST_CASE_TEMPLATE(
      "SequenceAdapter on threads runs on_epoch_end between epochs only" * doctest::timeout(30), W,
      workers<0>, workers<1>, workers<3>) {
    SequenceAdapter<AugmentingSequence, W::value> adapter(AugmentingSequence{},
                                                          {.max_queue_size = 4});
    for (std::uint64_t e = 0; e < 5; ++e) {
      for (std::size_t i = 0; i < 10; ++i) {
        const auto [epoch, value] = *adapter.next();
        CHECK(epoch == e);
        CHECK(value == loadstar::batch_seed(seed, e, i));
      }
    }
    CHECK(adapter.sequence().epoch == 4);
    CHECK(adapter.sequence().overlaps->load() == 0);
  }

  TEST_CASE_TEMPLATE(
      "SequenceAdapter on threads rethrows a failed batch as WorkerError and goes on" *
          doctest::timeout(30),
      W, workers<0>, workers<1>, workers<4>) {
    SequenceAdapter<FailingSequence, W::value> adapter(FailingSequence{}, {.max_queue_size = 3});
    for (std::size_t i = 0; i < 7; ++i)
      CHECK(*adapter.next() == i);
    CHECK_THROWS_WITH_AS(adapter.next(), doctest::Contains("batch 7 (epoch 0, position 7)"),
                         WorkerError);
    for (std::size_t i = 8; i < 20; ++i)
      CHECK(*adapter.next() == i);
    CHECK(*adapter.next() == 0);
    // The message of the original exception is kept.
    SequenceAdapter<FailingSequence, W::value> again(FailingSequence{0});
    CHECK_THROWS_WITH_AS(again.next(), doctest::Contains("cannot decode image 0"), WorkerError);
  }

  TEST_CASE("SequenceAdapter on threads wakes parked workers when batches turn slow" *
            doctest::timeout(60)) {
    // Cheap batches first: on two CPUs, two of three workers park. Then batches that take 2 ms:
    // the consumer's waits wake the parked workers, and they build their share again.
    struct Turning {
      std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
      std::shared_ptr<std::set<std::thread::id>> slow_builders =
          std::make_shared<std::set<std::thread::id>>();
      std::size_t size() const { return 3040; }
      std::size_t operator[](std::size_t i) const {
        if (i >= 3000) {
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
          const std::lock_guard lock(*mutex);
          slow_builders->insert(std::this_thread::get_id());
        }
        return i;
      }
    };
    const CpuAffinity affinity(2);
    const Turning sequence;
    SequenceAdapter<Turning, 3> adapter(sequence, {.max_queue_size = 8});
    bool in_order = true;
    for (std::size_t i = 0; i < 3040; ++i)
      in_order = in_order && *adapter.next() == i;
    CHECK(in_order);
    const std::lock_guard lock(*sequence.mutex);
    CHECK(sequence.slow_builders->size() >= 2);
  }

  TEST_CASE("SequenceAdapter on threads hands off cheap batches in order through a small ring" *
            doctest::timeout(60)) {
    // Workers race to claim and publish while the consumer frees one slot at a time: every
    // batch arrives once and in order whatever the ring size, with and without a timeout (whose
    // wait is timed), and the ring is never overfilled. On one or two CPUs, six workers on such
    // cheap batches park all but one (or share the consumer's CPU, where both sides yield rather
    // than spin): each wake-up must still reach a worker that builds the awaited batch (a parked
    // worker that took a wake-up meant for the batch once left the consumer waiting forever).
    for (const int cpus : {0, 1, 2}) {
      std::optional<CpuAffinity> affinity;
      if (cpus > 0) affinity.emplace(cpus);
      for (const std::size_t queue : {1, 2, 3, 16}) {
        for (const bool timed : {false, true}) {
          CAPTURE(cpus);
          CAPTURE(queue);
          CAPTURE(timed);
          const AdapterOptions o{
              .max_queue_size = queue,
              .sampler = {.shuffle = true, .seed = seed},
              .timeout = timed ? std::chrono::milliseconds(20000) : std::chrono::milliseconds(0)};
          SequenceAdapter<IndexSequence, 6> adapter(IndexSequence{}, o);
          const auto expected = sampler_stream(o, 3000);
          bool in_order = true;
          for (std::size_t i = 0; i < expected.size(); ++i) {
            in_order = in_order && *adapter.next() == expected[i];
            CHECK(adapter.stats().queue_occupancy <= queue);
          }
          CHECK(in_order);
          CHECK(adapter.stats().batches_produced <= expected.size() + queue);
        }
      }
    }
  }

  TEST_CASE("SequenceAdapter on threads gives up a batch past the timeout and goes on" *
            doctest::timeout(30)) {
    const std::size_t threads_before = thread_count();
    auto finished = std::make_shared<std::atomic<int>>(0);
    {
      SequenceAdapter<StuckSequence, 2> adapter(
          StuckSequence{1, std::chrono::seconds(3), finished},
          {.max_queue_size = 4, .timeout = std::chrono::milliseconds(100)});
      const auto started = std::chrono::steady_clock::now();
      CHECK(*adapter.next() == 0);
      CHECK_THROWS_WITH_AS(adapter.next(),
                           doctest::Contains("batch 1 (epoch 0, position 1) was not ready after "
                                             "100 ms (per-batch timeout); its worker thread was "
                                             "abandoned"),
                           WorkerError);
      // Measured: 0.1 s; the bound leaves room for a loaded machine, not for the 3 s batch.
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(2));
      // The adapter goes on with the following batches, on a fresh worker.
      for (std::size_t i = 2; i < 12; ++i)
        CHECK(*adapter.next() == i);
      CHECK(finished->load() == 0);
    }
    check_abandoned_call_ends(*finished, threads_before);
  }

  TEST_CASE("SequenceAdapter on threads waits in its destructor for the call in flight" *
            doctest::timeout(30)) {
    const std::size_t threads_before = thread_count();
    auto finished = std::make_shared<std::atomic<int>>(0);
    std::chrono::steady_clock::duration destruction{};
    {
      auto adapter = std::make_unique<SequenceAdapter<StuckSequence, 1>>(
          StuckSequence{1, std::chrono::milliseconds(400), finished},
          AdapterOptions{.max_queue_size = 2});
      for (std::size_t batch : *adapter) {
        CHECK(batch == 0);
        break;
      }
      // Let the worker enter batch 1.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const auto started = std::chrono::steady_clock::now();
      adapter.reset();
      destruction = std::chrono::steady_clock::now() - started;
      // The call returned before the destructor did, and its thread is gone.
      CHECK(finished->load() == 1);
      CHECK(thread_count() == threads_before);
    }
    // The rest of the 400 ms batch (measured: 0.35 s).
    CHECK(destruction > std::chrono::milliseconds(200));
    CHECK(destruction < std::chrono::seconds(5));
  }

  TEST_CASE("SequenceAdapter on threads stops a SequenceWithStopToken's call at destruction" *
            doctest::timeout(30)) {
    static_assert(loadstar::SequenceWithStopToken<StoppableSequence>);
    const std::size_t threads_before = thread_count();
    auto log = std::make_shared<CallLog>();
    std::chrono::steady_clock::duration destruction{};
    {
      auto adapter = std::make_unique<SequenceAdapter<StoppableSequence, 2>>(
          StoppableSequence{log, 1, std::chrono::seconds(20)}, AdapterOptions{.max_queue_size = 2});
      CHECK(*adapter->next() == 0);
      wait_until([&] { return log->inside.load() > 0; });
      const auto started = std::chrono::steady_clock::now();
      adapter.reset();
      destruction = std::chrono::steady_clock::now() - started;
      log->destroyed(std::chrono::steady_clock::now());
    }
    // Measured: under 1 ms; the bound leaves room for a loaded machine, not for the 20 s batch.
    CHECK(destruction < std::chrono::seconds(2));
    CHECK(log->stopped.load() == 1);
    CHECK(log->late.load() == 0);
    CHECK(thread_count() == threads_before);
  }

  TEST_CASE("SequenceAdapter on threads runs no call after its destructor, whatever the calls do" *
            doctest::timeout(120)) {
    // Calls that throw, sleep at random and end early when asked to; the consumer breaks out
    // after a random number of batches. No call may return after the destructor.
    std::mt19937_64 rng(43);
    for (int trial = 0; trial < 36; ++trial) {
      auto log = std::make_shared<CallLog>();
      const std::size_t consumed = rng() % 12;
      const std::size_t workers = 1 + rng() % 4;
      const bool stoppable = trial % 2 == 0;
      {
        SequenceAdapter<RandomSequence, loadstar::dynamic_workers> adapter(
            RandomSequence{log, static_cast<std::uint64_t>(trial), stoppable},
            {.max_queue_size = 1 + rng() % 4, .workers = workers});
        for (std::size_t i = 0; i < consumed; ++i) {
          try {
            adapter.next();
          } catch (const WorkerError&) {
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 5));
      }
      log->destroyed(std::chrono::steady_clock::now());
      CAPTURE(trial);
      CHECK(log->inside.load() == 0);
      CHECK(log->late.load() == 0);
    }
  }

  TEST_CASE("SequenceAdapter on threads with a timeout waits at most the timeout, then abandons" *
            doctest::timeout(30)) {
    const std::size_t threads_before = thread_count();
    auto finished = std::make_shared<std::atomic<int>>(0);
    std::chrono::steady_clock::duration destruction{};
    {
      auto adapter = std::make_unique<SequenceAdapter<StuckSequence, 1>>(
          StuckSequence{1, std::chrono::seconds(3), finished},
          AdapterOptions{.max_queue_size = 2, .timeout = std::chrono::milliseconds(200)});
      CHECK(*adapter->next() == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      const auto started = std::chrono::steady_clock::now();
      adapter.reset();
      destruction = std::chrono::steady_clock::now() - started;
    }
    CHECK(destruction >= std::chrono::milliseconds(150));
    CHECK(destruction < std::chrono::seconds(2));
    CHECK(finished->load() == 0);
    check_abandoned_call_ends(*finished, threads_before);
  }

  TEST_CASE("SequenceAdapter with dynamic_workers runs exactly the workers asked for" *
            doctest::timeout(60)) {
    const std::size_t threads_before = thread_count();
    const AdapterOptions base{.sampler = {.shuffle = true, .seed = seed}};
    const auto expected = sampler_stream(base, 250);
    for (const std::size_t n : {0U, 1U, 3U, 5U}) {
      AdapterOptions o = base;
      o.workers = n;
      SequenceAdapter<IndexSequence, loadstar::dynamic_workers> adapter(IndexSequence{}, o);
      CHECK(adapter.worker_count() == n);
      CHECK(thread_count() == threads_before + n);
      std::vector<std::size_t> got;
      for (std::size_t i = 0; i < expected.size(); ++i)
        got.push_back(*adapter.next());
      CAPTURE(n);
      CHECK(got == expected);
    }
    CHECK(thread_count() == threads_before);
    CHECK(
        SequenceAdapter<IndexSequence, loadstar::dynamic_workers>(IndexSequence{}).worker_count() ==
        0);
    CHECK_THROWS_WITH_AS((SequenceAdapter<IndexSequence, 2>(IndexSequence{}, {.workers = 3})),
                         doctest::Contains("workers is 3 but the adapter's Workers argument is 2"),
                         ConfigError);
    CHECK_NOTHROW((SequenceAdapter<IndexSequence, 2>(IndexSequence{}, {.workers = 2})));
    CHECK_THROWS_WITH_AS((SequenceAdapter<IndexSequence, loadstar::dynamic_workers>(
                             IndexSequence{}, {.workers = 5000})),
                         doctest::Contains("workers must be at most 1024 but is 5000"),
                         ConfigError);
  }

  TEST_CASE("SequenceAdapter resumes a state saved on N ranks on M ranks, any workers" *
            doctest::timeout(60)) {
    // The stream one process reads, and 2 ranks in step stopped after 37 steps.
    const auto global = sampler_stream({.sampler = {.shuffle = true, .seed = seed}}, 400);
    std::vector<nlohmann::json> saved;
    for (std::size_t r = 0; r < 2; ++r) {
      SequenceAdapter<IndexSequence, 2> rank(
          IndexSequence{}, {.sampler = {.shuffle = true, .seed = seed, .rank = r, .size = 2}});
      for (int s = 0; s < 37; ++s)
        rank.next();
      saved.push_back(rank.state());
    }
    // 3 ranks (threads, inline, dynamic), each from another rank's state.
    std::vector<std::vector<std::size_t>> got(3);
    for (std::size_t r = 0; r < 3; ++r) {
      const AdapterOptions o{.sampler = {.shuffle = true, .seed = seed, .rank = r, .size = 3}};
      const auto state = saved[r % 2].get<SamplerState>();
      const auto read = [&](auto& adapter) {
        for (int s = 0; s < 50; ++s)
          got[r].push_back(*adapter.next());
      };
      if (r == 0) {
        SequenceAdapter<IndexSequence, 3> adapter(IndexSequence{}, o, state);
        read(adapter);
      } else if (r == 1) {
        SequenceAdapter<IndexSequence, 0> adapter(IndexSequence{}, o, state);
        read(adapter);
      } else {
        AdapterOptions dynamic = o;
        dynamic.workers = 2;
        SequenceAdapter<IndexSequence, loadstar::dynamic_workers> adapter(IndexSequence{}, dynamic,
                                                                          state);
        read(adapter);
      }
    }
    for (std::size_t s = 0; s < 50; ++s) {
      for (std::size_t r = 0; r < 3; ++r) {
        CAPTURE(s);
        CAPTURE(r);
        CHECK(got[r][s] == global[74 + s * 3 + r]);
      }
    }
  }

  TEST_CASE("SequenceAdapter on threads is destroyed promptly under a full queue" *
            doctest::timeout(30)) {
    const std::size_t threads_before = thread_count();
    for (int round = 0; round < 5; ++round) {
      SequenceAdapter<SlowSequence, 4> adapter(SlowSequence{std::chrono::milliseconds(5)},
                                               {.max_queue_size = 2});
      CHECK((*adapter.next())(0, 0) == 0.f);
      std::this_thread::sleep_for(std::chrono::milliseconds(30));  // let the queue fill
      CHECK(adapter.stats().queue_occupancy <= 2);
    }
    {
      // An early break out of an infinite range-for.
      SequenceAdapter<SlowSequence, 3> adapter(SlowSequence{std::chrono::milliseconds(1)});
      std::size_t seen = 0;
      for (const auto& batch : adapter) {
        CHECK(batch(0, 0) == static_cast<float>(seen));
        if (++seen == 5) break;
      }
      CHECK(seen == 5);
      CHECK(thread_count() == threads_before + 3);
    }
    // Every worker thread has ended when the destructor returns.
    CHECK(thread_count() == threads_before);
  }

  TEST_CASE("SequenceAdapter on threads counts produced batches and waiting time" *
            doctest::timeout(30)) {
    SequenceAdapter<SlowSequence, 2> adapter(SlowSequence{std::chrono::milliseconds(2)},
                                             {.max_queue_size = 4});
    for (int i = 0; i < 10; ++i)
      adapter.next();
    const auto stats = adapter.stats();
    CHECK(stats.batches_produced >= 10);
    CHECK(stats.batches_produced <= 10 + 4);
    CHECK(stats.consumer_wait.count() > 0);
    CHECK(stats.queue_occupancy <= 4);
  }

  TEST_CASE("SequenceAdapter resumes at random points with other worker counts" *
            doctest::timeout(60)) {
    std::mt19937_64 rng(2024);
    for (const auto& [rank, size] :
         std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {2, 3}}) {
      const AdapterOptions o{
          .sampler = {.shuffle = true, .seed = seed, .rank = rank, .size = size}};
      const auto uninterrupted = adapter_stream<2>(o, 400);
      for (int trial = 0; trial < 12; ++trial) {
        const auto point = static_cast<std::size_t>(rng() % 330);
        nlohmann::json saved;
        {
          SequenceAdapter<IndexSequence, 3> first(IndexSequence{}, o);
          for (std::size_t i = 0; i < point; ++i)
            first.next();
          saved = first.state();
        }
        const auto state = saved.get<SamplerState>();
        std::vector<std::size_t> got;
        if (trial % 2 == 0) {
          SequenceAdapter<IndexSequence, 0> resumed(IndexSequence{}, o, state);
          for (int i = 0; i < 60; ++i)
            got.push_back(*resumed.next());
        } else {
          SequenceAdapter<IndexSequence, 5> resumed(IndexSequence{}, o, state);
          for (int i = 0; i < 60; ++i)
            got.push_back(*resumed.next());
        }
        CAPTURE(point);
        CHECK(std::equal(got.begin(), got.end(),
                         uninterrupted.begin() + static_cast<std::ptrdiff_t>(point)));
      }
    }
  }

  TEST_CASE("SequenceAdapter rejects bad options and foreign states" * doctest::timeout(30)) {
    CHECK_THROWS_WITH_AS(
        (SequenceAdapter<IndexSequence, 2>(IndexSequence{}, {.max_queue_size = 0})),
        doctest::Contains("max_queue_size must be positive but is 0"), ConfigError);
    // Not std::bad_alloc from the ring: the limit is named.
    CHECK_THROWS_WITH_AS(
        (SequenceAdapter<IndexSequence, 2>(IndexSequence{},
                                           {.max_queue_size = std::size_t{1} << 40U})),
        doctest::Contains("max_queue_size must be at most 1048576 but is 1099511627776"),
        ConfigError);
    CHECK_NOTHROW((SequenceAdapter<IndexSequence, 0>(
        IndexSequence{}, {.max_queue_size = AdapterOptions::max_queue_size_limit})));
    CHECK_THROWS_WITH_AS(
        (SequenceAdapter<IndexSequence, 2>(IndexSequence{2}, {.sampler = {.size = 3}})),
        doctest::Contains("at least as many batches as ranks"), ConfigError);
    const SamplerState foreign{0, 0, seed + 1, length};
    CHECK_THROWS_WITH_AS(
        (SequenceAdapter<IndexSequence, 2>(IndexSequence{}, {.sampler = {.seed = seed}}, foreign)),
        doctest::Contains("saved with seed 778 but the sampler's seed is 777"), CheckpointError);
  }
}
