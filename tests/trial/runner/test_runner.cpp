// The trial runner: Determined's workload stream on a real trial, metrics.jsonl and trial.json,
// checkpoints that load with load_model, resume across runs and after a failure (max_restarts)
// with bitwise-equal weights, the callback order, and the errors for bad trials and checkpoints.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <sstream>

#include "temp_dir.hpp"

namespace {

using namespace runner_support;
using loadstar::trial::RunOptions;
using loadstar::trial::TrialSpec;

TrialSpec spec_in(const std::filesystem::path& dir, trial::ExperimentConfig c = config(),
                  nlohmann::json hp = hparams()) {
  register_trials();
  return trial_spec(dir, std::move(c), std::move(hp));
}

std::vector<nlohmann::json> metric_lines(const TrialSpec& s) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(s.trial_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    lines.push_back(nlohmann::json::parse(line));
  return lines;
}

const RunOptions quiet{.verbose = false};

/// The blobs trial on a stateful LSTM with dropout: each point is a sequence of its two
/// coordinates, and each sample's states carry from batch to batch (training and validation
/// alike), so that a resume must restore them, and the dropout masks, exactly.
class StatefulTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::shared_ptr<Model> build_model() override {
    auto m = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
        Input({2}), layers::Reshape({2, 1}),
        layers::LSTM(8, {.stateful = true, .dropout = 0.1, .recurrent_dropout = 0.2}),
        layers::Dense(2)});
    context.wrap_model(*m);
    m->compile({.optimizer = optimizers::Adam(
                    {.learning_rate = context.get_hparam("learning_rate").get<double>()}),
                .loss = losses::SparseCategoricalCrossentropy(true),
                .metrics = {"accuracy"}});
    return m;
  }
};

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("run_trial runs Determined's workload stream and writes metrics and checkpoints") {
    test_support::TempDir dir;
    const auto s = spec_in(dir.path());
    const auto result = trial::run_trial(s, quiet);
    CHECK(result.total_batches == 45);
    REQUIRE(result.searcher_metric.has_value());
    CHECK_FALSE(result.stop_requested);
    CHECK(result.restarts == 0);

    // scheduling_unit 3, validation every 10, checkpoint every 4, 45 batches: training workloads
    // of min(3, until validation, until checkpoint, left), ending checkpoint-then-validate. Every
    // validation improves here, so policy best checkpoints after each (at 10, 20, 30, 40), which
    // restarts the checkpoint period: checkpoints at 4 8 10 14 18 20 24 28 30 34 38 40 44 45.
    std::string stream;
    for (const auto& line : metric_lines(s)) {
      stream += (line["kind"] == "training" ? "T" : "V") + line["batches"].dump() + " ";
      CHECK(line["trial_id"] == 1);
      CHECK(line["records"] == line["batches"].get<int>() * 16);
      CHECK(line["epochs"].get<double>() == doctest::Approx(line["batches"].get<double>() / 15));
    }
    CHECK(stream ==
          "T3 T4 T7 T8 T10 V10 T13 T14 T17 T18 T20 V20 T23 T24 T27 T28 T30 V30 T33 T34 T37 T38 "
          "T40 V40 T43 T44 T45 V45 ");
    const auto lines = metric_lines(s);
    CHECK(lines.front()["metrics"].contains("loss"));
    CHECK(lines.front()["metrics"].contains("accuracy"));
    CHECK(lines.back()["metrics"].contains("val_loss"));
    CHECK(*result.searcher_metric == lines.back()["metrics"]["val_loss"].get<double>());

    const auto r = record(s);
    CHECK(r["state"] == "COMPLETED");
    CHECK(r["total_batches"] == 45);
    CHECK(r["trial_seed"] == 42);
    CHECK(r["hparams"] == hparams());
    CHECK(r["latest_checkpoint"] == result.latest_checkpoint);
    CHECK(r["best_checkpoint"] == result.best_checkpoint);
    // save_trial_latest 1 and save_trial_best 1: at most two checkpoints stay, on disk too.
    CHECK(r["checkpoints"].size() <= 2);
    std::size_t folders = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(s.checkpoint_dir))
      ++folders;
    CHECK(folders == r["checkpoints"].size());
    CHECK(r["checkpoints"].back()["batches"] == 45);
    CHECK(r["checkpoints"].back()["validation"] == lines.back()["metrics"]["val_loss"]);

    const auto folder = s.checkpoint_dir / result.latest_checkpoint;
    const auto metadata =
        nlohmann::json::parse(loadstar::keras::detail::read_bytes(folder / "metadata.json"));
    CHECK(metadata["batches"] == 45);
    CHECK(metadata["records"] == 720);
    CHECK(metadata["epochs"] == 3.0);
    CHECK(metadata["trial_id"] == 1);
    CHECK(metadata["experiment_id"] == 1);
    CHECK(metadata["hparams"] == hparams());
    CHECK(metadata["loadstar_version"] == "0.1.0");
    CHECK(std::filesystem::exists(folder / "state.cbor"));
    // The model file is a Keras model with its optimizer.
    auto loaded = load_model(folder / "determined-keras-model.h5");
    CHECK(loaded->compiled());
    CHECK(loaded->optimizer().iterations() == 45);
  }

  TEST_CASE("run_trial fires Determined's callback hooks in order") {
    test_support::TempDir dir;
    auto c = config();
    c.searcher.max_length = {trial::Unit::batches, 16};
    const auto s = spec_in(dir.path(), c);
    trial::run_trial(s, quiet);
    const auto& e = last_recorder()->events;
    REQUIRE(e.size() > 10);
    CHECK(e.front() == "train_begin");
    CHECK(e.back() == "train_end");
    CHECK(e[1] == "workload_begin 0 3");
    CHECK(e[2] == "epoch_begin 0");
    CHECK(e[3] == "workload_end 3 loss");
    std::vector<std::string> rest(e.begin() + 4, e.end());
    const auto count = [&](const std::string& name) {
      return std::count(e.begin(), e.end(), name);
    };
    // 16 batches, 15 an epoch: epoch 0 ends, epoch 1 begins; validations at 10 and 16.
    CHECK(count("epoch_end 0") == 1);
    CHECK(count("epoch_begin 1") == 1);
    CHECK(count("epoch_end 1") == 0);
    CHECK(count("test_end val_loss") == 2);
    CHECK(count("test_begin") == 2);
    CHECK(count("checkpoint_end") == 5);  // at 4, 8, 12, 16 (period) and none extra at the end
    CHECK(count("checkpoint_end missing") == 0);
  }

  TEST_CASE("run_trial continues a trial run to a shorter length bitwise as one run") {
    test_support::TempDir one;
    test_support::TempDir two;
    const auto a = spec_in(one.path());
    trial::run_trial(a, quiet);

    const auto b = spec_in(two.path());
    auto first = quiet;
    first.until = trial::Length{trial::Unit::batches, 20};
    const auto r1 = trial::run_trial(b, first);
    CHECK(r1.total_batches == 20);
    CHECK(record(b)["state"] == "ACTIVE");
    const auto r2 = trial::run_trial(b, quiet);
    CHECK(r2.total_batches == 45);
    CHECK(record(b)["state"] == "COMPLETED");
    CHECK(final_weights(a) == final_weights(b));
    CHECK(metric_lines(a) == metric_lines(b));
  }

  TEST_CASE("run_trial resumes a stateful recurrent model from its carried states bitwise") {
    trial::register_trial<StatefulTrial>("tests:StatefulTrial");
    test_support::TempDir one;
    test_support::TempDir two;
    const auto a = spec_in(one.path(), config("tests:StatefulTrial"));
    trial::run_trial(a, quiet);
    const auto b = spec_in(two.path(), config("tests:StatefulTrial"));
    auto first = quiet;
    first.until = trial::Length{trial::Unit::batches, 20};
    trial::run_trial(b, first);
    // The checkpoint it resumes from holds each sample's states: (16, 8) for h and for c.
    const auto latest = record(b).at("latest_checkpoint").get<std::string>();
    const auto state = trial::read_checkpoint_state(b.checkpoint_dir / latest);
    REQUIRE(state.contains("carried_states"));
    REQUIRE(state["carried_states"].size() == 1);
    CHECK(state["carried_states"].begin()->size() == 2);
    trial::run_trial(b, quiet);
    CHECK(final_weights(a) == final_weights(b));
    CHECK(metric_lines(a) == metric_lines(b));
  }

  TEST_CASE("A resumed trial removes the staging folder of a checkpoint write killed early") {
    // A write killed after creating its folder and before its metadata existed leaves the
    // staging folder alone; its name says whose it is. Another trial's is left in place.
    test_support::TempDir dir;
    auto s = spec_in(dir.path());
    s.experiment_id = 3;
    s.trial_id = 5;
    auto first = quiet;
    first.until = trial::Length{trial::Unit::batches, 20};
    trial::run_trial(s, first);
    const auto ours = s.checkpoint_dir / trial::checkpoint_staging_name("a-b-c", 3, 5);
    const auto theirs = s.checkpoint_dir / trial::checkpoint_staging_name("a-b-c", 3, 6);
    CHECK(ours.filename().string() == ".a-b-c.e3.t5.new");
    std::filesystem::create_directory(ours);
    std::filesystem::create_directory(theirs);
    trial::run_trial(s, quiet);
    CHECK_FALSE(std::filesystem::exists(ours));
    CHECK(std::filesystem::exists(theirs));
    std::filesystem::remove_all(theirs);
    std::size_t folders = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(s.checkpoint_dir))
      ++folders;
    CHECK(folders == record(s)["checkpoints"].size());
  }

  TEST_CASE("run_trial restarts a failing trial from its checkpoint up to max_restarts") {
    test_support::TempDir one;
    test_support::TempDir two;
    const auto a = spec_in(one.path());
    trial::run_trial(a, quiet);

    SUBCASE("within max_restarts it ends as an uninterrupted run") {
      failures() = 0;
      const auto b = spec_in(two.path(), config("tests:ThrowingTrial"));
      const auto result = trial::run_trial(b, quiet);
      CHECK(result.restarts == 1);
      CHECK(record(b)["restarts"] == 1);
      CHECK(record(b)["state"] == "COMPLETED");
      CHECK(final_weights(a) == final_weights(b));
      CHECK(metric_lines(a) == metric_lines(b));
    }
    SUBCASE("with max_restarts 0 it rethrows and the trial is in state ERROR") {
      failures() = 0;
      auto c = config("tests:ThrowingTrial");
      c.max_restarts = 0;
      const auto b = spec_in(two.path(), c);
      CHECK_THROWS_WITH_AS(trial::run_trial(b, quiet), "injected failure", loadstar::Error);
      CHECK(record(b)["state"] == "ERROR");
      CHECK(record(b)["error"] == "injected failure");
      CHECK(record(b)["total_batches"] == 10);  // checkpoints at 4, 8 and 10 (best)
    }
  }

  TEST_CASE("run_trial gives every loader kind the same exact resume") {
    for (const std::string loader : {"sequence", "threads", "dataset"}) {
      CAPTURE(loader);
      test_support::TempDir one;
      test_support::TempDir two;
      const auto a = spec_in(one.path(), config(), hparams(loader));
      trial::run_trial(a, quiet);
      const auto b = spec_in(two.path(), config(), hparams(loader));
      auto first = quiet;
      first.until = trial::Length{trial::Unit::batches, 20};
      trial::run_trial(b, first);
      trial::run_trial(b, quiet);
      CHECK(final_weights(a) == final_weights(b));
      CHECK(metric_lines(a) == metric_lines(b));
    }
  }

  TEST_CASE("run_trial in test mode trains one batch validates and checkpoints") {
    test_support::TempDir dir;
    const auto s = spec_in(dir.path());
    auto options = quiet;
    options.test = true;
    const auto result = trial::run_trial(s, options);
    CHECK(result.total_batches == 1);
    const auto lines = metric_lines(s);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0]["kind"] == "training");
    CHECK(lines[1]["kind"] == "validation");
    CHECK(std::filesystem::exists(s.checkpoint_dir / result.latest_checkpoint /
                                  "determined-keras-model.h5"));
  }

  TEST_CASE("run_trial refuses unknown entrypoints and bad checkpoints") {
    test_support::TempDir dir;
    SUBCASE("an entrypoint that is not registered") {
      const auto s = spec_in(dir.path(), config("model_def:Missing"));
      CHECK_THROWS_WITH_AS(
          trial::run_trial(s, quiet),
          doctest::Contains("entrypoint 'model_def:Missing': no trial class is registered under "
                            "this name (the registered ones are "),
          loadstar::ConfigError);
      CHECK(record(s)["state"] == "ERROR");
    }
    SUBCASE("a checkpoint that is missing, truncated or of another trial") {
      auto c = config();
      c.max_restarts = 0;
      auto s = spec_in(dir.path(), c);
      auto first = quiet;
      first.until = trial::Length{trial::Unit::batches, 8};
      const auto r = trial::run_trial(s, first);
      const auto folder = s.checkpoint_dir / r.latest_checkpoint;
      const auto saved = loadstar::keras::detail::read_bytes(s.trial_dir / "trial.json");
      const auto restore_record = [&] {
        loadstar::keras::detail::write_atomically(s.trial_dir / "trial.json", saved);
      };

      SUBCASE("truncated metadata") {
        const auto bytes = loadstar::keras::detail::read_bytes(folder / "metadata.json");
        loadstar::keras::detail::write_atomically(folder / "metadata.json",
                                                  bytes.substr(0, bytes.size() / 2));
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("metadata.json': expected JSON metadata but the "
                                               "file is truncated or corrupt"),
                             loadstar::CheckpointError);
      }
      SUBCASE("truncated state") {
        const auto bytes = loadstar::keras::detail::read_bytes(folder / "state.cbor");
        loadstar::keras::detail::write_atomically(folder / "state.cbor",
                                                  bytes.substr(0, bytes.size() - 10));
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("state.cbor': expected the trial's state in CBOR "
                                               "but the file is truncated or corrupt"),
                             loadstar::CheckpointError);
      }
      SUBCASE("state text that is not UTF-8") {
        const auto bytes = loadstar::keras::detail::read_bytes(folder / "state.cbor");
        auto state = nlohmann::json::from_cbor(bytes.begin(), bytes.end());
        state["model"] = "m\xC3\x28";  // a lead byte without its continuation
        const auto cbor = nlohmann::json::to_cbor(state);
        loadstar::keras::detail::write_atomically(
            folder / "state.cbor",
            std::string_view(reinterpret_cast<const char*>(cbor.data()), cbor.size()));
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("state.cbor': expected the trial's state in CBOR "
                                               "but the file is truncated or corrupt (expected "
                                               "UTF-8 text but found the byte 0xC3 at offset 1 "
                                               "of /model"),
                             loadstar::CheckpointError);
      }
      SUBCASE("a model file this process wrote is read in process, any other in a sandbox") {
        const auto model_file = folder / "determined-keras-model.h5";
        CHECK(trial::written_by_this_process(model_file));
        std::filesystem::copy(folder, dir.path() / "copied",
                              std::filesystem::copy_options::recursive);
        CHECK_FALSE(
            trial::written_by_this_process(dir.path() / "copied" / "determined-keras-model.h5"));
        const auto bytes = loadstar::keras::detail::read_bytes(model_file);
        loadstar::keras::detail::write_atomically(model_file, bytes);  // the same bytes, rewritten
        CHECK_FALSE(trial::written_by_this_process(model_file));
        restore_record();
        const auto resumed = trial::run_trial(s, quiet);  // resumes from the rewritten file
        CHECK(trial::written_by_this_process(s.checkpoint_dir / resumed.latest_checkpoint /
                                             "determined-keras-model.h5"));
      }
      SUBCASE("truncated model file") {
        const auto bytes =
            loadstar::keras::detail::read_bytes(folder / "determined-keras-model.h5");
        loadstar::keras::detail::write_atomically(folder / "determined-keras-model.h5",
                                                  bytes.substr(0, bytes.size() / 2));
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("determined-keras-model.h5': "),
                             loadstar::CheckpointError);
      }
      SUBCASE("a missing file") {
        std::filesystem::remove(folder / "state.cbor");
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("state.cbor': the file is missing"),
                             loadstar::CheckpointError);
      }
      SUBCASE("a missing folder") {
        std::filesystem::remove_all(folder);
        CHECK_THROWS_WITH_AS(trial::run_trial(s, quiet),
                             doctest::Contains("': expected a checkpoint folder but it is missing"),
                             loadstar::CheckpointError);
      }
      SUBCASE("a checkpoint of another trial") {
        auto other = s;
        other.trial_id = 2;
        std::filesystem::remove(other.trial_dir / "trial.json");
        // Trial 2's record naming trial 1's checkpoint.
        auto r2 = nlohmann::json::parse(saved);
        r2["trial_id"] = 2;
        loadstar::keras::detail::write_atomically(s.trial_dir / "trial.json", r2.dump());
        CHECK_THROWS_WITH_AS(trial::run_trial(other, quiet),
                             doctest::Contains("metadata.json': expected a checkpoint of "
                                               "experiment 1 trial 2 but found one of experiment "
                                               "1 trial 1"),
                             loadstar::CheckpointError);
      }
      restore_record();
    }
  }

  TEST_CASE("environment.environment_variables are set before the trial is built") {
    test_support::TempDir dir;
    ::unsetenv("LOADSTAR_TRIAL_GREETING");
    auto c = config();
    c.environment_variables = {"LOADSTAR_TRIAL_GREETING=hello=world"};
    c.searcher.max_length = {trial::Unit::batches, 3};
    trial::run_trial(spec_in(dir.path(), c), quiet);
    const char* set = std::getenv("LOADSTAR_TRIAL_GREETING");
    REQUIRE(set != nullptr);
    CHECK(std::string(set) == "hello=world");
    CHECK(BlobsTrial::greeting() == "hello=world");  // what the trial's constructor read
    ::unsetenv("LOADSTAR_TRIAL_GREETING");
  }

  TEST_CASE("TrialContext gives the hyperparameters and refuses missing ones") {
    trial::TrialContext context(config(), hparams(), 3, 9);
    CHECK(context.get_global_batch_size() == 16);
    CHECK(context.get_per_slot_batch_size() == 16);
    CHECK(context.get_trial_id() == 3);
    CHECK(context.get_trial_seed() == 9);
    CHECK(context.get_hparam("learning_rate") == 0.02);
    CHECK(context.distributed.get_size() == 1);
    CHECK_THROWS_WITH_AS(context.get_hparam("lr"),
                         "trial 3: no hyperparameter 'lr' (the hyperparameters are "
                         "global_batch_size, learning_rate, loader)",
                         loadstar::ConfigError);
    CHECK_THROWS_WITH_AS(trial::TrialContext(config(), {{"learning_rate", 0.1}}),
                         "trial 1: hyperparameter 'global_batch_size' must be an integer at "
                         "least 1 but is missing",
                         loadstar::ConfigError);
    context.configure_fit({.workers = 3});
    context.configure_fit({.shuffle = false});
    CHECK(context.fit_settings().workers == 3);
    CHECK_FALSE(context.fit_settings().shuffle);
    CHECK(context.fit_settings().max_queue_size == 10);
    CHECK_FALSE(context.get_stop_requested());
    context.set_stop_requested(true);
    CHECK(context.get_stop_requested());
  }

  TEST_CASE("DataLoader refuses an empty loader") {
    trial::DataLoader empty;
    CHECK(empty.empty());
    CHECK_THROWS_WITH_AS(static_cast<void>(empty.training({})),
                         "training data loader: expected (x, y), (x, y, sample_weights), a "
                         "Sequence, a Dataset or a SequenceAdapter but found an empty data loader",
                         loadstar::ConfigError);
    trial::DataLoader arrays(data().x, data().y);
    CHECK(arrays.kind() == "arrays");
  }

  TEST_CASE("make_trial lists the registered trials for an unknown name") {
    register_trials();
    CHECK(trial::has_trial("tests:BlobsTrial"));
    CHECK_FALSE(trial::has_trial("tests:Nope"));
    const auto names = trial::registered_trials();
    CHECK(std::find(names.begin(), names.end(), "tests:ThrowingTrial") != names.end());
    trial::TrialContext context(config(), hparams());
    CHECK_THROWS_WITH_AS(trial::make_trial("tests:Nope", context),
                         doctest::Contains("(the registered ones are 'tests:BlobsTrial', "),
                         loadstar::ConfigError);
  }
}
