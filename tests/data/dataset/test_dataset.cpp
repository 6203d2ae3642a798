#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/error.hpp>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "resume_check.hpp"
#include "test_helpers.hpp"

using dataset_test::check_exact_resume;
using loadstar::CheckpointError;
using loadstar::ConfigError;
using loadstar::MapOptions;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::WorkerError;

#if defined(__SANITIZE_THREAD__)
#define LOADSTAR_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOADSTAR_TEST_TSAN 1
#endif
#endif
#ifdef LOADSTAR_TEST_TSAN
// Debian's libtbb is not built with ThreadSanitizer: the happens-before edges of its task spawn
// and wait are invisible to it, so every parallel_for body looks racy. Reports with a oneTBB
// frame are suppressed; the prefetch thread, the cache and everything else stay checked.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libtbb.so\nrace:tbb::detail::\n";
}
#endif

namespace {

Tensor<float> iota_tensor(const loadstar::Shape& shape, float start = 0.f) {
  Tensor<float> t(shape);
  std::iota(t.begin(), t.end(), start);
  return t;
}

Tensor<std::int32_t> labels(std::size_t n) {
  Tensor<std::int32_t> t({n});
  for (std::size_t i = 0; i < n; ++i)
    t.data()[i] = static_cast<std::int32_t>(i % 10);
  return t;
}

using test_support::drain;

std::vector<std::int64_t> iota64(std::int64_t begin, std::int64_t end, std::int64_t step = 1) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = begin; i < end; i += step)
    out.push_back(i);
  return out;
}

struct NotADataset {
  int next() { return 0; }
};

}  // namespace

static_assert(loadstar::Dataset<loadstar::RangeDataset>);
static_assert(loadstar::Dataset<loadstar::TensorSlices<std::tuple<Tensor<float>, Tensor<int>>>>);
static_assert(loadstar::Dataset<loadstar::BatchDataset<loadstar::RangeDataset>>);
static_assert(loadstar::Dataset<loadstar::PrefetchDataset<loadstar::RangeDataset>>);
static_assert(!loadstar::Dataset<NotADataset>);
static_assert(!loadstar::Dataset<std::vector<int>>);

