// The trials the runner's tests run: a small MLP with dropout on the blobs problem, trained with
// Adam, with its training data as arrays, a Sequence (with threads or processes, through
// configure_fit), a Dataset or the data layer's cache of one, chosen by the hyperparameter
// `loader`; and a trial that throws once, for max_restarts.
#pragma once

#include "keras/blobs.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/dataset/from_sequence.hpp>
#include <loadstar/data/dataset/from_tensor_slices.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <loadstar/trial/callback.hpp>
#include <loadstar/trial/keras_trial.hpp>
#include <loadstar/trial/registry.hpp>
#include <loadstar/trial/trial_runner.hpp>
#include <loadstar/trial/trial_spec.hpp>
#include <memory>
#include <string>
#include <vector>

namespace runner_support {

using namespace loadstar;
using namespace loadstar::keras;

/// Counts the hooks a trial callback hears, in order, as short names.
class Recorder : public trial::Callback {
 public:
  std::vector<std::string> events;
  void on_train_begin(const Logs&) override { events.push_back("train_begin"); }
  void on_train_end(const Logs&) override { events.push_back("train_end"); }
  void on_epoch_begin(std::size_t e, const Logs&) override {
    events.push_back("epoch_begin " + std::to_string(e));
  }
  void on_epoch_end(std::size_t e, const Logs&) override {
    events.push_back("epoch_end " + std::to_string(e));
  }
  void on_test_begin(const Logs&) override { events.push_back("test_begin"); }
  void on_test_end(const Logs& logs) override {
    events.push_back(std::string("test_end") + (logs.contains("val_loss") ? " val_loss" : ""));
  }
  void on_train_workload_begin(std::uint64_t total, std::uint64_t requested, const Logs&) override {
    events.push_back("workload_begin " + std::to_string(total) + " " + std::to_string(requested));
  }
  void on_train_workload_end(std::uint64_t total, const Logs& logs) override {
    events.push_back("workload_end " + std::to_string(total) +
                     (logs.contains("loss") ? " loss" : ""));
  }
  void on_checkpoint_end(const std::string& path) override {
    events.push_back(std::filesystem::exists(path) ? "checkpoint_end" : "checkpoint_end missing");
  }
  nlohmann::json get_state() const override { return {{"workloads", workloads_}}; }
  void load_state(const nlohmann::json& state) override { workloads_ = state.at("workloads"); }
  std::string class_name() const override { return "Recorder"; }
  std::uint64_t workloads_ = 0;
};

/// Halves the learning rate after a validation whose val_loss is not 1% better than the best
/// (Determined's ReduceLROnPlateau acts on validations, `on_test_end`); its best is its state, the
/// learning rate is the checkpoint's.
class HalveOnPlateau : public trial::Callback {
 public:
  void on_test_end(const Logs& logs) override {
    const double loss = *logs.get("val_loss");
    if (loss < best_ * 0.99) {
      best_ = loss;
      return;
    }
    auto& optimizer = model().optimizer();
    optimizer.set_learning_rate(optimizer.get_config()["learning_rate"].get<double>() / 2);
  }
  nlohmann::json get_state() const override { return best_; }
  void load_state(const nlohmann::json& state) override { best_ = state.get<double>(); }
  std::string class_name() const override { return "HalveOnPlateau"; }

 private:
  double best_ = 1e30;
};

/// The last Recorder made (a test reads it after run_trial returns).
inline std::shared_ptr<Recorder>& last_recorder() {
  static std::shared_ptr<Recorder> recorder;
  return recorder;
}

inline const Blobs& data() {
  static const Blobs b = blobs(240, 5);
  return b;
}
inline const Blobs& validation_data() {
  static const Blobs b = blobs(64, 17);
  return b;
}

class BlobsTrial : public trial::KerasTrial {
 public:
  explicit BlobsTrial(trial::TrialContext& context) : KerasTrial(context) {
    const char* greeting = std::getenv("LOADSTAR_TRIAL_GREETING");
    BlobsTrial::greeting() = greeting != nullptr ? greeting : "";
    const std::string loader = context.get_hparams().value("loader", "arrays");
    if (loader == "threads") context.configure_fit({.workers = 2});
    if (loader == "processes") context.configure_fit({.workers = 2, .use_multiprocessing = true});
    if (loader == "sequence") context.configure_fit({.workers = 0});
    // Mixed precision as a Keras trial sets it: a dtype policy from a hyperparameter.
    if (context.get_hparams().contains("dtype_policy"))
      context.set_global_policy(context.get_hparam("dtype_policy").get<std::string>());
  }

  /// `LOADSTAR_TRIAL_GREETING` as the last trial built saw it.
  static std::string& greeting() {
    static std::string value;
    return value;
  }

  std::shared_ptr<Model> build_model() override {
    auto m = std::make_shared<Sequential>(
        std::initializer_list<SequentialItem>{Input({2}), layers::Dense(16, {.activation = "relu"}),
                                              layers::Dropout(0.25), layers::Dense(2)});
    context.wrap_model(*m);
    m->compile({.optimizer = optimizers::Adam(
                    {.learning_rate = context.get_hparam("learning_rate").get<double>()}),
                .loss = losses::SparseCategoricalCrossentropy(true),
                .metrics = {"accuracy"}});
    return m;
  }

