#include <doctest/doctest.h>

#include "keras/blobs.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <loadstar/data.hpp>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/keras.hpp>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using namespace loadstar::keras::callbacks;

namespace {
std::atomic<std::size_t> allocations{0};
}  // namespace

// Counts every allocation of this test executable, to check that training steps allocate nothing.
// GCC 12 takes free() in these replacements for a mismatch with the new they pair with.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t size, std::align_val_t alignment) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto align = static_cast<std::size_t>(alignment);
  if (void* p = std::aligned_alloc(align, (size + align - 1) / align * align)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
  return operator new(size);
}
// The nothrow forms too (std::stable_sort's temporary buffer): every new here pairs with the
// deletes below.
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  return std::malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
  return operator new(size, tag);
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
  return operator new(size, alignment);
}
// The aligned nothrow form: tensors' storage is allocated with it.
void* operator new(std::size_t size, std::align_val_t alignment, const std::nothrow_t&) noexcept {
  allocations.fetch_add(1, std::memory_order_relaxed);
  const auto align = static_cast<std::size_t>(alignment);
  return std::aligned_alloc(align, (size + align - 1) / align * align);
}
void* operator new[](std::size_t size, std::align_val_t alignment,
                     const std::nothrow_t& tag) noexcept {
  return operator new(size, alignment, tag);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

namespace {

nlohmann::json reference() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR must name the source tree");
  std::ifstream in(std::string(root) + "/tests/keras/reference/model.json");
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

Tensor<float> tensor_of(const nlohmann::json& values) {
  std::vector<float> flat;
  std::vector<std::size_t> dims;
  if (values.is_array() && !values.empty() && values[0].is_array()) {
    dims = {values.size(), values[0].size()};
    for (const auto& row : values) {
      for (const auto& v : row)
        flat.push_back(v.get<float>());
    }
  } else {
    dims = {values.size()};
    for (const auto& v : values)
      flat.push_back(v.get<float>());
  }
  return Tensor<float>(Shape(dims), std::span<const float>(flat));
}

Tensor<std::int64_t> labels_of(const nlohmann::json& values) {
  std::vector<std::int64_t> flat = values.get<std::vector<std::int64_t>>();
  return Tensor<std::int64_t>({flat.size()}, std::span<const std::int64_t>(flat));
}

void set_layer_weights(Model& model, const nlohmann::json& initial) {
  for (const auto& [name, weights] : initial.items()) {
    auto layer = model.get_layer(name);
    for (std::size_t i = 0; i < weights.size(); ++i) {
      const Tensor<float> value = tensor_of(weights[i]);
      REQUIRE(value.shape() == layer->weights()[i].value.shape());
      std::copy(value.begin(), value.end(), layer->weights()[i].value.begin());
    }
  }
}

/// Element-wise comparison with a relative and absolute tolerance, reporting the first
/// mismatch's index, value and target.
void check_close(const Tensor<float>& got, const nlohmann::json& expected, double tolerance,
                 const std::string& what) {
  const Tensor<float> want = tensor_of(expected);
  REQUIRE(got.shape() == want.shape());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got.data()[i], w = want.data()[i];
    if (std::abs(g - w) > tolerance * (1.0 + std::abs(w))) {
      FAIL_CHECK(what << ": element " << i << " is " << g << " but PyTorch gives " << w);
      return;
    }
  }
}

std::shared_ptr<Model> small_classifier(std::uint64_t seed = 3) {
  set_random_seed(seed);
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({2}), Dense(8, {.activation = "relu"}), Dense(2)});
  model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  return model;
}

/// A Sequence over arrays, for the loader kinds.
struct BlobSequence {
  Tensor<float> x;
  Tensor<std::int64_t> y;
  std::size_t batch;
  std::size_t size() const { return (x.rows() + batch - 1) / batch; }
  std::tuple<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
    const std::size_t end = std::min(x.rows(), (i + 1) * batch);
    return {x.slice_rows(i * batch, end), y.slice_rows(i * batch, end)};
  }
};

