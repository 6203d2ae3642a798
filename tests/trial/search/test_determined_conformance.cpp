// The workload sequencer and adaptive_asha against Determined's own Go code (tag 0.15.6), run on
// random configurations by generate_determined_references.py:
// - reference/sequencer_streams.json: the streams of its master sequencer
//   (trial_workload_sequencer.go) for 150 configurations (every unit, policy, period, initial
//   validation, several operations, graceful stops), replayed workload by workload;
// - reference/asha_searches.json: 120 searches of its adaptive_asha searcher (adaptive_asha.go,
//   asha.go, tournament.go) with errored and invalid trials, replayed operation by operation;
// - reference/asha_stop_once_searches.json: 120 searches with searcher.stop_once, its stopping
//   variant (asha_stopping.go), replayed the same way, and again with the searcher saved and
//   restored mid search.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <limits>
#include <loadstar/trial/searcher.hpp>
#include <loadstar/trial/workload_sequencer.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <variant>
#include <vector>

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;

namespace {

json load_cases(const std::string& name) {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  const std::string path = std::string(root) + "/tests/trial/search/reference/" + name;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot open ", path);
  return json::parse(in);
}

Length length(const json& j) {
  return length_from_json(j, "reference length");
}

std::string letter(WorkloadKind kind) {
  switch (kind) {
    case WorkloadKind::run_step:
      return "T";
    case WorkloadKind::compute_validation_metrics:
      return "V";
    case WorkloadKind::checkpoint_model:
      return "C";
    case WorkloadKind::terminate:
      return "X";
  }
  return "?";
}

CheckpointPolicy policy(const std::string& name) {
  if (name == "all") return CheckpointPolicy::all;
  if (name == "none") return CheckpointPolicy::none;
  return CheckpointPolicy::best;
}

/// The experiment that generate_determined_references.py simulates around Determined's searcher
/// (determined/searcher/asha_driver.go), around ours. With `restore_at`, the searcher is saved
/// (as JSON text) after that many events and replaced by a new one restored from it.
struct AshaSimulation {
  const ExperimentConfig& config;
  std::unique_ptr<Searcher> searcher = make_searcher(config, 7);
  std::size_t restore_at = std::numeric_limits<std::size_t>::max();
  std::vector<std::string> transcript = {};
  std::deque<Operation> events = {};
  std::set<std::uint64_t> closed = {};

  void take(const std::vector<Operation>& ops) {
    for (const auto& op : ops) {
      if (const auto* create = std::get_if<Create>(&op)) {
        transcript.push_back("Create " + std::to_string(create->request_id));
      } else if (const auto* validate = std::get_if<ValidateAfter>(&op)) {
        transcript.push_back("ValidateAfter " + std::to_string(validate->request_id) + " " +
                             std::to_string(validate->length.value));
        events.push_back(op);
      } else if (const auto* close = std::get_if<Close>(&op)) {
        transcript.push_back("Close " + std::to_string(close->request_id));
        events.push_back(op);
      } else {
        transcript.push_back(std::get<Shutdown>(op).failure ? "Shutdown failure" : "Shutdown");
      }
    }
  }

  void close(std::uint64_t id) {
    closed.insert(id);
    take(searcher->trial_closed(id));
  }

