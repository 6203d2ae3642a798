// Callbacks that act on validation inside a trial (Keras's own at the synthesized epoch ends with
// the training and validation logs; Determined's EarlyStopping and ReduceLROnPlateau after each
// validation), and failures that tell the truth: InvalidHP ends a trial as invalid and the
// searcher replaces it, and a failure that recurs at the same batch is not retried again.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <loadstar/trial/callbacks.hpp>
#include <loadstar/trial/detail/experiment_describe.hpp>
#include <loadstar/trial/experiment.hpp>
#include <loadstar/trial/invalid_hp.hpp>
#include <map>
#include <sstream>

#include "temp_dir.hpp"

namespace {

using namespace runner_support;

/// The logs of every synthesized epoch end, as the callback heard them.
struct EpochLogs {
  std::size_t epoch = 0;
  std::map<std::string, double> logs;
};

std::vector<EpochLogs>& epoch_logs() {
  static std::vector<EpochLogs> seen;
  return seen;
}

/// A plain Keras callback (not a trial::Callback) that keeps what on_epoch_end hears.
class EpochLogsRecorder : public callbacks::Callback {
 public:
  void on_epoch_end(std::size_t epoch, const Logs& logs) override {
    EpochLogs e{epoch, {}};
    for (const auto& [name, value] : logs)
      e.logs[name] = value;
    epoch_logs().push_back(std::move(e));
  }
};

/// The callbacks the hyperparameter `callbacks` names, over the blobs trial:
/// - `keras`: a list copied from a Keras script (EarlyStopping that never stops,
///   ReduceLROnPlateau, ModelCheckpoint(save_best_only), CSVLogger) and the recorder;
/// - `keras_stop`: Keras's EarlyStopping that stops at the second epoch end;
/// - `det_stop`: Determined's EarlyStopping that stops at the third validation (and
///   `det_stop_restore`, the same restoring the weights of the first);
/// - `det_plateau`: Determined's ReduceLROnPlateau, halving at every validation after the first.
class CallbacksTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    const std::string which = context.get_hparams().value("callbacks", "keras");
    const std::string dir = context.get_hparams().value("dir", "");
    if (which == "keras") {
      return {std::make_shared<EpochLogsRecorder>(),
              std::make_shared<callbacks::EarlyStopping>(
                  callbacks::EarlyStoppingOptions{.monitor = "val_loss", .patience = 100}),
              std::make_shared<callbacks::ReduceLROnPlateau>(
                  callbacks::ReduceLROnPlateauOptions{.monitor = "val_loss", .patience = 100}),
              std::make_shared<callbacks::ModelCheckpoint>(
                  dir + "/best.h5",
                  callbacks::ModelCheckpointOptions{.monitor = "val_loss", .save_best_only = true}),
              std::make_shared<callbacks::CSVLogger>(dir + "/log.csv")};
    }
    if (which == "keras_stop") {
      return {std::make_shared<callbacks::EarlyStopping>(
          callbacks::EarlyStoppingOptions{.monitor = "val_loss", .min_delta = 100, .patience = 1})};
    }
    if (which == "det_stop" || which == "det_stop_restore") {
      return {std::make_shared<trial::callbacks::EarlyStopping>(
          callbacks::EarlyStoppingOptions{.monitor = "val_loss",
                                          .min_delta = 100,
                                          .patience = 2,
                                          .restore_best_weights = which == "det_stop_restore"})};
    }
    return {
        std::make_shared<trial::callbacks::ReduceLROnPlateau>(callbacks::ReduceLROnPlateauOptions{
            .monitor = "val_loss", .factor = 0.5, .patience = 1, .min_delta = 100})};
  }
};

/// Throws InvalidHP from the place the hyperparameter `invalid_at` names (the trial's constructor
/// runs for every trial; trial 1 of an experiment throws, the others train).
class InvalidTrial : public BlobsTrial {
 public:
  explicit InvalidTrial(trial::TrialContext& context) : BlobsTrial(context) {}
  bool invalid(const std::string& where) const {
    return context.get_hparams().value("invalid_at", "") == where &&
           context.get_hparams().value("only_trial", context.get_trial_id()) ==
               context.get_trial_id();
  }
  std::shared_ptr<Model> build_model() override {
    if (invalid("build_model")) throw trial::InvalidHP("hidden units exceed the budget");
    return BlobsTrial::build_model();
  }
  trial::DataLoader build_training_data_loader() override {
    if (invalid("loader")) throw trial::InvalidHP("batch larger than the data");
    return BlobsTrial::build_training_data_loader();
  }
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    if (!invalid("callback")) return {};
    class Refuses : public trial::Callback {
      void on_train_batch_end(std::size_t, const Logs&) override {
        throw trial::InvalidHP("the loss diverges for this learning rate");
      }
    };
    return {std::make_shared<Refuses>()};
  }
};

