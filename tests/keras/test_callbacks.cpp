#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loadstar/keras.hpp>
#include <sstream>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using namespace loadstar::keras::callbacks;

namespace {

/// Records every hook as "name[:index]".
class Recorder : public Callback {
 public:
  std::vector<std::string> calls;
  void on_train_begin(const Logs&) override { calls.emplace_back("train_begin"); }
  void on_train_end(const Logs&) override { calls.emplace_back("train_end"); }
  void on_epoch_begin(std::size_t e, const Logs&) override { add("epoch_begin", e); }
  void on_epoch_end(std::size_t e, const Logs&) override { add("epoch_end", e); }
  void on_train_batch_begin(std::size_t b, const Logs&) override { add("batch_begin", b); }
  void on_train_batch_end(std::size_t b, const Logs&) override { add("batch_end", b); }
  void on_test_begin(const Logs&) override { calls.emplace_back("test_begin"); }
  void on_test_end(const Logs&) override { calls.emplace_back("test_end"); }
  void on_test_batch_begin(std::size_t b, const Logs&) override { add("test_batch_begin", b); }
  void on_test_batch_end(std::size_t b, const Logs&) override { add("test_batch_end", b); }
  void on_predict_begin(const Logs&) override { calls.emplace_back("predict_begin"); }
  void on_predict_end(const Logs&) override { calls.emplace_back("predict_end"); }
  void on_predict_batch_begin(std::size_t b, const Logs&) override {
    add("predict_batch_begin", b);
  }
  void on_predict_batch_end(std::size_t b, const Logs&) override { add("predict_batch_end", b); }

