// The helper process of the runner's kill test: runs the blobs trial (training data of the kind
// `argv[3]`: arrays, sequence, threads, processes or dataset) in `argv[1]` (trial folder) and
// `argv[2]` (checkpoints), resuming from what a killed run left. It reports every batch it
// trains on standard output (`batch <n>`, unbuffered), so that the test can kill it at chosen
// points, and `done <total batches>` at the end.
#include "trial/runner/tiny_trial.hpp"

#include <unistd.h>

#include <iostream>

namespace {

using namespace runner_support;

void say(const std::string& line) {
  const std::string text = line + "\n";
  static_cast<void>(::write(STDOUT_FILENO, text.data(), text.size()));
}

class Reporter : public trial::Callback {
 public:
  void on_train_batch_end(std::size_t, const Logs&) override { say("batch"); }
  std::string class_name() const override { return "Reporter"; }
};

class ReportingTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    auto list = BlobsTrial::keras_callbacks();
    list.push_back(std::make_shared<Reporter>());
    return list;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: trial_runner_child <trial_dir> <checkpoint_dir> <loader>\n";
    return 2;
  }
  try {
    trial::register_trial<ReportingTrial>("tests:ReportingTrial");
    trial::TrialSpec spec;
    spec.config = config("tests:ReportingTrial");
    spec.config.max_restarts = 0;
    spec.hparams = hparams(argv[3]);
    spec.trial_seed = 42;
    spec.trial_dir = argv[1];
    spec.checkpoint_dir = argv[2];
    const auto result = trial::run_trial(spec, {.verbose = false});
    say("done " + std::to_string(result.total_batches));
  } catch (const std::exception& e) {
    std::cerr << "trial_runner_child: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
