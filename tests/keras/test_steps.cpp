// The public step API, nested calls, weighted metrics and exact resume of fit in the middle of an
// epoch for every loader kind.
#include <doctest/doctest.h>

#include "keras/blobs.hpp"
#include "random_tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <loadstar/data.hpp>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/keras.hpp>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;

namespace {

using test_support::random_tensor;

/// An MLP with dropout (so that resumed runs must also draw the same masks).
std::shared_ptr<Model> classifier(std::uint64_t seed = 11) {
  set_random_seed(seed);
  auto model = std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input({2}), layers::Dense(16, {.activation = "relu"}),
                                            layers::Dropout(0.2), layers::Dense(2)});
  model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.01}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  return model;
}

/// A Sequence whose batches depend on the epoch (a shift of the inputs that changes every epoch,
/// as an augmentation would), told the epoch through `set_epoch`.
struct EpochSequence {
  Tensor<float> x;
  Tensor<std::int64_t> y;
  std::size_t batch = 8;
  std::uint64_t epoch = 0;
  std::size_t size() const { return (x.rows() + batch - 1) / batch; }
  void set_epoch(std::uint64_t e) { epoch = e; }
  std::tuple<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
    const std::size_t end = std::min(x.rows(), (i + 1) * batch);
    Tensor<float> shifted = x.slice_rows(i * batch, end).clone();
    for (auto& v : shifted)
      v += 0.01F * static_cast<float>(epoch);
    return {shifted, y.slice_rows(i * batch, end)};
  }
};

bool same_weights(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!(a[i] == b[i])) return false;
  }
  return true;
}

/// Everything a checkpoint keeps, taken from inside a callback.
struct Checkpoint {
  std::vector<Tensor<float>> weights;
  std::vector<Tensor<float>> slots;
  std::int64_t iterations = 0;
  nlohmann::json data;
  nlohmann::json metrics;
  std::size_t epoch = 0;
};

Checkpoint checkpoint(Model& model, const DataIterator& data, std::size_t epoch) {
  Checkpoint c;
  c.weights = model.get_weights();
  for (const auto& slot : model.optimizer().variables())
    c.slots.push_back(slot.value.clone());
  c.iterations = model.optimizer().iterations();
  c.data = data.state();
  c.metrics = model.training_metrics().state();
  c.epoch = epoch;
  return c;
}

void restore(Model& model, DataIterator& data, const Checkpoint& c) {
  model.set_weights(c.weights);
  model.optimizer().build(model.trainable_variables());
  auto slots = model.optimizer().variables();
  REQUIRE(slots.size() == c.slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i)
    std::copy(c.slots[i].begin(), c.slots[i].end(), slots[i].value.begin());
  model.optimizer().set_iterations(c.iterations);
  model.training_metrics().restore(c.metrics);
  data.restore(c.data);
}

/// Stops `fit` after batch `batch` of epoch `epoch`, keeping a checkpoint.
class StopAndSave : public callbacks::Callback {
 public:
  StopAndSave(const DataIterator& data, std::size_t epoch, std::size_t batch)
      : data_(data), epoch_(epoch), batch_(batch) {}
  void on_epoch_begin(std::size_t epoch, const Logs&) override { current_ = epoch; }
  void on_train_batch_end(std::size_t batch, const Logs&) override {
    if (current_ == epoch_ && batch == batch_) {
      saved = checkpoint(model(), data_, current_);
      model().stop_training = true;
    }
  }
  Checkpoint saved;

 private:
  const DataIterator& data_;
  std::size_t epoch_, batch_, current_ = 0;
};

