// An experiment folder read back: experiment.json round trip, describe's text from the trials'
// trial.json and metrics.jsonl, list over a root, and the refusals of folders that are not
// experiments.

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <loadstar/error.hpp>
#include <loadstar/trial/detail/experiment_describe.hpp>
#include <loadstar/trial/detail/experiment_record.hpp>
#include <sstream>
#include <string>
#include <thread>

#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::FormatError;
namespace trial = loadstar::trial;
namespace detail = loadstar::trial::detail;

namespace {

void write(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

detail::ExperimentRecord two_trials() {
  detail::ExperimentRecord record;
  record.id = 42;
  record.seed = 7;
  record.state = "COMPLETED";
  record.config_file = "/somewhere/adaptive.yaml";
  record.raw = {{"searcher", {{"name", "grid"}}}};
  record.config = {{"entrypoint", "model_def:Tiny"}};
  record.name = "widths";
  record.description = "two widths";
  record.searcher_name = "grid";
  record.metric = "val_loss";
  record.smaller_is_better = true;
  record.searcher_state = {{"anything", 1}};
  record.progress = 1.0;
  record.next_trial_id = 3;
  record.checkpoint_dir = "checkpoints";
  detail::TrialRecord first;
  first.id = 1;
  first.request_id = 11;
  first.hparams = {{"hidden_size", 8}};
  first.trial_seed = 123;
  first.state = "COMPLETED";
  first.total_batches = 20;
  first.searcher_metric = 0.5;
  first.best_validation = 0.25;
  detail::TrialRecord second;
  second.id = 2;
  second.request_id = 12;
  second.hparams = {{"hidden_size", 16}};
  second.trial_seed = 456;
  second.state = "ERROR";
  second.error = "the trial process ended with killed by signal 9 (Killed) without reporting";
  second.pending.push_back({trial::Unit::batches, 10});
  record.trials = {first, second};
  return record;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("experiment_record_from_json reads back what to_json writes") {
    test_support::TempDir dir;
    const auto record = two_trials();
    detail::write_experiment_record(dir.path(), record);
    CHECK_FALSE(std::filesystem::exists(dir / "experiment.json.tmp"));
    const auto back = detail::read_experiment_record(dir.path());
    CHECK(detail::to_json(back) == detail::to_json(record));
    REQUIRE(back.trials.size() == 2);
    CHECK(back.trials[1].pending.front() == trial::Length{trial::Unit::batches, 10});
    CHECK(back.trials[0].best_validation == 0.25);
    CHECK_FALSE(back.trials[1].best_validation.has_value());
  }

  TEST_CASE("read_experiment_record refuses folders without an experiment and foreign files") {
    test_support::TempDir dir;
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir / "nowhere"),
                         doctest::Contains("nowhere': expected an experiment.json but found no "
                                           "such folder"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir.path()),
                         doctest::Contains("expected an experiment.json but found none in it"),
                         ConfigError);
    write(dir / "experiment.json", "{\"format\": \"something-else\"}");
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir.path()),
                         doctest::Contains("experiment.json': expected format "
                                           "'loadstar-experiment' but found \"something-else\""),
                         FormatError);
    write(dir / "experiment.json", "{\"format\": \"loadstar-");
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir.path()),
                         doctest::Contains("expected JSON but found text that does not parse"),
                         FormatError);
    auto json = detail::to_json(two_trials());
    json["trials"][1]["pending"] = nlohmann::json::array({{{"minutes", 3}}});
    write(dir / "experiment.json", json.dump());
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir.path()),
                         doctest::Contains("trials[1].pending: expected lengths like "
                                           "{\"batches\": 10} but found {\"minutes\":3}"),
                         FormatError);
    json = detail::to_json(two_trials());
    json["trials"][0].erase("trial_seed");
    write(dir / "experiment.json", json.dump());
    CHECK_THROWS_WITH_AS(detail::read_experiment_record(dir.path()),
                         doctest::Contains("trials[0].trial_seed: expected a value but found none"),
                         FormatError);
  }

  TEST_CASE("describe_experiment_to prints trials with hyperparameters state and checkpoints") {
    test_support::TempDir dir;
    detail::write_experiment_record(dir.path(), two_trials());
    write(dir / "trials/1/trial.json",
          R"({"trial_id": 1, "state": "COMPLETED", "restarts": 1, "total_batches": 20,
              "latest_checkpoint": "uuid-b", "best_checkpoint": "uuid-a",
              "best_validation": 0.125,
              "checkpoints": [{"uuid": "uuid-a", "batches": 10, "validation": 0.125},
                              {"uuid": "uuid-b", "batches": 20, "validation": {"val_loss": 0.5}}]})");
    std::ostringstream out;
    detail::describe_experiment_to(dir.path(), out);
    const std::string text = out.str();
    INFO(text);
    CHECK(text.find("experiment 42 in '" + dir.path().string() + "': COMPLETED") !=
          std::string::npos);
    CHECK(text.find("name:        widths\n  description: two widths") != std::string::npos);
    CHECK(text.find("searcher:    grid, metric val_loss (smaller is better), progress 100%") !=
          std::string::npos);
    CHECK(text.find("1      COMPLETED  20        0.125          1         {\"hidden_size\":8}") !=
          std::string::npos);
    CHECK(text.find("2      ERROR      0         -              0         {\"hidden_size\":16}") !=
          std::string::npos);
    CHECK(text.find("error: the trial process ended with killed by signal 9") != std::string::npos);
    CHECK(text.find("trial 1  uuid-a  batches 10  val_loss 0.125  best") != std::string::npos);
    CHECK(text.find("trial 1  uuid-b  batches 20  val_loss 0.5  latest") != std::string::npos);
  }

  TEST_CASE("describe_experiment_to says how many trials run at once and why") {
    test_support::TempDir dir;
    detail::ExperimentRecord record = two_trials();
    record.config = {
        {"entrypoint", "model_def:Tiny"},
        {"hyperparameters",
         {{"global_batch_size", 16},
          {"width", {{"type", "int"}, {"minval", 1}, {"maxval", 1000}, {"count", 1000}}}}},
        {"searcher", {{"name", "grid"}, {"metric", "val_loss"}, {"max_length", {{"batches", 5}}}}}};
    detail::write_experiment_record(dir.path(), record);
    const std::uint64_t cores = std::max(std::thread::hardware_concurrency(), 1U);
    std::ostringstream out;
    detail::describe_experiment_to(dir.path(), out);
    INFO(out.str());
    CHECK(out.str().find("at once:     " + std::to_string(cores) +
                         (cores == 1 ? " trial" : " trials") +
                         " of 1000 (max_concurrent_trials 0: bounded by " +
                         std::to_string(std::thread::hardware_concurrency()) +
                         " cores / 1 slots per trial)\n") != std::string::npos);
    record.config["searcher"]["max_concurrent_trials"] = 2;
    detail::write_experiment_record(dir.path(), record);
    out.str("");
    detail::describe_experiment_to(dir.path(), out);
    CHECK(out.str().find("at once:     2 trials (searcher.max_concurrent_trials 2)\n") !=
          std::string::npos);
    record.config["resources"] = {{"slots_per_trial", 1}, {"max_slots", 1}};
    detail::write_experiment_record(dir.path(), record);
    out.str("");
    detail::describe_experiment_to(dir.path(), out);
    CHECK(out.str().find("at once:     1 trial (resources.max_slots 1 / 1 slots per trial)\n") !=
          std::string::npos);
  }

  TEST_CASE("list_experiment_folders finds the experiments under a root") {
    test_support::TempDir dir;
    std::filesystem::create_directories(dir / "b");
    detail::write_experiment_record(dir / "b", two_trials());
    auto other = two_trials();
    other.id = 43;
    other.trials.clear();
    std::filesystem::create_directories(dir / "a");
    detail::write_experiment_record(dir / "a", other);
    std::filesystem::create_directories(dir / "not-an-experiment");
    write(dir / "broken/experiment.json", "{}");
    const auto listings = detail::list_experiment_folders(dir.path());
    REQUIRE(listings.size() == 3);
    CHECK(listings[0].dir == dir / "a");
    CHECK(listings[0].id == 43);
    CHECK(listings[0].trials == 0);
    CHECK(listings[1].dir == dir / "b");
    CHECK(listings[1].state == "COMPLETED");
    CHECK(listings[1].trials == 2);
    CHECK(listings[1].name == "widths");
    CHECK(listings[2].dir == dir / "broken");
    CHECK(listings[2].state == "UNREADABLE");
    CHECK_THROWS_WITH_AS(detail::list_experiment_folders(dir / "missing"),
                         doctest::Contains("missing': expected a folder but found nothing"),
                         ConfigError);
  }
}