  void run() {
    take(searcher->initial_operations());
    for (std::size_t event_count = 0; !events.empty(); ++event_count) {
      if (event_count == restore_at) {
        const std::string saved = searcher->state().dump();
        searcher = make_searcher(config, 7);
        searcher->restore(json::parse(saved));
        REQUIRE(searcher->state().dump() == saved);
      }
      const Operation event = events.front();
      events.pop_front();
      if (const auto* validate = std::get_if<ValidateAfter>(&event)) {
        const auto id = static_cast<std::int64_t>(validate->request_id);
        const auto length = static_cast<std::int64_t>(validate->length.value);
        if (closed.contains(validate->request_id)) continue;
        switch ((31 * id + 7 * length) % 23) {
          case 0:
            transcript.push_back("Exit " + std::to_string(id) + " errored");
            take(searcher->trial_exited_early(validate->request_id, ExitedReason::errored));
            close(validate->request_id);
            break;
          case 1:
            transcript.push_back("Exit " + std::to_string(id) + " invalid");
            take(searcher->trial_exited_early(validate->request_id, ExitedReason::invalid_hp));
            close(validate->request_id);
            break;
          default:
            take(searcher->validation_completed(
                validate->request_id,
                static_cast<double>((7919 * id + 104729 * length) % 1000) / 1000, *validate));
        }
      } else {
        const auto id = std::get<Close>(event).request_id;
        if (closed.contains(id)) continue;
        close(id);
      }
      char progress[64];
      std::snprintf(progress, sizeof progress, "Progress %.9f", searcher->progress());
      transcript.emplace_back(progress);
      REQUIRE(transcript.size() < 20000);
    }
  }
};

/// Replays every search of the reference file `name` (each with searcher.stop_once `stop_once`)
/// operation by operation; with `stop_once` also again with the searcher saved and restored mid
/// search. Returns the lines compared.
std::size_t replay_asha_searches(const std::string& name, bool stop_once) {
  const json reference = load_cases(name);
  const json& cases = reference.at("cases");
  REQUIRE(cases.size() == 120);
  std::size_t compared = 0;
  for (std::size_t index = 0; index < cases.size(); ++index) {
    const json& c = cases[index];
    CAPTURE(index);
    REQUIRE(c.value("stop_once", false) == stop_once);
    ExperimentConfig config;
    config.hyperparameters = {{"global_batch_size", Hyperparameter{}}};
    config.hyperparameters[0].value.val = 32;
    config.searcher.name = "adaptive_asha";
    config.searcher.metric = "val_loss";
    config.searcher.max_length = Length{Unit::batches, c.at("max_length").get<std::uint64_t>()};
    config.searcher.max_trials = c.at("max_trials").get<std::uint64_t>();
    config.searcher.mode = c.at("mode").get<std::string>();
    config.searcher.divisor = c.at("divisor").get<double>();
    config.searcher.max_rungs = c.at("max_rungs").get<std::uint64_t>();
    if (c.at("bracket_rungs").is_array()) {
      config.searcher.bracket_rungs = c.at("bracket_rungs").get<std::vector<std::uint64_t>>();
    }
    config.searcher.max_concurrent_trials = c.at("max_concurrent_trials").get<std::uint64_t>();
    config.searcher.smaller_is_better = c.at("smaller_is_better").get<bool>();
    config.searcher.stop_once = stop_once;
    INFO(to_string(Operation{ValidateAfter{0, config.searcher.max_length}}), " trials ",
         config.searcher.max_trials, " ", config.searcher.mode, " divisor ",
         config.searcher.divisor, " max_rungs ", config.searcher.max_rungs, " stop_once ",
         stop_once);

    const AshaPlan plan = adaptive_asha_plan(config.searcher);
    CHECK(json(plan.bracket_rungs) == c.at("brackets"));
    CHECK(json(plan.max_trials) == c.at("bracket_max_trials"));
    CHECK(json(plan.max_concurrent_trials) == c.at("bracket_max_concurrent_trials"));

    AshaSimulation simulation{config};
    simulation.run();
    // Determined's promoting progress panics where its count of pending trials exceeds
    // max_concurrent_trials; those lines are missing there. The stopping variant's never panics.
    const auto& want = c.at("transcript");
    const auto& got = simulation.transcript;
    std::size_t j = 0;
    bool same = true;
    for (std::size_t i = 0; i < want.size() && same; ++i, ++j) {
      const auto expected = want[i].get<std::string>();
      while (!stop_once && j < got.size() && got[j].starts_with("Progress") &&
             !expected.starts_with("Progress")) {
        ++j;
      }
      if (j >= got.size() || got[j] != expected) {
        FAIL_CHECK("line ", i, ": Determined gives '", expected, "' but ours is '",
                   j < got.size() ? got[j] : std::string("(end)"), "'");
        same = false;
      }
      ++compared;
    }
    if (same) {
      while (!stop_once && j < got.size() && got[j].starts_with("Progress"))
        ++j;
      CHECK(j == got.size());
    }
    if (stop_once) {
      // Saved and restored after between a sixth and five sixths of the events.
      const auto events =
          static_cast<std::size_t>(std::count_if(want.begin(), want.end(), [](const json& line) {
            return line.get<std::string>().starts_with("Progress");
          }));
      AshaSimulation resumed{config};
      resumed.restore_at = events * (index % 5 + 1) / 6;
      CAPTURE(resumed.restore_at);
      resumed.run();
      CHECK(resumed.transcript == simulation.transcript);
    }
  }
  return compared;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("WorkloadSequencer gives the streams of Determined's master sequencer") {
    const json reference = load_cases("sequencer_streams.json");
    const json& cases = reference.at("cases");
    REQUIRE(cases.size() == 150);
    std::size_t workloads = 0;
    for (std::size_t index = 0; index < cases.size(); ++index) {
      const json& c = cases[index];
      CAPTURE(index);
      INFO(c.dump().substr(0, 400));
      SequencerOptions options;
      options.global_batch_size = c.at("global_batch_size").get<std::uint64_t>();
      options.records_per_epoch = c.at("records_per_epoch").get<std::uint64_t>();
      options.scheduling_unit = c.at("scheduling_unit").get<std::uint64_t>();
      options.min_validation_period = length(c.at("min_validation_period"));
      options.min_checkpoint_period = length(c.at("min_checkpoint_period"));
      options.checkpoint_policy = policy(c.at("checkpoint_policy").get<std::string>());
      options.perform_initial_validation = c.at("perform_initial_validation").get<bool>();
      options.searcher_unit = length(json{{c.at("searcher_unit").get<std::string>(), 1}}).unit;
      WorkloadSequencer sequencer(options);
      const json& stream = c.at("stream");
      const auto stop_after = c.at("stop_after").get<std::int64_t>();
      std::size_t at = 0;
      bool mismatch = false;
      for (const json& op : c.at("ops")) {
        sequencer.set_operation(length(op));
        for (;;) {
          REQUIRE(at < stream.size());
          const json& expected = stream[at];
          const Workload w = sequencer.next();
          const json got{letter(w.kind), w.step_id, w.num_batches, w.total_batches_processed};
          const json want{expected[0], expected[1], expected[2], expected[3]};
          if (got != want) {
            FAIL_CHECK("workload ", at, ": got ", got.dump(), " but Determined gives ",
                       want.dump());
            mismatch = true;
            break;
          }
          ++workloads;
          if (w.kind == WorkloadKind::terminate) {
            ++at;
            break;
          }
          if (w.kind == WorkloadKind::compute_validation_metrics) {
            sequencer.complete_validation(w, expected[4].get<bool>());
          } else {
            sequencer.complete(w);
          }
          if (static_cast<std::int64_t>(at) == stop_after) sequencer.request_stop();
          ++at;
        }
        if (mismatch) break;
      }
      if (!mismatch) CHECK(at == stream.size());
    }
    CHECK(workloads > 5000);
  }

  TEST_CASE("AdaptiveAshaSearcher makes the searches of Determined's adaptive_asha") {
    CHECK(replay_asha_searches("asha_searches.json", false) > 10000);
  }

  TEST_CASE(
      "AdaptiveAshaSearcher with stop_once makes the searches of Determined's stopping ASHA") {
    CHECK(replay_asha_searches("asha_stop_once_searches.json", true) > 10000);
  }
}
