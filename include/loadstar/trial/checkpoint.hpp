/// \file
/// A trial's checkpoint: a folder `<checkpoint_dir>/<uuid>/` holding the Keras model file, its
/// metadata and the state that makes a resume exact, written under a temporary name and renamed
/// into place.
#pragma once

#include "loadstar/config.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/saving/saving.hpp"

namespace loadstar::trial {

/// The loadstar version written into checkpoint metadata.
inline constexpr std::string_view loadstar_version = "0.1.0";
/// The checkpoint format: `determined-keras-model.h5` (a whole Keras model with its optimizer),
/// `metadata.json` and `state.cbor`.
inline constexpr std::string_view checkpoint_format = "loadstar-trial-1";

/// The file names inside a checkpoint folder.
inline constexpr std::string_view checkpoint_model_file = "determined-keras-model.h5";
inline constexpr std::string_view checkpoint_metadata_file = "metadata.json";
inline constexpr std::string_view checkpoint_state_file = "state.cbor";

/// A fresh random (version 4) UUID, Determined's checkpoint name.
LOADSTAR_DECL std::string new_checkpoint_uuid();

/// Flushes the file `path` to disk; `IoError` naming it when it cannot.
LOADSTAR_DECL void sync_file(const std::filesystem::path& path);

/// The name of the folder a checkpoint of `experiment_id`'s trial `trial_id` is started in,
/// before its metadata is there: `.<uuid>.e<experiment_id>.t<trial_id>.new`, so that a folder
/// left by a process killed at that moment still says whose it is.
LOADSTAR_DECL std::string checkpoint_staging_name(const std::string& uuid,
                                                  std::uint64_t experiment_id,
                                                  std::uint64_t trial_id);

/// Writes checkpoint `uuid` into `checkpoint_dir`: the folder starts as
/// `checkpoint_staging_name(...)` (from the metadata's `experiment_id` and `trial_id`) with
/// `metadata` as `metadata.json`, is renamed to `<uuid>.tmp/` and receives the model file
/// (`keras::save_model`, optimizer included) and `state` as `state.cbor` (CBOR keeps every
/// double's bits), each flushed to disk, then is renamed to `<uuid>/`. Returns the folder. A folder
/// left by a process killed while writing is replaced.
LOADSTAR_DECL std::filesystem::path write_checkpoint(const std::filesystem::path& checkpoint_dir,
                                                     const std::string& uuid,
                                                     const keras::Model& model,
                                                     const nlohmann::json& metadata,
                                                     const nlohmann::json& state);

/// What a checkpoint is checked against when it is read: the experiment and trial it must belong
/// to.
struct CheckpointOwner {
  std::uint64_t experiment_id = 1;
  std::uint64_t trial_id = 1;
};

/// Reads and checks `metadata.json` of the checkpoint folder `path`; throws `CheckpointError`
/// naming the file for a missing folder or file, a file that is not complete JSON, and a
/// checkpoint of another experiment or trial.
LOADSTAR_DECL nlohmann::json read_checkpoint_metadata(const std::filesystem::path& path,
                                                      const CheckpointOwner& owner);

/// Reads `state.cbor` of the checkpoint folder `path`; `CheckpointError` naming the file when it
/// is truncated or not CBOR.
LOADSTAR_DECL nlohmann::json read_checkpoint_state(const std::filesystem::path& path);

/// Loads the weights and the optimizer's state of the checkpoint folder `path` into `model`;
/// `CheckpointError` naming the file when it is truncated, corrupt or of another model.
///
/// The model file is parsed in this process (`Trust::trusted`) only when this process wrote it
/// with `write_checkpoint` and it has not changed since (the same device, inode, size,
/// modification and status-change times); any other checkpoint (another process's, one copied or
/// restored from storage, one written before a restart) is parsed in a sandbox child
/// (`Trust::untrusted`), so that a corrupt file is an error, never a crash.
LOADSTAR_DECL void load_checkpoint_model(keras::Model& model, const std::filesystem::path& path);

/// Whether `write_checkpoint` in this process wrote the model file `file` and it is unchanged.
LOADSTAR_DECL bool written_by_this_process(const std::filesystem::path& file);

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

namespace detail {

/// What identifies a file's contents as this process left them: renaming keeps it, and any write,
/// replacement or change of times changes it (the status-change time cannot be set).
struct FileIdentity {
  dev_t device = 0;
  ino_t inode = 0;
  off_t size = 0;
  std::int64_t modified_ns = 0;
  std::int64_t changed_ns = 0;
  bool operator==(const FileIdentity&) const = default;
};

inline std::optional<FileIdentity> file_identity(const std::filesystem::path& file) {
  struct stat info {};
  if (::stat(file.c_str(), &info) != 0) return std::nullopt;
  const auto ns = [](const timespec& t) {
    return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
  };
  return FileIdentity{info.st_dev, info.st_ino, info.st_size, ns(info.st_mtim), ns(info.st_ctim)};
}

/// The model files `write_checkpoint` wrote in this process, the last 1,024.
class WrittenCheckpoints {
 public:
  static WrittenCheckpoints& instance() {
    static WrittenCheckpoints written;
    return written;
  }
  void add(const FileIdentity& identity) {
    const std::lock_guard lock(mutex_);
    if (files_.size() == 1024) files_.erase(files_.begin());
    files_.push_back(identity);
  }
  bool contains(const FileIdentity& identity) const {
    const std::lock_guard lock(mutex_);
    return std::find(files_.begin(), files_.end(), identity) != files_.end();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<FileIdentity> files_;
};

}  // namespace detail

bool written_by_this_process(const std::filesystem::path& file) {
  const auto identity = detail::file_identity(file);
  return identity && detail::WrittenCheckpoints::instance().contains(*identity);
}

std::string new_checkpoint_uuid() {
  std::random_device device;
  std::uint8_t bytes[16];
  for (auto& byte : bytes)
    byte = static_cast<std::uint8_t>(device() & 0xFF);
  bytes[6] = static_cast<std::uint8_t>((bytes[6] & 0x0F) | 0x40);
  bytes[8] = static_cast<std::uint8_t>((bytes[8] & 0x3F) | 0x80);
  static constexpr char digits[] = "0123456789abcdef";
  std::string text;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    text += digits[bytes[i] >> 4];
    text += digits[bytes[i] & 0x0F];
  }
  return text;
}

std::string checkpoint_staging_name(const std::string& uuid, std::uint64_t experiment_id,
                                    std::uint64_t trial_id) {
  return "." + uuid + ".e" + std::to_string(experiment_id) + ".t" + std::to_string(trial_id) +
         ".new";
}

void sync_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string reason = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw IoError("'" + path.string() + "': cannot flush to disk: " + reason);
  }
  ::close(fd);
}

