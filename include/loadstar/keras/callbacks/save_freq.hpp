/// \file
/// `SaveFreq`: Keras's `save_freq` of `ModelCheckpoint` and `BackupAndRestore`.
#pragma once

#include "loadstar/config.hpp"

#include <concepts>
#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/config_reader.hpp"

namespace loadstar::keras::callbacks {

/// Keras's `save_freq`: `"epoch"` (at the end of every epoch) or a number of training batches
/// (counted across epochs). Implicit from both, as Keras's argument is:
/// \code
/// ModelCheckpointOptions{.save_freq = 100};      // every 100 batches
/// ModelCheckpointOptions{.save_freq = "epoch"};  // the default
/// \endcode
class SaveFreq {
 public:
  /// Throws `ConfigError` for any string but `"epoch"`.
  SaveFreq(const char* freq)
      : SaveFreq(std::string(freq)) {}  // NOLINT(google-explicit-constructor)
  LOADSTAR_DECL SaveFreq(const std::string& freq);
  /// Throws `ConfigError` unless `batches` is positive.
  template <std::integral T>
  SaveFreq(T batches) {  // NOLINT(google-explicit-constructor)
    if (batches <= 0) {
      throw ConfigError("save_freq: expected \"epoch\" or a positive number of batches but found " +
                        std::to_string(batches));
    }
    batches_ = static_cast<std::size_t>(batches);
  }

  /// Whether saving happens at the end of every epoch.
  bool epoch() const noexcept { return batches_ == 0; }
  /// The batches between saves (0 for `"epoch"`).
  std::size_t batches() const noexcept { return batches_; }

  /// `"epoch"` or the number of batches, as in a Keras config.
  nlohmann::json to_json() const {
    return epoch() ? nlohmann::json("epoch") : nlohmann::json(batches_);
  }

 private:
  std::size_t batches_ = 0;
};

}  // namespace loadstar::keras::callbacks

namespace loadstar::keras::detail {

/// Reads `save_freq` (`"epoch"` by default) from a callback's config.
LOADSTAR_DECL callbacks::SaveFreq config_save_freq(const ConfigReader& read);

/// Keras's batch counting for `save_freq` batches (`_should_save_on_batch`): a batch index not
/// above the last one seen starts a new epoch and counts `batch + 1`, otherwise the batches
/// since the last one seen count; returns whether `freq` batches were seen since the last save.
struct BatchCounter {
  std::size_t since_last_save = 0;
  std::size_t last_batch_seen = 0;

  LOADSTAR_DECL bool should_save(std::size_t batch, std::size_t freq);
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

SaveFreq::SaveFreq(const std::string& freq) {  // NOLINT(google-explicit-constructor)
  if (freq != "epoch") {
    throw ConfigError("save_freq: expected \"epoch\" or a positive number of batches but found \"" +
                      freq + "\"");
  }
}

}  // namespace loadstar::keras::callbacks
namespace loadstar::keras::detail {

bool BatchCounter::should_save(std::size_t batch, std::size_t freq) {
  since_last_save += batch <= last_batch_seen ? batch + 1 : batch - last_batch_seen;
  last_batch_seen = batch;
  if (since_last_save < freq) return false;
  since_last_save = 0;
  return true;
}

callbacks::SaveFreq config_save_freq(const ConfigReader& read) {
  const nlohmann::json* value = read.find("save_freq");
  if (value == nullptr || value->is_null()) return "epoch";
  if (value->is_string() && value->get<std::string>() == "epoch") return "epoch";
  if (value->is_number_integer() && value->get<std::int64_t>() > 0) {
    return value->get<std::int64_t>();
  }
  read.fail("save_freq", "\"epoch\" or a positive number of batches");
}

}  // namespace loadstar::keras::detail
#endif
