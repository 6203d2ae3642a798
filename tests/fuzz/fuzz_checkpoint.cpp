// libFuzzer harness: the readers of a trial checkpoint (metadata.json, state.cbor and the trial's
// record trial.json) and of a Keras BackupAndRestore backup (state.cbor, weights.bin), each driven
// through the path that reads it for real: run_trial resuming a tiny trial, and fit resuming from
// a backup. The first input byte chooses the file, the rest is its content; every other file is
// that of a real checkpoint and backup, written once at the first call and put back before each
// input. Every outcome but a finished run or a loadstar::Error is a finding.
//
// With LOADSTAR_FUZZ_WRITE_SEEDS=<folder>, the first call also writes the real files there as
// seeds, each behind its selector byte (make_seeds.py --checkpoint-harness).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/callbacks/backup_and_restore.hpp>
#include <loadstar/trial/keras_trial.hpp>
#include <loadstar/trial/registry.hpp>
#include <loadstar/trial/trial_runner.hpp>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace keras = loadstar::keras;
namespace trial = loadstar::trial;
using CallbackList = std::vector<std::shared_ptr<keras::callbacks::Callback>>;

// Eight rows of two features, in batches of four: two batches an epoch.
const loadstar::Tensor<float>& features() {
  static const loadstar::Tensor<float> x = [] {
    loadstar::Tensor<float> t({8, 2});
    for (std::size_t i = 0; i < 8; ++i) {
      t(i, 0) = static_cast<float>(i) / 8;
      t(i, 1) = 1 - static_cast<float>(i) / 4;
    }
    return t;
  }();
  return x;
}

const loadstar::Tensor<float>& targets() {
  static const loadstar::Tensor<float> y = [] {
    loadstar::Tensor<float> t({8, 1});
    for (std::size_t i = 0; i < 8; ++i)
      t(i, 0) = features()(i, 0) - features()(i, 1);
    return t;
  }();
  return y;
}

std::shared_ptr<keras::Model> tiny_model() {
  auto model = std::make_shared<keras::Sequential>(
      std::initializer_list<keras::SequentialItem>{keras::Input({2}), keras::layers::Dense(1)});
  return model;
}

void compile(keras::Model& model) {
  model.compile({.optimizer = keras::optimizers::Adam({.learning_rate = 0.01}), .loss = "mse"});
}

// Callbacks with a state of their own, so that the states' readers run too.
CallbackList stateful_callbacks(const std::string& monitor) {
  return {std::make_shared<keras::callbacks::EarlyStopping>(
              keras::callbacks::EarlyStoppingOptions{.monitor = monitor, .patience = 5}),
          std::make_shared<keras::callbacks::ReduceLROnPlateau>(
              keras::callbacks::ReduceLROnPlateauOptions{.monitor = monitor, .patience = 1})};
}

class TinyTrial : public trial::KerasTrial {
 public:
  using KerasTrial::KerasTrial;
  std::shared_ptr<keras::Model> build_model() override {
    auto model = tiny_model();
    context.wrap_model(*model);
    compile(*model);
    return model;
  }
  trial::DataLoader build_training_data_loader() override { return {features(), targets()}; }
  trial::DataLoader build_validation_data_loader() override { return {features(), targets()}; }
  CallbackList keras_callbacks() override { return stateful_callbacks("val_loss"); }
};

// Two batches, validated and checkpointed after the second: a resume has nothing left to train.
trial::TrialSpec trial_spec(const fs::path& root) {
  trial::ExperimentConfig config;
  config.entrypoint = "fuzz:TinyTrial";
  config.records_per_epoch = 8;
  config.scheduling_unit = 1;
  config.min_validation_period = {trial::Unit::batches, 2};
  config.min_checkpoint_period = {trial::Unit::batches, 2};
  config.searcher.metric = "val_loss";
  config.searcher.max_length = {trial::Unit::batches, 2};
  config.max_restarts = 0;
  config.raw = {{"entrypoint", config.entrypoint}};
  return {.config = config,
          .hparams = {{"global_batch_size", 4}},
          .trial_seed = 1,
          .trial_dir = root / "trial",
          .checkpoint_dir = root / "checkpoints"};
}

