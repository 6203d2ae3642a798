/// \file
/// `BackupAndRestore`: backs training up as it runs, and resumes an interrupted `fit` at the exact
/// batch it was interrupted after.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/callback_list.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/callbacks/detail/states.hpp"
#include "loadstar/keras/callbacks/fit_loop.hpp"
#include "loadstar/keras/callbacks/save_freq.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/model.hpp"

namespace loadstar::keras::detail {

/// The tensors of a backup, in the order given: `LSBACKUP`, a format version, then per group a
/// count and per tensor its rank, dimensions and float32 elements (host byte order: a backup is
/// read back on the machine that wrote it).
class TensorFile {
 public:
  static constexpr std::string_view magic = "LSBACKUP";
  static constexpr std::uint32_t version = 1;

  LOADSTAR_DECL TensorFile();
  LOADSTAR_DECL void add_group(const std::vector<Tensor<float>>& tensors);
  const std::string& bytes() const noexcept { return bytes_; }

  /// Reads the groups of `bytes` (the file `path`); throws `CheckpointError` naming `path` for a
  /// file that is not a backup or is cut short.
  LOADSTAR_DECL static std::vector<std::vector<Tensor<float>>> read(
      const std::string& bytes, const std::filesystem::path& path);

 private:
  template <class T>
  void put(T value) {
    bytes_.append(reinterpret_cast<const char*>(&value), sizeof value);
  }

  struct Reader {
    const std::string& bytes;
    const std::filesystem::path& path;
    std::size_t at = 0;
    [[noreturn]] LOADSTAR_DECL void fail(const std::string& what) const;
    void need(std::size_t n) const {
      if (n > bytes.size() - at) fail("the file ends early");
    }
    template <class T>
    T get() {
      need(sizeof(T));
      T value;
      std::memcpy(&value, bytes.data() + at, sizeof value);
      at += sizeof value;
      return value;
    }
  };

  std::string bytes_;
};

/// Sets the seed of randomness without a seed of its own (dropout, `fit`'s shuffling) and keeps
/// the count of initializer seeds drawn, which only matters to layers built later.
LOADSTAR_DECL void restore_global_seed(std::uint64_t seed);

}  // namespace loadstar::keras::detail

namespace loadstar::keras::callbacks {

/// `BackupAndRestore`'s Keras arguments, with Keras's defaults.
struct BackupAndRestoreOptions {
  /// `"epoch"`: back up at the end of every epoch; a number: every that many batches.
  SaveFreq save_freq = "epoch";
  /// Remove the backup when `fit` ends (the training is done; nothing is left to resume).
  bool delete_checkpoint = true;
};

/// Keras's `BackupAndRestore` (keras/callbacks/backup_and_restore.py), resuming at the exact batch:
/// where Keras restarts the interrupted epoch from its beginning, a `fit` that finds a backup in
/// `backup_dir` continues right after the last batch backed up, with the same model weights,
/// optimizer slots, iteration count and learning rate, the same position and shuffling of the
/// data, the same training metrics, the state of every callback (`get_state`/`load_state`,
/// `History` included), the epoch and step, and the global random seed that dropout and shuffling
/// draw from. What follows is then bitwise the training an uninterrupted run does, even after a
/// `SIGKILL`.
///
/// Each backup is a directory `backup_dir/ckpt-<n>` holding `weights.bin` (the model's weights and
/// the optimizer's slots) and `state.cbor` (everything else, in CBOR, which keeps every double's
/// bits, infinities included), written as `ckpt-<n>.tmp`, flushed to disk and renamed; the file
/// `backup_dir/checkpoint` names the current backup and is replaced atomically the same way, so
/// a process killed at any moment leaves one complete backup that the next run reads. No backup
/// is taken after a batch or epoch that set `model.stop_training` (training ends there anyway).
///
/// A resumed `fit` needs the same model, the same data, the same `fit` arguments and the same
/// callbacks in the same order; a backup of another model or callback list is a
/// `CheckpointError`.
/// \code
/// auto backup = std::make_shared<BackupAndRestore>("/tmp/backup", BackupAndRestoreOptions{
///     .save_freq = 100});
/// model.fit(x, y, {.epochs = 10, .callbacks = {backup}});  // rerun after a crash: it resumes
/// \endcode
class BackupAndRestore : public Callback {
 public:
  /// Throws `ConfigError` for an empty `backup_dir`.
  LOADSTAR_DECL explicit BackupAndRestore(std::filesystem::path backup_dir,
                                          BackupAndRestoreOptions options = {});