/// Trains three epochs uninterrupted, then again stopped in epoch 1 after batch 2 and resumed in
/// a fresh model from the checkpoint; returns whether the final weights are bitwise equal, and
/// checks the History of the resumed epochs against the uninterrupted one.
bool resumes_exactly(const std::function<DataIterator(Model&)>& make) {
  const FitOptions options{.epochs = 3, .verbose = 0, .seed = 42};
  auto reference = classifier();
  DataIterator reference_data = make(*reference);
  const callbacks::History full = reference->fit(reference_data, options);

  auto interrupted = classifier();
  DataIterator interrupted_data = make(*interrupted);
  auto stopper = std::make_shared<StopAndSave>(interrupted_data, 1, 2);
  FitOptions first = options;
  first.callbacks = {stopper};
  interrupted->fit(interrupted_data, first);
  REQUIRE(stopper->saved.iterations > 0);

  auto resumed = classifier(12345);  // other initial weights: everything comes from the checkpoint
  DataIterator resumed_data = make(*resumed);
  restore(*resumed, resumed_data, stopper->saved);
  FitOptions rest = options;
  rest.initial_epoch = stopper->saved.epoch;
  const callbacks::History tail = resumed->fit(resumed_data, rest);
  CHECK(tail.history.at("loss").back() == full.history.at("loss").back());
  CHECK(tail.history.at("accuracy").back() == full.history.at("accuracy").back());
  CHECK(tail.history.at("loss").front() == full.history.at("loss")[1]);
  return same_weights(resumed->get_weights(), reference->get_weights());
}

/// Every trainable variable's gradient set to NaN (a step must not read what they held unless it
/// zeroed them first).
void poison_gradients(Model& model) {
  for (Variable* v : model.trainable_variables())
    std::fill_n(v->gradient.data(), v->gradient.size(), std::numeric_limits<float>::quiet_NaN());
}

/// `to`'s weights set to `from`'s (layers of the same kind and shapes).
void copy_weights(const Layer& from, Layer& to) {
  REQUIRE(from.weights().size() == to.weights().size());
  for (std::size_t i = 0; i < from.weights().size(); ++i) {
    const Tensor<float>& src = from.weights()[i].value;
    REQUIRE(src.size() == to.weights()[i].value.size());
    std::copy_n(src.data(), src.size(), to.weights()[i].value.data());
  }
}

