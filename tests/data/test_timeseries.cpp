// timeseries_dataset_from_array against the examples of Keras's documentation.
#include <doctest/doctest.h>

#include "data/dataset/resume_check.hpp"

#include <algorithm>
#include <cstddef>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <tuple>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::Tensor;
using loadstar::TimeseriesOptions;

namespace {

// The series 0, 1, ..., n - 1 as one feature per step.
Tensor<float> steps(std::size_t n, float scale = 1) {
  Tensor<float> t(Shape{n, 1});
  for (std::size_t i = 0; i < n; ++i)
    t.data()[i] = scale * static_cast<float>(i);
  return t;
}

std::vector<float> values(const Tensor<float>& t) {
  return std::vector<float>(t.data(), t.data() + t.size());
}

std::vector<float> range_of(float first, float step, std::size_t count) {
  std::vector<float> out;
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(first + step * static_cast<float>(i));
  return out;
}

}  // namespace

TEST_CASE("timeseries_dataset_from_array: Keras's first example's windows of every other step") {
  // Keras: indices 0..98, sequence_length=10, sampling_rate=2, sequence_stride=3 give the
  // windows [0 2 .. 18], [3 5 .. 21], [6 8 .. 24], ..., the last [78 80 .. 96].
  auto ds = loadstar::timeseries_dataset_from_array(
      steps(99), 10, {.sequence_stride = 3, .sampling_rate = 2, .batch_size = 128});
  auto batch = ds.next();
  REQUIRE(batch);
  CHECK_FALSE(ds.next());
  REQUIRE(batch->shape() == Shape{27, 10, 1});
  const auto all = values(*batch);
  CHECK(std::vector<float>(all.begin(), all.begin() + 10) == range_of(0, 2, 10));
  CHECK(std::vector<float>(all.begin() + 10, all.begin() + 20) == range_of(3, 2, 10));
  CHECK(std::vector<float>(all.begin() + 20, all.begin() + 30) == range_of(6, 2, 10));
  CHECK(std::vector<float>(all.end() - 10, all.end()) == range_of(78, 2, 10));
}

TEST_CASE("timeseries_dataset_from_array: Keras's temporal regression example") {
  // data[:-10] as inputs and data[10:] as targets: inputs[0] is data[:10], targets[0] data[10].
  const Tensor<float> data = steps(100);
  auto ds =
      loadstar::timeseries_dataset_from_array(data.slice_rows(0, 90), data.slice_rows(10, 100), 10);
  auto batch = ds.next();
  REQUIRE(batch);
  const auto& [inputs, targets] = *batch;
  REQUIRE(inputs.shape() == Shape{81, 10, 1});
  REQUIRE(targets.shape() == Shape{81, 1});
  CHECK(values(inputs.row(0)) == range_of(0, 1, 10));
  CHECK(targets.data()[0] == 10);
  CHECK(values(inputs.row(80)) == range_of(80, 1, 10));
  CHECK(targets.data()[80] == 90);
}

TEST_CASE("timeseries_dataset_from_array: Keras's example of input and target datasets zipped") {
  // X = arange(100), Y = 2X, windows of 20 with stride 20: inputs[0] is X[:20], and the second
  // target window is Y[20:40].
  auto x = loadstar::timeseries_dataset_from_array(steps(100), 20, {.sequence_stride = 20});
  auto y = loadstar::timeseries_dataset_from_array(steps(100, 2), 20, {.sequence_stride = 20});
  auto xb = x.next();
  auto yb = y.next();
  REQUIRE(xb);
  REQUIRE(yb);
  CHECK(xb->shape() == Shape{5, 20, 1});
  CHECK(values(xb->row(0)) == range_of(0, 1, 20));
  CHECK(values(yb->row(1)) == range_of(40, 2, 20));
}

TEST_CASE("timeseries_dataset_from_array: start and end index, batches, shuffling and resume") {
  // Rows 5..49: windows of 4 steps at positions 0, 2, ... below 45 - 3 = 42: 21 windows.
  const TimeseriesOptions options{
      .sequence_stride = 2, .batch_size = 8, .start_index = 5, .end_index = 50};
  auto ds = loadstar::timeseries_dataset_from_array(steps(60), steps(60, -1), 4, options);
  std::vector<float> firsts;
  std::size_t batches = 0;
  while (auto batch = ds.next()) {
    ++batches;
    const auto& [inputs, targets] = *batch;
    for (std::size_t i = 0; i < inputs.shape()[0]; ++i) {
      firsts.push_back(inputs.row(i).data()[0]);
      CHECK(targets.data()[i] == -inputs.row(i).data()[0]);
      CHECK(inputs.row(i).data()[3] == inputs.row(i).data()[0] + 3);
    }
  }
  CHECK(batches == 3);
  CHECK(firsts == range_of(5, 2, 21));

  // Shuffled: the same windows in another order, the same in every run with the seed, and
  // another order in the next epoch (the local shuffle reshuffles).
  TimeseriesOptions shuffled = options;
  shuffled.shuffle = true;
  shuffled.seed = 7;
  const auto epoch_firsts = [&](auto& d) {
    std::vector<float> out;
    while (auto batch = d.next()) {
      const auto& inputs = std::get<0>(*batch);
      for (std::size_t i = 0; i < inputs.shape()[0]; ++i)
        out.push_back(inputs.row(i).data()[0]);
    }
    return out;
  };
  auto a = loadstar::timeseries_dataset_from_array(steps(60), steps(60, -1), 4, shuffled);
  auto b = loadstar::timeseries_dataset_from_array(steps(60), steps(60, -1), 4, shuffled);
  const auto first = epoch_firsts(a);
  CHECK(first == epoch_firsts(b));
  CHECK(first != firsts);
  auto sorted = first;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == firsts);
  a.reset();
  CHECK(epoch_firsts(a) != first);

  dataset_test::check_exact_resume(
      [&] { return loadstar::timeseries_dataset_from_array(steps(60), 4, shuffled); }, 3, 6);
  dataset_test::check_exact_resume([&] { return loadstar::timeseries_windows(steps(30), 5); }, 2,
                                   6);
}

TEST_CASE("timeseries_dataset_from_array refuses what Keras refuses, naming the argument") {
  const auto make = [](std::size_t n, std::size_t length, TimeseriesOptions o) {
    return loadstar::timeseries_windows(steps(n), length, o);
  };
  CHECK_THROWS_WITH_AS(make(10, 2, {.start_index = 10}),
                       doctest::Contains("start_index must be lower than the length of the data "
                                         "but is 10, for data of length 10"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(make(10, 2, {.start_index = 5, .end_index = 5}),
                       doctest::Contains("end_index must be higher than start_index 5"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(make(10, 2, {.end_index = 10}),
                       doctest::Contains("end_index must be lower than the length"), ConfigError);
  CHECK_THROWS_WITH_AS(make(10, 2, {.sampling_rate = 0}),
                       doctest::Contains("sampling_rate must be higher than 0"), ConfigError);
  CHECK_THROWS_WITH_AS(make(10, 2, {.sequence_stride = 10}),
                       doctest::Contains("sequence_stride must be lower than the length"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(make(10, 0, {}), doctest::Contains("sequence_length must be higher than 0"),
                       ConfigError);
  // Windows longer than the series: no windows, as in Keras.
  CHECK(make(10, 11, {}).size() == 0);
}
