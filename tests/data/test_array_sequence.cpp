#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/class_weight.hpp>
#include <loadstar/data/validation_split.hpp>
#include <loadstar/error.hpp>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

using loadstar::ArrayOptions;
using loadstar::ArraySequence;
using loadstar::ClassWeight;
using loadstar::ConfigError;
using loadstar::ShapeError;
using loadstar::Tensor;

namespace {
// Rows numbered 0..n-1: row r of x holds (r, r + 0.5); y holds r.
Tensor<float> numbered_x(std::size_t n) {
  Tensor<float> x({n, 2});
  for (std::size_t r = 0; r < n; ++r) {
    x(r, 0) = static_cast<float>(r);
    x(r, 1) = static_cast<float>(r) + 0.5f;
  }
  return x;
}
Tensor<std::int64_t> numbered_y(std::size_t n) {
  Tensor<std::int64_t> y({n});
  std::iota(y.begin(), y.end(), std::int64_t{0});
  return y;
}
}  // namespace

TEST_SUITE("data") {
  TEST_CASE("ArraySequence size is the ceiling of rows over batch size") {
    ArraySequence seq(numbered_x(10), numbered_y(10), 3);
    CHECK(seq.size() == 4);
    CHECK(seq.rows() == 10);
    CHECK(seq.batch_size() == 3);
    ArraySequence exact(numbered_x(9), numbered_y(9), 3);
    CHECK(exact.size() == 3);
  }

  TEST_CASE("ArraySequence with drop_leftovers floors the number of batches") {
    ArraySequence seq(numbered_x(10), numbered_y(10), 3, ArrayOptions{.drop_leftovers = true});
    CHECK(seq.size() == 3);
    auto [x, y] = seq[2];
    CHECK(y == Tensor<std::int64_t>({3}, {6, 7, 8}));
  }

  TEST_CASE("ArraySequence batch i holds rows i times bs up to the end with a partial last batch") {
    // Determined's _ArrayLikeAdapter, test_one_var_training: data range 10, batch 3 gives
    // [0 1 2] [3 4 5] [6 7 8] [9].
    ArraySequence seq(numbered_x(10), numbered_y(10), 3);
    const std::vector<std::vector<std::int64_t>> expected{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9}};
    for (std::size_t i = 0; i < seq.size(); ++i) {
      auto [x, y] = seq[i];
      CHECK(std::vector<std::int64_t>(y.begin(), y.end()) == expected[i]);
      REQUIRE(x.shape() == loadstar::Shape{expected[i].size(), 2});
      for (std::size_t r = 0; r < x.rows(); ++r) {
        CHECK(x(r, 0) == static_cast<float>(expected[i][r]));
        CHECK(x(r, 1) == static_cast<float>(expected[i][r]) + 0.5f);
      }
    }
  }

  TEST_CASE("ArraySequence batches are views of the arrays") {
    auto x = numbered_x(8);
    ArraySequence seq(x, numbered_y(8), 4);
    auto [bx, by] = seq[1];
    CHECK(bx.shares_storage_with(x));
    CHECK(bx.data() == x.data() + 8);
  }

  TEST_CASE("ArraySequence slices every member of lists maps and tuples") {
    std::vector<Tensor<float>> xs{numbered_x(5), numbered_x(5).reshape({5, 1, 2})};
    std::map<std::string, Tensor<std::int64_t>> ys{{"class", numbered_y(5)},
                                                   {"other", numbered_y(5)}};
    ArraySequence seq(xs, ys, 2);
    auto [bx, by] = seq[2];
    REQUIRE(bx.size() == 2);
    CHECK(bx[0].shape() == loadstar::Shape{1, 2});
    CHECK(bx[1].shape() == loadstar::Shape{1, 1, 2});
    CHECK(by.at("class") == Tensor<std::int64_t>({1}, {4}));
    CHECK(by.at("other") == Tensor<std::int64_t>({1}, {4}));

    std::tuple<Tensor<float>, Tensor<std::uint8_t>> mixed{numbered_x(4),
                                                          Tensor<std::uint8_t>({4, 3})};
    ArraySequence tuple_seq(mixed, numbered_y(4), 3);
    auto [tx, ty] = tuple_seq[1];
    CHECK(std::get<0>(tx).rows() == 1);
    CHECK(std::get<1>(tx).shape() == loadstar::Shape{1, 3});
  }

  TEST_CASE("ArraySequence with sample weights yields x y and w") {
    Tensor<float> w({5}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f});
    ArraySequence seq(numbered_x(5), numbered_y(5), w, 2);
    static_assert(std::tuple_size_v<decltype(seq[0])> == 3);
    auto [x, y, bw] = seq[2];
    CHECK(bw == Tensor<float>({1}, {0.5f}));
    CHECK(y == Tensor<std::int64_t>({1}, {4}));
  }

  TEST_CASE("ArraySequence rejects mismatched row counts naming both") {
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(10), numbered_y(9), 2),
                         doctest::Contains("array sequence: y has 9 rows but x has 10"),
                         ShapeError);
    std::vector<Tensor<float>> xs{numbered_x(5), numbered_x(4)};
    CHECK_THROWS_WITH_AS(ArraySequence(xs, numbered_y(5), 2),
                         doctest::Contains("array sequence: x[1] has 4 rows but x[0] has 5"),
                         ShapeError);
    std::map<std::string, Tensor<float>> named{{"a", numbered_x(5)}, {"b", numbered_x(6)}};
    CHECK_THROWS_WITH_AS(ArraySequence(named, numbered_y(5), 2),
                         doctest::Contains("array sequence: x['b'] has 6 rows but x['a'] has 5"),
                         ShapeError);
    std::tuple<Tensor<float>, Tensor<std::int32_t>> mixed{numbered_x(3), Tensor<std::int32_t>({2})};
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(3), mixed, 2),
                         doctest::Contains("array sequence: y[1] has 2 rows but y[0] has 3"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(5), numbered_y(5), Tensor<float>({4}), 2),
                         doctest::Contains("array sequence: sample_weight has 4 rows but x has 5"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        ArraySequence(numbered_x(5), numbered_y(5), Tensor<float>({5, 2}), 2),
        doctest::Contains("sample_weight must have rank 1 (one weight per row) but is a float32 "
                          "tensor of shape (5, 2)"),
        ShapeError);
  }

  TEST_CASE("ArraySequence rejects a bad batch size") {
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(5), numbered_y(5), 0),
                         doctest::Contains("array sequence: batch_size must be positive but is 0"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        ArraySequence(numbered_x(5), numbered_y(5), 6),
        doctest::Contains("array sequence: batch_size 6 is larger than the 5 rows of the data"),
        ConfigError);
  }

  TEST_CASE("ArraySequence rejects empty inputs") {
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(0), numbered_y(0), 1),
                         doctest::Contains("array sequence: x and y have no rows"), ShapeError);
    CHECK_THROWS_WITH_AS(ArraySequence(std::vector<Tensor<float>>{}, numbered_y(3), 1),
                         doctest::Contains("array sequence: x is an empty collection of arrays"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(
        ArraySequence(Tensor<float>(loadstar::Shape{}), numbered_y(1), 1),
        doctest::Contains("array sequence: x is a scalar but arrays need a batch axis (rank >= 1)"),
        ShapeError);
  }

  TEST_CASE("ArraySequence rejects an index past the last batch") {
    ArraySequence seq(numbered_x(5), numbered_y(5), 2);
    CHECK_THROWS_WITH_AS(seq[3],
                         doctest::Contains("array sequence: batch 3 is out of range for a "
                                           "sequence of 3 batches"),
                         ConfigError);
  }

  TEST_CASE("class_weight_to_sample_weight maps class indices to weights") {
    const ClassWeight cw{{0, 1.0f}, {1, 2.5f}, {2, 4.0f}};
    Tensor<std::int64_t> sparse({4}, {2, 0, 1, 2});
    CHECK(loadstar::class_weight_to_sample_weight(sparse, cw) ==
          Tensor<float>({4}, {4.0f, 1.0f, 2.5f, 4.0f}));
    // A (n, 1) column of float labels is rounded, as tf.keras does.
    Tensor<float> column({3, 1}, {1.0f, 2.0f, 0.0f});
    CHECK(loadstar::class_weight_to_sample_weight(column, cw) ==
          Tensor<float>({3}, {2.5f, 4.0f, 1.0f}));
    // One-hot rows use the argmax.
    Tensor<float> onehot({2, 3}, {0, 0, 1, 0.1f, 0.8f, 0.1f});
    CHECK(loadstar::class_weight_to_sample_weight(onehot, cw) == Tensor<float>({2}, {4.0f, 2.5f}));
  }

  TEST_CASE("ArraySequence with class_weight yields the class weights as sample weights") {
    const ClassWeight cw{{0, 1.0f}, {1, 3.0f}};
    Tensor<std::int32_t> y({4}, {1, 0, 0, 1});
    ArraySequence seq(numbered_x(4), y, cw, 2);
    auto [x0, y0, w0] = seq[0];
    auto [x1, y1, w1] = seq[1];
    CHECK(w0 == Tensor<float>({2}, {3.0f, 1.0f}));
    CHECK(w1 == Tensor<float>({2}, {1.0f, 3.0f}));
  }

  TEST_CASE("class_weight rejects a missing class and multi-output targets") {
    const ClassWeight cw{{0, 1.0f}, {1, 3.0f}};
    Tensor<std::int64_t> y({3}, {0, 1, 7});
    CHECK_THROWS_WITH_AS(loadstar::class_weight_to_sample_weight(y, cw),
                         doctest::Contains("class_weight: no weight for class 7 (row 2 of y); "
                                           "class_weight has 2 classes"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(ArraySequence(numbered_x(3), y, cw, 2),
                         doctest::Contains("no weight for class 7"), ConfigError);
    std::vector<Tensor<std::int64_t>> two{numbered_y(3), numbered_y(3)};
    CHECK_THROWS_WITH_AS(
        loadstar::class_weight_to_sample_weight(two, cw),
        doctest::Contains("class_weight: supported for a single output only but y has 2 arrays"),
        ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::class_weight_to_sample_weight(Tensor<float>({2, 3, 4}), cw),
                         doctest::Contains("class_weight: y must have rank 1 or 2 but is a "
                                           "float32 tensor of shape (2, 3, 4)"),
                         ShapeError);
  }

  TEST_CASE("resolve_sample_weight refuses sample_weight and class_weight together") {
    auto y = numbered_y(2);
    const ClassWeight cw{{0, 1.0f}, {1, 2.0f}};
    CHECK_THROWS_WITH_AS(loadstar::resolve_sample_weight(y, Tensor<float>({2}), cw),
                         doctest::Contains("fit: sample_weight and class_weight were both given"),
                         ConfigError);
    auto from_classes = loadstar::resolve_sample_weight(y, std::nullopt, cw);
    REQUIRE(from_classes.has_value());
    CHECK(*from_classes == Tensor<float>({2}, {1.0f, 2.0f}));
    auto given = loadstar::resolve_sample_weight(y, Tensor<float>({2}, 0.5f), std::nullopt);
    CHECK(*given == Tensor<float>({2}, 0.5f));
    CHECK_FALSE(loadstar::resolve_sample_weight(y, std::nullopt, std::nullopt).has_value());
  }

  TEST_CASE("validation_split takes the last fraction of the rows") {
    // tf.keras: split_at = floor(n * (1 - f)); n = 10, f = 0.25 gives 7 training rows.
    auto [train, val] = loadstar::validation_split(numbered_x(10), numbered_y(10), 0.25);
    CHECK(train.y == numbered_y(7));
    CHECK(val.y == Tensor<std::int64_t>({3}, {7, 8, 9}));
    CHECK(val.x(0, 0) == 7.0f);
    CHECK_FALSE(train.sample_weight.has_value());
    auto [train2, val2] = loadstar::validation_split(numbered_x(10), numbered_y(10), 0.2);
    CHECK(train2.y.rows() == 8);
    CHECK(val2.y.rows() == 2);
  }

  TEST_CASE("validation_split splits sample weights and list members alike") {
    loadstar::Arrays<std::vector<Tensor<float>>, Tensor<std::int64_t>> data{
        {numbered_x(4), numbered_x(4)}, numbered_y(4), Tensor<float>({4}, {1, 2, 3, 4})};
    auto [train, val] = loadstar::validation_split(data, 0.5);
    CHECK(*train.sample_weight == Tensor<float>({2}, {1, 2}));
    CHECK(*val.sample_weight == Tensor<float>({2}, {3, 4}));
    CHECK(val.x[1](0, 0) == 2.0f);
    ArraySequence seq(val.x, val.y, *val.sample_weight, 2);
    CHECK(seq.size() == 1);
  }

  TEST_CASE("validation_split rejects fractions outside the open unit interval") {
    for (double f : {0.0, 1.0, 1.5, -0.1, std::numeric_limits<double>::quiet_NaN()}) {
      CHECK_THROWS_WITH_AS(loadstar::validation_split(numbered_x(10), numbered_y(10), f),
                           doctest::Contains("validation_split: must be in (0, 1) but is"),
                           ConfigError);
    }
    CHECK_THROWS_WITH_AS(
        loadstar::validation_split(numbered_x(1), numbered_y(1), 0.5),
        doctest::Contains("validation_split: too few rows to split into training and validation "
                          "sets with validation_split=0.500000 (rows: 1, training rows: 0)"),
        ConfigError);
    CHECK_THROWS_WITH_AS(loadstar::validation_split(numbered_x(3), numbered_y(4), 0.5),
                         doctest::Contains("validation_split: y has 4 rows but x has 3"),
                         ShapeError);
  }
}
