// What a Keras user writes first and the mistakes they make: Keras's constructor forms, and
// errors that name what the user called and what to do instead.
#include <doctest/doctest.h>

#include "keras/blobs.hpp"

#include <cstdint>
#include <loadstar/keras.hpp>
#include <memory>
#include <sstream>
#include <tuple>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;

TEST_CASE(
    "Model takes Keras's forms: several inputs and one output, one input and several outputs") {
  auto a = Input({2}, "a");
  auto b = Input({3}, "b");
  auto out = call(layers::Dense(1, {.name = "out"}),
                  call(layers::Concatenate(), std::vector<KerasTensor>{a, b}));
  Model two_in({a, b}, out);  // Keras: Model(inputs=[a, b], outputs=out)
  CHECK(two_in.inputs().size() == 2);
  CHECK(two_in.outputs().size() == 1);

  auto x = Input({2}, "x");
  auto h = call(layers::Dense(4, {.name = "h"}), x);
  Model two_out(
      x, {call(layers::Dense(1, {.name = "p"}), h), call(layers::Dense(2, {.name = "q"}), h)});
  CHECK(two_out.inputs().size() == 1);
  CHECK(two_out.outputs().size() == 2);
}

TEST_CASE("compile refuses a misspelt metric at once, naming it and the known ones") {
  Sequential model{Input({2}), layers::Dense(2)};
  CHECK_THROWS_WITH_AS(
      model.compile(
          {.optimizer = "adam", .loss = "sparse_categorical_crossentropy", .metrics = {"acuracy"}}),
      doctest::Contains("compile: unknown metric 'acuracy'; known: "), ConfigError);
  CHECK_THROWS_WITH_AS(model.compile({.optimizer = "adam",
                                      .loss = "sparse_categorical_crossentropy",
                                      .weighted_metrics = {"acc", "recal"}}),
                       doctest::Contains("unknown metric 'recal'"), ConfigError);
  // Keras's names and class names still pass.
  CHECK_NOTHROW(model.compile({.optimizer = "adam",
                               .loss = "sparse_categorical_crossentropy",
                               .metrics = {"accuracy", "acc", "AUC", "mae"}}));
}

TEST_CASE("one-hot labels with sparse_categorical_crossentropy point to categorical_crossentropy") {
  const Blobs data = blobs(16);
  Tensor<float> one_hot({16, 2});
  for (std::size_t i = 0; i < 16; ++i)
    one_hot(i, static_cast<std::size_t>(data.y(i))) = 1.0F;
  Sequential model{Input({2}), layers::Dense(2)};
  model.compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
  std::ostringstream quiet;
  CHECK_THROWS_WITH_AS(model.fit(data.x, one_hot, {.epochs = 1, .verbose = 0, .output = &quiet}),
                       doctest::Contains("looks one-hot (the shape of y_pred); this loss takes one "
                                         "class index per row, of shape (16,): use "
                                         "categorical_crossentropy for one-hot labels"),
                       ShapeError);
}

TEST_CASE("fit with arrays of different row counts names fit and its arguments") {
  const Blobs data = blobs(10);
  Sequential model{Input({2}), layers::Dense(2)};
  model.compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
  CHECK_THROWS_WITH_AS(model.fit(data.x, data.y.slice_rows(0, 9), {.epochs = 1, .verbose = 0}),
                       doctest::Contains("fit: y has 9 rows but x has 10"), ShapeError);
  CHECK_THROWS_WITH_AS(
      model.fit(data.x, data.y, {.epochs = 1, .verbose = 0, .sample_weight = Tensor<float>({8})}),
      doctest::Contains("fit: sample_weight has 8 rows but x has 10"), ShapeError);
}

namespace {
/// A Keras Sequence that counts its on_epoch_end calls (in a counter its copies share).
struct CountingSequence {
  Blobs data = blobs(24);
  std::shared_ptr<int> epoch_ends = std::make_shared<int>(0);
  std::size_t size() const { return 3; }
  std::tuple<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
    return {data.x.slice_rows(i * 8, i * 8 + 8), data.y.slice_rows(i * 8, i * 8 + 8)};
  }
  void on_epoch_end() { ++*epoch_ends; }
};
}  // namespace

TEST_CASE("fit runs a Sequence's on_epoch_end at the end of every epoch, the last one included") {
  for (const std::size_t workers : {0, 2}) {
    CAPTURE(workers);
    CountingSequence sequence;
    Sequential model{Input({2}), layers::Dense(2)};
    model.compile({.optimizer = "sgd", .loss = "sparse_categorical_crossentropy"});
    std::ostringstream quiet;
    model.fit(sequence, {.epochs = 2, .verbose = 0, .workers = workers, .output = &quiet});
    CHECK(*sequence.epoch_ends == 2);  // Keras: once per epoch
  }
}
