// Determined's data layer in a trial: context.experimental's cache_train_dataset and
// cache_validation_dataset, keyed by id and version under the config's data_layer, built once,
// shuffled with the trial seed, sharded by rank, refused twice or beside wrap_dataset, and resumed
// exactly by the runner.
#include "trial/runner/tiny_trial.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <loadstar/data/dataset/range.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "temp_dir.hpp"
#include "test_helpers.hpp"

namespace {

using namespace runner_support;

trial::ExperimentConfig cached_config(const std::filesystem::path& caches) {
  auto c = config();
  c.data_layer.host_storage_path = caches.string();
  return c;
}

using test_support::drain;

/// Sets an environment variable for one scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_, old_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("context.experimental caches by id and version under data_layer, once") {
    test_support::TempDir dir;
    const auto c = cached_config(dir.path() / "caches");
    int builds = 0;
    auto make = [&] {
      ++builds;
      return loadstar::range(20);
    };
    trial::TrialContext first(c, hparams(), 1, 5);
    auto records = first.experimental.cache_train_dataset("ints", "v1", true)(make);
    CHECK(builds == 1);
    CHECK(std::filesystem::exists(dir / "caches/ints/v1_train.ldscache"));
    const auto epoch = drain(records);
    CHECK(epoch.size() == 20);
    CHECK(std::set<std::int64_t>(epoch.begin(), epoch.end()).size() == 20);
    // Shuffled with the trial seed: another trial of the same seed reads the same order from the
    // same cache without building it; one of another seed reads another order.
    trial::TrialContext same_seed(c, hparams(), 2, 5);
    auto again = same_seed.experimental.cache_train_dataset("ints", "v1", true)(make);
    CHECK(drain(again) == epoch);
    trial::TrialContext other_seed(c, hparams(), 3, 6);
    auto other = other_seed.experimental.cache_train_dataset("ints", "v1", true)(make);
    CHECK(drain(other) != epoch);
    CHECK(builds == 1);
    // A new version is a new cache: built again.
    trial::TrialContext next(c, hparams(), 4, 5);
    auto v2 = next.experimental.cache_train_dataset("ints", "v2")(make);
    CHECK(builds == 2);
    CHECK(drain(v2).front() == 0);  // not shuffled
    // Validation has its own cache, read in one order every time.
    auto validation = next.experimental.cache_validation_dataset("ints", "v2")(make);
    CHECK(builds == 3);
    CHECK(std::filesystem::exists(dir / "caches/ints/v2_val.ldscache"));
    const auto pass = drain(validation);
    validation.reset();
    CHECK(drain(validation) == pass);
    CHECK(next.experimental.cached_datasets() == 2);
  }

  TEST_CASE("context.experimental gives two ranks disjoint shards of one shuffled cache") {
    test_support::TempDir dir;
    const auto c = cached_config(dir.path());
    int builds = 0;
    auto make = [&] {
      ++builds;
      return loadstar::range(21);
    };
    std::set<std::int64_t> seen;
    std::set<std::int64_t> validated;
    for (int rank = 0; rank < 2; ++rank) {
      trial::TrialContext context(c, hparams(), 1, 5, 1,
                                  std::make_shared<dist::UnconnectedCollective>(rank, 2));
      auto shard = context.experimental.cache_train_dataset("ints", "v1", true)(make);
      const auto rows = drain(shard);
      // Training drops the remainder: 10 records each of the 20 kept.
      CHECK(rows.size() == 10);
      for (const auto row : rows)
        CHECK(seen.insert(row).second);
      auto validation = context.experimental.cache_validation_dataset("ints", "v1")(make);
      for (const auto row : drain(validation))
        CHECK(validated.insert(row).second);
    }
    CHECK(seen.size() == 20);
    CHECK(validated.size() == 21);  // validation reads every record once across the ranks
    CHECK(builds == 2);
  }

  TEST_CASE("context.experimental refuses a second use and wrap_dataset beside the cache") {
    test_support::TempDir dir;
    const auto c = cached_config(dir.path());
    trial::TrialContext context(c, hparams(), 7, 5);
    (void)context.experimental.cache_train_dataset("ints", "v1");
    CHECK_THROWS_WITH_AS(
        (void)context.experimental.cache_train_dataset("ints", "v2"),
        "trial 7: context.experimental.cache_train_dataset can serve one dataset per trial but "
        "was called twice",
        ConfigError);
    CHECK_THROWS_WITH_AS((void)context.wrap_dataset(loadstar::range(3)),
                         "trial 7: wrap_dataset cannot be combined with context.experimental's "
                         "cache_train_dataset or cache_validation_dataset (the cache shards the "
                         "records by rank already)",
                         ConfigError);
    trial::TrialContext wrapped(c, hparams(), 8, 5);
    (void)wrapped.wrap_dataset(loadstar::range(3));
    CHECK_THROWS_WITH_AS((void)wrapped.experimental.cache_validation_dataset("ints", "v1"),
                         "trial 8: context.experimental.cache_validation_dataset cannot be "
                         "combined with wrap_dataset (the cache shards the records by rank "
                         "already), but wrap_dataset was called",
                         ConfigError);
    CHECK_THROWS_WITH_AS((void)context.experimental.cache_validation_dataset("a/b", "v1"),
                         "data layer: dataset_id must be a non-empty name without '/' but is "
                         "'a/b'",
                         ConfigError);
  }

  TEST_CASE("The data layer's default directory is under the user's cache directory") {
    const trial::DataLayerConfig unset;
    {
      ScopedEnv xdg("XDG_CACHE_HOME", "/var/cache/someone");
      CHECK(trial::data_layer_directory(unset) == "/var/cache/someone/loadstar/data_layer");
      CHECK(trial::data_layer_directory({.host_storage_path = "/data/caches"}) == "/data/caches");
    }
    {
      ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
      ScopedEnv home("HOME", "/home/someone");
      CHECK(trial::data_layer_directory(unset) == "/home/someone/.cache/loadstar/data_layer");
    }
    {
      ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
      ScopedEnv home("HOME", nullptr);
      CHECK_THROWS_WITH_AS(trial::data_layer_directory(unset),
                           "data_layer: expected host_storage_path, or HOME or XDG_CACHE_HOME "
                           "set to an absolute path for the default cache directory, but none is",
                           ConfigError);
    }
  }

  TEST_CASE("run_trial on the data layer's cache resumes bitwise as one run") {
    test_support::TempDir caches;
    test_support::TempDir one;
    test_support::TempDir two;
    register_trials();
    const auto c = cached_config(caches.path());
    const auto a = trial_spec(one.path(), c, hparams("cached"));
    trial::run_trial(a, {.verbose = false});
    const auto b = trial_spec(two.path(), c, hparams("cached"));
    trial::run_trial(b, {.until = trial::Length{trial::Unit::batches, 20}, .verbose = false});
    trial::run_trial(b, {.verbose = false});
    CHECK(final_weights(a) == final_weights(b));
    CHECK(text(a.trial_dir / "metrics.jsonl") == text(b.trial_dir / "metrics.jsonl"));
    // The checkpoint holds the cache's position: its epoch and the record within it.
    const auto uuid = record(b).at("latest_checkpoint").get<std::string>();
    CHECK(text(b.checkpoint_dir / uuid / std::string(trial::checkpoint_state_file))
              .find("cached_records") != std::string::npos);
  }
}