bool same_weights(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i])) return false;
  }
  return true;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Sequential MLP matches PyTorch after three epochs of Adam") {
    const auto ref = reference()["mlp"];
    Sequential model{Input({4}), Dense(5, {.activation = "relu"}), Dense(3)};
    set_layer_weights(model, ref["initial"]);
    model.compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                   .loss = losses::SparseCategoricalCrossentropy(true)});
    const History history =
        model.fit(tensor_of(ref["x"]), labels_of(ref["y"]),
                  {.epochs = 3, .batch_size = 5, .verbose = 0, .shuffle = false});
    // Tolerance: float32 against PyTorch in float64, over 9 Adam steps.
    for (std::size_t e = 0; e < 3; ++e) {
      CHECK(history.history.at("loss")[e] ==
            doctest::Approx(ref["loss"][e].get<double>()).epsilon(1e-5));
    }
    check_close(model.get_layer("dense")->weights()[0].value, ref["final"]["dense"][0], 1e-4,
                "dense kernel");
    check_close(model.get_layer("dense")->weights()[1].value, ref["final"]["dense"][1], 1e-4,
                "dense bias");
    check_close(model.get_layer("dense_1")->weights()[0].value, ref["final"]["dense_1"][0], 1e-4,
                "dense_1 kernel");
    check_close(model.get_layer("dense_1")->weights()[1].value, ref["final"]["dense_1"][1], 1e-4,
                "dense_1 bias");
  }

  TEST_CASE("Model with shared layer fan-out and three outputs matches PyTorch") {
    const auto ref = reference()["functional"];
    auto build = [&] {
      auto a = Input({3}, "a");
      auto b = Input({3}, "b");
      auto shared =
          std::make_shared<Dense>(4, DenseOptions{.activation = "relu", .name = "shared"});
      auto ha = call(shared, a);
      auto hb = call(shared, b);
      auto out1 = call(Dense(2, {.name = "out1"}), ha);
      auto out2 = call(Dense(1, {.name = "out2"}), ha);
      auto out3 = call(Dense(1, {.name = "out3"}), hb);
      auto model = std::make_shared<Model>(std::vector{a, b}, std::vector{out1, out2, out3});
      set_layer_weights(*model, ref["initial"]);
      model->compile({.optimizer = optimizers::SGD({.learning_rate = 0.1}),
                      .loss = {losses::SparseCategoricalCrossentropy(true), "mse", "mse"},
                      .loss_weights = {1.0, 0.5, 2.0}});
      return model;
    };
    const Tensor<float> a = tensor_of(ref["a"]), b = tensor_of(ref["b"]);
    const Tensor<float> y1 = labels_of(ref["y1"]).cast<float>();
    const Tensor<float> y2 = tensor_of(ref["y2"]), y3 = tensor_of(ref["y3"]);
    const FitOptions options{.epochs = 2, .batch_size = 4, .verbose = 0, .shuffle = false};

    auto check = [&](Model& model, const History& history) {
      for (const char* key : {"loss", "out1_loss", "out2_loss", "out3_loss"}) {
        for (std::size_t e = 0; e < 2; ++e) {
          CHECK(history.history.at(key)[e] ==
                doctest::Approx(ref["history"][key][e].get<double>()).epsilon(1e-5));
        }
      }
      for (const char* layer : {"shared", "out1", "out2", "out3"}) {
        for (std::size_t i = 0; i < 2; ++i) {
          check_close(model.get_layer(layer)->weights()[i].value, ref["final"][layer][i], 1e-4,
                      std::string(layer) + " weight " + std::to_string(i));
        }
      }
    };
    SUBCASE("fed by position") {
      auto model = build();
      CHECK(model->input_names() == std::vector<std::string>{"a", "b"});
      CHECK(model->output_names() == std::vector<std::string>{"out1", "out2", "out3"});
      const History history = model->fit(std::vector{a, b}, std::vector{y1, y2, y3}, options);
      check(*model, history);
    }
    SUBCASE("fed by name") {
      auto model = build();
      const std::map<std::string, Tensor<float>> x{{"b", b}, {"a", a}};
      const std::map<std::string, Tensor<float>> y{{"out3", y3}, {"out1", y1}, {"out2", y2}};
      const History history = model->fit(x, y, options);
      check(*model, history);
    }
  }

  TEST_CASE("Model reproduces Determined's one-variable training exactly") {
    // Determined's test_one_var_training: y = w * x with w = 0 initially, data x = 0..9 and
    // y = x, MSE, SGD(lr), batches of 3 (the last one [9]). Per batch: loss = mean(x^2) (w-1)^2,
    // dloss/dw = 2 (w - 1) mean(x^2).
    const double lr = 0.001;
    Tensor<float> x({10, 1}), y({10, 1});
    for (std::size_t i = 0; i < 10; ++i) {
      x(i, 0) = static_cast<float>(i);
      y(i, 0) = static_cast<float>(i);
    }
    Sequential model{Input({1}),
                     Dense(1, {.use_bias = false, .kernel_initializer = Initializer::zeros()})};
    model.compile(optimizers::SGD({.learning_rate = lr}), "mse");
    double w = 0.0;
    std::vector<double> expected;
    for (std::size_t start = 0; start < 10; start += 3) {
      double mean_square = 0.0;
      std::size_t n = 0;
      for (std::size_t i = start; i < std::min<std::size_t>(start + 3, 10); ++i, ++n)
        mean_square += static_cast<double>(i * i);
      mean_square /= static_cast<double>(n);
      expected.push_back(mean_square * (w - 1) * (w - 1));
      w -= lr * 2 * (w - 1) * mean_square;
    }
    std::vector<double> losses;
    const auto record = std::make_shared<LambdaCallback>(
        LambdaCallbackOptions{.on_batch_end = [&](std::size_t batch, const Logs& logs) {
          // Logs hold running means weighted by rows; recover this batch's loss.
          static double previous_sum = 0.0;
          static std::size_t previous_rows = 0;
          if (batch == 0) previous_sum = 0.0, previous_rows = 0;
          const std::size_t rows = std::min<std::size_t>((batch + 1) * 3, 10);
          const double sum = *logs.get("loss") * static_cast<double>(rows);
          losses.push_back((sum - previous_sum) / static_cast<double>(rows - previous_rows));
          previous_sum = sum;
          previous_rows = rows;
        }});
    model.fit(
        x, y,
        {.epochs = 1, .batch_size = 3, .verbose = 0, .callbacks = {record}, .shuffle = false});
    REQUIRE(losses.size() == 4);
    for (std::size_t i = 0; i < 4; ++i)
      CHECK(losses[i] == doctest::Approx(expected[i]).epsilon(1e-5));
    CHECK(model.get_weights()[0].data()[0] == doctest::Approx(w).epsilon(1e-6));

    SUBCASE("and train_on_batch gives each batch's loss") {
      Sequential again{Input({1}),
                       Dense(1, {.use_bias = false, .kernel_initializer = Initializer::zeros()})};
      again.compile(optimizers::SGD({.learning_rate = lr}), "mse");
      for (std::size_t b = 0; b < 4; ++b) {
        const std::size_t end = std::min<std::size_t>(b * 3 + 3, 10);
        const Logs logs = again.train_on_batch(x.slice_rows(b * 3, end), y.slice_rows(b * 3, end));
        CHECK(*logs.get("loss") == doctest::Approx(expected[b]).epsilon(1e-5));
      }
    }
  }

  TEST_CASE("Model names layers as Keras does and prints Keras's summary") {
    Sequential model{Input({28, 28}), Flatten(), Dense(128, {.activation = "relu"}), Dense(10)};
    std::vector<std::string> names;
    for (const auto& layer : model.layers())
      names.push_back(layer->name());
    CHECK(names == std::vector<std::string>{"flatten", "dense", "dense_1"});
    std::ostringstream out;
    model.summary(out);
    const std::string expected =
        "Model: \"sequential\"\n"
        "_________________________________________________________________\n"
        " Layer (type)                Output Shape              Param #   \n"
        "=================================================================\n"
        " flatten (Flatten)           (None, 784)               0         \n"
        "                                                                 \n"
        " dense (Dense)               (None, 128)               100480    \n"
        "                                                                 \n"
        " dense_1 (Dense)             (None, 10)                1290      \n"
        "                                                                 \n"
        "=================================================================\n"
        "Total params: 101,770\n"
        "Trainable params: 101,770\n"
        "Non-trainable params: 0\n"
        "_________________________________________________________________\n";
    CHECK(out.str() == expected);
    CHECK(model.count_params() == 101770);

    SUBCASE("unique per model, keeping given names") {
      auto in = Input({4});
      auto h = call(Dense(3, {.name = "dense_1"}), in);
      auto o = call(Dense(2), call(Dense(3), h));
      Model functional(in, o);
      std::vector<std::string> got;
      for (const auto& layer : functional.layers())
        got.push_back(layer->name());
      CHECK(got == std::vector<std::string>{"dense_1", "dense", "dense_2"});
      CHECK(functional.input_names() == std::vector<std::string>{"input_1"});
    }
  }

  TEST_CASE("Model predict and evaluate agree with a forward pass computed by hand") {
    auto model = small_classifier();
    const Blobs data = blobs(50);
    model->fit(data.x, data.y, {.epochs = 2, .batch_size = 16, .verbose = 0});
    const Tensor<float> predicted = model->predict(data.x, {.batch_size = 7});
    REQUIRE(predicted.shape() == Shape{50, 2});
    const auto w = model->get_weights();
    double loss = 0.0;
    std::size_t correct = 0;
    for (std::size_t i = 0; i < 50; ++i) {
      double hidden[8];
      for (std::size_t u = 0; u < 8; ++u) {
        double s = w[1].data()[u];
        for (std::size_t f = 0; f < 2; ++f)
          s += static_cast<double>(data.x(i, f)) * w[0].data()[f * 8 + u];
        hidden[u] = std::max(0.0, s);
      }
      double logits[2];
      for (std::size_t c = 0; c < 2; ++c) {
        logits[c] = w[3].data()[c];
        for (std::size_t u = 0; u < 8; ++u)
          logits[c] += hidden[u] * w[2].data()[u * 2 + c];
        CHECK(predicted(i, c) == doctest::Approx(logits[c]).epsilon(1e-4));
      }
      const double top = std::max(logits[0], logits[1]);
      const double log_sum = top + std::log(std::exp(logits[0] - top) + std::exp(logits[1] - top));
      loss += log_sum - logits[data.y(i)];
      correct += (logits[1] > logits[0] ? 1 : 0) == data.y(i) ? 1 : 0;
    }
    const Logs results = model->evaluate(data.x, data.y, {.batch_size = 16, .verbose = 0});
    CHECK(*results.get("loss") == doctest::Approx(loss / 50).epsilon(1e-4));
    CHECK(*results.get("accuracy") == doctest::Approx(static_cast<double>(correct) / 50));
    const Logs batch = model->test_on_batch(data.x, data.y);
    CHECK(*batch.get("loss") == doctest::Approx(loss / 50).epsilon(1e-4));
    // Half-precision arrays are widened to the model's float32 exactly: the same predictions as
    // the float32 arrays of the same values.
    const auto half = data.x.cast<loadstar::float16>();
    const auto brain = data.x.cast<loadstar::bfloat16>();
    CHECK(model->predict(half, {.batch_size = 7}) ==
          model->predict(half.cast<float>(), {.batch_size = 7}));
    CHECK(model->predict(brain, {.batch_size = 7}) ==
          model->predict(brain.cast<float>(), {.batch_size = 7}));
  }

  TEST_CASE("Model training steps allocate nothing after the first batch") {
    const Blobs data = blobs(200);
    for (const std::size_t threads : {1, 2}) {
      set_random_seed(2);
      Sequential model{Input({2}), Dense(16, {.activation = "relu"}), Dense(2)};
      model.compile({.optimizer = "adam",
                     .loss = losses::SparseCategoricalCrossentropy(true),
                     .metrics = {"accuracy"},
                     .threads = threads});
      std::vector<std::size_t> counts;
      counts.reserve(64);
      auto counter = std::make_shared<LambdaCallback>(
          LambdaCallbackOptions{.on_batch_end = [&](std::size_t, const Logs&) {
            counts.push_back(allocations.load(std::memory_order_relaxed));
          }});
      // 200 rows in batches of 32: six full batches and a partial one of 8 rows (a view).
      model.fit(data.x, data.y,
                {.epochs = 1, .batch_size = 32, .verbose = 0, .callbacks = {counter}});
      REQUIRE(counts.size() == 7);
      for (std::size_t i = 1; i < counts.size(); ++i) {
        INFO("threads " << threads << ", batch " << i);
        CHECK(counts[i] == counts[i - 1]);
      }
    }
  }

  TEST_CASE("Model fit is bitwise reproducible for one seed and thread count") {
    const Blobs data = blobs(300);
    auto run = [&](std::uint64_t seed) {
      set_random_seed(seed);
      Sequential model{Input({2}), Dense(16, {.activation = "relu"}), Dense(2)};
      model.compile(
          {.optimizer = "adam", .loss = losses::SparseCategoricalCrossentropy(true), .threads = 2});
      model.fit(data.x, data.y, {.epochs = 2, .batch_size = 32, .verbose = 0});
      return model.get_weights();
    };
    const auto first = run(7);
    CHECK(same_weights(first, run(7)));
    CHECK_FALSE(same_weights(first, run(8)));
  }

  TEST_CASE("Model learns a separable problem and logs Keras's names") {
    auto model = small_classifier();
    const Blobs data = blobs(400);
    const History history = model->fit(
        data.x, data.y, {.epochs = 15, .batch_size = 32, .verbose = 0, .validation_split = 0.2});
    std::vector<std::string> keys;
    for (const auto& [key, values] : history.history) {
      keys.push_back(key);
      CHECK(values.size() == 15);
    }
    CHECK(keys == std::vector<std::string>{"accuracy", "loss", "val_accuracy", "val_loss"});
    CHECK(history.epoch.front() == 0);
    CHECK(history.epoch.back() == 14);
    CHECK(history.history.at("val_accuracy").back() > 0.95);
    CHECK(history.history.at("loss").back() < history.history.at("loss").front());
  }

  TEST_CASE("Model trains identically from arrays a Sequence a Dataset and a SequenceAdapter") {
    const Blobs data = blobs(100);
    const FitOptions options{
        .epochs = 2, .batch_size = 16, .verbose = 0, .shuffle = false, .workers = 2};
    auto arrays = small_classifier();
    arrays->fit(data.x, data.y, options);
    const auto expected = arrays->get_weights();

    auto from_sequence = small_classifier();
    from_sequence->fit(BlobSequence{data.x, data.y, 16}, options);
    CHECK(same_weights(from_sequence->get_weights(), expected));

    auto from_processes = small_classifier();
    FitOptions forked = options;
    forked.use_multiprocessing = true;
    from_processes->fit(BlobSequence{data.x, data.y, 16}, forked);
    CHECK(same_weights(from_processes->get_weights(), expected));

    auto from_dataset = small_classifier();
    auto dataset = from_tensor_slices(data.x, data.y).batch(16);
    from_dataset->fit(dataset, options);
    CHECK(same_weights(from_dataset->get_weights(), expected));

    auto from_adapter = small_classifier();
    SequenceAdapter<BlobSequence, 1> adapter(BlobSequence{data.x, data.y, 16});
    from_adapter->fit(adapter, options);
    CHECK(same_weights(from_adapter->get_weights(), expected));

    SUBCASE("and validates on each kind") {
      auto model = small_classifier();
      const History history =
          model->fit(data.x, data.y,
                     {.epochs = 1,
                      .batch_size = 16,
                      .verbose = 0,
                      .validation_data = ValidationData(BlobSequence{data.x, data.y, 32})});
      const Logs direct = model->evaluate(data.x, data.y, {.verbose = 0});
      CHECK(history.history.at("val_loss")[0] == doctest::Approx(*direct.get("loss")));
    }
  }

  TEST_CASE("Model class_weight equals the sample weights it stands for") {
    const Blobs data = blobs(64);
    Tensor<float> weights({64});
    for (std::size_t i = 0; i < 64; ++i)
      weights(i) = data.y(i) == 1 ? 3.0F : 0.5F;
    auto by_class = small_classifier();
    by_class->fit(data.x, data.y,
                  {.epochs = 1, .verbose = 0, .class_weight = ClassWeight{{0, 0.5F}, {1, 3.0F}}});
    auto by_sample = small_classifier();
    by_sample->fit(data.x, data.y, {.epochs = 1, .verbose = 0, .sample_weight = weights});
    CHECK(same_weights(by_class->get_weights(), by_sample->get_weights()));
    auto plain = small_classifier();
    plain->fit(data.x, data.y, {.epochs = 1, .verbose = 0});
    CHECK_FALSE(same_weights(plain->get_weights(), by_sample->get_weights()));
  }

  TEST_CASE("Sequential without an input is built from the first batch") {
    set_random_seed(5);
    Sequential model;
    model.add(Dense(4, {.activation = "relu"}));
    model.add(Dense(2));
    CHECK_THROWS_WITH_AS(model.summary(), doctest::Contains("has not been built yet"), ConfigError);
    model.compile("sgd", losses::SparseCategoricalCrossentropy(true));
    const Blobs data = blobs(20);
    model.fit(data.x, data.y, {.epochs = 1, .verbose = 0});
    CHECK(model.count_params() == 2 * 4 + 4 + 4 * 2 + 2);
    CHECK(model.layers().front()->name() == "dense");
  }

  TEST_CASE("Model reports bad input with typed errors") {
    const Blobs data = blobs(20);
    SUBCASE("use before compile") {
      Sequential model{Input({2}), Dense(2)};
      CHECK_THROWS_WITH_AS(model.fit(data.x, data.y),
                           doctest::Contains("model 'sequential': must be compiled before fit"),
                           ConfigError);
      CHECK_THROWS_WITH_AS(model.evaluate(data.x, data.y),
                           doctest::Contains("must be compiled before evaluate"), ConfigError);
    }
    SUBCASE("samples of another shape") {
      auto model = small_classifier();
      const Tensor<float> wide({20, 3});
      CHECK_THROWS_WITH_AS(
          model->fit(wide, data.y, {.verbose = 0}),
          doctest::Contains(
              "input 'input_1' expects samples of shape (2,) but x has samples of shape (3,)"),
          ShapeError);
    }
    SUBCASE("unknown names") {
      Sequential model{Input({2}), Dense(2)};
      CHECK_THROWS_WITH_AS(model.compile("adamm", "mse"), doctest::Contains("adamm"), ConfigError);
      CHECK_THROWS_WITH_AS(model.compile("adam", "msee"), doctest::Contains("msee"), ConfigError);
      // A misspelt metric is refused by compile, as Keras does, not at the first batch.
      CHECK_THROWS_WITH_AS(
          model.compile({.optimizer = "adam", .loss = "mse", .metrics = {"accuracyy"}}),
          doctest::Contains("compile: unknown metric 'accuracyy'"), ConfigError);
      CHECK_THROWS_WITH_AS(model.get_layer("nope"),
                           doctest::Contains("model 'sequential': no layer named 'nope'"),
                           ConfigError);
    }
    SUBCASE("inputs missing from a map and unknown keys") {
      auto a = Input({2}, "a");
      auto b = Input({2}, "b");
      auto shared = std::make_shared<Dense>(2);
      Model model({a, b}, {call(shared, a), call(shared, b)}, "pair");
      model.compile("sgd", "mse");
      const Tensor<float> y({20, 2});
      const std::map<std::string, Tensor<float>> only_a{{"a", data.x}};
      CHECK_THROWS_WITH_AS(model.fit(only_a, std::vector{y, y}, {.verbose = 0}),
                           doctest::Contains("model 'pair': no data for input 'b' in the map x"),
                           ConfigError);
      const std::map<std::string, Tensor<float>> extra{{"a", data.x}, {"b", data.x}, {"c", data.x}};
      CHECK_THROWS_WITH_AS(model.fit(extra, std::vector{y, y}, {.verbose = 0}),
                           doctest::Contains("x has the key 'c', which names no input"),
                           ConfigError);
      SUBCASE("and mismatched numbers of inputs, outputs and targets") {
        CHECK_THROWS_WITH_AS(model.fit(data.x, std::vector{y, y}, {.verbose = 0}),
                             doctest::Contains("model 'pair': has 2 inputs but x has 1 array"),
                             ShapeError);
        CHECK_THROWS_WITH_AS(model.fit(std::vector{data.x, data.x}, y, {.verbose = 0}),
                             doctest::Contains("model 'pair': has 2 outputs but y has 1 array"),
                             ShapeError);
        CHECK_THROWS_WITH_AS(model.compile("sgd", {"mse", "mse", "mse"}),
                             doctest::Contains("has 2 outputs but 3 losses were given"),
                             ConfigError);
      }
    }
    SUBCASE("a NaN loss without TerminateOnNaN") {
      Sequential model{Input({2}), Dense(1)};
      model.compile("sgd", "mse");
      Tensor<float> y({20, 1});
      y(3, 0) = std::nanf("");
      CHECK_THROWS_WITH_AS(model.fit(data.x, y, {.verbose = 0, .shuffle = false}),
                           doctest::Contains("the loss is nan at batch 0 of epoch 1"), Error);
    }
    SUBCASE("a label out of range names the epoch and the batch") {
      Sequential model{Input({2}), Dense(3)};
      model.compile("sgd", "sparse_categorical_crossentropy");
      Tensor<float> y({20, 1});
      y(13, 0) = 5;  // batch 1 (rows 8..15) at row 5 of the batch, without shuffling
      CHECK_THROWS_WITH_AS(
          model.fit(data.x, y, {.epochs = 2, .batch_size = 8, .verbose = 0, .shuffle = false}),
          "fit: epoch 1, batch 1 (rows counted within the batch): "
          "sparse_categorical_crossentropy: label 5 at row 5 is outside [0, 3)",
          ConfigError);
      CHECK_THROWS_WITH_AS(model.evaluate(data.x, y, {.batch_size = 4, .verbose = 0}),
                           doctest::Contains("evaluate: batch 3 (rows counted within the batch): "
                                             "sparse_categorical_crossentropy: label 5 at row 1"),
                           ConfigError);
    }
    SUBCASE("weights of another shape") {
      auto model = small_classifier();
      auto weights = model->get_weights();
      weights[2] = Tensor<float>({8, 3});
      CHECK_THROWS_WITH_AS(
          model->set_weights(weights),
          doctest::Contains("layer 'dense_1' weight 'kernel' has shape (8, 2) but the given "
                            "weight has shape (8, 3)"),
          ShapeError);
      weights.pop_back();
      CHECK_THROWS_WITH_AS(model->set_weights(weights),
                           doctest::Contains("set_weights expects 4 weights but got 3"),
                           ShapeError);
    }
    SUBCASE("bad fit options") {
      auto model = small_classifier();
      CHECK_THROWS_WITH_AS(model->fit(data.x, data.y, {.batch_size = 0, .verbose = 0}),
                           doctest::Contains("batch_size must be positive"), ConfigError);
      CHECK_THROWS_WITH_AS(
          model->fit(BlobSequence{data.x, data.y, 4}, {.verbose = 0, .validation_split = 0.2}),
          doctest::Contains("validation_split is supported for arrays only"), ConfigError);
      CHECK_THROWS_WITH_AS(model->fit(data.x, data.y, {.verbose = 0, .validation_split = 1.5}),
                           doctest::Contains("validation_split: must be in (0, 1)"), ConfigError);
    }
    SUBCASE("an output that needs an undeclared input") {
      auto a = Input({2}, "a");
      auto b = Input({2}, "b");
      CHECK_THROWS_WITH_AS(Model(a, call(Dense(1), b)),
                           doctest::Contains("depends on an Input 'b' that is not among"),
                           ConfigError);
    }
  }
}