// Two epochs backed up after every batch, the last backup kept.
void fit_with_backup(const fs::path& backup_dir) {
  keras::set_random_seed(1);
  auto model = tiny_model();
  compile(*model);
  CallbackList callbacks = stateful_callbacks("loss");
  callbacks.insert(callbacks.begin(),
                   std::make_shared<keras::callbacks::BackupAndRestore>(
                       backup_dir, keras::callbacks::BackupAndRestoreOptions{
                                       .save_freq = 1, .delete_checkpoint = false}));
  (void)model->fit(features(), targets(),
                   {.epochs = 2, .batch_size = 4, .verbose = 0, .callbacks = std::move(callbacks)});
}

void write_file(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (auto at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// The files of a real checkpoint and backup, and the ones the selector byte chooses from.
struct World {
  fs::path root;
  std::vector<std::pair<fs::path, std::string>> files;    // relative to root
  std::vector<std::pair<std::string, fs::path>> targets;  // seed name, file relative to root

  World() {
    // In memory where there is /dev/shm: the writers flush every file to disk.
    const fs::path base = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path();
    root = base / ("loadstar-fuzz-checkpoint-" + std::to_string(::getpid()));
    fs::remove_all(root);
    trial::register_trial<TinyTrial>("fuzz:TinyTrial");
    const auto result = trial::run_trial(trial_spec(root), {.verbose = false});
    fit_with_backup(root / "backup");
    // The checkpoint gets a fixed name instead of its random one (in every file: the names have
    // the same length), so that the seeds of one process fit the files of another.
    const std::string fixed = "00000000-0000-4000-8000-000000000000";
    const fs::path checkpoint = fs::path("checkpoints") / fixed;
    std::string backup = read_file(root / "backup" / "checkpoint");
    while (!backup.empty() && backup.back() == '\n')
      backup.pop_back();
    targets = {{"trial-state.cbor", checkpoint / "state.cbor"},
               {"trial-metadata.json", checkpoint / "metadata.json"},
               {"trial-record.json", fs::path("trial") / "trial.json"},
               {"backup-state.cbor", fs::path("backup") / backup / "state.cbor"},
               {"backup-weights.bin", fs::path("backup") / backup / "weights.bin"}};
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      if (!entry.is_regular_file()) continue;
      files.emplace_back(
          replaced(fs::relative(entry.path(), root), result.latest_checkpoint, fixed),
          replaced(read_file(entry.path()), result.latest_checkpoint, fixed));
    }
    fs::remove_all(root);
    for (const auto& [file, bytes] : files)
      write_file(root / file, bytes);
    if (const char* seeds = std::getenv("LOADSTAR_FUZZ_WRITE_SEEDS")) {
      for (std::size_t i = 0; i < targets.size(); ++i) {
        write_file(fs::path(seeds) / targets[i].first,
                   static_cast<char>(i) + read_file(root / targets[i].second));
      }
    }
  }
  World(const World&) = delete;
  World& operator=(const World&) = delete;
  ~World() {
    std::error_code ignored;
    fs::remove_all(root, ignored);
  }

  bool backup(std::size_t target) const { return targets[target].first.starts_with("backup"); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const World world;
  if (size == 0) return 0;
  const std::size_t target = data[0] % world.targets.size();
  fs::remove_all(world.root);
  for (const auto& [file, bytes] : world.files)
    write_file(world.root / file, bytes);
  write_file(world.root / world.targets[target].second,
             std::string_view(reinterpret_cast<const char*>(data + 1), size - 1));
  try {
    if (world.backup(target)) {
      fit_with_backup(world.root / "backup");
    } else {
      (void)trial::run_trial(trial_spec(world.root), {.verbose = false});
    }
  } catch (const loadstar::Error&) {
  }
  return 0;
}
