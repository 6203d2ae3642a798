#include <doctest/doctest.h>

#include <cstdint>
#include <exception>
#include <loadstar/random.hpp>
#include <loadstar/trial/experiment_config.hpp>
#include <nlohmann/json.hpp>
#include <string>

using namespace loadstar;
using namespace loadstar::trial;

namespace {

const char* const full_config = R"(description: fashion mnist
labels: [mlp]
entrypoint: model_def:FashionMNISTTrial
hyperparameters:
  global_batch_size: {type: categorical, vals: [16, 32]}
  learning_rate: {type: log, minval: -4, maxval: -1, base: 10, count: 3}
  hidden_size: {type: int, minval: 32, maxval: 256, count: 4}
  dropout: {type: double, minval: 0.0, maxval: 0.5}
  layers: [64, 32]
  optimizer:
    name: adam
    beta_1: {type: const, val: 0.9}
searcher:
  name: adaptive_asha
  metric: val_accuracy
  smaller_is_better: false
  max_length: {epochs: 5}
  max_trials: 16
  mode: standard
  divisor: 4
  max_rungs: 5
records_per_epoch: 60000
scheduling_unit: 50
min_validation_period: {records: 6000}
min_checkpoint_period: {batches: 1000}
checkpoint_policy: best
checkpoint_storage: {save_trial_best: 1, save_trial_latest: 1}
reproducibility: {experiment_seed: 42}
max_restarts: 2
resources: {slots_per_trial: 1}
optimizations: {aggregation_frequency: 1}
data: {path: /data}
)";

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("parse_experiment_config answers mutated files with a config or a ConfigError") {
    // Every mutation either parses, and then round trips through JSON, or is refused with a
    // ConfigError: never another exception.
    const std::string base = full_config;
    REQUIRE_NOTHROW(parse_experiment_config(base, "m.yaml"));
    const std::string alphabet = " :-{}[],#'\"\n0123456789abcdeystx_.";
    SplitMix64 rng(2024);
    int parsed = 0;
    int refused = 0;
    for (int round = 0; round < 3000; ++round) {
      std::string text = base;
      const int edits = 1 + static_cast<int>(rng.below(3));
      for (int e = 0; e < edits && !text.empty(); ++e) {
        const auto at = static_cast<std::size_t>(rng.below(text.size()));
        switch (rng.below(4)) {
          case 0:
            text.erase(at, 1);
            break;
          case 1:
            text.insert(at, 1, alphabet[static_cast<std::size_t>(rng.below(alphabet.size()))]);
            break;
          case 2:
            text[at] = alphabet[static_cast<std::size_t>(rng.below(alphabet.size()))];
            break;
          default: {
            // Duplicate the line holding `at`.
            const auto begin =
                text.rfind('\n', at) == std::string::npos ? 0 : text.rfind('\n', at) + 1;
            const auto end = text.find('\n', at);
            if (end != std::string::npos) text.insert(begin, text.substr(begin, end - begin + 1));
            break;
          }
        }
      }
      try {
        const ExperimentConfig config = parse_experiment_config(text, "m.yaml");
        ++parsed;
        const ExperimentConfig back = experiment_config_from_json(to_json(config), "m.json");
        if (!(back == config)) {
          FAIL_CHECK("no round trip for\n" << text);
        }
      } catch (const ConfigError& error) {
        ++refused;
        const std::string message = error.what();
        if (message.rfind("experiment config 'm.yaml': ", 0) != 0) {
          FAIL_CHECK("a message without the config's name: " << message);
        }
      } catch (const std::exception& error) {
        FAIL_CHECK("not a ConfigError: " << error.what() << " for\n" << text);
      }
    }
    // Both outcomes happen often enough for the test to mean something.
    CHECK(parsed > 100);
    CHECK(refused > 300);
    MESSAGE(parsed << " mutations parsed, " << refused << " refused");
  }
}