/// Two image inputs through convolutions, pooling, dense layers and batch normalisation; with
/// `shared`, one Conv2D and one Dense are each called on both branches.
std::shared_ptr<Model> two_branches(bool shared, bool frozen) {
  set_random_seed(21);
  using namespace layers;
  auto a = Input({5, 5, 2}, "a");
  auto b = Input({5, 5, 2}, "b");
  const auto conv = [](const char* name) {
    return std::make_shared<Conv2D>(
        3, 3, Conv2DOptions{.padding = "same", .activation = "relu", .name = name});
  };
  const auto dense = [](const char* name) {
    return std::make_shared<Dense>(4, DenseOptions{.activation = "tanh", .name = name});
  };
  auto conv_a = conv("conv_a");
  auto conv_b = shared ? conv_a : conv("conv_b");
  auto dense_a = dense("dense_a");
  auto dense_b = shared ? dense_a : dense("dense_b");
  auto ha = call(dense_a, call(Flatten(), call(conv_a, a)));
  auto hb = call(dense_b, call(Flatten(), call(conv_b, b)));
  auto h = call(BatchNormalization(), call(Concatenate(), std::vector{ha, hb}));
  auto fixed = std::make_shared<Dense>(5, DenseOptions{.activation = "relu", .name = "fixed"});
  if (frozen) fixed->set_trainable(false);
  auto out = call(Dense(2, {.name = "out"}), call(fixed, h));
  auto model = std::make_shared<Model>(std::vector{a, b}, std::vector{out});
  model->compile({.optimizer = optimizers::SGD({.learning_rate = 0.05}), .loss = "mse"});
  return model;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("A training step writes or zeroes every weight gradient, whatever they held") {
    // Dense and Conv2D layers called once write their gradients; BatchNormalization's, a shared
    // layer's and a frozen layer's neighbours are zeroed and added to. NaNs left in any gradient
    // that is neither written nor zeroed would reach the weights.
    const Tensor<float> a = random_tensor({6, 5, 5, 2}, 31), b = random_tensor({6, 5, 5, 2}, 32);
    const Tensor<float> y = random_tensor({6, 2}, 33);
    for (const bool shared : {false, true}) {
      CAPTURE(shared);
      auto poisoned = two_branches(shared, true);
      auto clean = two_branches(shared, true);
      for (int step = 0; step < 3; ++step) {
        poison_gradients(*poisoned);
        poisoned->train_on_batch(std::vector{a, b}, std::vector{y});
        clean->train_on_batch(std::vector{a, b}, std::vector{y});
      }
      const auto got = poisoned->get_weights(), want = clean->get_weights();
      REQUIRE(got.size() == want.size());
      for (std::size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        for (std::size_t j = 0; j < got[i].size(); ++j)
          REQUIRE(std::isfinite(got[i].data()[j]));
        CHECK(got[i] == want[i]);
      }
    }
  }

  TEST_CASE("A frozen Dense layer computes no weight gradients until it is trainable again") {
    const Tensor<float> a = random_tensor({6, 5, 5, 2}, 34), b = random_tensor({6, 5, 5, 2}, 35);
    const Tensor<float> y = random_tensor({6, 2}, 36);
    auto model = two_branches(false, true);
    auto clean = two_branches(false, true);
    Layer& fixed = *model->get_layer("fixed");
    const auto nan = std::numeric_limits<float>::quiet_NaN();
    for (auto& w : fixed.weights())
      std::fill_n(w.gradient.data(), w.gradient.size(), nan);
    for (int step = 0; step < 3; ++step) {
      model->train_on_batch(std::vector{a, b}, std::vector{y});
      clean->train_on_batch(std::vector{a, b}, std::vector{y});
    }
    // Never written (its NaNs reach nothing): the training is that of the clean model.
    for (const auto& w : fixed.weights()) {
      CAPTURE(w.name);
      CHECK(
          std::all_of(w.gradient.begin(), w.gradient.end(), [](float g) { return std::isnan(g); }));
    }
    const auto got = model->get_weights(), want = clean->get_weights();
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == want[i]);
    }
    // Trainable again, and compiled again (as Keras asks): its gradients are computed and its
    // weights move.
    fixed.set_trainable(true);
    model->compile({.optimizer = optimizers::SGD({.learning_rate = 0.05}), .loss = "mse"});
    const Tensor<float> kernel = fixed.weights()[0].value.clone();
    model->train_on_batch(std::vector{a, b}, std::vector{y});
    for (const auto& w : fixed.weights()) {
      CAPTURE(w.name);
      CHECK(std::all_of(w.gradient.begin(), w.gradient.end(),
                        [](float g) { return std::isfinite(g); }));
    }
    CHECK_FALSE(fixed.weights()[0].value == kernel);
  }

  TEST_CASE("A shared layer's weight gradients are the sums of its calls' gradients") {
    // The same network with one Conv2D and one Dense shared by both branches, and with a copy
    // of each per branch: the shared gradient is the sum of the copies' gradients.
    const Tensor<float> a = random_tensor({4, 5, 5, 2}, 41), b = random_tensor({4, 5, 5, 2}, 42);
    const Tensor<float> y = random_tensor({4, 2}, 43);
    auto shared = two_branches(true, false);
    auto separate = two_branches(false, false);
    for (const char* name : {"conv_b", "dense_b"}) {
      const std::string from = std::string(name, std::strlen(name) - 1) + "a";
      copy_weights(*shared->get_layer(from), *separate->get_layer(name));
    }
    for (const char* name : {"conv_a", "dense_a", "fixed", "out"})
      copy_weights(*shared->get_layer(name), *separate->get_layer(name));
    poison_gradients(*shared);
    shared->train_on_batch(std::vector{a, b}, std::vector{y});
    separate->train_on_batch(std::vector{a, b}, std::vector{y});
    for (const char* name : {"conv", "dense"}) {
      CAPTURE(name);
      const auto& together = shared->get_layer(std::string(name) + "_a")->weights();
      const auto& first = separate->get_layer(std::string(name) + "_a")->weights();
      const auto& second = separate->get_layer(std::string(name) + "_b")->weights();
      for (std::size_t w = 0; w < together.size(); ++w) {
        CAPTURE(w);
        const Tensor<float>& g = together[w].gradient;
        for (std::size_t i = 0; i < g.size(); ++i) {
          const float sum = first[w].gradient.data()[i] + second[w].gradient.data()[i];
          REQUIRE(g.data()[i] == doctest::Approx(sum).epsilon(1e-4).scale(1.0));
        }
      }
    }
  }

  TEST_CASE("A loop of train_step over a DataIterator trains exactly as fit") {
    const Blobs data = blobs(100, 7);
    auto by_fit = classifier();
    by_fit->fit(data.x, data.y, {.epochs = 2, .batch_size = 16, .verbose = 0});

    auto by_steps = classifier();
    DataIterator batches = by_steps->make_data_iterator(data.x, data.y, {.batch_size = 16});
    for (std::size_t epoch = 0; epoch < 2; ++epoch) {
      by_steps->training_metrics().reset();
      batches.start_epoch(epoch);
      while (const auto* batch = batches.next())
        by_steps->train_step(*batch);
    }
    CHECK(same_weights(by_steps->get_weights(), by_fit->get_weights()));
  }

  TEST_CASE("train_on_batch and test_on_batch take every batch kind") {
    const Blobs data = blobs(16, 7);
    Tensor<float> weights({16}, 1.0F);
    auto a = classifier();
    auto b = classifier();
    auto c = classifier();
    const Logs from_arrays = a->train_on_batch(data.x, data.y);
    const Logs from_pair = b->train_on_batch(std::make_tuple(data.x, data.y));
    const Logs from_triple = c->train_on_batch(std::make_tuple(data.x, data.y, weights));
    CHECK(*from_arrays.get("loss") == *from_pair.get("loss"));
    CHECK(*from_arrays.get("loss") == *from_triple.get("loss"));
    CHECK(same_weights(a->get_weights(), b->get_weights()));
    const Logs tested = a->test_on_batch(std::make_tuple(data.x, data.y, weights));
    CHECK(tested.contains("accuracy"));
    const auto& outputs = a->predict_step(data.x);
    REQUIRE(outputs.size() == 1);
    CHECK(outputs[0].shape() == Shape{16, 2});
  }

  TEST_CASE("Validation between training steps leaves the training metrics alone") {
    const Blobs data = blobs(64, 7);
    auto plain = classifier();
    auto interleaved = classifier();
    const auto batch = [&](std::size_t i) {
      return std::make_tuple(data.x.slice_rows(i * 16, (i + 1) * 16),
                             data.y.slice_rows(i * 16, (i + 1) * 16));
    };
    Logs expected, got;
    for (std::size_t i = 0; i < 4; ++i) {
      expected = plain->train_step(batch(i));
      got = interleaved->train_step(batch(i));
      if (i == 1) {
        interleaved->evaluation_metrics().reset();
        interleaved->test_step(batch(3));
      }
    }
    CHECK(*got.get("loss") == *expected.get("loss"));
    CHECK(*got.get("accuracy") == *expected.get("accuracy"));
    CHECK(same_weights(plain->get_weights(), interleaved->get_weights()));
  }

  TEST_CASE("evaluate called from a callback during fit leaves class weights and metrics alone") {
    const Blobs data = blobs(96, 7);
    const FitOptions options{.epochs = 2,
                             .batch_size = 16,
                             .verbose = 0,
                             .class_weight = ClassWeight{{0, 0.5F}, {1, 2.0F}}};
    auto plain = classifier();
    DataIterator plain_data = plain->make_data_iterator(data.x, data.y, {.batch_size = 16});
    const callbacks::History expected = plain->fit(plain_data, options);

    auto nested = classifier();
    DataIterator nested_data = nested->make_data_iterator(data.x, data.y, {.batch_size = 16});
    std::size_t evaluations = 0;
    FitOptions with_callback = options;
    with_callback.callbacks = {std::make_shared<callbacks::LambdaCallback>(
        callbacks::LambdaCallbackOptions{.on_batch_end = [&](std::size_t batch, const Logs&) {
          if (batch == 2) {
            nested->evaluate(data.x, data.y, {.verbose = 0});
            ++evaluations;
          }
        }})};
    const callbacks::History got = nested->fit(nested_data, with_callback);
    CHECK(evaluations == 2);
    CHECK(got.history.at("loss") == expected.history.at("loss"));
    CHECK(got.history.at("accuracy") == expected.history.at("accuracy"));
    CHECK(same_weights(nested->get_weights(), plain->get_weights()));
  }

  TEST_CASE("metrics are unweighted and weighted_metrics take the sample weights, as in Keras") {
    // A linear model whose outputs are its inputs: the logits are chosen so that rows 1, 3 and 4
    // are right and row 2 is wrong.
    auto make = [](std::vector<MetricArg> metrics, std::vector<MetricArg> weighted) {
      auto model = std::make_shared<Sequential>(
          std::initializer_list<SequentialItem>{Input({2}), layers::Dense(2, {.use_bias = false})});
      model->compile({.optimizer = "sgd",
                      .loss = losses::SparseCategoricalCrossentropy(true),
                      .metrics = std::move(metrics),
                      .weighted_metrics = std::move(weighted)});
      model->set_weights({Tensor<float>(
          {2, 2}, std::span<const float>(std::vector<float>{1.0F, 0.0F, 0.0F, 1.0F}))});
      return model;
    };
    const Tensor<float> x({4, 2},
                          std::span<const float>(std::vector<float>{2, 0, 2, 0, 0, 2, 0, 2}));
    const Tensor<std::int64_t> y(
        {4}, std::span<const std::int64_t>(std::vector<std::int64_t>{0, 1, 1, 1}));
    const Tensor<float> w({4}, std::span<const float>(std::vector<float>{1, 3, 1, 1}));

    auto both = make({"accuracy"}, {"accuracy"});
    const Logs logs = both->test_on_batch(x, y, w);
    CHECK(*logs.get("accuracy") == doctest::Approx(0.75));
    CHECK(*logs.get("weighted_accuracy") == doctest::Approx(0.5));
    CHECK(both->metrics_names() ==
          std::vector<std::string>{"loss", "accuracy", "weighted_accuracy"});

    auto only_weighted = make({}, {"accuracy"});
    CHECK(*only_weighted->test_on_batch(x, y, w).get("accuracy") == doctest::Approx(0.5));

    SUBCASE("and class_weight reaches only the weighted metrics") {
      auto model = make({"accuracy"}, {"accuracy"});
      const callbacks::History history =
          model->fit(x, y,
                     {.epochs = 1,
                      .batch_size = 4,
                      .verbose = 0,
                      .shuffle = false,
                      .class_weight = ClassWeight{{0, 3.0F}, {1, 1.0F}}});
      // Class 0 (row 1, right) weighs 3: weighted accuracy (3 + 0 + 1 + 1) / 6.
      CHECK(history.history.at("accuracy")[0] == doctest::Approx(0.75));
      CHECK(history.history.at("weighted_accuracy")[0] == doctest::Approx(5.0 / 6.0));
    }
  }

  TEST_CASE("fit stopped mid-epoch resumes bitwise from arrays") {
    const Blobs data = blobs(100, 7);
    CHECK(resumes_exactly([&](Model& model) {
      return model.make_data_iterator(data.x, data.y, {.batch_size = 16, .seed = 5});
    }));
  }

  TEST_CASE(
      "fit stopped mid-epoch resumes bitwise from a Sequence whose batches depend on the epoch") {
    const Blobs data = blobs(100, 7);
    CHECK(resumes_exactly([&](Model& model) {
      return model.make_data_iterator(EpochSequence{data.x, data.y},
                                      {.shuffle = true, .workers = 2, .seed = 5});
    }));
    SUBCASE("served by forked workers") {
      CHECK(resumes_exactly([&](Model& model) {
        return model.make_data_iterator(
            EpochSequence{data.x, data.y},
            {.shuffle = true, .workers = 2, .use_multiprocessing = true, .seed = 5});
      }));
    }
  }

  TEST_CASE("fit's Sequence loader runs exactly the workers asked for") {
    // Batches that take 2 ms, each naming the thread that built it.
    struct Recording {
      std::shared_ptr<std::mutex> mutex = std::make_shared<std::mutex>();
      std::shared_ptr<std::set<std::thread::id>> threads =
          std::make_shared<std::set<std::thread::id>>();
      std::size_t size() const { return 60; }
      std::pair<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        {
          const std::lock_guard lock(*mutex);
          threads->insert(std::this_thread::get_id());
        }
        return {Tensor<float>({1, 2}, static_cast<float>(i)), Tensor<std::int64_t>({1}, 0)};
      }
    };
    for (const std::size_t workers : {0U, 1U, 3U, 5U}) {
      const Recording sequence;
      auto reader = classifier();
      auto it = reader->make_data_iterator(sequence, {.max_queue_size = 12, .workers = workers});
      it.start_epoch(0);
      for (int i = 0; i < 60; ++i)
        REQUIRE(it.next() != nullptr);
      CAPTURE(workers);
      CHECK(sequence.threads->size() == std::max<std::size_t>(workers, 1));
      CHECK(sequence.threads->count(std::this_thread::get_id()) == (workers == 0 ? 1U : 0U));
    }
  }

  TEST_CASE("fit stopped mid-epoch resumes bitwise from a Dataset") {
    const Blobs data = blobs(100, 7);
    // One dataset per model, kept alive by the iterator's owner below.
    std::vector<
        std::unique_ptr<decltype(from_tensor_slices(data.x, data.y).shuffle(64, 3).batch(16))>>
        datasets;
    CHECK(resumes_exactly([&](Model& model) {
      datasets.push_back(
          std::make_unique<decltype(from_tensor_slices(data.x, data.y).shuffle(64, 3).batch(16))>(
              from_tensor_slices(data.x, data.y).shuffle(64, 3).batch(16)));
      return model.make_data_iterator(*datasets.back());
    }));
  }

  TEST_CASE("fit stopped mid-epoch resumes bitwise from a SequenceAdapter") {
    const Blobs data = blobs(100, 7);
    using Adapter = SequenceAdapter<EpochSequence, 2>;
    const AdapterOptions adapter_options{.sampler = {.shuffle = true, .seed = 9}};
    const FitOptions options{.epochs = 3, .verbose = 0, .seed = 42};

    auto reference = classifier();
    Adapter reference_adapter(EpochSequence{data.x, data.y}, adapter_options);
    reference->fit(reference_adapter, options);

    auto interrupted = classifier();
    Adapter interrupted_adapter(EpochSequence{data.x, data.y}, adapter_options);
    DataIterator interrupted_data = interrupted->make_data_iterator(interrupted_adapter);
    auto stopper = std::make_shared<StopAndSave>(interrupted_data, 1, 3);
    FitOptions first = options;
    first.callbacks = {stopper};
    interrupted->fit(interrupted_data, first);

    auto resumed = classifier(777);
    // The caller's adapter resumes from the adapter state inside the checkpoint.
    Adapter resumed_adapter(EpochSequence{data.x, data.y}, adapter_options,
                            stopper->saved.data.at("adapter").get<SamplerState>());
    DataIterator resumed_data = resumed->make_data_iterator(resumed_adapter);
    restore(*resumed, resumed_data, stopper->saved);
    FitOptions rest = options;
    rest.initial_epoch = 1;
    resumed->fit(resumed_data, rest);
    CHECK(same_weights(resumed->get_weights(), reference->get_weights()));

    SUBCASE("and refuses a state the adapter does not stand at") {
      auto other = classifier();
      Adapter fresh(EpochSequence{data.x, data.y}, adapter_options);
      DataIterator fresh_data = other->make_data_iterator(fresh);
      CHECK_THROWS_WITH_AS(fresh_data.restore(stopper->saved.data),
                           doctest::Contains("construct the adapter from the saved state"),
                           CheckpointError);
    }
  }

  TEST_CASE("Restoring a state of another kind or shape throws CheckpointError naming it") {
    const Blobs data = blobs(32, 7);
    auto model = classifier();
    DataIterator batches = model->make_data_iterator(data.x, data.y, {.batch_size = 8});
    CHECK_THROWS_WITH_AS(batches.restore({{"epoch", 0}}),
                         "array source state: the field 'step' is missing in {\"epoch\":0}",
                         CheckpointError);
    nlohmann::json saved = batches.state();
    saved["sampler"]["seed"] = 12345U;
    CHECK_THROWS_WITH_AS(batches.restore(saved), doctest::Contains("saved with seed 12345"),
                         CheckpointError);
    model->train_on_batch(data.x, data.y);
    nlohmann::json metrics = model->training_metrics().state();
    metrics["metrics"].push_back(nullptr);
    CHECK_THROWS_WITH_AS(model->training_metrics().restore(metrics),
                         doctest::Contains("running metrics state: expected the states of 1 "
                                           "metrics"),
                         CheckpointError);
  }

  TEST_CASE("Callbacks write to the stream fit is given and keep their state") {
    const Blobs data = blobs(64, 7);
    std::ostringstream out;
    auto model = classifier();
    auto stop = std::make_shared<callbacks::EarlyStopping>(callbacks::EarlyStoppingOptions{
        .monitor = "loss", .min_delta = 10.0, .patience = 1, .verbose = 1});
    model->fit(data.x, data.y, {.epochs = 5, .verbose = 2, .callbacks = {stop}, .output = &out});
    const std::string text = out.str();
    CHECK(text.find("Epoch 1/5") != std::string::npos);
    CHECK(text.find("Epoch 00002: early stopping") != std::string::npos);
    const nlohmann::json state = stop->get_state();
    CHECK(state.at("stopped_epoch") == 1);

    callbacks::EarlyStopping restored(
        callbacks::EarlyStoppingOptions{.monitor = "loss", .min_delta = 10.0, .patience = 1});
    restored.load_state(state);
    CHECK(restored.get_state() == state);
    CHECK_THROWS_WITH_AS(restored.load_state({{"wait", "x"}}),
                         doctest::Contains("early stopping state: the field 'wait'"),
                         CheckpointError);
    // A state written before the best weights were kept loads with none.
    nlohmann::json older = state;
    older.erase("best_weights");
    restored.load_state(older);
    CHECK(restored.get_state() == state);  // no best weights without restore_best_weights
  }

  TEST_CASE("EarlyStopping keeps its best weights in its state, so a resumed run restores them") {
    const Blobs data = blobs(64, 7);
    auto model = classifier();
    const callbacks::EarlyStoppingOptions options{
        .monitor = "loss", .min_delta = 10.0, .patience = 5, .restore_best_weights = true};
    auto stop = std::make_shared<callbacks::EarlyStopping>(options);
    model->fit(data.x, data.y, {.epochs = 2, .verbose = 0, .callbacks = {stop}});
    const nlohmann::json state = stop->get_state();
    const auto weights = model->get_weights();
    REQUIRE(state.at("best_weights").size() == weights.size());
    CHECK(state.at("best_weights")[0].at("values").size() == weights[0].size());

    // Resumed from its state, it holds the same best weights; a spoiled list is refused.
    callbacks::EarlyStopping resumed(options);
    resumed.load_state(state);
    nlohmann::json spoiled = state;
    spoiled["best_weights"][0]["values"].erase(0);
    callbacks::EarlyStopping other(options);
    const std::string message = "early stopping state: best_weights: expected " +
                                std::to_string(weights[0].size()) + " values";
    CHECK_THROWS_WITH_AS(other.load_state(spoiled), doctest::Contains(message.c_str()),
                         CheckpointError);
    CHECK(resumed.get_state() == state);
  }
}