  std::string class_name() const override { return "BackupAndRestore"; }
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  const std::filesystem::path& backup_dir() const noexcept { return backup_dir_; }
  /// The backup the last `fit` resumed from (empty when it started afresh).
  const std::filesystem::path& restored_from() const noexcept { return restored_from_; }
  /// The backup written last (empty before the first).
  std::filesystem::path latest() const {
    return serial_ == 0 ? std::filesystem::path() : backup_dir_ / name_of(serial_);
  }

  /// Resumes from the backup in `backup_dir`, if there is one.
  LOADSTAR_DECL void on_fit_begin(FitLoop& loop) override;

  LOADSTAR_DECL void on_fit_batch_end(FitLoop& loop) override;

  void on_fit_epoch_end(FitLoop& loop) override {
    if (options_.save_freq.epoch() && !model().stop_training) save(loop, true);
  }

  LOADSTAR_DECL void on_train_end(const Logs&) override;

  /// Keras's batch counter of `save_freq` (`{"batches_since_last_save", "last_batch_seen"}`).
  nlohmann::json get_state() const override {
    return {{"batches_since_last_save", counter_.since_last_save},
            {"last_batch_seen", counter_.last_batch_seen}};
  }
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

 private:
  static std::string name_of(std::uint64_t serial) { return "ckpt-" + std::to_string(serial); }
  LOADSTAR_DECL static std::optional<std::uint64_t> serial_of(std::string_view name);

  /// Writes backup `serial_ + 1`, points `checkpoint` at it, then removes every other backup.
  LOADSTAR_DECL void save(FitLoop& loop, bool epoch_end);

  /// Removes every backup but the current one (older ones, and parts of killed writes).
  LOADSTAR_DECL void remove_others() const;

  LOADSTAR_DECL void restore(FitLoop& loop, const std::filesystem::path& dir);

  std::filesystem::path backup_dir_;
  BackupAndRestoreOptions options_;
  detail::BatchCounter counter_;
  std::uint64_t serial_ = 0;
  std::filesystem::path restored_from_;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

TensorFile::TensorFile() {
  bytes_.append(magic);
  put(version);
}

void TensorFile::add_group(const std::vector<Tensor<float>>& tensors) {
  put(static_cast<std::uint64_t>(tensors.size()));
  for (const auto& tensor : tensors) {
    put(static_cast<std::uint64_t>(tensor.shape().rank()));
    for (const auto dim : tensor.shape())
      put(static_cast<std::uint64_t>(dim));
    bytes_.append(reinterpret_cast<const char*>(tensor.data()), tensor.size() * sizeof(float));
  }
}

std::vector<std::vector<Tensor<float>>> TensorFile::read(const std::string& bytes,
                                                         const std::filesystem::path& path) {
  Reader in{bytes, path};
  if (bytes.compare(0, magic.size(), magic) != 0) in.fail("not a loadstar backup");
  in.at = magic.size();
  if (const auto v = in.get<std::uint32_t>(); v != version) {
    in.fail("format version " + std::to_string(v) + " but this build reads version " +
            std::to_string(version));
  }
  std::vector<std::vector<Tensor<float>>> groups;
  while (in.at < bytes.size()) {
    auto& group = groups.emplace_back();
    const auto count = in.get<std::uint64_t>();
    for (std::uint64_t i = 0; i < count; ++i) {
      const auto rank = in.get<std::uint64_t>();
      if (rank > 16) in.fail("a tensor of rank " + std::to_string(rank));
      std::vector<std::size_t> dims;
      std::size_t elements = 1;
      for (std::uint64_t d = 0; d < rank; ++d) {
        dims.push_back(static_cast<std::size_t>(in.get<std::uint64_t>()));
        if (dims.back() != 0 && elements > (bytes.size() / sizeof(float)) / dims.back()) {
          in.fail("a tensor larger than the file");
        }
        elements *= dims.back();
      }
      in.need(elements * sizeof(float));
      // Copied bytewise: the elements are not aligned for float in the file's bytes.
      Tensor<float> tensor{Shape(dims)};
      if (elements != 0) std::memcpy(tensor.data(), bytes.data() + in.at, elements * sizeof(float));
      group.push_back(std::move(tensor));
      in.at += elements * sizeof(float);
    }
  }
  return groups;
}

void TensorFile::Reader::fail(const std::string& what) const {
  throw CheckpointError("backup '" + path.string() + "': " + what + " at byte " +
                        std::to_string(at));
}

}  // namespace loadstar::keras::detail
namespace loadstar::keras::callbacks {

BackupAndRestore::BackupAndRestore(std::filesystem::path backup_dir,
                                   BackupAndRestoreOptions options)
    : backup_dir_(std::move(backup_dir)), options_(options) {
  if (backup_dir_.empty()) throw ConfigError("backup and restore: backup_dir is empty");
}

nlohmann::json BackupAndRestore::get_config() const {
  return {{"backup_dir", backup_dir_.string()},
          {"save_freq", options_.save_freq.to_json()},
          {"delete_checkpoint", options_.delete_checkpoint}};
}

std::shared_ptr<Callback> BackupAndRestore::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "BackupAndRestore");
  read.expect("double_checkpoint", false, "every backup switches atomically");
  return std::make_shared<BackupAndRestore>(
      read.get<std::string>("backup_dir"),
      BackupAndRestoreOptions{.save_freq = detail::config_save_freq(read),
                              .delete_checkpoint = read.get("delete_checkpoint", true)});
}

