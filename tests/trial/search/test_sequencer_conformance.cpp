// The workload sequencer against Determined's own: reference/sequencer_streams.json holds the
// streams that Determined's master sequencer (trial_workload_sequencer.go@0.15.6, run by
// generate_sequencer_streams.py) gives for 150 random configurations (every unit, policy, period,
// initial validation, several operations, graceful stops); each is replayed workload by workload.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <loadstar/trial/workload_sequencer.hpp>
#include <nlohmann/json.hpp>
#include <string>

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;

namespace {

json load_cases() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  const std::string path =
      std::string(root) + "/tests/trial/search/reference/sequencer_streams.json";
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

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("WorkloadSequencer gives the streams of Determined's master sequencer") {
    const json reference = load_cases();
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
}