std::filesystem::path write_checkpoint(const std::filesystem::path& checkpoint_dir,
                                       const std::string& uuid, const keras::Model& model,
                                       const nlohmann::json& metadata,
                                       const nlohmann::json& state) {
  namespace kd = keras::detail;
  std::filesystem::create_directories(checkpoint_dir);
  const auto target = checkpoint_dir / uuid;
  auto temporary = target;
  temporary += ".tmp";
  const auto staging = checkpoint_dir / checkpoint_staging_name(
                                            uuid, metadata.value("experiment_id", std::uint64_t{0}),
                                            metadata.value("trial_id", std::uint64_t{0}));
  std::filesystem::remove_all(staging);
  std::filesystem::remove_all(temporary);
  std::filesystem::remove_all(target);
  // The metadata first, in a folder whose name says whose it is: the metadata tells whose a
  // `<uuid>.tmp` folder left by a killed write is.
  std::filesystem::create_directory(staging);
  kd::write_synced(staging / checkpoint_metadata_file, metadata.dump(2) + "\n");
  kd::rename_into_place(staging, temporary);
  keras::save_model(model, temporary / checkpoint_model_file);
  sync_file(temporary / checkpoint_model_file);  // written through HDF5, flushed here
  const std::vector<std::uint8_t> cbor = nlohmann::json::to_cbor(state);
  kd::write_synced(temporary / checkpoint_state_file,
                   std::string_view(reinterpret_cast<const char*>(cbor.data()), cbor.size()));
  kd::sync_directory(temporary);
  kd::rename_into_place(temporary, target);
  kd::sync_directory(checkpoint_dir);
  if (const auto identity = detail::file_identity(target / checkpoint_model_file)) {
    detail::WrittenCheckpoints::instance().add(*identity);
  }
  return target;
}

nlohmann::json read_checkpoint_metadata(const std::filesystem::path& path,
                                        const CheckpointOwner& owner) {
  if (!std::filesystem::is_directory(path)) {
    throw CheckpointError("checkpoint '" + path.string() + "': expected a checkpoint folder but " +
                          (std::filesystem::exists(path) ? "found a file" : "it is missing"));
  }
  for (const auto name : {checkpoint_model_file, checkpoint_metadata_file, checkpoint_state_file}) {
    if (!std::filesystem::is_regular_file(path / name)) {
      throw CheckpointError("checkpoint '" + (path / name).string() + "': the file is missing");
    }
  }
  const auto file = path / checkpoint_metadata_file;
  nlohmann::json metadata;
  try {
    metadata = nlohmann::json::parse(keras::detail::read_bytes(file));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("checkpoint '" + file.string() +
                          "': expected JSON metadata but the file is truncated or corrupt (" +
                          e.what() + ")");
  }
  const loadstar::detail::StateReader read("checkpoint '" + file.string() + "'", metadata);
  if (const auto format = read.get<std::string>("format"); format != checkpoint_format) {
    throw CheckpointError("checkpoint '" + file.string() + "': expected format '" +
                          std::string(checkpoint_format) + "' but found '" + format + "'");
  }
  const auto experiment = read.get<std::uint64_t>("experiment_id");
  const auto trial = read.get<std::uint64_t>("trial_id");
  if (experiment != owner.experiment_id || trial != owner.trial_id) {
    throw CheckpointError("checkpoint '" + file.string() +
                          "': expected a checkpoint of experiment " +
                          std::to_string(owner.experiment_id) + " trial " +
                          std::to_string(owner.trial_id) + " but found one of experiment " +
                          std::to_string(experiment) + " trial " + std::to_string(trial));
  }
  return metadata;
}

nlohmann::json read_checkpoint_state(const std::filesystem::path& path) {
  const auto file = path / checkpoint_state_file;
  try {
    const std::string bytes = keras::detail::read_bytes(file);
    nlohmann::json state = nlohmann::json::from_cbor(bytes.begin(), bytes.end());
    if (!state.is_object()) throw CheckpointError("");
    loadstar::detail::check_json_text(state, "text");
    return state;
  } catch (const std::exception& e) {
    throw CheckpointError(
        "checkpoint '" + file.string() +
        "': expected the trial's state in CBOR but the file is truncated or "
        "corrupt" +
        (std::string_view(e.what()).empty() ? "" : std::string(" (") + e.what() + ")"));
  }
}

void load_checkpoint_model(keras::Model& model, const std::filesystem::path& path) {
  const auto file = path / checkpoint_model_file;
  try {
    model.load_weights(
        file, {.optimizer = true,
               .trust = written_by_this_process(file) ? Trust::trusted : Trust::untrusted});
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError("checkpoint '" + file.string() + "': " + e.what());
  }
}

}  // namespace loadstar::trial
#endif
