// Exact resume under SIGKILL: the runner's helper process is killed at random moments (in a
// batch, a validation or a checkpoint write) and run again until it finishes; its final weights
// and metrics.jsonl must equal an uninterrupted run's bitwise, for arrays, a Sequence read on the
// training thread, by threads and by processes, and a Dataset.
#include "trial/runner/kill_harness.hpp"

#include <doctest/doctest.h>

#include "temp_dir.hpp"

TEST_SUITE("trial") {
  TEST_CASE("run_trial resumes bitwise after SIGKILLs at random moments" * doctest::timeout(500)) {
    using namespace kill_harness;
    REQUIRE_MESSAGE(!child_path().empty(), "LOADSTAR_TRIAL_RUNNER_CHILD is not set");
    loadstar::SplitMix64 rng(20261123);
    for (const std::string loader : {"arrays", "sequence", "threads", "processes", "dataset"}) {
      CAPTURE(loader);
      test_support::TempDir dir;
      const ChildResult clean = run_child(dir / "clean", loader, 0, {});
      REQUIRE(clean.exited_ok);
      CHECK(clean.batches == 45);
      // A run killed late may finish before a second kill (where a kill lands depends on the
      // machine's load): such a sequence is run again in a new folder, up to three times.
      KillRun run;
      std::filesystem::path killed;
      for (int attempt = 0; attempt < 3 && run.kills < 2; ++attempt) {
        killed = dir / ("killed" + std::to_string(attempt));
        run = kill_until_done(killed, loader, rng, 4);
        REQUIRE(run.finished);
      }
      CHECK(run.kills >= 2);
      CHECK(final_weights(dir / "clean") == final_weights(killed));
      CHECK(file_bytes(dir / "clean" / "trial" / "metrics.jsonl") ==
            file_bytes(killed / "trial" / "metrics.jsonl"));
      // Checkpoints a killed run wrote but did not record are gone: the folder holds the
      // record's checkpoints only.
      const auto record = nlohmann::json::parse(file_bytes(killed / "trial" / "trial.json"));
      std::size_t folders = 0;
      for ([[maybe_unused]] const auto& entry :
           std::filesystem::directory_iterator(killed / "checkpoints"))
        ++folders;
      CHECK(folders == record["checkpoints"].size());
    }
  }
}
