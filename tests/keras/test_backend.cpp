#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <loadstar/keras.hpp>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <memory>
#include <string>
#include <vector>

#include "keras/protected_backend.hpp"
#include "random_tensor.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using loadstar::test::ProtectedBackend;

namespace {

using test_support::random_tensor;
using test_support::values;

/// Images `(n, 8, 8, 1)` and 3 classes decided by their quadrant sums, and per-row weights.
struct Data {
  Tensor<float> x;
  Tensor<std::int64_t> y;
  Tensor<float> w;
};

Data images(std::size_t n, std::uint64_t seed) {
  Data d{random_tensor({n, 8, 8, 1}, seed), Tensor<std::int64_t>({n}), Tensor<float>({n})};
  for (std::size_t i = 0; i < n; ++i) {
    float top = 0, left = 0;
    for (std::size_t r = 0; r < 8; ++r) {
      for (std::size_t c = 0; c < 8; ++c) {
        top += r < 4 ? d.x(i, r, c, std::size_t{0}) : 0.0F;
        left += c < 4 ? d.x(i, r, c, std::size_t{0}) : 0.0F;
      }
    }
    d.y(i) = top > 0 ? 0 : left > 0 ? 1 : 2;
    d.w(i) = 0.5F + static_cast<float>(i % 3) * 0.5F;
  }
  return d;
}

bool bitwise_equal(const Tensor<float>& a, const Tensor<float>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.bytes()) == 0;
}

void check_same_weights(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("weight " << i);
    CHECK(bitwise_equal(a[i], b[i]));
  }
}

using ModelFactory = std::function<std::shared_ptr<Model>()>;

/// Trains, evaluates and predicts with the model from `make` on a `CpuBackend` and on a
/// `ProtectedBackend`, from the same initial weights, and checks that everything is bitwise equal.
void check_backends_agree(const ModelFactory& make, std::size_t threads) {
  const Data train = images(96, 7);
  const Data test = images(40, 8);
  struct Run {
    std::vector<Tensor<float>> weights;
    callbacks::History history;
    Logs evaluation;
    Tensor<float> predictions;
    std::size_t device_allocations = 0;
  };
  std::vector<Tensor<float>> initial;
  // `resident`: the arrays in the backend's memory (float labels), copied there row by row.
  auto run = [&](std::shared_ptr<Backend> backend, bool resident = false) {
    Backend& where = *backend;
    const auto place = [&](const Tensor<float>& t) { return resident ? where.from_host(t) : t; };
    const Tensor<float> x = place(train.x), y = place(train.y.cast<float>()), w = place(train.w);
    const Tensor<float> test_x = place(test.x), test_y = place(test.y.cast<float>());
    auto model = make();
    if (initial.empty()) {
      initial = model->get_weights();
    } else {
      model->set_weights(initial);
    }
    model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                    .loss = losses::SparseCategoricalCrossentropy(true),
                    .metrics = {"accuracy"},
                    .threads = threads,
                    .backend = std::move(backend)});
    Run r;
    r.history = model->fit(x, y,
                           {.epochs = 2,
                            .batch_size = 16,
                            .verbose = 0,
                            .validation_data = {test_x, test_y},
                            .sample_weight = w,
                            .seed = 5});
    r.evaluation = model->evaluate(test_x, test_y, {.batch_size = 16, .verbose = 0});
    r.predictions = model->predict(test_x, {.batch_size = 16, .verbose = 0});
    r.weights = model->get_weights();
    if (auto* guarded = dynamic_cast<ProtectedBackend*>(&model->backend()))
      r.device_allocations = guarded->allocations();
    return r;
  };
  const Run cpu = run(std::make_shared<CpuBackend>(threads));
  const Run guarded = run(std::make_shared<ProtectedBackend>(threads));
  CHECK(guarded.device_allocations > 0);
  check_same_weights(cpu.weights, guarded.weights);
  CHECK(cpu.history.history == guarded.history.history);
  CHECK(cpu.history.history.count("val_accuracy") == 1);
  for (const char* key : {"loss", "accuracy"}) {
    INFO(key);
    REQUIRE(cpu.evaluation.get(key));
    CHECK(*cpu.evaluation.get(key) == *guarded.evaluation.get(key));
  }
  CHECK(guarded.predictions.is_host());
  CHECK(bitwise_equal(cpu.predictions, guarded.predictions));
  // The same from arrays in the protected memory: a host read of them would crash.
  const Run resident = run(std::make_shared<ProtectedBackend>(threads), true);
  check_same_weights(cpu.weights, resident.weights);
  CHECK(cpu.history.history == resident.history.history);
  CHECK(*cpu.evaluation.get("loss") == *resident.evaluation.get("loss"));
  CHECK(bitwise_equal(cpu.predictions, resident.predictions));
}