/// Fails at its 13th batch every time (its batch count is in its state, so a restart from the
/// checkpoint at 12 replays the failure).
class FailsAtThirteen : public trial::Callback {
 public:
  void on_train_batch_end(std::size_t, const Logs&) override {
    if (++batches_ == 13) throw Error("deterministic failure");
  }
  std::string class_name() const override { return "FailsAtThirteen"; }
  nlohmann::json get_state() const override { return batches_; }
  void load_state(const nlohmann::json& s) override { batches_ = s.get<int>(); }

 private:
  int batches_ = 0;
};

class DeterministicFailureTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    return {std::make_shared<FailsAtThirteen>()};
  }
};

void register_here() {
  register_trials();
  trial::register_trial<CallbacksTrial>("tests:CallbacksTrial");
  trial::register_trial<InvalidTrial>("tests:InvalidTrial");
  trial::register_trial<DeterministicFailureTrial>("tests:DeterministicFailureTrial");
}

trial::TrialSpec callbacks_spec(const std::filesystem::path& dir, trial::ExperimentConfig c,
                                nlohmann::json hp) {
  register_here();
  return trial_spec(dir, std::move(c), std::move(hp));
}

std::vector<nlohmann::json> metric_lines(const trial::TrialSpec& s, const std::string& kind) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text(s.trial_dir / "metrics.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto json = nlohmann::json::parse(line);
    if (json["kind"] == kind) lines.push_back(std::move(json));
  }
  return lines;
}

std::shared_ptr<Model> latest_model(const trial::TrialSpec& s) {
  return load_model(s.checkpoint_dir / record(s).at("latest_checkpoint").get<std::string>() /
                    "determined-keras-model.h5");
}

nlohmann::json with(nlohmann::json hp, const std::string& key, nlohmann::json value) {
  hp[key] = std::move(value);
  return hp;
}

