// The trial runner with the other loader kinds ((x, y, sample_weights) and a SequenceAdapter),
// a callback's stop_training turned into Determined's stop request, and checkpoint retention.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <loadstar/trial/detail/interruption.hpp>
#include <sstream>

#include "temp_dir.hpp"

namespace {

using namespace runner_support;

class OtherLoadersTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  trial::DataLoader build_training_data_loader() override {
    const std::string loader = context.get_hparams().value("loader", "weighted");
    const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
    const Blobs& d = data();
    if (loader == "weighted") {
      Tensor<float> w({d.x.rows()});
      for (std::size_t i = 0; i < w.size(); ++i)
        w(i) = 0.5F + static_cast<float>(i % 3);
      return {d.x, d.y, w};
    }
    return trial::DataLoader(
        std::make_shared<SequenceAdapter<decltype(ArraySequence(d.x, d.y, batch)), 2>>(
            ArraySequence(d.x, d.y, batch),
            AdapterOptions{.sampler = {.shuffle = true, .seed = context.get_trial_seed()}}));
  }
};

/// A trial that sets configure_fit's shuffle (or validation_freq) as the hyperparameters say.
class ConfiguredFitTrial : public OtherLoadersTrial {
 public:
  explicit ConfiguredFitTrial(trial::TrialContext& context) : OtherLoadersTrial(context) {
    if (context.get_hparams().contains("shuffle")) {
      context.configure_fit({.shuffle = context.get_hparam("shuffle").get<bool>()});
    }
    if (context.get_hparams().contains("validation_freq")) {
      context.configure_fit(
          {.validation_freq = context.get_hparam("validation_freq").get<std::size_t>()});
    }
  }
  trial::DataLoader build_training_data_loader() override {
    if (context.get_hparams().value("loader", "") == "dataset") {
      const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
      return trial::DataLoader(from_sequence(ArraySequence(data().x, data().y, batch)));
    }
    return OtherLoadersTrial::build_training_data_loader();
  }
};

/// Sets stop_training at the end of the workload that reaches 7 batches.
class StopAtSeven : public trial::Callback {
 public:
  void on_train_workload_end(std::uint64_t total, const Logs&) override {
    if (total >= 7) model().stop_training = true;
  }
  std::string class_name() const override { return "StopAtSeven"; }
};

class StoppingTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    return {std::make_shared<StopAtSeven>()};
  }
};

/// Asks this process to pause (as SIGTERM does) once, when the batch the hyperparameter
/// `pause_after` names has been trained, and records how many batches it saw.
class PauseAfter : public trial::Callback {
 public:
  explicit PauseAfter(std::uint64_t after) : after_(after) {}
  void on_train_batch_end(std::size_t, const Logs&) override {
    ++seen();
    if (seen() == after_ && !asked()) {
      asked() = true;
      trial::detail::interruption_flag = trial::detail::interruption_pause;
    }
  }
  std::string class_name() const override { return "PauseAfter"; }
  static std::uint64_t& seen() {
    static std::uint64_t count = 0;
    return count;
  }
  static bool& asked() {
    static bool once = false;
    return once;
  }

 private:
  std::uint64_t after_;
};

class PausingTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    auto list = BlobsTrial::keras_callbacks();
    list.push_back(
        std::make_shared<PauseAfter>(context.get_hparam("pause_after").get<std::uint64_t>()));
    return list;
  }
};

/// Trains with the hyperparameter learning rate (a huge one makes the loss non-finite), with
/// Keras's TerminateOnNaN when the hyperparameter `terminate_on_nan` is true.
class NanTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    if (!context.get_hparams().value("terminate_on_nan", false)) return {};
    return {std::make_shared<callbacks::TerminateOnNaN>()};
  }
};

