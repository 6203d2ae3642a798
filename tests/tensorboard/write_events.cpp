// Writes the TensorBoard event files that check_events.py reads with TensorFlow's own definitions:
//   write_events DIR
// DIR/callback: a fit with keras::callbacks::TensorBoard (histograms every epoch, batch scalars
// every 2 batches, a validation each epoch); DIR/callback/history.json (History) and
// DIR/callback/batches.json (the logs of every batch, by the batch count since fit began).
// DIR/trial: a trial run to its end (trial/metrics.jsonl, trial/tensorboard/).
// DIR/resumed: the same trial stopped at 20 batches and continued (two event files), and a run
// after a process that trained to the end while its record still named the checkpoint at 20
// batches (as a kill leaves it): the resumed file's SessionLog START must drop the later events.
#include "trial/runner/tiny_trial.hpp"

#include <exception>
#include <fstream>
#include <iostream>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <loadstar/keras/callbacks/tensorboard.hpp>

namespace {

using namespace runner_support;

class BatchRecorder : public callbacks::Callback {
 public:
  nlohmann::json batches = nlohmann::json::object();
  void on_train_batch_end(std::size_t, const Logs& logs) override {
    nlohmann::json line = nlohmann::json::object();
    for (const auto& [name, value] : logs)
      line[name] = value;
    batches[std::to_string(++count_)] = line;
  }

 private:
  std::size_t count_ = 0;
};

void write_json(const std::filesystem::path& path, const nlohmann::json& json) {
  keras::detail::write_atomically(path, json.dump(2) + "\n");
}

void callback_run(const std::filesystem::path& dir) {
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({2}), layers::Dense(8, {.activation = "relu", .name = "hidden"}),
      layers::Dense(2, {.name = "logits"})});
  model->compile({.optimizer = optimizers::Adam({.learning_rate = 0.02}),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  auto board = std::make_shared<callbacks::TensorBoard>(
      callbacks::TensorBoardOptions{.log_dir = dir, .histogram_freq = 1, .update_freq = 2});
  auto recorder = std::make_shared<BatchRecorder>();
  const Blobs& d = data();
  const Blobs& v = validation_data();
  const auto history = model->fit(d.x, d.y,
                                  {.epochs = 3,
                                   .batch_size = 32,
                                   .verbose = 0,
                                   .callbacks = {board, recorder},
                                   .validation_data = {v.x, v.y},
                                   .shuffle = false});
  write_json(dir / "history.json", {{"history", history.history}, {"epoch", history.epoch}});
  write_json(dir / "batches.json", recorder->batches);
}

trial::ExperimentConfig keep_all() {
  auto c = config();
  c.checkpoint_storage.save_trial_latest = 100;
  return c;
}

void trial_runs(const std::filesystem::path& dir) {
  register_trials();
  const trial::RunOptions quiet{.verbose = false};
  trial::run_trial(trial_spec(dir / "full", config(), hparams()), quiet);

  // Stopped at 20 batches, then continued to the end.
  const auto continued = trial_spec(dir / "continued", config(), hparams());
  auto first = quiet;
  first.until = trial::Length{trial::Unit::batches, 20};
  trial::run_trial(continued, first);
  trial::run_trial(continued, quiet);

  // Trained to the end while the record still names the checkpoint at 20 batches.
  const auto killed = trial_spec(dir / "killed", keep_all(), hparams());
  trial::run_trial(killed, first);
  const auto record_at_20 = text(killed.trial_dir / "trial.json");
  trial::run_trial(killed, quiet);
  keras::detail::write_atomically(killed.trial_dir / "trial.json", record_at_20);
  trial::run_trial(killed, quiet);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: write_events DIR\n";
    return 2;
  }
  try {
    const std::filesystem::path dir = argv[1];
    callback_run(dir / "callback");
    trial_runs(dir / "trials");
  } catch (const std::exception& e) {
    std::cerr << "write_events: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
