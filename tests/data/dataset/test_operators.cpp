// tf.data's remaining operators: zip, concatenate, from_tensors, flat_map, enumerate, window,
// padded_batch, sample_from_datasets, choose_from_datasets, bucket_by_sequence_length, and the
// threaded interleave. Expected values are tf.data's documented examples.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <map>
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
using loadstar::InterleaveOptions;
using loadstar::ShapeError;
using loadstar::Tensor;
using test_support::drain;

#if defined(__SANITIZE_THREAD__)
#define LOADSTAR_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOADSTAR_TEST_TSAN 1
#endif
#endif
#ifdef LOADSTAR_TEST_TSAN
// Debian's libtbb is not built with ThreadSanitizer (see test_dataset.cpp): reports with a
// oneTBB frame are suppressed; the interleave's and prefetch's threads stay checked.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libtbb.so\nrace:tbb::detail::\n";
}
#endif

namespace {

using I64 = std::int64_t;

std::vector<I64> iota64(I64 begin, I64 end) {
  std::vector<I64> out;
  for (I64 i = begin; i < end; ++i)
    out.push_back(i);
  return out;
}

// A rank-1 tensor of `values`.
Tensor<I64> vec(std::vector<I64> values) {
  return Tensor<I64>(loadstar::Shape{values.size()}, std::span<const I64>(values));
}

// tf.fill([x], x) for x in range(begin, end): the padded_batch examples' input.
auto filled(I64 begin, I64 end) {
  return loadstar::range(begin, end).map([](I64 x) {
    return Tensor<I64>(loadstar::Shape{static_cast<std::size_t>(x)}, x);
  });
}

// Elements of the bucket_by_sequence_length example, as a dataset.
auto sequences(std::vector<std::vector<I64>> rows) {
  std::vector<Tensor<I64>> tensors;
  for (auto& r : rows)
    tensors.push_back(vec(r));
  return loadstar::range(static_cast<I64>(tensors.size())).map([tensors](I64 i) {
    return tensors[static_cast<std::size_t>(i)];
  });
}

std::vector<I64> values(const Tensor<I64>& t) {
  return {t.data(), t.data() + t.size()};
}

// Checks the nondeterministic resume: at every chosen point the restored dataset yields exactly
// the elements the reference run had not consumed yet (as a multiset), across epochs.
template <class Make>
void check_resume_as_multiset(Make make, std::size_t epochs, std::size_t points) {
  auto reference_dataset = make();
  const auto reference = dataset_test::record(reference_dataset, epochs);
  REQUIRE(!reference.elements.empty());
  std::mt19937 rng(3);
  std::uniform_int_distribution<std::size_t> pick(0, reference.elements.size() - 1);
  for (std::size_t p = 0; p < points; ++p) {
    const std::size_t at = pick(rng);
    const std::size_t epoch = reference.epoch_of[at];
    auto resumed = make();
    resumed.restore(nlohmann::json::parse(reference.states[at].dump()));
    std::vector<I64> expected, got;
    for (std::size_t i = at; i < reference.elements.size() && reference.epoch_of[i] == epoch; ++i)
      expected.push_back(reference.elements[i]);
    got = drain(resumed);
    std::sort(expected.begin(), expected.end());
    std::sort(got.begin(), got.end());
    REQUIRE_MESSAGE(got == expected, "resumed at " << at);
  }
}

// range(n) with a little work per element that differs by element, so that threads finish out
// of order.
auto slow_range(I64 base, I64 n) {
  return loadstar::range(base, base + n).map([](I64 x) {
    std::this_thread::sleep_for(std::chrono::microseconds(20 * (x % 7)));
    return x;
  });
}

}  // namespace