void BackupAndRestore::on_fit_begin(FitLoop& loop) {
  counter_ = {};
  restored_from_.clear();
  serial_ = 0;
  const auto pointer = backup_dir_ / "checkpoint";
  if (!std::filesystem::exists(pointer)) return;
  std::string name = detail::read_bytes(pointer);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\r'))
    name.pop_back();
  const auto serial = serial_of(name);
  if (!serial) {
    throw CheckpointError("backup '" + pointer.string() +
                          "': expected the name of a backup (ckpt-<n>) but found '" + name + "'");
  }
  restore(loop, backup_dir_ / name);
  serial_ = *serial;
  restored_from_ = backup_dir_ / name;
}

void BackupAndRestore::on_fit_batch_end(FitLoop& loop) {
  if (options_.save_freq.epoch()) return;
  // Keras counts batches as `on_train_batch_end` sees them; `data.step()` is past this batch.
  if (!counter_.should_save(loop.data.step() - 1, options_.save_freq.batches())) return;
  if (!model().stop_training) save(loop, false);
}

void BackupAndRestore::on_train_end(const Logs&) {
  if (!options_.delete_checkpoint) return;
  std::error_code error;
  std::filesystem::remove_all(backup_dir_, error);
  if (error) {
    throw IoError("backup and restore: cannot remove '" + backup_dir_.string() +
                  "': " + error.message());
  }
  serial_ = 0;
}

void BackupAndRestore::load_state(const nlohmann::json& state) {
  const detail::StateReader read("backup and restore", state);
  counter_.since_last_save = read.get<std::size_t>("batches_since_last_save");
  counter_.last_batch_seen = read.get<std::size_t>("last_batch_seen");
}

std::optional<std::uint64_t> BackupAndRestore::serial_of(std::string_view name) {
  constexpr std::string_view prefix = "ckpt-";
  if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) return {};
  std::uint64_t serial = 0;
  for (const char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9' || serial > (UINT64_MAX - 9) / 10) return {};
    serial = serial * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (serial == 0) return {};
  return serial;
}

void BackupAndRestore::save(FitLoop& loop, bool epoch_end) {
  Model& m = model();
  Optimizer& optimizer = m.optimizer();
  nlohmann::json callback_states = detail::callback_states(loop.callbacks);
  nlohmann::json logs = nlohmann::json::array();
  for (const auto& [name, value] : loop.logs)
    logs.push_back({name, value});
  // A constant learning rate may have been changed (ReduceLROnPlateau); a schedule follows the
  // restored iteration count.
  const nlohmann::json config = optimizer.get_config();
  const auto found = config.find("learning_rate");
  const nlohmann::json learning_rate = found != config.end() ? *found : nlohmann::json();
  const nlohmann::json state = {
      {"model", m.name()},
      {"epoch", loop.epoch},
      {"epoch_end", epoch_end},
      {"data", loop.data.state()},
      {"logs", std::move(logs)},
      {"training_metrics", m.training_metrics().state()},
      {"carried_states", m.carried_states()},
      {"iterations", optimizer.iterations()},
      {"learning_rate", learning_rate.is_number() ? learning_rate : nullptr},
      {"seed", detail::global_seed()},
      {"callbacks", std::move(callback_states)}};

  std::vector<Tensor<float>> slots;
  for (const auto& slot : optimizer.variables())
    slots.push_back(slot.value.is_host() ? slot.value : m.backend().to_host(slot.value));
  detail::TensorFile weights;
  weights.add_group(m.get_weights());
  weights.add_group(slots);
  const std::vector<std::uint8_t> cbor = nlohmann::json::to_cbor(state);

  std::filesystem::create_directories(backup_dir_);
  const std::uint64_t serial = serial_ + 1;
  const auto target = backup_dir_ / name_of(serial);
  auto temporary = target;
  temporary += ".tmp";
  std::filesystem::remove_all(temporary);  // left by a process killed while writing
  std::filesystem::remove_all(target);
  std::filesystem::create_directory(temporary);
  detail::write_synced(temporary / "weights.bin", weights.bytes());
  detail::write_synced(temporary / "state.cbor",
                       std::string_view(reinterpret_cast<const char*>(cbor.data()), cbor.size()));
  detail::sync_directory(temporary);
  detail::rename_into_place(temporary, target);
  detail::write_atomically(backup_dir_ / "checkpoint", name_of(serial) + "\n");
  serial_ = serial;
  remove_others();
}