  trial::DataLoader build_training_data_loader() override {
    const std::string loader = context.get_hparams().value("loader", "arrays");
    const auto batch = static_cast<std::size_t>(context.get_per_slot_batch_size());
    const Blobs& d = data();
    if (loader == "arrays") return {d.x, d.y};
    if (loader == "dataset")
      return trial::DataLoader(from_sequence(ArraySequence(d.x, d.y, batch)));
    if (loader == "cached") {
      // The data layer's cache (under the config's data_layer.host_storage_path), shuffled with
      // the trial seed each epoch.
      return trial::DataLoader(context.experimental
                                   .cache_train_dataset("blobs", "v1", true)(
                                       [&d] { return from_tensor_slices(d.x, d.y); })
                                   .batch(batch));
    }
    return trial::DataLoader(ArraySequence(d.x, d.y, batch));
  }

  trial::DataLoader build_validation_data_loader() override {
    const Blobs& d = validation_data();
    return {d.x, d.y};
  }

  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    last_recorder() = std::make_shared<Recorder>();
    return {last_recorder(), std::make_shared<HalveOnPlateau>()};
  }
};

/// Throws at the first batch after 12 batches, once per process (a counter shared by attempts).
inline std::atomic<int>& failures() {
  static std::atomic<int> count{0};
  return count;
}

class ThrowOnceCallback : public trial::Callback {
 public:
  void on_train_batch_end(std::size_t, const Logs&) override {
    if (++batches_ > 12 && failures().fetch_add(1) == 0) throw Error("injected failure");
  }
  std::string class_name() const override { return "ThrowOnce"; }
  nlohmann::json get_state() const override { return batches_; }
  void load_state(const nlohmann::json& s) override { batches_ = s.get<int>(); }

 private:
  int batches_ = 0;
};

class ThrowingTrial : public BlobsTrial {
 public:
  using BlobsTrial::BlobsTrial;
  std::vector<std::shared_ptr<callbacks::Callback>> keras_callbacks() override {
    auto list = BlobsTrial::keras_callbacks();
    list.push_back(std::make_shared<ThrowOnceCallback>());
    return list;
  }
};

/// The experiment config of the tests: 240 rows, batches of 16 (15 an epoch), validation every 10
/// batches, checkpoints every 4, 45 batches in all.
inline trial::ExperimentConfig config(std::string entrypoint = "tests:BlobsTrial") {
  trial::ExperimentConfig c;
  c.entrypoint = std::move(entrypoint);
  c.records_per_epoch = 240;
  c.scheduling_unit = 3;
  c.min_validation_period = {trial::Unit::batches, 10};
  c.min_checkpoint_period = {trial::Unit::batches, 4};
  c.searcher.metric = "val_loss";
  c.searcher.max_length = {trial::Unit::batches, 45};
  c.checkpoint_storage.save_trial_best = 1;
  c.checkpoint_storage.save_trial_latest = 1;
  c.raw = {{"entrypoint", c.entrypoint}};
  return c;
}

inline nlohmann::json hparams(const std::string& loader = "arrays") {
  return {{"global_batch_size", 16}, {"learning_rate", 0.02}, {"loader", loader}};
}

inline void register_trials() {
  trial::register_trial<BlobsTrial>("tests:BlobsTrial");
  trial::register_trial<ThrowingTrial>("tests:ThrowingTrial");
}

/// A trial of `c` with `hp` whose folders lie under `dir` (`trial/`, `checkpoints/`), seed 42;
/// the test registers the trial classes it names first.
inline trial::TrialSpec trial_spec(const std::filesystem::path& dir, trial::ExperimentConfig c,
                                   nlohmann::json hp) {
  trial::TrialSpec s;
  s.config = std::move(c);
  s.hparams = std::move(hp);
  s.trial_seed = 42;
  s.trial_dir = dir / "trial";
  s.checkpoint_dir = dir / "checkpoints";
  return s;
}

/// A file's whole content.
inline std::string text(const std::filesystem::path& path) {
  return keras::detail::read_bytes(path);
}

/// The trial's record (`trial.json`).
inline nlohmann::json record(const trial::TrialSpec& s) {
  return nlohmann::json::parse(text(s.trial_dir / "trial.json"));
}

inline std::string weight_bytes(const std::vector<Tensor<float>>& weights) {
  std::string out;
  for (const auto& w : weights)
    out.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  return out;
}

/// The weights of the trial's latest checkpoint, read with load_model, as bytes.
inline std::string final_weights(const trial::TrialSpec& s) {
  const auto uuid = record(s).at("latest_checkpoint").get<std::string>();
  auto m = load_model(s.checkpoint_dir / uuid / "determined-keras-model.h5");
  return weight_bytes(m->get_weights());
}

}  // namespace runner_support