/// 240 rows in batches of 16: 10 batches an epoch of 160 records, validated every 10 batches.
trial::ExperimentConfig epoch_config(const std::string& entrypoint) {
  auto c = config(entrypoint);
  c.records_per_epoch = 160;
  return c;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("Keras callbacks in a trial hear the training and validation logs at each epoch end") {
    test_support::TempDir dir;
    epoch_logs().clear();
    const auto s = callbacks_spec(dir.path(), epoch_config("tests:CallbacksTrial"),
                                  with(hparams(), "dir", dir.path().string()));
    std::ostringstream out;
    const auto result = trial::run_trial(s, {.output = &out});
    CAPTURE(out.str());
    CHECK_FALSE(result.stop_requested);
    CHECK(out.str().find("not in the logs") == std::string::npos);
    // 45 batches: epochs end at 10, 20, 30 and 40, each right after its validation.
    const auto validations = metric_lines(s, "validation");
    REQUIRE(validations.size() == 5);  // at 10, 20, 30, 40 and the searcher's 45
    REQUIRE(epoch_logs().size() == 4);
    for (std::size_t k = 0; k < 4; ++k) {
      CAPTURE(k);
      const auto& e = epoch_logs()[k];
      CHECK(e.epoch == k);
      CHECK(e.logs.contains("loss"));
      CHECK(e.logs.contains("accuracy"));
      REQUIRE(e.logs.contains("val_loss"));
      CHECK(e.logs.contains("val_accuracy"));
      // The validation at the epoch's last batch went first: its metrics are the epoch's.
      CHECK(validations[k]["batches"] == 10 * (k + 1));
      CHECK(e.logs.at("val_loss") == validations[k]["metrics"]["val_loss"].get<double>());
    }
    // ModelCheckpoint(save_best_only) saved on val_loss; CSVLogger wrote a row per epoch with
    // the validation columns.
    CHECK(std::filesystem::exists(dir.path() / "best.h5"));
    const std::string csv = text(dir.path() / "log.csv");
    CAPTURE(csv);
    CHECK(csv.starts_with("epoch,accuracy,loss,val_accuracy,val_loss\r\n"));
    CHECK(std::count(csv.begin(), csv.end(), '\n') == 5);
    CHECK(csv.find("NA") == std::string::npos);
  }

  TEST_CASE("A trial resumed mid-run gives its epoch ends the same validation logs") {
    test_support::TempDir one;
    test_support::TempDir two;
    const auto c = epoch_config("tests:CallbacksTrial");
    epoch_logs().clear();
    trial::run_trial(callbacks_spec(one.path(), c, with(hparams(), "dir", one.path().string())),
                     {.verbose = false});
    const auto whole = epoch_logs();
    epoch_logs().clear();
    const auto b = callbacks_spec(two.path(), c, with(hparams(), "dir", two.path().string()));
    trial::run_trial(b, {.until = trial::Length{trial::Unit::batches, 20}, .verbose = false});
    trial::run_trial(b, {.verbose = false});
    REQUIRE(epoch_logs().size() == whole.size());
    for (std::size_t k = 0; k < whole.size(); ++k) {
      CAPTURE(k);
      CHECK(epoch_logs()[k].logs == whole[k].logs);
    }
  }

  TEST_CASE("Keras's EarlyStopping in a trial stops it: a stop request, a checkpoint, completed") {
    test_support::TempDir dir;
    const auto s = callbacks_spec(dir.path(), epoch_config("tests:CallbacksTrial"),
                                  with(hparams(), "callbacks", "keras_stop"));
    const auto result = trial::run_trial(s, {.verbose = false});
    // Epoch 0 sets the best; epoch 1 (after the validation at 20) does not beat it by 100.
    CHECK(result.stop_requested);
    CHECK(result.total_batches == 20);
    const auto r = record(s);
    CHECK(r["state"] == "COMPLETED");
    REQUIRE_FALSE(r["checkpoints"].empty());
    CHECK(r["checkpoints"].back()["batches"] == 20);
    CHECK(r["latest_checkpoint"] == result.latest_checkpoint);
  }

  TEST_CASE("Determined's EarlyStopping acts on validations and resumes exactly") {
    for (const std::string variant : {"det_stop", "det_stop_restore"}) {
      CAPTURE(variant);
      auto c = config("tests:CallbacksTrial");
      c.records_per_epoch = 0;  // no epochs at all: it acts on validations alone
      const auto hp = with(hparams(), "callbacks", variant);
      test_support::TempDir one;
      const auto a = callbacks_spec(one.path(), c, hp);
      const auto result = trial::run_trial(a, {.verbose = false});
      // Validations at 10 (best), 20 (wait 1), 30 (wait 2 = patience): stop, checkpoint at 30.
      CHECK(result.stop_requested);
      CHECK(result.total_batches == 30);
      CHECK(record(a)["state"] == "COMPLETED");
      CHECK(record(a)["checkpoints"].back()["batches"] == 30);

      // Stopped at 20 and resumed: its wait and best come back from the checkpoint, so it stops at
      // 30 as well (a fresh best would count the validation at 30 as an improvement).
      test_support::TempDir two;
      const auto b = callbacks_spec(two.path(), c, hp);
      trial::run_trial(b, {.until = trial::Length{trial::Unit::batches, 20}, .verbose = false});
      const auto resumed = trial::run_trial(b, {.verbose = false});
      CHECK(resumed.stop_requested);
      CHECK(resumed.total_batches == 30);
      // With restore_best_weights the best weights (of the validation at 10) come back from the
      // checkpoint too: a fresh callback would keep the weights at 30.
      CHECK(weight_bytes(latest_model(a)->get_weights()) ==
            weight_bytes(latest_model(b)->get_weights()));
      CHECK(text(a.trial_dir / "metrics.jsonl") == text(b.trial_dir / "metrics.jsonl"));
    }
  }

  TEST_CASE("An experiment's trial that early-stops completes early and its searcher is told") {
    register_here();
    test_support::TempDir dir;
    std::ofstream(dir / "exp.yaml") << R"(entrypoint: tests:CallbacksTrial
hyperparameters:
  global_batch_size: 16
  learning_rate: 0.02
  callbacks: det_stop
records_per_epoch: 240
scheduling_unit: 3
min_validation_period:
  batches: 10
searcher:
  name: single
  metric: val_loss
  max_length:
    batches: 45
reproducibility:
  experiment_seed: 7
)";
    std::ostringstream out;
    trial::ExperimentOptions options;
    options.verbose = false;
    options.plot = false;
    options.out = &out;
    const auto summary = trial::create_experiment(dir / "exp.yaml", dir / "exp", options);
    CAPTURE(out.str());
    CHECK(summary.state == "COMPLETED");
    CHECK(summary.completed == 1);
    CHECK(out.str().find("trial 1: stopped at its own request after 30 batches") !=
          std::string::npos);
    const auto experiment = nlohmann::json::parse(text(dir / "exp" / "experiment.json"));
    CHECK(experiment["trials"][0]["state"] == "COMPLETED");
    CHECK(experiment["trials"][0]["total_batches"] == 30);
    // The searcher heard the early exit (Determined's USER_CANCELED) and the close.
    CHECK(experiment["searcher_state"]["exits"] == nlohmann::json::array({1}));
    CHECK(experiment["searcher_state"]["trials_closed"] == nlohmann::json::array({1}));
    CHECK(experiment["searcher_state"]["failures"] == nlohmann::json::array());
    // Stop request, then checkpoint, then close: the last checkpoint is at the stop.
    const auto trial1 = nlohmann::json::parse(text(dir / "exp" / "trials" / "1" / "trial.json"));
    CHECK(trial1["checkpoints"].back()["batches"] == 30);
  }

  TEST_CASE("Determined's ReduceLROnPlateau lowers the rate per validation, not per epoch") {
    auto c = config("tests:CallbacksTrial");
    c.records_per_epoch = 80;  // 5 batches an epoch: 9 epoch ends that it must not count
    const auto hp = with(hparams(), "callbacks", "det_plateau");
    test_support::TempDir one;
    const auto a = callbacks_spec(one.path(), c, hp);
    trial::run_trial(a, {.verbose = false});
    // Validations at 10, 20, 30, 40, 45: the first sets the best, each later one halves 0.02; the
    // checkpoint at 45 comes before the validation at 45 (checkpoint, then validate): 3 halvings.
    CHECK(latest_model(a)->optimizer().learning_rate() == doctest::Approx(0.02 / 8).epsilon(1e-6));

    test_support::TempDir two;
    const auto b = callbacks_spec(two.path(), c, hp);
    trial::run_trial(b, {.until = trial::Length{trial::Unit::batches, 20}, .verbose = false});
    trial::run_trial(b, {.verbose = false});
    CHECK(weight_bytes(latest_model(a)->get_weights()) ==
          weight_bytes(latest_model(b)->get_weights()));
    CHECK(latest_model(b)->optimizer().learning_rate() == doctest::Approx(0.02 / 8).epsilon(1e-6));
  }

  TEST_CASE("Determined's callbacks refuse a bad mode and a checkpoint state without its fields") {
    CHECK_THROWS_WITH_AS(
        trial::callbacks::EarlyStopping(callbacks::EarlyStoppingOptions{.mode = "up"}),
        "determined.keras.callbacks.EarlyStopping: mode must be 'auto', 'min' or 'max' but is "
        "'up'",
        ConfigError);
    trial::callbacks::ReduceLROnPlateau plateau;
    CHECK_THROWS_WITH_AS(plateau.load_state({{"best", 1.0}, {"wait", 0}, {"cooldown_counter", 0}}),
                         doctest::Contains("determined.keras.callbacks.ReduceLROnPlateau state: "
                                           "the field 'test_end_count' is missing"),
                         CheckpointError);
    trial::callbacks::EarlyStopping stopping;
    auto state = stopping.get_state();
    state["best_weights"] = {{{"shape", {2, 2}}, {"values", {1.0, 2.0}}}};
    CHECK_THROWS_WITH_AS(stopping.load_state(state),
                         "determined.keras.callbacks.EarlyStopping state: best_weights: expected 4 "
                         "values for its shape but found 2",
                         CheckpointError);
  }

  TEST_CASE("A checkpoint's validation logs read back in order, and malformed ones are refused") {
    Logs logs;
    logs.set("val_loss", 0.5);
    logs.set("val_accuracy", 0.75);
    const auto json = trial::detail::logs_json(logs);
    CHECK(json == nlohmann::json::parse(R"([["val_loss", 0.5], ["val_accuracy", 0.75]])"));
    const Logs back = trial::detail::logs_from_json(json, "checkpoint 'x': validation_logs");
    CHECK(trial::detail::logs_json(back) == json);
    CHECK_THROWS_WITH_AS(
        trial::detail::logs_from_json(nlohmann::json::parse(R"([["val_loss"]])"),
                                      "checkpoint 'x': validation_logs"),
        "checkpoint 'x': validation_logs: expected a list of [name, value] pairs but found "
        "[[\"val_loss\"]]",
        CheckpointError);
  }

  TEST_CASE("InvalidHP ends a trial as invalid without using a restart") {
    for (const std::string where : {"build_model", "loader", "callback"}) {
      CAPTURE(where);
      test_support::TempDir dir;
      auto c = config("tests:InvalidTrial");
      c.max_restarts = 3;
      const auto s = callbacks_spec(dir.path(), c, with(hparams(), "invalid_at", where));
      CHECK_THROWS_AS(trial::run_trial(s, {.verbose = false}), trial::InvalidHP);
      const auto r = record(s);
      CHECK(r["state"] == "INVALID");
      CHECK(r["restarts"] == 0);
      CHECK(r["error"] == (where == "build_model" ? "hidden units exceed the budget"
                           : where == "loader"    ? "batch larger than the data"
                                                  : "the loss diverges for this learning rate"));
    }
  }

  TEST_CASE("An invalid trial is replaced by random and adaptive_asha, and described as invalid") {
    register_here();
    for (const std::string searcher : {"random", "adaptive_asha"}) {
      CAPTURE(searcher);
      test_support::TempDir dir;
      std::ofstream(dir / "exp.yaml") << "entrypoint: tests:InvalidTrial\n"
                                         "hyperparameters:\n"
                                         "  global_batch_size: 16\n"
                                         "  learning_rate: 0.02\n"
                                         "  invalid_at: build_model\n"
                                         "  only_trial: 1\n"
                                         "records_per_epoch: 240\n"
                                         "scheduling_unit: 3\n"
                                         "max_restarts: 2\n"
                                         "searcher:\n"
                                         "  name: "
                                      << searcher
                                      << "\n"
                                         "  metric: val_loss\n"
                                         "  max_trials: 2\n"
                                         "  max_concurrent_trials: 1\n"
                                         "  max_length:\n"
                                         "    batches: 6\n"
                                         "reproducibility:\n"
                                         "  experiment_seed: 7\n";
      std::ostringstream out;
      trial::ExperimentOptions options;
      options.verbose = false;
      options.plot = false;
      options.out = &out;
      const auto summary = trial::create_experiment(dir / "exp.yaml", dir / "exp", options);
      CAPTURE(out.str());
      CHECK(summary.state == "COMPLETED");
      CHECK(summary.trials == 3);  // trial 1 invalid, its replacement and trial 2
      CHECK(summary.invalid == 1);
      CHECK(summary.completed == 2);
      CHECK(summary.errored == 0);
      CHECK(out.str().find("trial 1: invalid hyperparameters: hidden units exceed the budget") !=
            std::string::npos);
      const auto experiment = nlohmann::json::parse(text(dir / "exp" / "experiment.json"));
      REQUIRE(experiment["trials"].size() == 3);
      CHECK(experiment["trials"][0]["state"] == "INVALID");
      CHECK(experiment["trials"][0]["error"] == "hidden units exceed the budget");
      CHECK(experiment["trials"][1]["state"] == "COMPLETED");
      CHECK(experiment["trials"][2]["state"] == "COMPLETED");
      const auto trial1 = nlohmann::json::parse(text(dir / "exp" / "trials" / "1" / "trial.json"));
      CHECK(trial1["restarts"] == 0);
      std::ostringstream described;
      trial::detail::describe_experiment_to(dir / "exp", described);
      CAPTURE(described.str());
      CHECK(described.str().find("INVALID") != std::string::npos);
      CHECK(described.str().find("invalid: hidden units exceed the budget") != std::string::npos);
    }
  }

  TEST_CASE("A failure that recurs at the same batch after a restart is not retried again") {
    test_support::TempDir dir;
    auto c = config("tests:DeterministicFailureTrial");
    c.max_restarts = 5;
    const auto s = callbacks_spec(dir.path(), c, hparams());
    CHECK_THROWS_WITH_AS(trial::run_trial(s, {.verbose = false}),
                         "trial 1: the failure at batch 12 recurred at the same batch after "
                         "restart 1 of 5, so it is deterministic and is not retried again: "
                         "deterministic failure",
                         Error);
    const auto r = record(s);
    CHECK(r["state"] == "ERROR");
    CHECK(r["restarts"] == 1);
    CHECK(r["error"].get<std::string>().find("is not retried again") != std::string::npos);
  }
}
