// A trial under a mixed-precision dtype policy set from a hyperparameter: it trains with loss
// scaling, checkpoints the policy and the loss scale, and resumes bitwise.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include "temp_dir.hpp"

namespace {

using namespace runner_support;

trial::TrialSpec mixed_spec(const std::filesystem::path& dir, const std::string& policy) {
  register_trials();
  nlohmann::json hp = hparams();
  hp["dtype_policy"] = policy;
  return trial_spec(dir, config(), std::move(hp));
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("run_trial resumes a mixed_float16 trial bitwise with its loss scale") {
    test_support::TempDir one;
    test_support::TempDir two;
    test_support::TempDir plain;
    const trial::RunOptions quiet{.verbose = false};
    const auto a = mixed_spec(one.path(), "mixed_float16");
    trial::run_trial(a, quiet);

    const auto b = mixed_spec(two.path(), "mixed_float16");
    auto first = quiet;
    first.until = trial::Length{trial::Unit::batches, 20};
    CHECK(trial::run_trial(b, first).total_batches == 20);
    CHECK(trial::run_trial(b, quiet).total_batches == 45);
    CHECK(final_weights(a) == final_weights(b));

    // The checkpoint holds the policy and the wrapped optimizer with its scale.
    const auto uuid = record(a).at("latest_checkpoint").get<std::string>();
    auto model = load_model(a.checkpoint_dir / uuid / "determined-keras-model.h5");
    CHECK(model->layers()[0]->dtype_policy().name() == "mixed_float16");
    auto* scaling = dynamic_cast<optimizers::LossScaleOptimizer*>(&model->optimizer());
    REQUIRE(scaling != nullptr);
    CHECK(scaling->inner_optimizer().class_name() == "Adam");
    CHECK(scaling->step_counter() > 0);

    // The policy changes the training: a float32 run ends elsewhere, and the global policy of
    // the process was left alone.
    CHECK(keras::mixed_precision::global_policy().name() == "float32");
    const auto c = mixed_spec(plain.path(), "float32");
    trial::run_trial(c, quiet);
    CHECK(final_weights(a) != final_weights(c));
  }

  TEST_CASE("run_trial refuses an unknown dtype policy hyperparameter") {
    test_support::TempDir dir;
    const auto s = mixed_spec(dir.path(), "mixed_float64");
    // A failure while the trial is built is retried once, as any failure at batch 0.
    CHECK_THROWS_WITH_AS(trial::run_trial(s, {.verbose = false}),
                         doctest::Contains("so it is deterministic and is not retried again: "
                                           "dtype policy: expected 'float32', 'mixed_float16', "
                                           "'mixed_bfloat16', 'float16' or 'bfloat16' but found "
                                           "'mixed_float64'"),
                         Error);
  }
}
