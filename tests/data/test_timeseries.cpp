// timeseries_dataset_from_array against the examples of Keras's documentation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <optional>
#include <tuple>
#include <vector>

using loadstar::ConfigError;
using loadstar::Shape;
using loadstar::Tensor;

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
      steps(99), std::nullopt, 10, {.sequence_stride = 3, .sampling_rate = 2, .batch_size = 128});
  auto batch = ds.next();
  REQUIRE(batch);
  CHECK_FALSE(ds.next());
  REQUIRE(batch->first.shape() == Shape{27, 10, 1});
  const auto all = values(batch->first);
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
  auto x = loadstar::timeseries_dataset_from_array(steps(100), std::nullopt, 20,
                                                   {.sequence_stride = 20});
  auto y = loadstar::timeseries_dataset_from_array(steps(100, 2), std::nullopt, 20,
                                                   {.sequence_stride = 20});
  auto xb = x.next();
  auto yb = y.next();
  REQUIRE(xb);
  REQUIRE(yb);
  CHECK(xb->first.shape() == Shape{5, 20, 1});
  CHECK(values(xb->first.row(0)) == range_of(0, 1, 20));
  CHECK(values(yb->first.row(1)) == range_of(40, 2, 20));
}