/// `backend`'s copy of a host tensor (the tensor itself for a host backend).
Tensor<float> on(Backend& backend, const Tensor<float>& host) {
  return backend.is_host() ? host.clone() : backend.from_host(host);
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Tensor host accessors throw DeviceError for device memory") {
    auto memory = std::make_shared<std::vector<float>>(6, 1.0F);
    const auto t = Tensor<float>::wrap(memory->data(), {2, 3}, memory, Device{"cuda", 1});
    CHECK_FALSE(t.is_host());
    CHECK(t.device().str() == "cuda:1");
    CHECK(t.slice_rows(0, 1).device() == Device{"cuda", 1});
    CHECK(t.reshape({3, 2}).device() == Device{"cuda", 1});
    CHECK(t.data() == memory->data());
    const auto message = doctest::Contains(
        "float32 tensor of shape (2, 3): begin() needs host "
        "memory but the tensor lives on cuda:1");
    CHECK_THROWS_WITH_AS(static_cast<void>(t.begin()), message, DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t.clone()), doctest::Contains("clone() needs host"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t.cast<double>()), doctest::Contains("lives on cuda:1"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t(1, 2)), doctest::Contains("operator()"), DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t.span()), doctest::Contains("span()"), DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t == t), doctest::Contains("lives on cuda:1"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(static_cast<void>(t.gather_rows(std::vector<int>{0})),
                         doctest::Contains("gather_rows needs host"), DeviceError);
    CHECK(Tensor<float>({2}).device() == Device::host());
    CHECK(Device::host().str() == "cpu");
  }

  TEST_CASE("ProtectedBackend keeps its memory behind its kernels and copies") {
    ProtectedBackend backend(1);
    const Tensor<float> host({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor<float> x = backend.from_host(host);
    CHECK(x.device() == backend.device());
    CHECK_THROWS_AS(static_cast<void>(x.begin()), DeviceError);
    const Tensor<float> y = backend.allocate({2, 3});
    backend.add(x, x, y);
    const Tensor<float> back = backend.to_host(y);
    CHECK(back == Tensor<float>({2, 3}, {2, 4, 6, 8, 10, 12}));
    CHECK(host == Tensor<float>({2, 3}, {1, 2, 3, 4, 5, 6}));  // the host tensor stays readable
    CHECK_THROWS_WITH_AS(backend.add(x, host, y),
                         doctest::Contains("protected backend: add was given a float32 tensor "
                                           "of shape (2, 3) on cpu but expects protected:0"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(backend.copy_to_host(y, x),
                         doctest::Contains("copy_to_host needs a host tensor"), DeviceError);
    float sum = 0;
    backend.on_host({x, Tensor<float>()}, [&](std::span<const Tensor<float>> t) {
      CHECK(t[0].is_host());
      for (float v : t[0])
        sum += v;
      CHECK(t[1].empty());
    });
    CHECK(sum == 21.0F);
  }

  TEST_CASE("Embedding reports a bad index found by the gather kernel") {
    auto backend = std::make_shared<ProtectedBackend>(1);
    Sequential model{Input({2}), Embedding(4, 3), Flatten(), Dense(1)};
    model.compile({.optimizer = "sgd", .loss = "mse", .backend = backend});
    const Tensor<float> x({2, 2}, {0, 1, 2, 7});
    CHECK_THROWS_WITH_AS(model.predict(x, {.verbose = 0}),
                         doctest::Contains("index 7 at position 3 is outside [0, input_dim) with "
                                           "input_dim 4"),
                         ConfigError);
  }

  TEST_CASE("Model trains an MLP on a protected backend bitwise as on the CPU backend") {
    for (const std::size_t threads : {1, 2}) {
      CAPTURE(threads);
      check_backends_agree(
          [] {
            set_random_seed(11);
            return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
                Input({8, 8, 1}), Flatten(), Dense(16, {.activation = "relu"}), Dropout(0.25),
                Dense(3)});
          },
          threads);
    }
  }

  TEST_CASE("Model trains a CNN on a protected backend bitwise as on the CPU backend") {
    check_backends_agree(
        [] {
          set_random_seed(12);
          auto in = Input({8, 8, 1});
          auto h = call(Conv2D(4, 3, {.activation = "relu"}), in);
          h = call(BatchNormalization(), h);
          h = call(MaxPooling2D(), h);
          auto a = call(GlobalAveragePooling2D(), h);
          auto b = call(Flatten(), h);
          auto out = call(Dense(3), call(Concatenate(), std::vector{a, b}));
          return std::make_shared<Model>(in, out);
        },
        2);
  }

  TEST_CASE(
      "A ReLU layer's gradient carried by the next Dense or max pooling layer keeps the bits") {
    const Data train = images(40, 7);
    // How many ReLU layers each model has whose gradient the next Dense layer may carry
    // (`fused`), and how many whose gradient the next max pooling layer may carry (`pooled`).
    struct Case {
      const char* name;
      std::function<std::shared_ptr<Model>()> make;
      std::size_t fused;
      std::size_t pooled = 0;
    };
    const auto in = [] { return Input({8, 8, 1}); };
    const std::vector<Case> cases{
        {"chain",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Flatten(), Dense(16, {.activation = "relu"}), Dense(8, {.activation = "relu"}),
               Dense(3)});
         },
         2},
        // Two consumers, a Dropout between, a ReLU output with its own loss, no bias, a ReLU
        // layer called twice (its gradients accumulate): nothing is carried.
        {"two consumers",
         [&] {
           auto x = in();
           auto h = call(Dense(16, {.activation = "relu"}), call(Flatten(), x));
           auto out = call(Add(), std::vector{call(Dense(3), h), call(Dense(3), h)});
           return std::make_shared<Model>(x, out);
         },
         0},
        {"dropout",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Flatten(), Dense(16, {.activation = "relu"}), Dropout(0.5), Dense(3)});
         },
         0},
        {"no bias",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Flatten(), Dense(16, {.activation = "relu", .use_bias = false}), Dense(3)});
         },
         0},
        {"called twice",
         [&] {
           auto x = in();
           auto shared = Dense(64, {.activation = "relu"});
           auto h = call(shared, call(Flatten(), x));
           auto out = call(Dense(3), call(Add(), std::vector{h, call(shared, h)}));
           return std::make_shared<Model>(x, out);
         },
         0},
        {"cnn",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Conv2D(4, 3, {.activation = "relu"}), MaxPooling2D(),
               Conv2D(6, 2, {.activation = "relu"}), MaxPooling2D(), Flatten(),
               Dense(8, {.activation = "relu"}), Dense(3)});
         },
         1, 2},
        // Overlapping windows with padding (each input gathers from several windows), and
        // channels_first (the layers transpose around the kernels).
        {"overlapping windows, channels_first",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Conv2D(4, 3, {.activation = "relu"}),
               MaxPooling2D({.pool_size = 3, .strides = 1, .padding = "same"}), Permute({3, 1, 2}),
               Conv2D(3, 2, {.data_format = "channels_first", .activation = "relu"}),
               MaxPooling2D({.data_format = "channels_first"}), Flatten(), Dense(3)});
         },
         0, 2},
        {"conv1d",
         [&] {
           return std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
               in(), Reshape({8, 8}), Conv1D(4, 3, {.activation = "relu"}), MaxPooling1D(),
               Flatten(), Dense(3)});
         },
         0, 1},
        // No ReLU, average pooling, a second consumer: nothing is carried.
        {"cnn without",
         [&] {
           auto x = in();
           auto h = call(Conv2D(4, 3), x);
           h = call(MaxPooling2D(), h);
           h = call(Conv2D(4, 2, {.activation = "relu"}), h);
           h = call(AveragePooling2D(), h);
           auto c = call(Conv2D(4, 1, {.activation = "relu"}), h);
           auto out =
               call(Dense(3),
                    call(Flatten(),
                         call(Add(), std::vector{call(MaxPooling2D({.pool_size = 1}), c), c})));
           return std::make_shared<Model>(x, out);
         },
         0},
    };
    for (const auto& c : cases) {
      const std::string name = c.name;
      CAPTURE(name);
      auto run = [&](std::shared_ptr<Backend> backend) {
        set_random_seed(21);
        auto model = c.make();
        model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                        .loss = losses::SparseCategoricalCrossentropy(true),
                        .backend = std::move(backend)});
        auto history =
            model->fit(train.x, train.y, {.epochs = 2, .batch_size = 16, .verbose = 0, .seed = 5});
        return std::pair{model->get_weights(), history.history.at("loss")};
      };
      const auto plain = run(std::make_shared<CpuBackend>(1));
      auto fusing = std::make_shared<ProtectedBackend>(1);
      fusing->fuse_relu_gradients = true;
      const auto fused = run(fusing);
      check_same_weights(plain.first, fused.first);
      CHECK(plain.second == fused.second);
      // 2 epochs of 3 batches (16, 16, 8), one mask and one carried gradient per pair.
      CHECK(fusing->relu_masks_written == 6 * c.fused);
      CHECK(fusing->relu_gradients_carried == 6 * c.fused);
      CHECK(fusing->relu_pool_gradients == 6 * c.pooled);
    }
  }

  TEST_CASE("fit names arrays in memory the model's backend cannot read as DeviceError") {
    const Data data = images(8, 3);
    auto make = [](std::shared_ptr<Backend> backend) {
      auto model = std::make_shared<Sequential>(
          std::initializer_list<SequentialItem>{Input({8, 8, 1}), Flatten(), Dense(3)});
      model->compile({.optimizer = "sgd",
                      .loss = losses::SparseCategoricalCrossentropy(true),
                      .backend = std::move(backend)});
      return model;
    };
    const Tensor<float> labels = data.y.cast<float>();
    // Views that only carry a device: the checks come before anything reads them.
    const auto on_gpu =
        Tensor<float>::wrap(data.x.data(), data.x.shape(), nullptr, Device{"cuda", 1});
    auto cpu = make(std::make_shared<CpuBackend>(1));
    CHECK_THROWS_WITH_AS(cpu->fit(on_gpu, labels, {.batch_size = 4, .verbose = 0}),
                         doctest::Contains("x is in cuda:1 memory but the model computes in cpu"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(
        static_cast<void>(cpu->predict(std::vector{on_gpu}, {.verbose = 0})),
        doctest::Contains("x[0] is in cuda:1 memory but the model computes in cpu"), DeviceError);
    auto guarded_backend = std::make_shared<ProtectedBackend>(1);
    auto guarded = make(guarded_backend);
    const Tensor<float> labels_there = guarded_backend->from_host(labels);
    CHECK_THROWS_WITH_AS(
        guarded->fit(data.x, labels_there,
                     {.batch_size = 4, .verbose = 0, .class_weight = ClassWeight{{0, 1.0F}}}),
        doctest::Contains("class_weight (reading the classes of y) needs host memory but the "
                          "tensor lives on protected:0"),
        DeviceError);
    const auto integers = Tensor<std::int64_t>::wrap(data.y.data(), data.y.shape(), nullptr,
                                                     guarded_backend->device());
    CHECK_THROWS_WITH_AS(guarded->fit(data.x, integers, {.batch_size = 4, .verbose = 0}),
                         doctest::Contains("y is in protected:0 memory with elements of type "
                                           "int64 but arrays in device memory must be float32"),
                         DeviceError);
    CHECK_THROWS_WITH_AS(
        guarded->fit(
            data.x, labels_there,
            {.batch_size = 4,
             .verbose = 0,
             .sample_weight = Tensor<float>::wrap(data.w.data(), {8}, nullptr, Device{"cuda", 1})}),
        doctest::Contains("sample_weight is in cuda:1 memory but the model computes in "
                          "protected:0"),
        DeviceError);
  }

  TEST_CASE("cpu_backend is the backend compile makes by default") {
    CHECK_THROWS_WITH_AS(cpu_backend(0), doctest::Contains("thread count must be at least 1"),
                         ConfigError);
    const auto backend = cpu_backend(2);
    CHECK(dynamic_cast<CpuBackend*>(backend.get()) != nullptr);
    const Tensor<float> x = random_tensor({8, 4}, 1);
    const Tensor<float> y = random_tensor({8, 2}, 2);
    auto train = [&](std::shared_ptr<Backend> given) {
      set_random_seed(5);
      Sequential model{Input({4}), Dense(3, {.activation = "relu"}), Dense(2)};
      model.compile({.optimizer = "adam", .loss = "mse", .threads = 2, .backend = given});
      model.fit(x, y, {.epochs = 2, .batch_size = 4, .verbose = 0});
      CHECK(&model.backend() == (given ? given.get() : &model.backend()));
      return model.get_weights();
    };
    check_same_weights(train(backend), train(nullptr));
  }

  TEST_CASE("Model moves its weights between backends on compile") {
    set_random_seed(3);
    Sequential model{Input({4}), Dense(3, {.activation = "relu"}), BatchNormalization(), Dense(2)};
    const Tensor<float> x = random_tensor({8, 4}, 1);
    const Tensor<float> y = random_tensor({8, 2}, 2);
    model.compile(
        {.optimizer = "adam", .loss = "mse", .backend = std::make_shared<ProtectedBackend>(1)});
    model.fit(x, y, {.epochs = 1, .batch_size = 4, .verbose = 0});
    CHECK_FALSE(model.layers()[0]->weights()[0].value.is_host());
    const auto trained = model.get_weights();
    const Tensor<float> guarded = model.predict(x, {.verbose = 0});
    model.compile({.optimizer = "adam", .loss = "mse", .threads = 1});
    CHECK(model.layers()[0]->weights()[0].value.is_host());
    check_same_weights(model.get_weights(), trained);
    CHECK(bitwise_equal(model.predict(x, {.verbose = 0}), guarded));
    model.fit(x, y, {.epochs = 1, .batch_size = 4, .verbose = 0});
  }

  TEST_CASE("Losses compute on a protected backend bitwise as on the CPU backend") {
    const Tensor<float> logits = random_tensor({6, 4}, 3);
    Tensor<float> probabilities = random_tensor({6, 4}, 4);
    for (float& v : probabilities)
      v = 0.05F + 0.9F * (v + 1.0F) / 2.0F;
    Tensor<float> one_hot({6, 4});
    Tensor<float> labels({6});
    Tensor<float> binary({6, 4});
    for (std::size_t i = 0; i < 6; ++i) {
      labels(i) = static_cast<float>(i % 4);
      one_hot(i, i % 4) = 1.0F;
      for (std::size_t j = 0; j < 4; ++j)
        binary(i, j) = static_cast<float>((i + j) % 2);
    }
    const Tensor<float> weights({6}, {1, 0.5, 2, 0, 1, 3});
    struct Case {
      std::shared_ptr<Loss> loss;
      Tensor<float> y_true, y_pred;
    };
    const std::vector<Case> cases{
        {std::make_shared<losses::MeanSquaredError>(), binary, logits},
        {std::make_shared<losses::MeanAbsoluteError>(), binary, logits},
        {std::make_shared<losses::Huber>(0.5), binary, logits},
        {std::make_shared<losses::Hinge>(), binary, logits},
        {std::make_shared<losses::KLDivergence>(), one_hot, probabilities},
        {std::make_shared<losses::BinaryCrossentropy>(true, 0.1), binary, logits},
        {std::make_shared<losses::BinaryCrossentropy>(), binary, probabilities},
        {std::make_shared<losses::CategoricalCrossentropy>(true, 0.1), one_hot, logits},
        {std::make_shared<losses::CategoricalCrossentropy>(), one_hot, probabilities},
        {std::make_shared<losses::SparseCategoricalCrossentropy>(true), labels, logits},
        {std::make_shared<losses::SparseCategoricalCrossentropy>(), labels, probabilities},
        {std::make_shared<losses::MeanSquaredError>(Reduction::sum), binary, logits},
    };
    CpuBackend cpu(1);
    ProtectedBackend guarded(1);
    for (const auto& c : cases) {
      CAPTURE(c.loss->class_name());
      for (const bool weighted : {false, true}) {
        CAPTURE(weighted);
        float value[2];
        Tensor<float> gradient[2];
        Backend* backends[2] = {&cpu, &guarded};
        for (int b = 0; b < 2; ++b) {
          Backend& backend = *backends[b];
          const Tensor<float> w = on(backend, weights);
          const Tensor<float> g = backend.allocate(c.y_pred.shape());
          value[b] = c.loss->compute(backend, on(backend, c.y_true), on(backend, c.y_pred),
                                     weighted ? &w : nullptr, g);
          gradient[b] = backend.to_host(g);
        }
        CHECK(value[0] == value[1]);
        CHECK(bitwise_equal(gradient[0], gradient[1]));
      }
    }
    losses::SparseCategoricalCrossentropy sparse(true);
    const Tensor<float> bad = guarded.from_host(Tensor<float>({6}, {0, 1, 2, 9, 0, 1}));
    CHECK_THROWS_WITH_AS(
        sparse.compute(guarded, bad, guarded.from_host(logits), nullptr, Tensor<float>()),
        doctest::Contains("label 9 at row 3 is outside [0, 4)"), ConfigError);
  }

  TEST_CASE("Metrics update on a protected backend bitwise as on the CPU backend") {
    const Tensor<float> logits = random_tensor({6, 4}, 5);
    Tensor<float> probabilities = random_tensor({6, 4}, 6);
    for (float& v : probabilities)
      v = (v + 1.0F) / 2.0F;
    Tensor<float> one_hot({6, 4});
    Tensor<float> labels({6});
    Tensor<float> binary({6, 4});
    for (std::size_t i = 0; i < 6; ++i) {
      labels(i) = static_cast<float>((i * 3) % 4);
      one_hot(i, (i * 3) % 4) = 1.0F;
      for (std::size_t j = 0; j < 4; ++j)
        binary(i, j) = static_cast<float>((i * j) % 2);
    }
    const Tensor<float> weights({6}, {1, 0.5, 2, 0, 1, 3});
    using Make = std::function<std::shared_ptr<Metric>()>;
    struct Case {
      Make make;
      Tensor<float> y_true, y_pred;
    };
    const std::vector<Case> cases{
        {[] { return std::make_shared<metrics::Accuracy>(); }, binary, binary},
        {[] { return std::make_shared<metrics::BinaryAccuracy>(); }, binary, probabilities},
        {[] { return std::make_shared<metrics::CategoricalAccuracy>(); }, one_hot, logits},
        {[] { return std::make_shared<metrics::SparseCategoricalAccuracy>(); }, labels, logits},
        {[] { return std::make_shared<metrics::TopKCategoricalAccuracy>(2); }, one_hot, logits},
        {[] { return std::make_shared<metrics::SparseTopKCategoricalAccuracy>(2); }, labels,
         logits},
        {[] { return std::make_shared<metrics::MeanSquaredError>(); }, binary, logits},
        {[] { return std::make_shared<metrics::MeanAbsoluteError>(); }, binary, logits},
        {[] { return std::make_shared<metrics::Mean>(); }, binary, logits},
        {[] { return std::make_shared<metrics::Precision>(); }, binary, probabilities},
        {[] { return std::make_shared<metrics::Recall>(); }, binary, probabilities},
        {[] { return std::make_shared<metrics::AUC>(); }, binary, probabilities},
    };
    CpuBackend cpu(1);
    ProtectedBackend guarded(1);
    for (const auto& c : cases) {
      double result[2];
      Backend* backends[2] = {&cpu, &guarded};
      std::string name;
      for (int b = 0; b < 2; ++b) {
        Backend& backend = *backends[b];
        auto metric = c.make();
        name = metric->class_name();
        const Tensor<float> w = on(backend, weights);
        metric->update_state(backend, on(backend, c.y_true), on(backend, c.y_pred), nullptr);
        metric->update_state(backend, on(backend, c.y_true), on(backend, c.y_pred), &w);
        result[b] = metric->result();
      }
      CAPTURE(name);
      CHECK(result[0] == result[1]);
    }
  }

  TEST_CASE("Optimizers step on a protected backend bitwise as on the CPU backend") {
    using Make = std::function<std::shared_ptr<Optimizer>()>;
    const std::vector<Make> makes{
        [] {
          return std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = 0.1});
        },
        [] {
          return std::make_shared<optimizers::SGD>(optimizers::SGDOptions{
              .learning_rate = 0.1, .momentum = 0.9, .nesterov = true, .clipnorm = 0.5});
        },
        [] {
          return std::make_shared<optimizers::Adam>(
              optimizers::AdamOptions{.learning_rate = 0.01, .amsgrad = true, .clipvalue = 0.3});
        },
        [] {
          return std::make_shared<optimizers::AdamW>(
              optimizers::AdamWOptions{.learning_rate = 0.01, .global_clipnorm = 0.7});
        },
        [] {
          return std::make_shared<optimizers::RMSprop>(
              optimizers::RMSpropOptions{.momentum = 0.5, .centered = true});
        },
        [] { return std::make_shared<optimizers::Adagrad>(); },
        [] {
          return std::make_shared<optimizers::Adadelta>(
              optimizers::AdadeltaOptions{.learning_rate = 1.0});
        },
    };
    for (const auto& make : makes) {
      std::vector<Tensor<float>> results[2];
      std::vector<Tensor<float>> slots[2];
      std::string name;
      for (int b = 0; b < 2; ++b) {
        std::shared_ptr<Backend> backend;
        if (b == 0) {
          backend = std::make_shared<CpuBackend>(1);
        } else {
          backend = std::make_shared<ProtectedBackend>(1);
        }
        auto optimizer = make();
        name = optimizer->class_name();
        optimizer->set_backend(backend);
        std::vector<Variable> variables;
        for (std::uint64_t k = 0; k < 3; ++k) {
          variables.push_back(Variable{"v" + std::to_string(k),
                                       on(*backend, random_tensor({5, 3}, 20 + k)),
                                       backend->allocate({5, 3}), k != 1});
        }
        std::vector<Variable*> pointers;
        for (auto& v : variables)
          pointers.push_back(&v);
        for (std::uint64_t step = 0; step < 3; ++step) {
          for (std::size_t k = 0; k < variables.size(); ++k)
            backend->copy_from_host(random_tensor({5, 3}, 40 + step * 3 + k),
                                    variables[k].gradient);
          optimizer->apply_gradients(pointers);
        }
        for (const auto& v : variables)
          results[b].push_back(backend->to_host(v.value));
        for (const auto& slot : optimizer->variables())
          slots[b].push_back(backend->to_host(slot.value));
      }
      CAPTURE(name);
      check_same_weights(results[0], results[1]);
      check_same_weights(slots[0], slots[1]);
      CHECK(slots[0].size() == slots[1].size());
    }
  }
}
