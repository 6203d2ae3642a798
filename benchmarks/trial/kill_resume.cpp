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
    // Kills land after 1 to 8 batches: several per run of 45 batches, every part of the run. A
    // trial survives as many as it takes to finish; rounds of fresh trials go on until `kills`.
    std::size_t loader_kills = 0, runs = 0, rounds = 0;
    bool equal = true;
    while (loader_kills < kills) {
      const auto killed = dir / ("killed-" + std::to_string(rounds++));
      const KillRun run = kill_until_done(killed, loader, rng, kills - loader_kills, 8);
      equal = equal && run.finished && final_weights(dir / "clean") == final_weights(killed) &&
              file_bytes(dir / "clean" / "trial" / "metrics.jsonl") ==
                  file_bytes(killed / "trial" / "metrics.jsonl");
      loader_kills += run.kills;
      runs += run.runs;
      std::filesystem::remove_all(killed);
    }
    std::cout << loader << ": survived " << loader_kills << " kills in " << runs << " runs ("
              << rounds << " trials), final weights and metrics "
              << (equal ? "bitwise equal" : "DIFFERENT") << "\n";
    all_equal = all_equal && equal;
    survived += loader_kills;
  }
  std::filesystem::remove_all(root);
  std::cout << "total: survived " << survived << " kills, "
            << (all_equal ? "all equal" : "NOT all equal") << "\n";
  return all_equal ? 0 : 1;
}