TEST_SUITE("dataset") {
  TEST_CASE("element_seed depends on seed and epoch and index only") {
    using loadstar::element_seed;
    CHECK(element_seed(1, 2, 3) == element_seed(1, 2, 3));
    CHECK(element_seed(1, 2, 3) != element_seed(1, 2, 4));
    CHECK(element_seed(1, 2, 3) != element_seed(1, 3, 3));
    CHECK(element_seed(1, 2, 3) != element_seed(2, 2, 3));
    static_assert(element_seed(0, 0, 0) != element_seed(0, 0, 1));
  }

  TEST_CASE("from_tensor_slices yields rows as views and resumes exactly") {
    const auto x = iota_tensor({6, 2});
    const auto y = labels(6);
    auto ds = loadstar::from_tensor_slices(x, y);
    CHECK(ds.size() == 6);
    auto first = ds.next();
    REQUIRE(first);
    CHECK(std::get<0>(*first).shape() == loadstar::Shape{2});
    CHECK(std::get<0>(*first).shares_storage_with(x));
    CHECK(std::get<0>(*first)(1) == 1.f);
    CHECK(drain(ds).size() == 5);
    CHECK_FALSE(ds.next());
    ds.reset();
    CHECK(ds.next());
    check_exact_resume([&] { return loadstar::from_tensor_slices(x, y); }, 3, 10);
    auto weighted = loadstar::from_tensor_slices(x, y, Tensor<float>({6}, 1.f));
    CHECK(std::get<2>(*weighted.next()).rank() == 0);
  }

  TEST_CASE("from_tensor_slices rejects arrays with different row counts") {
    CHECK_THROWS_WITH_AS(loadstar::from_tensor_slices(iota_tensor({6, 2}), labels(5)),
                         doctest::Contains("member 1 has 5 rows but member 0 has 6"), ShapeError);
  }

  TEST_CASE("range counts with a step and rejects a step of zero") {
    auto ds = loadstar::range(2, 11, 3);
    CHECK(drain(ds) == std::vector<std::int64_t>{2, 5, 8});
    auto down = loadstar::range(3, 0, -1);
    CHECK(drain(down) == std::vector<std::int64_t>{3, 2, 1});
    CHECK_THROWS_WITH_AS(loadstar::range(0, 4, 0), doctest::Contains("step must be non-zero"),
                         ConfigError);
    check_exact_resume([] { return loadstar::range(0, 20, 3); }, 2, 8);
  }

  TEST_CASE("from_generator makes a generator per epoch and replays it on restore") {
    auto make = [] {
      return [i = 0]() mutable -> std::optional<int> {
        if (i >= 7) return std::nullopt;
        return i++ * 10;
      };
    };
    auto ds = loadstar::from_generator(make);
    CHECK(drain(ds) == std::vector<int>{0, 10, 20, 30, 40, 50, 60});
    ds.reset();
    CHECK(*ds.next() == 0);
    check_exact_resume([&] { return loadstar::from_generator(make); }, 2, 8);
    auto short_one = loadstar::from_generator(make);
    CHECK_THROWS_WITH_AS(
        short_one.restore(nlohmann::json{{"op", "generator"}, {"index", 9}}),
        doctest::Contains("generator: state is at element 9 but the generator ended after 7"),
        CheckpointError);
  }

  TEST_CASE("from_sequence yields the batches of a Sequence in order") {
    const auto x = iota_tensor({10, 3});
    const auto y = labels(10);
    loadstar::ArraySequence sequence(x, y, 4);
    auto ds = loadstar::from_sequence(sequence);
    const auto batches = drain(ds);
    REQUIRE(batches.size() == 3);
    for (std::size_t i = 0; i < 3; ++i)
      CHECK(batches[i] == sequence[i]);
    check_exact_resume([&] { return loadstar::from_sequence(sequence); }, 2, 5);
    CHECK_THROWS_WITH_AS(ds.restore(nlohmann::json{{"op", "sequence"}, {"index", 4}}),
                         doctest::Contains("sequence: state is at batch 4 but the sequence has 3"),
                         CheckpointError);
  }

  TEST_CASE("from_sequence yields the same batches as the SequenceAdapter" * doctest::timeout(60)) {
    const auto x = iota_tensor({23, 3});
    const auto y = labels(23);
    const loadstar::ArraySequence sequence(x, y, 4);
    SUBCASE("for one validation pass") {
      loadstar::SequenceAdapter<decltype(sequence), 2> adapter(sequence,
                                                               {.sampler = {.repeat = false}});
      auto ds = loadstar::from_sequence(sequence).prefetch(3);
      std::size_t n = 0;
      while (auto expected = adapter.next()) {
        auto got = ds.next();
        REQUIRE(got);
        CHECK(*got == *expected);
        ++n;
      }
      CHECK(n == sequence.size());
      CHECK_FALSE(ds.next());
    }
    SUBCASE("for three epochs of training") {
      loadstar::SequenceAdapter<decltype(sequence), 2> adapter(sequence,
                                                               {.sampler = {.repeat = true}});
      auto ds = loadstar::from_sequence(sequence).repeat(3);
      for (std::size_t i = 0; i < 3 * sequence.size(); ++i)
        CHECK(*ds.next() == *adapter.next());
      CHECK_FALSE(ds.next());
    }
    SUBCASE("for each of three ranks") {
      for (std::size_t rank = 0; rank < 3; ++rank) {
        loadstar::SequenceAdapter<decltype(sequence), 1> adapter(
            sequence, {.sampler = {.rank = rank, .size = 3, .repeat = false}});
        auto ds = loadstar::wrap_dataset(loadstar::from_sequence(sequence), {rank, 3});
        while (auto expected = adapter.next())
          CHECK(*ds.next() == *expected);
        CHECK_FALSE(ds.next());
      }
    }
  }

  TEST_CASE("Dataset restore rejects a state of another kind of dataset") {
    auto ds = loadstar::range(5).batch(2);
    CHECK_THROWS_WITH_AS(ds.restore(loadstar::range(5).state()),
                         doctest::Contains("batch: state was taken from a 'range' dataset"),
                         CheckpointError);
    CHECK_THROWS_WITH_AS(ds.restore(nlohmann::json::array()),
                         doctest::Contains("batch: state is not a dataset state"), CheckpointError);
  }

  TEST_CASE("map applies a function and unpacks tuples") {
    auto squares = loadstar::range(5).map([](std::int64_t i) { return i * i; });
    CHECK(drain(squares) == std::vector<std::int64_t>{0, 1, 4, 9, 16});
    auto sums2 = loadstar::from_tensor_slices(iota_tensor({3}), iota_tensor({3}, 10.f))
                     .map([](Tensor<float> a, Tensor<float> b) { return *a.data() + *b.data(); });
    CHECK(drain(sums2) == std::vector<float>{10.f, 12.f, 14.f});
    check_exact_resume([] { return loadstar::range(50).map([](std::int64_t i) { return i + 1; }); },
                       2, 10);
  }

  TEST_CASE("map in parallel gives the same stream as sequential map for any thread count") {
    auto f = [](std::int64_t i, std::uint64_t seed) {
      return static_cast<std::int64_t>((seed ^ static_cast<std::uint64_t>(i)) % 1000);
    };
    auto sequential = loadstar::range(300).map_with_seed(f, 7).repeat(2);
    const auto expected = drain(sequential);
    for (std::size_t threads : {2u, 3u, 4u}) {
      CAPTURE(threads);
      auto parallel =
          loadstar::range(300)
              .map_with_seed(f, 7, MapOptions{.num_parallel_calls = threads, .window = 17})
              .repeat(2);
      CHECK(drain(parallel) == expected);
      check_exact_resume(
          [&] {
            return loadstar::range(100).map_with_seed(
                f, 7, MapOptions{.num_parallel_calls = threads, .window = 9});
          },
          3, 12);
    }
  }

  TEST_CASE("map with deterministic false yields every element once and resumes exactly") {
    auto f = [](std::int64_t i) {
      if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      return i;
    };
    auto ds = loadstar::range(200).map(
        f, MapOptions{.num_parallel_calls = 4, .deterministic = false, .window = 16});
    auto out = drain(ds);
    std::sort(out.begin(), out.end());
    CHECK(out == iota64(0, 200));
    // A restore inside a window replays the recorded order of the rest of that window,
    // whatever the new completion order; later windows may come in another order.
    auto make = [&] {
      return loadstar::range(64).map(
          f, MapOptions{.num_parallel_calls = 4, .deterministic = false, .window = 16});
    };
    auto reference_dataset = make();
    const auto reference = dataset_test::record(reference_dataset, 1);
    REQUIRE(reference.elements.size() == 64);
    for (std::size_t at : {1u, 5u, 15u, 17u, 40u, 63u}) {
      CAPTURE(at);
      auto resumed = make();
      resumed.restore(reference.states[at]);
      const std::size_t window_end = (at / 16 + 1) * 16;
      std::vector<std::int64_t> rest;
      while (auto element = resumed.next())
        rest.push_back(*element);
      REQUIRE(rest.size() == 64 - at);
      for (std::size_t i = at; i < window_end; ++i)
        CHECK(rest[i - at] == reference.elements[i]);
      std::vector<std::int64_t> expected(reference.elements.begin() + std::ptrdiff_t(at),
                                         reference.elements.end());
      std::sort(expected.begin(), expected.end());
      std::sort(rest.begin(), rest.end());
      CHECK(rest == expected);
    }
  }

  TEST_CASE("map passes an exception to the consumer with the element index" *
            doctest::timeout(30)) {
    auto f = [](std::int64_t i) {
      if (i == 17) throw std::runtime_error("bad record");
      return i;
    };
    for (std::size_t threads : {1u, 3u}) {
      CAPTURE(threads);
      auto ds = loadstar::range(40).map(f, MapOptions{.num_parallel_calls = threads});
      for (std::int64_t i = 0; i < 17; ++i)
        CHECK(*ds.next() == i);
      CHECK_THROWS_WITH_AS(ds.next(), doctest::Contains("map: element 17 failed: bad record"),
                           WorkerError);
      CHECK(*ds.next() == 18);
    }
    auto prefetched = loadstar::range(40).map(f).prefetch(4);
    for (std::int64_t i = 0; i < 17; ++i)
      CHECK(*prefetched.next() == i);
    CHECK_THROWS_WITH_AS(prefetched.next(), doctest::Contains("map: element 17 failed: bad record"),
                         WorkerError);
    CHECK(*prefetched.next() == 18);
  }

  TEST_CASE("map rejects zero parallel calls") {
    CHECK_THROWS_WITH_AS(loadstar::range(3).map([](std::int64_t i) { return i; },
                                                MapOptions{.num_parallel_calls = 0}),
                         doctest::Contains("map: num_parallel_calls must be positive but is 0"),
                         ConfigError);
  }

  TEST_CASE("filter keeps matching elements and resumes exactly") {
    auto even = [](std::int64_t i) { return i % 2 == 0; };
    auto ds = loadstar::range(10).filter(even);
    CHECK(drain(ds) == std::vector<std::int64_t>{0, 2, 4, 6, 8});
    check_exact_resume([&] { return loadstar::range(40).filter(even); }, 2, 10);
  }

  TEST_CASE("batch stacks rows along a new axis with a partial last batch") {
    const auto x = iota_tensor({10, 2, 3});
    const auto y = labels(10);
    auto ds = loadstar::from_tensor_slices(x, y).batch(4);
    const auto batches = drain(ds);
    REQUIRE(batches.size() == 3);
    CHECK(std::get<0>(batches[0]).shape() == loadstar::Shape{4, 2, 3});
    CHECK(std::get<1>(batches[0]).shape() == loadstar::Shape{4});
    CHECK(std::get<0>(batches[2]).shape() == loadstar::Shape{2, 2, 3});
    CHECK(std::get<0>(batches[1]) == x.slice_rows(4, 8));
    CHECK(std::get<1>(batches[2]) == y.slice_rows(8, 10));
    auto dropped = loadstar::from_tensor_slices(x, y).batch(4, true);
    CHECK(drain(dropped).size() == 2);
    auto scalars = loadstar::range(5).batch(2);
    const auto scalar_batches = drain(scalars);
    REQUIRE(scalar_batches.size() == 3);
    CHECK(scalar_batches[0] == Tensor<std::int64_t>({2}, {0, 1}));
    check_exact_resume([&] { return loadstar::from_tensor_slices(x, y).batch(3); }, 2, 6);
  }

  TEST_CASE("batch stacks lists and maps member by member") {
    std::vector<Tensor<float>> list{iota_tensor({4, 2}), iota_tensor({4}, 100.f)};
    auto listed = loadstar::from_tensor_slices(list).batch(4);
    const auto b = *listed.next();
    REQUIRE(b.size() == 2);
    CHECK(b[0] == list[0]);
    CHECK(b[1] == list[1]);
    std::map<std::string, Tensor<float>> named{{"image", iota_tensor({4, 2})}};
    auto mapped = loadstar::from_tensor_slices(named).batch(3);
    CHECK(mapped.next()->at("image").shape() == loadstar::Shape{3, 2});
  }

  TEST_CASE("batch rejects a batch size of zero and rows of different shapes") {
    CHECK_THROWS_WITH_AS(loadstar::range(3).batch(0),
                         doctest::Contains("batch: batch_size must be positive but is 0"),
                         ConfigError);
    auto ragged = loadstar::range(3)
                      .map([](std::int64_t i) { return Tensor<float>({std::size_t(i) + 1}); })
                      .batch(3);
    CHECK_THROWS_WITH_AS(ragged.next(),
                         doctest::Contains("batch: element 1 has shape (2,) but element 0 has "
                                           "shape (1,)"),
                         ShapeError);
  }

  TEST_CASE("unbatch reverses batch and resumes inside a batch") {
    const auto x = iota_tensor({10, 3});
    const auto y = labels(10);
    auto ds = loadstar::from_tensor_slices(x, y).batch(4).unbatch();
    auto direct = loadstar::from_tensor_slices(x, y);
    CHECK(drain(ds) == drain(direct));
    check_exact_resume(
        [&] { return loadstar::from_sequence(loadstar::ArraySequence(x, y, 3)).unbatch(); }, 2, 10);
  }

  TEST_CASE("shuffle permutes each epoch by seed and resumes exactly") {
    auto ds = loadstar::range(100).shuffle(100, 42);
    auto first = drain(ds);
    ds.reset();
    auto second = drain(ds);
    CHECK(first != second);
    CHECK(first != iota64(0, 100));
    auto sorted = first;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == iota64(0, 100));
    auto again = loadstar::range(100).shuffle(100, 42);
    CHECK(drain(again) == first);
    auto fixed = loadstar::range(100).shuffle(100, 42, false);
    auto fixed_first = drain(fixed);
    fixed.reset();
    CHECK(drain(fixed) == fixed_first);
    check_exact_resume([] { return loadstar::range(60).shuffle(16, 3); }, 3, 15);
    CHECK_THROWS_WITH_AS(loadstar::range(3).shuffle(0, 1),
                         doctest::Contains("shuffle: buffer_size must be positive but is 0"),
                         ConfigError);
  }

  TEST_CASE("repeat concatenates epochs and ends on an empty upstream") {
    auto ds = loadstar::range(3).repeat(2);
    CHECK(drain(ds) == std::vector<std::int64_t>{0, 1, 2, 0, 1, 2});
    auto forever = loadstar::range(2).repeat();
    for (int i = 0; i < 11; ++i)
      CHECK(*forever.next() == i % 2);
    auto empty = loadstar::range(0).repeat();
    CHECK_FALSE(empty.next());
    auto reshuffled = loadstar::range(20).shuffle(20, 5).repeat(2);
    const auto both = drain(reshuffled);
    REQUIRE(both.size() == 40);
    CHECK(std::vector<std::int64_t>(both.begin(), both.begin() + 20) !=
          std::vector<std::int64_t>(both.begin() + 20, both.end()));
    check_exact_resume([] { return loadstar::range(10).shuffle(4, 9).repeat(3); }, 2, 15);
  }

  TEST_CASE("take and skip cut every epoch and resume exactly") {
    auto taken = loadstar::range(10).take(3);
    CHECK(drain(taken) == std::vector<std::int64_t>{0, 1, 2});
    auto skipped = loadstar::range(10).skip(7);
    CHECK(drain(skipped) == std::vector<std::int64_t>{7, 8, 9});
    auto beyond = loadstar::range(3).skip(5);
    CHECK_FALSE(beyond.next());
    check_exact_resume([] { return loadstar::range(30).skip(4).take(20); }, 2, 10);
  }

  TEST_CASE("shard partitions the data and rejects an index beyond the shards") {
    for (std::size_t shards : {1u, 3u, 4u}) {
      std::vector<std::int64_t> all;
      for (std::size_t index = 0; index < shards; ++index) {
        auto ds = loadstar::range(10).shard(shards, index);
        for (auto v : drain(ds)) {
          CHECK(static_cast<std::size_t>(v) % shards == index);
          all.push_back(v);
        }
      }
      std::sort(all.begin(), all.end());
      CHECK(all == iota64(0, 10));
    }
    check_exact_resume([] { return loadstar::range(23).shard(4, 1); }, 2, 8);
    CHECK_THROWS_WITH_AS(loadstar::range(3).shard(2, 2),
                         doctest::Contains("shard: index must be less than num_shards 2 but is 2"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).shard(0, 0),
                         doctest::Contains("shard: num_shards must be positive but is 0"),
                         ConfigError);
  }

  TEST_CASE("shard resumes a state saved on N shards on M, reading on from the same element") {
    // The global stream: a shuffled range, read by one process.
    const auto global = [] {
      auto ds = loadstar::range(103).shuffle(16, 5);
      return drain(ds);
    }();
    auto pipeline = [](std::size_t shards, std::size_t index) {
      return loadstar::range(103).shuffle(16, 5).shard(shards, index);
    };
    for (const std::size_t n : {1U, 2U, 3U}) {
      for (const std::size_t m : {1U, 2U, 3U, 4U}) {
        for (const std::size_t steps : {0U, 1U, 9U, 25U}) {
          std::vector<decltype(pipeline(1, 0))> before;
          for (std::size_t r = 0; r < n; ++r)
            before.push_back(pipeline(n, r));
          std::multiset<std::int64_t> seen;
          for (std::size_t t = 0; t < steps; ++t) {
            for (auto& rank : before) {
              if (auto element = rank.next()) seen.insert(*element);
            }
          }
          // Every rank's state is the same place upstream; each new rank restores another's.
          for (std::size_t r = 1; r < n; ++r)
            CHECK(before[r].state()["upstream"] == before[0].state()["upstream"]);
          std::vector<decltype(pipeline(1, 0))> after;
          for (std::size_t r = 0; r < m; ++r) {
            after.push_back(pipeline(m, r));
            after.back().restore(before[(r + 1) % n].state());
          }
          CAPTURE(n);
          CAPTURE(m);
          CAPTURE(steps);
          // Step t of the M ranks reads global elements [J + tM, J + (t + 1)M), rank r the r-th.
          std::size_t at = std::min<std::size_t>(steps * n, global.size());
          for (bool more = true; more;) {
            more = false;
            for (auto& rank : after) {
              const auto element = rank.next();
              if (!element) {
                CHECK(at >= global.size());
                continue;
              }
              more = true;
              REQUIRE(at < global.size());
              CHECK(*element == global[at++]);
              seen.insert(*element);
            }
          }
          CHECK(seen == std::multiset<std::int64_t>(global.begin(), global.end()));
        }
      }
    }
  }

  TEST_CASE("shard before a shuffle resumes on the same shards only, and says why otherwise") {
    auto two = loadstar::range(40).shard(2, 0).shuffle(8, 3);
    for (int i = 0; i < 5; ++i)
      two.next();
    auto three = loadstar::range(40).shard(3, 0).shuffle(8, 3);
    CHECK_THROWS_WITH_AS(three.restore(two.state()),
                         doctest::Contains("shuffle: the state was saved with shard(2, 0) upstream "
                                           "of this shuffle but the dataset has shard(3, 0)"),
                         CheckpointError);
    auto same = loadstar::range(40).shard(2, 0).shuffle(8, 3);
    same.restore(two.state());
    CHECK(drain(same) == drain(two));
    // A parallel map's window holds elements too.
    auto mapped = loadstar::range(40).shard(2, 1).map([](std::int64_t v) { return v; },
                                                      MapOptions{.num_parallel_calls = 2});
    mapped.next();
    auto remapped = loadstar::range(40).shard(3, 1).map([](std::int64_t v) { return v; },
                                                        MapOptions{.num_parallel_calls = 2});
    CHECK_THROWS_WITH_AS(remapped.restore(mapped.state()),
                         doctest::Contains("map: the state was saved with shard(2, 1)"),
                         CheckpointError);
  }

  TEST_CASE("shard before an interleave or a cache resumes on the same shards only") {
    auto make = [](std::int64_t i) { return loadstar::range(i * 10, i * 10 + 3); };
    auto two = loadstar::range(8).shard(2, 0).interleave(make, 2);
    for (int i = 0; i < 3; ++i)
      two.next();
    auto three = loadstar::range(8).shard(3, 0).interleave(make, 2);
    CHECK_THROWS_WITH_AS(three.restore(two.state()),
                         doctest::Contains("interleave: the state was saved with shard(2, 0) "
                                           "upstream of this interleave but the dataset has "
                                           "shard(3, 0)"),
                         CheckpointError);
    auto cached = loadstar::range(8).shard(2, 1).cache();
    cached.next();
    auto recached = loadstar::range(8).shard(3, 1).cache();
    CHECK_THROWS_WITH_AS(recached.restore(cached.state()),
                         doctest::Contains("cache: the state was saved with shard(2, 1)"),
                         CheckpointError);
  }

  TEST_CASE("shard restores a state written when shards skipped lazily") {
    // After elements 1 and 5 of shard(4, 1), the upstream stood at 6.
    const auto legacy = nlohmann::json::parse(
        R"({"op":"shard","started":true,"upstream":{"op":"range","next":6}})");
    auto ds = loadstar::range(23).shard(4, 1);
    ds.restore(legacy);
    CHECK(drain(ds) == std::vector<std::int64_t>{9, 13, 17, 21});
  }

  TEST_CASE("wrap_dataset shards by rank when distributed and is the identity otherwise") {
    auto alone = loadstar::wrap_dataset(loadstar::range(5), {0, 1});
    CHECK(drain(alone) == iota64(0, 5));
    auto unsharded = loadstar::wrap_dataset(loadstar::range(5), {1, 2}, false);
    CHECK(drain(unsharded) == iota64(0, 5));
    auto rank1 = loadstar::wrap_dataset(loadstar::range(7), {1, 3});
    CHECK(drain(rank1) == std::vector<std::int64_t>{1, 4});
    CHECK_THROWS_WITH_AS(loadstar::wrap_dataset(loadstar::range(5), {2, 2}),
                         doctest::Contains("wrap_dataset: rank must be less than the distributed "
                                           "size 2 but is 2"),
                         ConfigError);
  }

  TEST_CASE("prefetch yields the upstream stream and resumes at the consumed element" *
            doctest::timeout(60)) {
    auto ds = loadstar::range(50).map([](std::int64_t i) { return i * 3; }).prefetch(4);
    CHECK(drain(ds) == [] {
      std::vector<std::int64_t> v;
      for (std::int64_t i = 0; i < 50; ++i)
        v.push_back(i * 3);
      return v;
    }());
    CHECK_FALSE(ds.next());
    ds.reset();
    CHECK(*ds.next() == 0);
    check_exact_resume([] { return loadstar::range(40).shuffle(8, 1).batch(3).prefetch(2); }, 3,
                       12);
    CHECK_THROWS_WITH_AS(loadstar::range(3).prefetch(0),
                         doctest::Contains("prefetch: buffer_size must be positive but is 0"),
                         ConfigError);
  }

  TEST_CASE("prefetch shuts down promptly with a blocked or busy producer" * doctest::timeout(30)) {
    using clock = std::chrono::steady_clock;
    {
      // A full queue: the producer is blocked on it.
      auto ds = loadstar::range(1'000'000).prefetch(2);
      CHECK(*ds.next() == 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto start = clock::now();
      { auto gone = std::move(ds); }
      CHECK(clock::now() - start < std::chrono::seconds(2));
    }
    {
      // A producer inside a slow element: shutdown waits for that element only.
      std::atomic<int> calls{0};
      auto slow = loadstar::range(1'000'000)
                      .map([&calls](std::int64_t i) {
                        ++calls;
                        std::this_thread::sleep_for(std::chrono::milliseconds(50));
                        return i;
                      })
                      .prefetch(8);
      CHECK(*slow.next() == 0);
      const auto start = clock::now();
      { auto gone = std::move(slow); }
      CHECK(clock::now() - start < std::chrono::seconds(2));
      CHECK(calls.load() < 10);
    }
  }

  TEST_CASE("interleave reads datasets round robin and resumes exactly") {
    auto make = [](std::int64_t i) { return loadstar::range(i * 10, i * 10 + 3); };
    auto ds = loadstar::range(4).interleave(make, 2);
    CHECK(drain(ds) == std::vector<std::int64_t>{0, 10, 1, 11, 2, 12, 20, 30, 21, 31, 22, 32});
    auto blocks = loadstar::range(2).interleave(make, 2, 2);
    CHECK(drain(blocks) == std::vector<std::int64_t>{0, 1, 10, 11, 2, 12});
    auto uneven = [](std::int64_t i) { return loadstar::range(i * 10, i * 10 + i % 3 + 1); };
    check_exact_resume([&] { return loadstar::range(9).interleave(uneven, 3, 2); }, 2, 15);
    check_exact_resume(
        [&] { return loadstar::range(9).shuffle(4, 1).interleave(uneven, 4).batch(2); }, 2, 10);
    CHECK_THROWS_WITH_AS(loadstar::range(3).interleave(make, 0),
                         doctest::Contains("interleave: cycle_length must be positive but is 0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).interleave(make, 1, 0),
                         doctest::Contains("interleave: block_length must be positive but is 0"),
                         ConfigError);
  }

  TEST_CASE("Dataset pipelines resume exactly at random points") {
    const auto x = iota_tensor({37, 4});
    const auto y = labels(37);
    auto augment = [](Tensor<float> row, Tensor<std::int32_t> label, std::uint64_t seed) {
      auto out = row.clone();
      out.data()[0] += static_cast<float>(seed % 100);
      return std::tuple{out, label.clone()};
    };
    SUBCASE("with a parallel map and a prefetch") {
      check_exact_resume(
          [&] {
            return loadstar::from_tensor_slices(x, y)
                .shuffle(10, 11)
                .map_with_seed(augment, 5, MapOptions{.num_parallel_calls = 2, .window = 8})
                .batch(4)
                .prefetch(2);
          },
          3, 20);
    }
    SUBCASE("with filter and shard and repeat") {
      check_exact_resume(
          [&] {
            return loadstar::from_tensor_slices(x, y)
                .filter([](const auto& e) { return std::get<1>(e).data()[0] != 3; })
                .shard(2, 1)
                .shuffle(5, 2)
                .repeat(2)
                .batch(3, true)
                .unbatch()
                .take(25);
          },
          2, 20);
    }
  }
}