trial::TrialSpec loaders_spec(const std::filesystem::path& dir, trial::ExperimentConfig c,
                              nlohmann::json hp) {
  register_trials();
  trial::register_trial<OtherLoadersTrial>("tests:OtherLoadersTrial");
  trial::register_trial<StoppingTrial>("tests:StoppingTrial");
  trial::register_trial<NanTrial>("tests:NanTrial");
  trial::register_trial<ConfiguredFitTrial>("tests:ConfiguredFitTrial");
  trial::register_trial<PausingTrial>("tests:PausingTrial");
  return trial_spec(dir, std::move(c), std::move(hp));
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("run_trial resumes sample-weighted arrays and a SequenceAdapter exactly") {
    for (const std::string loader : {"weighted", "adapter"}) {
      CAPTURE(loader);
      test_support::TempDir one;
      test_support::TempDir two;
      const auto c = config("tests:OtherLoadersTrial");
      const auto a = loaders_spec(one.path(), c, hparams(loader));
      trial::run_trial(a, {.verbose = false});
      const auto b = loaders_spec(two.path(), c, hparams(loader));
      trial::run_trial(b, {.until = trial::Length{trial::Unit::batches, 20}, .verbose = false});
      trial::run_trial(b, {.verbose = false});
      CHECK(final_weights(a) == final_weights(b));
      CHECK(text(a.trial_dir / "metrics.jsonl") == text(b.trial_dir / "metrics.jsonl"));
    }
  }

  TEST_CASE("configure_fit refuses a shuffle it cannot apply and a validation_freq other than 1") {
    auto c = config("tests:ConfiguredFitTrial");
    c.max_restarts = 0;
    const auto refusal = [&](nlohmann::json hp) {
      test_support::TempDir dir;
      try {
        trial::run_trial(loaders_spec(dir.path(), c, std::move(hp)), {.verbose = false});
      } catch (const ConfigError& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    auto hp = hparams("dataset");
    hp["shuffle"] = false;
    CHECK(refusal(hp) ==
          "trial 1 ('tests:ConfiguredFitTrial'): configure_fit: shuffle applies to arrays and "
          "Sequence loaders, but the training loader is a Dataset (shuffle it in the Dataset "
          "itself)");
    hp = hparams("adapter");
    hp["shuffle"] = true;
    CHECK(refusal(hp) ==
          "trial 1 ('tests:ConfiguredFitTrial'): configure_fit: shuffle applies to arrays and "
          "Sequence loaders, but the training loader is a SequenceAdapter (set shuffling in the "
          "SequenceAdapter's options)");
    hp = hparams("weighted");
    hp["validation_freq"] = 2;
    CHECK(refusal(hp) ==
          "trial 1: configure_fit: validation_freq must be 1 but is 2: validations in a trial "
          "follow min_validation_period and the searcher (Determined's configure_fit has no "
          "validation_freq)");
  }

  TEST_CASE("configure_fit(shuffle) changes what an array loader trains on") {
    test_support::TempDir one;
    test_support::TempDir two;
    auto c = config("tests:ConfiguredFitTrial");
    c.searcher.max_length = {trial::Unit::batches, 20};
    auto hp = hparams("weighted");
    hp["shuffle"] = true;
    const auto a = loaders_spec(one.path(), c, hp);
    trial::run_trial(a, {.verbose = false});
    hp["shuffle"] = false;
    const auto b = loaders_spec(two.path(), c, hp);
    trial::run_trial(b, {.verbose = false});
    CHECK(final_weights(a) != final_weights(b));
  }

  TEST_CASE(
      "optimizations.aggregation_frequency and average_aggregated_gradients act on one "
      "rank") {
    auto c = config();
    c.searcher.max_length = {trial::Unit::batches, 12};
    std::vector<std::string> weights;
    for (const auto& [frequency, average] :
         std::vector<std::pair<std::uint64_t, bool>>{{1, true}, {2, true}, {2, false}}) {
      test_support::TempDir dir;
      c.aggregation_frequency = frequency;
      c.average_aggregated_gradients = average;
      const auto s = loaders_spec(dir.path(), c, hparams());
      trial::run_trial(s, {.verbose = false});
      weights.push_back(final_weights(s));
    }
    CHECK(weights[0] != weights[1]);
    CHECK(weights[1] != weights[2]);
    CHECK(weights[0] != weights[2]);
  }

  TEST_CASE("run_trial turns stop_training into a stop request that checkpoints and ends") {
    test_support::TempDir dir;
    auto c = config("tests:StoppingTrial");
    c.min_checkpoint_period = {trial::Unit::batches, 0};
    c.min_validation_period = {trial::Unit::batches, 0};
    const auto s = loaders_spec(dir.path(), c, hparams());
    const auto result = trial::run_trial(s, {.verbose = false});
    CHECK(result.stop_requested);
    CHECK(result.total_batches == 9);  // workloads of 3: the one reaching 7 ends at 9
    CHECK_FALSE(result.searcher_metric.has_value());
    const auto r = record(s);
    CHECK(r["state"] == "COMPLETED");
    REQUIRE(r["checkpoints"].size() == 1);
    CHECK(r["checkpoints"][0]["batches"] == 9);
    CHECK(r["latest_checkpoint"] == result.latest_checkpoint);
  }

  TEST_CASE("A pause checkpoints at the batch it finds and resumes bitwise as one run") {
    test_support::TempDir one;
    auto hp = hparams();
    hp["pause_after"] = 1000;  // never
    const auto a = loaders_spec(one.path(), config("tests:PausingTrial"), hp);
    trial::run_trial(a, {.verbose = false});
    // The workloads end at batches 3, 4, 7, 8, 10, 13, 14, 17, 18, 20, ... (every 3, cut at the
    // checkpoints every 4 and the validations every 10): a pause after batch 16 comes inside a
    // workload, one after 17 at its end.
    for (const std::uint64_t after : {16, 17}) {
      CAPTURE(after);
      test_support::TempDir two;
      hp["pause_after"] = after;
      PauseAfter::seen() = 0;
      PauseAfter::asked() = false;
      const auto b = loaders_spec(two.path(), config("tests:PausingTrial"), hp);
      std::ostringstream out;
      const auto paused = trial::run_trial(b, {.verbose = true, .output = &out});
      trial::detail::interruption_flag = trial::detail::interruption_none;
      CHECK(paused.paused);
      CHECK(PauseAfter::seen() == after);
      const auto r = record(b);
      CHECK(r["state"] == "ACTIVE");
      CHECK(r["total_batches"] == after);
      CHECK(r["checkpoints"].back()["batches"] == after);
      CHECK(r["latest_checkpoint"] == paused.latest_checkpoint);
      CHECK_MESSAGE(out.str().find("checkpoint " + paused.latest_checkpoint + " at " +
                                   std::to_string(after) + " batches") != std::string::npos,
                    out.str());
      // Inside a workload, its training line comes when it ends, after the resume.
      CHECK((text(b.trial_dir / "metrics.jsonl").find("\"batches\":17") == std::string::npos) ==
            (after == 16));
      const auto resumed = trial::run_trial(b, {.verbose = false});
      CHECK_FALSE(resumed.paused);
      CHECK(PauseAfter::seen() == 45);  // every batch once: none trained twice
      CHECK(final_weights(a) == final_weights(b));
      CHECK(text(a.trial_dir / "metrics.jsonl") == text(b.trial_dir / "metrics.jsonl"));
    }
  }

  TEST_CASE("A non-finite loss fails the trial as fit does, or stops it under TerminateOnNaN") {
    test_support::TempDir dir;
    auto c = config("tests:NanTrial");
    c.max_restarts = 0;
    auto hp = hparams();
    hp["learning_rate"] = 1e38;
    SUBCASE("without TerminateOnNaN: fit's message") {
      const auto s = loaders_spec(dir.path(), c, hp);
      CHECK_THROWS_WITH_AS(trial::run_trial(s, {.verbose = false}),
                           doctest::Contains("add TerminateOnNaN to stop training instead"), Error);
    }
    SUBCASE("with TerminateOnNaN: a stop request, checkpointed") {
      hp["terminate_on_nan"] = true;
      const auto s = loaders_spec(dir.path(), c, hp);
      const auto result = trial::run_trial(s, {.verbose = false});
      CHECK(result.stop_requested);
      CHECK(result.total_batches < 45);
      CHECK_FALSE(result.latest_checkpoint.empty());
      CHECK(record(s)["state"] == "COMPLETED");
    }
  }

  TEST_CASE("run_trial shows Keras's progress bar per synthesized epoch, or per workload") {
    test_support::TempDir dir;
    auto c = config();
    c.records_per_epoch = 160;  // 10 batches of 16 per epoch: epochs 1..5 of 45 batches
    std::ostringstream out;
    trial::run_trial(loaders_spec(dir.path() / "epochs", c, hparams()), {.output = &out});
    const std::string shown = out.str();
    CAPTURE(shown);
    CHECK(shown.find("Epoch 1/5\n") != std::string::npos);
    CHECK(shown.find("Epoch 5/5\n") != std::string::npos);
    // Not a terminal: the final line of each finished epoch, with the running training metrics.
    CHECK(shown.find("10/10 [==============================] - ") != std::string::npos);
    CHECK(shown.find(" - loss: ") != std::string::npos);
    CHECK(shown.find("trial 1: step ") != std::string::npos);  // validations and checkpoints

    c.records_per_epoch = 0;  // no epochs: one bar per training workload of scheduling_unit 3
    std::ostringstream plain;
    trial::run_trial(loaders_spec(dir.path() / "workloads", c, hparams()), {.output = &plain});
    CHECK(plain.str().find("Epoch") == std::string::npos);
    CHECK(plain.str().find("3/3 [==============================] - ") != std::string::npos);
  }

  TEST_CASE("run_trial keeps save_trial_latest and save_trial_best checkpoints") {
    test_support::TempDir dir;
    auto c = config();
    c.checkpoint_storage.save_trial_latest = 2;
    c.checkpoint_storage.save_trial_best = 0;
    const auto s = loaders_spec(dir.path(), c, hparams());
    trial::run_trial(s, {.verbose = false});
    const auto r = record(s);
    REQUIRE(r["checkpoints"].size() == 2);
    CHECK(r["checkpoints"][0]["batches"] == 44);
    CHECK(r["checkpoints"][1]["batches"] == 45);
    std::size_t folders = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(s.checkpoint_dir))
      ++folders;
    CHECK(folders == 2);
  }
}
