/// \file
/// `CSVLogger`: one CSV row of logs per epoch.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"

namespace loadstar::keras::callbacks {

/// Keras's `CSVLogger` (tf.keras 2.11 callbacks.py): writes `epoch,<log names sorted>` as a
/// header, then one row per epoch, values in Python's shortest round-trip form, lines ended by
/// `\r\n` as Python's csv module writes them. With `append`, rows are added to an existing file
/// (the header only when the file is empty). The file is flushed after every row, so an
/// interrupted run keeps every finished epoch. When training was stopped, missing values are
/// written as `NA`, as Keras does.
/// \code
/// auto csv = std::make_shared<CSVLogger>("training.csv");
/// \endcode
class CSVLogger : public Callback {
 public:
  explicit CSVLogger(std::filesystem::path filename, char separator = ',', bool append = false)
      : filename_(std::move(filename)), separator_(separator), append_(append) {}

  std::string class_name() const override { return "CSVLogger"; }
  nlohmann::json get_config() const override {
    return {{"filename", filename_.string()},
            {"separator", std::string(1, separator_)},
            {"append", append_}};
  }
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  /// Throws `IoError` when the file cannot be opened.
  LOADSTAR_DECL void on_train_begin(const Logs&) override;

  LOADSTAR_DECL void on_epoch_end(std::size_t epoch, const Logs& logs) override;

  void on_train_end(const Logs&) override { file_.close(); }

 private:
  /// A float as Python's `repr` writes it: the shortest form that reads back the same.
  LOADSTAR_DECL static std::string python_repr(double value);

  std::filesystem::path filename_;
  char separator_;
  bool append_;
  bool header_ = true;
  std::ofstream file_;
  std::vector<std::string> keys_;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> CSVLogger::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "CSVLogger");
  const std::string separator = read.get("separator", ",");
  if (separator.size() != 1) read.fail("separator", "a string of one character");
  return std::make_shared<CSVLogger>(read.get<std::string>("filename"), separator[0],
                                     read.get("append", false));
}

void CSVLogger::on_train_begin(const Logs&) {
  header_ = true;
  if (append_ && std::filesystem::exists(filename_)) {
    header_ = std::filesystem::file_size(filename_) == 0;
  }
  file_.close();
  file_.clear();
  file_.open(filename_,
             append_ ? std::ios::app | std::ios::binary : std::ios::trunc | std::ios::binary);
  if (!file_) throw IoError("csv logger: cannot open '" + filename_.string() + "' for writing");
  keys_.clear();
}

void CSVLogger::on_epoch_end(std::size_t epoch, const Logs& logs) {
  if (keys_.empty()) {
    for (const auto& [name, value] : logs)
      keys_.push_back(name);
    std::sort(keys_.begin(), keys_.end());
  }
  if (header_) {
    file_ << "epoch";
    for (const auto& key : keys_)
      file_ << separator_ << key;
    file_ << "\r\n";
    header_ = false;
  }
  file_ << epoch;
  for (const auto& key : keys_) {
    const auto value = logs.get(key);
    file_ << separator_ << (value ? python_repr(*value) : std::string("NA"));
  }
  file_ << "\r\n";
  file_.flush();
  if (!file_) throw IoError("csv logger: cannot write to '" + filename_.string() + "'");
}

std::string CSVLogger::python_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

}  // namespace loadstar::keras::callbacks
#endif
