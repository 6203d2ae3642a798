// The Native API: trial::init in a plain program, fit on a model it builds itself, gives the same
// workloads, metrics, checkpoints and weights as the same training written as a trial class, and
// resumes from its checkpoint when run again.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include <fstream>
#include <loadstar/trial/native.hpp>

#include "temp_dir.hpp"

namespace {

using namespace runner_support;

std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string latest_weights(const std::filesystem::path& trial_dir,
                           const std::filesystem::path& checkpoint_dir) {
  const auto record = nlohmann::json::parse(file_text(trial_dir / "trial.json"));
  auto m = load_model(checkpoint_dir / record.at("latest_checkpoint").get<std::string>() /
                      "determined-keras-model.h5");
  return weight_bytes(m->get_weights());
}

/// The program a user writes: init, build, fit.
trial::TrialResult native_main(const std::filesystem::path& dir,
                               std::optional<trial::Length> until) {
  auto c = config();
  trial::Hyperparameter gbs;
  gbs.val = 16;
  trial::Hyperparameter lr;
  lr.val = 0.02;
  c.hyperparameters = {{"global_batch_size", gbs}, {"learning_rate", lr}};
  auto native = trial::init(c, {.trial_seed = 42,
                                .trial_dir = dir / "trial",
                                .checkpoint_dir = dir / "checkpoints",
                                .until = until,
                                .verbose = false});
  auto m = std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input({2}), layers::Dense(16, {.activation = "relu"}),
                                            layers::Dropout(0.25), layers::Dense(2)});
  m->compile({.optimizer = optimizers::Adam(
                  {.learning_rate = native.get_hparam("learning_rate").get<double>()}),
              .loss = losses::SparseCategoricalCrossentropy(true),
              .metrics = {"accuracy"}});
  return native.fit(*m, {data().x, data().y}, {validation_data().x, validation_data().y},
                    {std::make_shared<Recorder>(), std::make_shared<HalveOnPlateau>()});
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("init refuses a searcher other than single") {
    auto c = config();
    c.searcher.name = "random";
    c.searcher.max_trials = 3;
    CHECK_THROWS_WITH_AS(trial::init(c, {.verbose = false}),
                         "trial::init: searcher.name: expected single but found 'random': the "
                         "Native API trains one trial in this process; run a random search with a "
                         "trial class and `experiment create`",
                         ConfigError);
  }

  TEST_CASE("init and fit train as the same trial class does and resume when run again") {
    test_support::TempDir dir;
    register_trials();
    trial::TrialSpec s;
    s.config = config();
    s.hparams = {{"global_batch_size", 16}, {"learning_rate", 0.02}, {"loader", "arrays"}};
    s.trial_seed = 42;
    s.trial_dir = dir / "class" / "trial";
    s.checkpoint_dir = dir / "class" / "checkpoints";
    trial::run_trial(s, {.verbose = false});

    const auto first = native_main(dir / "native", trial::Length{trial::Unit::batches, 20});
    CHECK(first.total_batches == 20);
    const auto second = native_main(dir / "native", std::nullopt);
    CHECK(second.total_batches == 45);
    REQUIRE(second.searcher_metric.has_value());
    CHECK(latest_weights(dir / "native" / "trial", dir / "native" / "checkpoints") ==
          latest_weights(s.trial_dir, s.checkpoint_dir));
    CHECK(file_text(dir / "native" / "trial" / "metrics.jsonl") ==
          file_text(s.trial_dir / "metrics.jsonl"));
  }
}