 private:
  void add(const char* name, std::size_t i) { calls.push_back(name + (":" + std::to_string(i))); }
};

struct Data {
  Tensor<float> x;
  Tensor<float> y;
};

/// y = 2 x + 1 on 10 rows.
Data line() {
  Data d{Tensor<float>({10, 1}), Tensor<float>({10, 1})};
  for (std::size_t i = 0; i < 10; ++i) {
    d.x(i, 0) = static_cast<float>(i) / 10.0F;
    d.y(i, 0) = 2.0F * d.x(i, 0) + 1.0F;
  }
  return d;
}

std::unique_ptr<Sequential> regression(double learning_rate = 0.1) {
  set_random_seed(1);
  auto model =
      std::make_unique<Sequential>(std::initializer_list<SequentialItem>{Input({1}), Dense(1)});
  model->compile(optimizers::SGD({.learning_rate = learning_rate}), "mse");
  return model;
}

Logs logs_with(const std::string& name, double value) {
  Logs logs;
  logs.set(name, value);
  return logs;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("Callback hooks run in Keras's order in fit evaluate and predict") {
    auto model = regression();
    const Data d = line();
    auto recorder = std::make_shared<Recorder>();
    model->fit(d.x, d.y,
               {.epochs = 2,
                .batch_size = 4,
                .verbose = 0,
                .callbacks = {recorder},
                .validation_data = {d.x.slice_rows(0, 6), d.y.slice_rows(0, 6)},
                .validation_batch_size = 5});
    const std::vector<std::string> epoch = {
        "batch_begin:0",    "batch_end:0",        "batch_begin:1",    "batch_end:1",
        "batch_begin:2",    "batch_end:2",        "test_begin",       "test_batch_begin:0",
        "test_batch_end:0", "test_batch_begin:1", "test_batch_end:1", "test_end"};
    std::vector<std::string> expected{"train_begin", "epoch_begin:0"};
    expected.insert(expected.end(), epoch.begin(), epoch.end());
    expected.emplace_back("epoch_end:0");
    expected.emplace_back("epoch_begin:1");
    expected.insert(expected.end(), epoch.begin(), epoch.end());
    expected.emplace_back("epoch_end:1");
    expected.emplace_back("train_end");
    CHECK(recorder->calls == expected);

    recorder->calls.clear();
    model->evaluate(d.x, d.y, {.batch_size = 8, .verbose = 0, .callbacks = {recorder}});
    CHECK(recorder->calls == std::vector<std::string>{"test_begin", "test_batch_begin:0",
                                                      "test_batch_end:0", "test_batch_begin:1",
                                                      "test_batch_end:1", "test_end"});
    recorder->calls.clear();
    model->predict(d.x, {.batch_size = 10, .callbacks = {recorder}});
    CHECK(recorder->calls == std::vector<std::string>{"predict_begin", "predict_batch_begin:0",
                                                      "predict_batch_end:0", "predict_end"});
  }

  TEST_CASE("Callback setting stop_training ends fit after the current batch") {
    auto model = regression();
    const Data d = line();
    std::size_t batches = 0;
    auto stopper = std::make_shared<LambdaCallback>(
        LambdaCallbackOptions{.on_batch_end = [&](std::size_t batch, const Logs&) {
          ++batches;
          if (batch == 1) model->stop_training = true;
        }});
    const History history =
        model->fit(d.x, d.y, {.epochs = 5, .batch_size = 2, .verbose = 0, .callbacks = {stopper}});
    CHECK(batches == 2);
    CHECK(history.epoch == std::vector<std::size_t>{0});
    // A later fit starts again.
    const History again = model->fit(d.x, d.y, {.epochs = 2, .verbose = 0});
    CHECK(again.epoch.size() == 2);
  }

  TEST_CASE("EarlyStopping stops after patience and restores the best weights") {
    auto model = regression();
    SUBCASE("with logs given by hand") {
      EarlyStopping stop({.monitor = "val_loss", .patience = 2, .restore_best_weights = true});
      stop.set_model(*model);
      stop.on_train_begin({});
      const std::vector<double> values{1.0, 0.5, 0.7, 0.6, 0.4};
      std::vector<Tensor<float>> best;
      std::size_t stopped_at = 0;
      for (std::size_t epoch = 0; epoch < values.size(); ++epoch) {
        // Mark the weights with the epoch number.
        auto weights = model->get_weights();
        weights[0].data()[0] = static_cast<float>(epoch);
        model->set_weights(weights);
        if (epoch == 1) best = model->get_weights();
        stop.on_epoch_end(epoch, logs_with("val_loss", values[epoch]));
        if (model->stop_training) {
          stopped_at = epoch;
          break;
        }
      }
      CHECK(stopped_at == 3);
      CHECK(stop.stopped_epoch() == 3);
      CHECK(stop.best() == 0.5);
      CHECK(stop.best_epoch() == 1);
      CHECK(model->get_weights()[0].data()[0] == 1.0F);
    }
    SUBCASE("with min_delta mode max and a baseline") {
      EarlyStopping stop({.monitor = "val_accuracy", .min_delta = 0.1, .patience = 1});
      stop.set_model(*model);
      stop.on_train_begin({});
      stop.on_epoch_end(0, logs_with("val_accuracy", 0.5));
      stop.on_epoch_end(1, logs_with("val_accuracy", 0.55));  // not by more than min_delta
      CHECK(model->stop_training);
      model->stop_training = false;
      EarlyStopping base({.monitor = "loss", .patience = 2, .baseline = 0.1});
      base.set_model(*model);
      base.on_train_begin({});
      base.on_epoch_end(0, logs_with("loss", 0.5));
      base.on_epoch_end(1, logs_with("loss", 0.4));  // improves, but not beyond the baseline
      CHECK(model->stop_training);
    }
    SUBCASE("inside fit") {
      // A learning rate of zero: the loss never improves, so training stops at epoch patience.
      auto frozen = regression(0.0);
      auto stop =
          std::make_shared<EarlyStopping>(EarlyStoppingOptions{.monitor = "loss", .patience = 2});
      const Data d = line();
      const History history = frozen->fit(
          d.x, d.y, {.epochs = 20, .verbose = 0, .callbacks = {stop}, .shuffle = false});
      CHECK(history.epoch.size() == 3);
      CHECK(stop->stopped_epoch() == 2);
    }
    CHECK_THROWS_WITH_AS(EarlyStopping({.mode = "up"}),
                         doctest::Contains("mode must be 'auto', 'min' or 'max' but is 'up'"),
                         ConfigError);
  }

  TEST_CASE("ReduceLROnPlateau lowers the learning rate after patience and cooldown") {
    auto model = regression(0.1);
    ReduceLROnPlateau plateau(
        {.monitor = "val_loss", .factor = 0.5, .patience = 2, .cooldown = 1, .min_lr = 0.02});
    plateau.set_model(*model);
    plateau.on_train_begin({});
    const std::vector<double> values{1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0};
    std::vector<double> rates;
    for (std::size_t epoch = 0; epoch < values.size(); ++epoch) {
      plateau.on_epoch_end(epoch, logs_with("val_loss", values[epoch]));
      rates.push_back(model->optimizer().learning_rate());
    }
    // Epoch 0 sets the best; waits at 1, 2 -> reduce; cooldown 3; waits 4, 5 -> reduce to the
    // floor 0.025 -> 0.02 clamps later.
    CHECK(rates[0] == doctest::Approx(0.1));
    CHECK(rates[2] == doctest::Approx(0.05));
    CHECK(rates[3] == doctest::Approx(0.05));
    CHECK(rates[5] == doctest::Approx(0.025));
    CHECK(rates[7] == doctest::Approx(0.02));
    CHECK_THROWS_WITH_AS(ReduceLROnPlateau({.factor = 1.0}),
                         doctest::Contains("factor must be below 1"), ConfigError);
  }

  TEST_CASE("LearningRateScheduler sets the rate each epoch") {
    auto model = regression(0.1);
    std::vector<double> seen;
    auto scheduler = std::make_shared<LearningRateScheduler>(
        [](std::size_t epoch, double lr) { return epoch == 0 ? lr : lr / 2; });
    auto spy = std::make_shared<LambdaCallback>(
        LambdaCallbackOptions{.on_epoch_begin = [&](std::size_t, const Logs&) {
          seen.push_back(model->optimizer().learning_rate());
        }});
    const Data d = line();
    model->fit(d.x, d.y, {.epochs = 3, .verbose = 0, .callbacks = {scheduler, spy}});
    REQUIRE(seen.size() == 3);
    CHECK(seen[0] == doctest::Approx(0.1));
    CHECK(seen[1] == doctest::Approx(0.05));
    CHECK(seen[2] == doctest::Approx(0.025));
  }

  TEST_CASE("CSVLogger writes Keras's header and one flushed row per epoch") {
    const auto path = std::filesystem::temp_directory_path() /
                      ("loadstar_csv_" + std::to_string(::getpid()) + ".csv");
    auto model = regression();
    const Data d = line();
    std::vector<std::string> seen_mid_run;
    auto csv = std::make_shared<CSVLogger>(path);
    auto reader = std::make_shared<LambdaCallback>(
        LambdaCallbackOptions{.on_epoch_end = [&](std::size_t, const Logs&) {
          std::ifstream in(path);
          seen_mid_run.emplace_back(std::istreambuf_iterator<char>(in),
                                    std::istreambuf_iterator<char>());
        }});
    const History history = model->fit(d.x, d.y,
                                       {.epochs = 2,
                                        .batch_size = 5,
                                        .verbose = 0,
                                        .callbacks = {csv, reader},
                                        .validation_data = {d.x, d.y}});
    std::ifstream in(path, std::ios::binary);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::istringstream lines(text);
    std::string header, row0, row1;
    std::getline(lines, header);
    std::getline(lines, row0);
    std::getline(lines, row1);
    CHECK(header == "epoch,loss,val_loss\r");
    double loss = 0, val_loss = 0;
    int epoch = -1;
    CHECK(std::sscanf(row1.c_str(), "%d,%lf,%lf", &epoch, &loss, &val_loss) == 3);
    CHECK(epoch == 1);
    CHECK(loss == history.history.at("loss")[1]);  // shortest round-trip form
    CHECK(val_loss == history.history.at("val_loss")[1]);
    // Flushed: the row of epoch 0 was on disk when epoch 0 ended.
    REQUIRE(seen_mid_run.size() == 2);
    CHECK(seen_mid_run[0].find("\r\n0,") != std::string::npos);

    SUBCASE("appending keeps the header once") {
      auto more = std::make_shared<CSVLogger>(path, ',', true);
      model->fit(d.x, d.y,
                 {.epochs = 1, .verbose = 0, .callbacks = {more}, .validation_data = {d.x, d.y}});
      std::ifstream again(path);
      const std::string all{std::istreambuf_iterator<char>(again),
                            std::istreambuf_iterator<char>()};
      std::size_t headers = 0;
      for (std::size_t at = all.find("epoch,"); at != std::string::npos;
           at = all.find("epoch,", at + 1))
        ++headers;
      CHECK(headers == 1);
      CHECK(std::count(all.begin(), all.end(), '\n') == 4);
    }
    std::filesystem::remove(path);
    CHECK_THROWS_WITH_AS(
        model->fit(
            d.x, d.y,
            {.verbose = 0, .callbacks = {std::make_shared<CSVLogger>("/nonexistent-dir/x.csv")}}),
        doctest::Contains("csv logger: cannot open '/nonexistent-dir/x.csv' for writing"), IoError);
  }

  TEST_CASE("TerminateOnNaN stops training on a NaN loss") {
    auto model = regression();
    Data d = line();
    d.y(4, 0) = std::nanf("");
    auto terminate = std::make_shared<TerminateOnNaN>();
    std::size_t batches = 0;
    auto count = std::make_shared<LambdaCallback>(
        LambdaCallbackOptions{.on_batch_end = [&](std::size_t, const Logs&) { ++batches; }});
    const History history = model->fit(d.x, d.y,
                                       {.epochs = 3,
                                        .batch_size = 2,
                                        .verbose = 0,
                                        .callbacks = {terminate, count},
                                        .shuffle = false});
    CHECK(terminate->terminated());
    CHECK(batches == 3);  // rows 4 and 5 are batch 2
    CHECK(history.epoch.size() == 1);
    CHECK(std::isnan(history.history.at("loss")[0]));
  }

  TEST_CASE("ProgbarLogger prints Keras's progress lines") {
    auto model = regression();
    const Data d = line();
    SUBCASE("plain lines when not a terminal") {
      std::ostringstream out;
      model->fit(d.x, d.y,
                 {.epochs = 2,
                  .batch_size = 4,
                  .verbose = 0,
                  .callbacks = {std::make_shared<ProgbarLogger>(1, out, false)},
                  .validation_data = {d.x, d.y}});
      const std::string text = out.str();
      CHECK(text.find("Epoch 1/2\n3/3 [==============================] - ") == 0);
      CHECK(text.find("/step - loss: ") != std::string::npos);
      CHECK(text.find(" - val_loss: ") != std::string::npos);
      CHECK(text.find("Epoch 2/2\n3/3 [") != std::string::npos);
      CHECK(text.find('\r') == std::string::npos);
      CHECK(std::count(text.begin(), text.end(), '\n') == 4);
    }
    SUBCASE("a bar redrawn in place on a terminal") {
      std::ostringstream out;
      model->fit(d.x, d.y,
                 {.epochs = 1,
                  .batch_size = 4,
                  .verbose = 0,
                  .callbacks = {std::make_shared<ProgbarLogger>(1, out, true)}});
      const std::string text = out.str();
      CHECK(text.find("\r1/3 [=========>....................] - ETA: ") == 0);
      CHECK(text.find("\r3/3 [==============================] - ") != std::string::npos);
      CHECK(text.back() == '\n');
    }
    SUBCASE("one line per epoch with verbose 2") {
      std::ostringstream out;
      model->fit(d.x, d.y,
                 {.epochs = 1,
                  .batch_size = 4,
                  .verbose = 0,
                  .callbacks = {std::make_shared<ProgbarLogger>(2, out)}});
      CHECK(out.str().find("3/3 - ") == 0);
      CHECK(out.str().find('[') == std::string::npos);
    }
    SUBCASE("evaluate shows its own bar") {
      std::ostringstream out;
      model->evaluate(d.x, d.y,
                      {.batch_size = 5,
                       .verbose = 0,
                       .callbacks = {std::make_shared<ProgbarLogger>(1, out, false)}});
      CHECK(out.str().find("2/2 [==============================] - ") == 0);
    }
  }
}
