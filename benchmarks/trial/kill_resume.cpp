// The long version of the runner's kill test: the trial helper process (tests/trial/runner) is
// killed with SIGKILL at random moments, `kills` times per loader kind (argv[1], default 40), and
// run again until it finishes; the final weights and metrics.jsonl are compared bitwise with an
// uninterrupted run's. Prints, per loader kind, the kills survived and whether the result is
// equal; exits non-zero when one is not.
#include "trial/runner/kill_harness.hpp"

#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  using namespace kill_harness;
  const std::size_t kills = argc > 1 ? std::stoul(argv[1]) : 40;
  if (child_path().empty()) {
    std::cerr << "kill_resume: LOADSTAR_TRIAL_RUNNER_CHILD is not set\n";
    return 2;
  }
  const auto root = std::filesystem::temp_directory_path() /
                    ("loadstar-kill-resume-" + std::to_string(::getpid()));
  loadstar::SplitMix64 rng(20261123);
  bool all_equal = true;
  std::size_t survived = 0;
  for (const std::string loader : {"arrays", "sequence", "threads", "processes", "dataset"}) {
    const auto dir = root / loader;
    std::filesystem::remove_all(dir);
    const ChildResult clean = run_child(dir / "clean", loader, 0, {});
    if (!clean.exited_ok) {
      std::cerr << "kill_resume: the uninterrupted run failed for " << loader << "\n";
      return 1;
    }
    // Kills land after 1 to 8 batches: several per run of 45 batches, every part of the run.
    const KillRun run = kill_until_done(dir / "killed", loader, rng, kills, 8);
    const bool equal = run.finished &&
                       final_weights(dir / "clean") == final_weights(dir / "killed") &&
                       file_bytes(dir / "clean" / "trial" / "metrics.jsonl") ==
                           file_bytes(dir / "killed" / "trial" / "metrics.jsonl");
    std::cout << loader << ": survived " << run.kills << " kills in " << run.runs
              << " runs, final weights and metrics " << (equal ? "bitwise equal" : "DIFFERENT")
              << "\n";
    all_equal = all_equal && equal;
    survived += run.kills;
  }
  std::filesystem::remove_all(root);
  std::cout << "total: survived " << survived << " kills, "
            << (all_equal ? "all equal" : "NOT all equal") << "\n";
  return all_equal ? 0 : 1;
}