TEST_SUITE("dataset operators") {
  TEST_CASE("zip ends with the shortest dataset and resumes exactly") {
    auto ds = loadstar::zip(loadstar::range(3), loadstar::range(10, 15));
    const auto out = drain(ds);
    REQUIRE(out.size() == 3);
    CHECK(out[2] == std::tuple<I64, I64>(2, 12));
    CHECK_FALSE(ds.next());
    ds.reset();
    CHECK(drain(ds).size() == 3);
    auto three =
        loadstar::zip(loadstar::range(4), loadstar::range(4).map([](I64 x) { return x * 2; }),
                      loadstar::from_tensors(std::string("a")).repeat());
    const auto t = drain(three);
    REQUIRE(t.size() == 4);
    CHECK(std::get<1>(t[3]) == 6);
    CHECK(std::get<2>(t[3]) == "a");
    check_exact_resume(
        [] { return loadstar::zip(loadstar::range(7).shuffle(3, 1), loadstar::range(20, 29)); }, 3,
        12);
    auto other = loadstar::zip(loadstar::range(3));
    CHECK_THROWS_WITH_AS(other.restore(loadstar::range(3).state()),
                         "zip: state was taken from a 'range' dataset", CheckpointError);
    auto wrong = ds.state();
    wrong["datasets"].erase(1);
    CHECK_THROWS_WITH_AS(ds.restore(wrong), "zip: state has 1 datasets but the zip has 2",
                         CheckpointError);
  }

  TEST_CASE("concatenate, from_tensors, enumerate and flat_map") {
    auto c = loadstar::range(1, 4).concatenate(loadstar::range(4, 8));
    CHECK(drain(c) == iota64(1, 8));
    check_exact_resume([] { return loadstar::range(1, 4).concatenate(loadstar::range(4, 8)); }, 3,
                       10);

    auto one = loadstar::from_tensors(vec({1, 2, 3}));
    const auto got = drain(one);
    REQUIRE(got.size() == 1);  // The whole tensor is one element.
    CHECK(values(got[0]) == std::vector<I64>{1, 2, 3});
    check_exact_resume([] { return loadstar::from_tensors(I64{5}).repeat(3); }, 2, 5);

    auto e = loadstar::range(1, 4).enumerate(5);
    const auto pairs = drain(e);
    REQUIRE(pairs.size() == 3);
    CHECK(pairs[0] == std::tuple<I64, I64>(5, 1));
    CHECK(pairs[2] == std::tuple<I64, I64>(7, 3));
    e.reset();
    CHECK(std::get<0>(*e.next()) == 5);  // The count restarts each epoch.
    check_exact_resume([] { return loadstar::range(9).shuffle(4, 2).enumerate(); }, 3, 12);

    // tf.data's example: Dataset.from_tensor_slices([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    //   .flat_map(from_tensor_slices) gives 1..9.
    Tensor<I64> rows(loadstar::Shape{3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
    auto flat = loadstar::from_tensor_slices(rows).flat_map(
        [](Tensor<I64> row) { return loadstar::from_tensor_slices(row); });
    std::vector<I64> flat_values;
    while (auto x = flat.next())
      flat_values.push_back(*x->data());
    CHECK(flat_values == iota64(1, 10));
    auto counts = loadstar::range(4).flat_map([](I64 x) { return loadstar::range(x); });
    CHECK(drain(counts) == std::vector<I64>{0, 0, 1, 0, 1, 2});
    check_exact_resume(
        [] { return loadstar::range(6).flat_map([](I64 x) { return loadstar::range(x); }); }, 2,
        15);
  }

  TEST_CASE("window follows tf.data's size, shift, stride and drop_remainder") {
    auto windows = [](auto ds) {
      std::vector<std::vector<I64>> out;
      while (auto w = ds.next())
        out.push_back(*w);
      return out;
    };
    using W = std::vector<std::vector<I64>>;
    CHECK(windows(loadstar::range(7).window(3)) == W{{0, 1, 2}, {3, 4, 5}, {6}});
    CHECK(windows(loadstar::range(7).window(3, 0, 1, true)) == W{{0, 1, 2}, {3, 4, 5}});
    CHECK(windows(loadstar::range(7).window(3, 2, 1, true)) == W{{0, 1, 2}, {2, 3, 4}, {4, 5, 6}});
    CHECK(windows(loadstar::range(7).window(3, 1, 2, true)) == W{{0, 2, 4}, {1, 3, 5}, {2, 4, 6}});
    CHECK(windows(loadstar::range(7).window(3, 2)) == W{{0, 1, 2}, {2, 3, 4}, {4, 5, 6}, {6}});
    CHECK(windows(loadstar::range(5).window(3, 1, 2)) == W{{0, 2, 4}, {1, 3}, {2, 4}, {3}, {4}});
    CHECK(windows(loadstar::range(9).window(2, 4)) == W{{0, 1}, {4, 5}, {8}});
    CHECK(windows(loadstar::range(10).window(2, 4, 1, true)) == W{{0, 1}, {4, 5}, {8, 9}});
    CHECK(windows(loadstar::range(0).window(2)).empty());
    for (std::size_t shift : {1, 2, 5}) {
      for (std::size_t stride : {1, 2}) {
        check_exact_resume(
            [=] { return loadstar::range(11).shuffle(3, 4).window(3, shift, stride); }, 3, 12);
        check_exact_resume(
            [=] { return loadstar::range(11).window(3, shift, stride, true).enumerate(); }, 2, 8);
      }
    }
    CHECK_THROWS_WITH_AS(loadstar::range(3).window(0), "window: size must be positive but is 0",
                         ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).window(2, 1, 0),
                         "window: stride must be positive but is 0", ConfigError);
  }

  TEST_CASE("padded_batch pads to the batch maximum or the given shape") {
    // tf.data's example: range(1, 5).map(lambda x: tf.fill([x], x)).padded_batch(2).
    auto b = filled(1, 5).padded_batch(2);
    auto first = *b.next();
    CHECK(first.shape() == loadstar::Shape{2, 2});
    CHECK(values(first) == std::vector<I64>{1, 0, 2, 2});
    auto second = *b.next();
    CHECK(values(second) == std::vector<I64>{3, 3, 3, 0, 4, 4, 4, 4});
    CHECK_FALSE(b.next());
    // padded_shapes=5, padding_values=-1.
    auto c = filled(1, 5).padded_batch(2, {5}, -1);
    CHECK(values(*c.next()) == std::vector<I64>{1, -1, -1, -1, -1, 2, 2, -1, -1, -1});
    // Rank 2, one axis fixed, the other to the batch maximum; the remainder dropped.
    auto grid = loadstar::range(1, 4).map([](I64 x) {
      return Tensor<I64>(loadstar::Shape{static_cast<std::size_t>(x), 2}, x);
    });
    auto g = std::move(grid).padded_batch(2, {-1, 3}, 9, true);
    auto gb = *g.next();
    CHECK(gb.shape() == loadstar::Shape{2, 2, 3});
    CHECK(values(gb) == std::vector<I64>{1, 1, 9, 9, 9, 9, 2, 2, 9, 2, 2, 9});
    CHECK_FALSE(g.next());
    check_exact_resume([] { return filled(0, 9).shuffle(4, 3).padded_batch(3); }, 3, 10);
    // Tuples pad member by member: (sequence, label) with one shape per member.
    auto pairs = filled(1, 4).map([](Tensor<I64> t) {
      return std::make_tuple(t, Tensor<float>(loadstar::Shape{}, static_cast<float>(t.dim(0))));
    });
    auto pb = pairs.padded_batch(3, std::vector<loadstar::PaddedShape>{{4}, {}}, -1);
    auto [seqs, labels] = *pb.next();
    CHECK(seqs.shape() == loadstar::Shape{3, 4});
    CHECK(values(seqs) == std::vector<I64>{1, -1, -1, -1, 2, 2, -1, -1, 3, 3, 3, -1});
    CHECK(labels.shape() == loadstar::Shape{3});
    CHECK(labels.data()[2] == 3.f);
    CHECK_THROWS_WITH_AS(pairs.padded_batch(3, std::vector<loadstar::PaddedShape>{{4}}),
                         "padded_batch: padded_shapes has 1 shapes but the elements have 2 members",
                         ConfigError);

    auto small = filled(1, 5).padded_batch(4, {3});
    CHECK_THROWS_WITH_AS(small.next(),
                         "padded_batch: element 3 has shape (4,), larger than the padded size 3 of "
                         "axis 0",
                         ShapeError);
    auto rank = filled(1, 3).padded_batch(2, {2, 2});
    CHECK_THROWS_WITH_AS(rank.next(),
                         "padded_batch: padded_shapes has rank 2 but element 0 has shape (1,)",
                         ShapeError);
    CHECK_THROWS_WITH_AS(filled(1, 3).padded_batch(2, {-2}),
                         "padded_shapes: axis 0 must be -1 (the batch maximum) or a size but is -2",
                         ConfigError);
    CHECK_THROWS_WITH_AS(filled(1, 3).padded_batch(0),
                         "padded_batch: batch_size must be positive but is 0", ConfigError);
  }

  TEST_CASE("bucket_by_sequence_length groups by length as tf.data's example") {
    const std::vector<std::vector<I64>> elements = {
        {0}, {1, 2, 3, 4}, {5, 6, 7}, {7, 8, 9, 10, 11}, {13, 14, 15, 16, 19, 20}, {21, 22}};
    auto length = [](const Tensor<I64>& t) { return t.dim(0); };
    auto ds = sequences(elements).bucket_by_sequence_length(length, {3, 5}, {2, 2, 2});
    auto b1 = *ds.next();
    CHECK(b1.shape() == loadstar::Shape{2, 4});
    CHECK(values(b1) == std::vector<I64>{1, 2, 3, 4, 5, 6, 7, 0});
    auto b2 = *ds.next();
    CHECK(values(b2) == std::vector<I64>{7, 8, 9, 10, 11, 0, 13, 14, 15, 16, 19, 20});
    auto b3 = *ds.next();
    CHECK(values(b3) == std::vector<I64>{0, 0, 21, 22});
    CHECK_FALSE(ds.next());

    // drop_remainder drops the partial buckets at the end.
    auto dropped = sequences(elements).bucket_by_sequence_length(length, {3, 5}, {2, 2, 3},
                                                                 {.drop_remainder = true});
    CHECK(drain(dropped).size() == 2);  // Buckets 0 and 1; bucket 2 holds 2 of 3.
    // pad_to_bucket_boundary pads to the bucket's boundary minus one; padding_value.
    auto to_boundary =
        sequences({{1}, {2, 3}, {4, 5, 6}})
            .bucket_by_sequence_length(length, {3, 5}, {2, 2, 2},
                                       {.padding_value = -1, .pad_to_bucket_boundary = true});
    auto p1 = *to_boundary.next();
    CHECK(values(p1) == std::vector<I64>{1, -1, 2, 3});
    auto p2 = *to_boundary.next();
    CHECK(values(p2) == std::vector<I64>{4, 5, 6, -1});
    auto too_long = sequences(elements).bucket_by_sequence_length(length, {3, 5}, {2, 2, 2},
                                                                  {.pad_to_bucket_boundary = true});
    CHECK_THROWS_WITH_AS(drain(too_long),
                         "bucket_by_sequence_length: an element has length 5 but with "
                         "pad_to_bucket_boundary elements must be shorter than the largest "
                         "boundary 5",
                         ShapeError);
    auto same = sequences({{1, 2}, {3, 4}, {5}})
                    .bucket_by_sequence_length(length, {2}, {1, 2}, {.no_padding = true});
    CHECK(values(*same.next()) == std::vector<I64>{1, 2, 3, 4});
    CHECK(values(*same.next()) == std::vector<I64>{5});

    check_exact_resume(
        [&] {
          return filled(0, 12).shuffle(5, 9).bucket_by_sequence_length(length, {3, 6, 9},
                                                                       {2, 3, 2, 1});
        },
        3, 15);
    // (sequence, label) tuples, the sequence padded to 6 and the label left as it is.
    auto labelled =
        filled(1, 7)
            .map([](Tensor<I64> t) {
              return std::make_tuple(t, Tensor<I64>(loadstar::Shape{}, t.dim(0) * 10));
            })
            .bucket_by_sequence_length(
                [](const std::tuple<Tensor<I64>, Tensor<I64>>& e) { return std::get<0>(e).dim(0); },
                {4}, {3, 3}, {.padded_shapes = {{6}, {}}});
    auto [short_seqs, short_labels] = *labelled.next();
    CHECK(short_seqs.shape() == loadstar::Shape{3, 6});
    CHECK(values(short_labels) == std::vector<I64>{10, 20, 30});

    CHECK_THROWS_WITH_AS(sequences(elements).bucket_by_sequence_length(length, {5, 3}, {2, 2, 2}),
                         "bucket_by_sequence_length: bucket_boundaries must be sorted but are "
                         "[5,3]",
                         ConfigError);
    CHECK_THROWS_WITH_AS(sequences(elements).bucket_by_sequence_length(length, {3, 5}, {2, 2}),
                         "bucket_by_sequence_length: bucket_batch_sizes must have 3 entries (one "
                         "more than bucket_boundaries) but has 2",
                         ConfigError);
    CHECK_THROWS_WITH_AS(sequences(elements).bucket_by_sequence_length(length, {3}, {2, 0}),
                         "bucket_by_sequence_length: bucket_batch_sizes[1] must be positive but "
                         "is 0",
                         ConfigError);
    CHECK_THROWS_WITH_AS(sequences(elements).bucket_by_sequence_length(
                             length, {3}, {2, 2}, {.padding_value = 1, .no_padding = true}),
                         "bucket_by_sequence_length: no_padding is set, so padded_shapes, "
                         "padding_value and pad_to_bucket_boundary must be left at their defaults",
                         ConfigError);
  }

  TEST_CASE("sample_from_datasets draws by weight and resumes exactly") {
    std::vector<loadstar::RangeDataset> two = {loadstar::range(0, 100), loadstar::range(100, 200)};
    // Without stop_on_empty_dataset (tf.data's default) every element comes out once.
    auto all = loadstar::sample_from_datasets(two, {0.5, 0.5}, 7);
    auto out = drain(all);
    CHECK(out.size() == 200);
    auto sorted = out;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == iota64(0, 200));
    CHECK(out != sorted);  // Mixed.
    // Weights: 0 never draws; 3:1 draws about three times as often over the first 100.
    auto only_second = loadstar::sample_from_datasets(two, {0.0, 1.0}, 7);
    CHECK(drain(only_second) == iota64(100, 200));
    auto skewed = loadstar::sample_from_datasets(two, {3.0, 1.0}, 11);
    int first = 0;
    for (int i = 0; i < 100; ++i)
      first += *skewed.next() < 100 ? 1 : 0;
    CHECK(first > 60);
    CHECK(first < 90);
    // stop_on_empty_dataset ends at the first exhausted draw.
    std::vector<loadstar::RangeDataset> uneven = {loadstar::range(0, 3), loadstar::range(100, 200)};
    auto stopping = loadstar::sample_from_datasets(uneven, {}, 5, true);
    const auto stopped = drain(stopping);
    CHECK(std::count_if(stopped.begin(), stopped.end(), [](I64 x) { return x < 3; }) == 3);
    CHECK(stopped.size() < 103);
    // The order depends on the seed only, and on the epoch with rerandomize_each_iteration.
    auto again = loadstar::sample_from_datasets(two, {0.5, 0.5}, 7);
    CHECK(drain(again) == out);
    again.reset();
    CHECK(drain(again) == out);
    auto other_seed = loadstar::sample_from_datasets(two, {0.5, 0.5}, 8);
    CHECK(drain(other_seed) != out);
    auto rerandomized = loadstar::sample_from_datasets(two, {0.5, 0.5}, 7, false, true);
    CHECK(drain(rerandomized) == out);
    rerandomized.reset();
    CHECK(drain(rerandomized) != out);
    check_exact_resume([&] { return loadstar::sample_from_datasets(uneven, {1, 2}, 3); }, 3, 15);
    check_exact_resume(
        [&] {
          return loadstar::sample_from_datasets(uneven, {1, 2}, 3, false, true);
        },
        3, 15);
    check_exact_resume([&] { return loadstar::sample_from_datasets(uneven, {}, 3, true); }, 3, 10);

    CHECK_THROWS_WITH_AS(loadstar::sample_from_datasets(std::vector<loadstar::RangeDataset>{}),
                         "sample_from_datasets: datasets is empty", ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::sample_from_datasets(two, {1.0}),
                         "sample_from_datasets: weights has 1 entries but there are 2 datasets",
                         ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::sample_from_datasets(two, {1.0, -1.0}),
                         "sample_from_datasets: weights[1] must be finite and non-negative but is "
                         "-1.000000",
                         ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::sample_from_datasets(two, {0.0, 0.0}),
                         "sample_from_datasets: the weights are all 0", ConfigError);
  }

  TEST_CASE("choose_from_datasets follows the choices") {
    // tf.data's example: foo, bar, baz repeated, chosen by range(3).repeat(3).
    using S = loadstar::RepeatDataset<loadstar::FromTensorsDataset<std::string>>;
    std::vector<S> words = {loadstar::from_tensors(std::string("foo")).repeat(),
                            loadstar::from_tensors(std::string("bar")).repeat(),
                            loadstar::from_tensors(std::string("baz")).repeat()};
    auto ds = loadstar::choose_from_datasets(words, loadstar::range(3).repeat(3));
    const auto out = drain(ds);
    CHECK(out ==
          std::vector<std::string>{"foo", "bar", "baz", "foo", "bar", "baz", "foo", "bar", "baz"});
    std::vector<loadstar::RangeDataset> two = {loadstar::range(0, 2), loadstar::range(10, 12)};
    auto choices = [] {
      return loadstar::range(6).map(
          [](I64 i) { return std::vector<I64>{0, 0, 0, 1, 0, 1}[static_cast<std::size_t>(i)]; });
    };
    auto stop = loadstar::choose_from_datasets(two, choices());
    CHECK(drain(stop) == std::vector<I64>{0, 1});
    auto skip = loadstar::choose_from_datasets(two, choices(), false);
    CHECK(drain(skip) == std::vector<I64>{0, 1, 10, 11});
    check_exact_resume([&] { return loadstar::choose_from_datasets(two, choices(), false); }, 3, 8);
    check_exact_resume(
        [&] {
          return loadstar::choose_from_datasets(
              words, loadstar::range(20).map([](I64 x) { return (x * 7) % 3; }));
        },
        2, 10);

    auto bad = loadstar::choose_from_datasets(two, loadstar::range(1, 4));
    CHECK(*bad.next() == 10);
    CHECK_THROWS_WITH_AS(bad.next(),
                         "choose_from_datasets: choice_dataset gave 2 but there are 2 datasets "
                         "(choices must be in [0, 2))",
                         ConfigError);
  }

  TEST_CASE("interleave with threads keeps the sequential order and resumes exactly") {
    auto inner = [](I64 x) { return slow_range(100 * x, 1 + x % 4); };
    for (std::size_t cycle : {1, 3, 4}) {
      for (std::size_t block : {1, 2}) {
        auto sequential = loadstar::range(10).interleave(inner, cycle, block);
        const auto expected = drain(sequential);
        for (std::size_t threads : {2, 4}) {
          auto parallel = loadstar::range(10).interleave(
              inner, cycle, block, InterleaveOptions{.num_parallel_calls = threads});
          CHECK(drain(parallel) == expected);
          check_exact_resume(
              [&] {
                return loadstar::range(10).shuffle(3, 5).interleave(
                    inner, cycle, block, InterleaveOptions{.num_parallel_calls = threads});
              },
              2, 6);
        }
      }
    }
    // A threaded interleave resumes a sequential one's state and the other way round.
    auto make = [&](std::size_t threads) {
      return loadstar::range(10).interleave(inner, 3, 2,
                                            InterleaveOptions{.num_parallel_calls = threads});
    };
    auto seq = make(1);
    for (int i = 0; i < 7; ++i)
      seq.next();
    auto par = make(3);
    par.restore(seq.state());
    auto seq_rest = drain(seq);
    CHECK(drain(par) == seq_rest);
    // An exception of an inner dataset reaches the consumer in its place.
    auto failing = loadstar::range(3).interleave(
        [](I64 x) {
          return loadstar::range(3).map([x](I64 y) {
            if (x == 1 && y == 1) throw std::runtime_error("bad record");
            return y;
          });
        },
        3, 1, InterleaveOptions{.num_parallel_calls = 3});
    for (int i = 0; i < 4; ++i)
      CHECK(failing.next());
    CHECK_THROWS_WITH_AS(failing.next(), "map: element 1 failed: bad record",
                         loadstar::WorkerError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).interleave(inner, 2, 1, {.num_parallel_calls = 0}),
                         "interleave: num_parallel_calls must be positive but is 0", ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::range(3).interleave(inner, loadstar::AUTOTUNE),
                         "interleave: cycle_length is AUTOTUNE, which only num_parallel_calls "
                         "accepts here; give a number",
                         ConfigError);
  }

  TEST_CASE("interleave and map without deterministic lose and repeat nothing across a restore") {
    auto inner = [](I64 x) { return slow_range(100 * x, 1 + x % 5); };
    auto make = [&] {
      return loadstar::range(12).interleave(
          inner, 4, 2, InterleaveOptions{.num_parallel_calls = 4, .deterministic = false});
    };
    auto ds = make();
    auto out = drain(ds);
    std::sort(out.begin(), out.end());
    auto sequential = loadstar::range(12).interleave(inner, 4, 2);
    auto expected = drain(sequential);
    std::sort(expected.begin(), expected.end());
    CHECK(out == expected);
    check_resume_as_multiset(make, 2, 12);
    check_resume_as_multiset(
        [] {
          return slow_range(0, 200).map(
              [](I64 x) { return x * 3; },
              {.num_parallel_calls = 4, .deterministic = false, .window = 16});
        },
        2, 12);
  }
}