void BackupAndRestore::remove_others() const {
  const std::string current = name_of(serial_);
  for (const auto& entry : std::filesystem::directory_iterator(backup_dir_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name != current) {
      std::filesystem::remove_all(entry.path());
    }
  }
}

void BackupAndRestore::restore(FitLoop& loop, const std::filesystem::path& dir) {
  Model& m = model();
  Optimizer& optimizer = m.optimizer();
  const auto weights_path = dir / "weights.bin";
  const auto state_path = dir / "state.cbor";
  const auto groups = detail::TensorFile::read(detail::read_bytes(weights_path), weights_path);
  nlohmann::json state;
  try {
    const std::string bytes = detail::read_bytes(state_path);
    state = nlohmann::json::from_cbor(bytes.begin(), bytes.end());
    loadstar::detail::check_json_text(state, "text");
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("backup '" + state_path.string() + "': not a CBOR state (" + e.what() +
                          ")");
  } catch (const FormatError& e) {
    throw CheckpointError("backup '" + state_path.string() + "': " + e.what());
  }
  const auto fail = [&](const std::string& what) {
    throw CheckpointError("backup '" + dir.string() + "': " + what);
  };
  try {
    const detail::StateReader read("backup '" + state_path.string() + "'", state);
    if (groups.size() != 2)
      fail("expected 2 groups of tensors but found " + std::to_string(groups.size()));
    m.set_weights(groups[0]);

    optimizer.build(m.trainable_variables());
    auto slots = optimizer.variables();
    if (slots.size() != groups[1].size()) {
      fail("holds " + std::to_string(groups[1].size()) + " optimizer slots but the " +
           optimizer.class_name() + " optimizer has " + std::to_string(slots.size()));
    }
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const auto& saved = groups[1][i];
      if (saved.shape() != slots[i].value.shape()) {
        fail("optimizer slot " + std::to_string(i) + " ('" + slots[i].name + "') is " +
             slots[i].value.shape().str() + " but the backup holds " + saved.shape().str());
      }
      if (slots[i].value.is_host()) {
        std::copy(saved.begin(), saved.end(), slots[i].value.begin());
      } else {
        m.backend().copy_from_host(saved, slots[i].value);
      }
    }
    optimizer.set_iterations(read.get<std::int64_t>("iterations"));
    const auto learning_rate = read.get<nlohmann::json>("learning_rate");
    if (learning_rate.is_number()) optimizer.set_learning_rate(learning_rate.get<double>());

    m.training_metrics().restore(read.get<nlohmann::json>("training_metrics"));
    const auto carried = state.find("carried_states");
    m.restore_carried_states(carried != state.end() ? *carried : nlohmann::json::object());
    loop.data.restore(read.get<nlohmann::json>("data"));
    detail::restore_global_seed(read.get<std::uint64_t>("seed"));

    loop.logs.clear();
    const auto logs = read.get<nlohmann::json>("logs");
    if (!logs.is_array())
      fail("expected a list of logs but found " + loadstar::detail::shown(logs));
    for (const auto& entry : logs) {
      if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() ||
          !entry[1].is_number()) {
        fail("expected a log [name, value] but found " + loadstar::detail::shown(entry));
      }
      loop.logs.set(entry[0].get<std::string>(), entry[1].get<double>());
    }

    detail::load_callback_states(read.get<nlohmann::json>("callbacks"), loop.callbacks,
                                 "backup '" + dir.string() + "'", "fit");

    const auto epoch = read.get<std::size_t>("epoch");
    loop.initial_epoch = read.get<bool>("epoch_end") ? epoch + 1 : epoch;
    loop.epoch = loop.initial_epoch;
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    fail(e.what());
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("a value of the state cannot be read (") + e.what() + ")");
  }
}

}  // namespace loadstar::keras::callbacks

namespace loadstar::keras::detail {

void restore_global_seed(std::uint64_t seed) {
  auto& state = seed_state();
  const std::lock_guard lock(state.mutex);
  state.seed = seed;
}

}  // namespace loadstar::keras::detail
#endif
