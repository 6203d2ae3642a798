/// \file
/// `ModelCheckpoint`: saves the model or its weights during training, every epoch or every few
/// batches, optionally only when a monitored log improves.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/detail/output.hpp"
#include "loadstar/keras/callbacks/detail/python_format.hpp"
#include "loadstar/keras/callbacks/save_freq.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/saving/saving.hpp"

namespace loadstar::keras::callbacks {

/// `ModelCheckpoint`'s Keras arguments, with Keras's defaults.
struct ModelCheckpointOptions {
  /// The log compared with the best so far when `save_best_only`.
  std::string monitor = "val_loss";
  /// 1: a message for every save (and every epoch without improvement); 0: silent.
  int verbose = 0;
  /// Save only when `monitor` improves on the best value so far.
  bool save_best_only = false;
  /// Save the weights (`save_weights`) instead of the whole model (`save_model`, with the
  /// optimizer).
  bool save_weights_only = false;
  /// `"min"`, `"max"` or `"auto"`: max when `monitor` contains `acc` or starts with `fmeasure`,
  /// else min (tf.keras 2.x's rule).
  std::string mode = "auto";
  /// `"epoch"`: at the end of every epoch; a number: every that many batches.
  SaveFreq save_freq = "epoch";
  /// The best value before the first save: the first must beat it.
  std::optional<double> initial_value_threshold = std::nullopt;
};

/// Keras's `ModelCheckpoint` (tf.keras 2.11 keras/callbacks.py): saves the model to `filepath`, a
/// Python format template over `epoch` (1-based), `batch` (1-based, when saving every few
/// batches) and the logs (`"ckpt-{epoch:02d}-{val_loss:.2f}.h5"`), at the end of every epoch or
/// every `save_freq` batches. With `save_best_only`, it saves only when `monitor` beats the best
/// value so far (strictly), and says so with `verbose`. `.h5`/`.hdf5` paths get the tf.keras 2.x
/// HDF5 layout and `.keras` the Keras 3 archive (`save_model`); weights-only paths
/// (`save_weights`) end in `.h5` or `.hdf5` (`.weights.h5` for Keras 3's layout). The best value
/// and the batch counter are its checkpoint state (`get_state`).
/// \code
/// auto checkpoint = std::make_shared<ModelCheckpoint>(
///     "ckpt/best-{epoch:02d}-{val_loss:.3f}.h5",
///     ModelCheckpointOptions{.monitor = "val_loss", .verbose = 1, .save_best_only = true});
/// model.fit(x, y, {.epochs = 20, .validation_split = 0.2, .callbacks = {checkpoint}});
/// \endcode
class ModelCheckpoint : public Callback {
 public:
  /// Throws `ConfigError` for a malformed template or spec, a file extension `save_model` or
  /// `save_weights` cannot write, or a mode other than auto, min or max.
  LOADSTAR_DECL explicit ModelCheckpoint(std::string filepath, ModelCheckpointOptions options = {});

  std::string class_name() const override { return "ModelCheckpoint"; }
  LOADSTAR_DECL nlohmann::json get_config() const override;
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  void on_epoch_begin(std::size_t epoch, const Logs&) override { current_epoch_ = epoch; }

  LOADSTAR_DECL void on_train_batch_end(std::size_t batch, const Logs& logs) override;

  void on_epoch_end(std::size_t epoch, const Logs& logs) override {
    if (options_.save_freq.epoch()) save(epoch, std::nullopt, logs);
  }

  /// `{"best", "batches_since_last_save", "last_batch_seen", "epoch"}`.
  LOADSTAR_DECL nlohmann::json get_state() const override;
  LOADSTAR_DECL void load_state(const nlohmann::json& state) override;

  /// The best value of `monitor` so far (the threshold, or an infinity, before the first save).
  double best() const noexcept { return best_; }
  /// The file written last (empty before the first save).
  const std::filesystem::path& last_saved() const noexcept { return last_saved_; }
  /// The path of a save at `epoch` (0-based) and `batch` (0-based; none at an epoch's end) with
  /// `logs`, as `filepath` formats it; throws `ConfigError` for a field not among them.
  LOADSTAR_DECL std::filesystem::path file_path(std::size_t epoch, std::optional<std::size_t> batch,
                                                const Logs& logs) const;

 private:
  LOADSTAR_DECL void save(std::size_t epoch, std::optional<std::size_t> batch, const Logs& logs);

  /// Python's `f"{value:.5f}"` (`inf`, `-inf`, `nan` for the non-finite).
  LOADSTAR_DECL static std::string fixed5(double value);

  detail::PythonFormat filepath_;
  ModelCheckpointOptions options_;
  bool maximize_ = false;
  double best_ = 0.0;
  detail::BatchCounter counter_;
  std::size_t current_epoch_ = 0;
  std::filesystem::path last_saved_;
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

ModelCheckpoint::ModelCheckpoint(std::string filepath, ModelCheckpointOptions options)
    : filepath_("model checkpoint", std::move(filepath)), options_(std::move(options)) {
  const auto& m = options_.mode;
  if (m != "auto" && m != "min" && m != "max") {
    throw ConfigError("model checkpoint: mode must be 'auto', 'min' or 'max' but is '" + m + "'");
  }
  const auto ends = [&](std::string_view suffix) {
    const std::string& path = filepath_.text();
    return path.size() >= suffix.size() &&
           path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  if (!ends(".h5") && !ends(".hdf5") && (options_.save_weights_only || !ends(".keras"))) {
    throw ConfigError("model checkpoint: file path template '" + filepath_.text() +
                      "' should end in " +
                      (options_.save_weights_only ? "'.h5', '.hdf5' or '.weights.h5'"
                                                  : "'.h5', '.hdf5' or '.keras'"));
  }
  // tf.keras 2.x: `'acc' in monitor or monitor.startswith('fmeasure')` maximises.
  maximize_ = m == "max" || (m == "auto" && (options_.monitor.find("acc") != std::string::npos ||
                                             options_.monitor.rfind("fmeasure", 0) == 0));
  best_ = options_.initial_value_threshold.value_or(maximize_
                                                        ? -std::numeric_limits<double>::infinity()
                                                        : std::numeric_limits<double>::infinity());
}

nlohmann::json ModelCheckpoint::get_config() const {
  return {{"filepath", filepath_.text()},
          {"monitor", options_.monitor},
          {"verbose", options_.verbose},
          {"save_best_only", options_.save_best_only},
          {"save_weights_only", options_.save_weights_only},
          {"mode", options_.mode},
          {"save_freq", options_.save_freq.to_json()},
          {"initial_value_threshold", options_.initial_value_threshold
                                          ? nlohmann::json(*options_.initial_value_threshold)
                                          : nullptr}};
}

std::shared_ptr<Callback> ModelCheckpoint::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "ModelCheckpoint");
  read.expect("period", 1, "use save_freq");
  return std::make_shared<ModelCheckpoint>(
      read.get<std::string>("filepath"),
      ModelCheckpointOptions{
          .monitor = read.get("monitor", "val_loss"),
          .verbose = read.get("verbose", 0),
          .save_best_only = read.get("save_best_only", false),
          .save_weights_only = read.get("save_weights_only", false),
          .mode = detail::config_mode(read),
          .save_freq = detail::config_save_freq(read),
          .initial_value_threshold = read.optional<double>("initial_value_threshold")});
}

void ModelCheckpoint::on_train_batch_end(std::size_t batch, const Logs& logs) {
  if (options_.save_freq.epoch()) return;
  if (counter_.should_save(batch, options_.save_freq.batches())) {
    save(current_epoch_, batch, logs);
  }
}

nlohmann::json ModelCheckpoint::get_state() const {
  return {{"best", best_},
          {"batches_since_last_save", counter_.since_last_save},
          {"last_batch_seen", counter_.last_batch_seen},
          {"epoch", current_epoch_}};
}

void ModelCheckpoint::load_state(const nlohmann::json& state) {
  const detail::StateReader read("model checkpoint", state);
  best_ = read.get<double>("best");
  counter_.since_last_save = read.get<std::size_t>("batches_since_last_save");
  counter_.last_batch_seen = read.get<std::size_t>("last_batch_seen");
  current_epoch_ = read.get<std::size_t>("epoch");
}

std::filesystem::path ModelCheckpoint::file_path(std::size_t epoch,
                                                 std::optional<std::size_t> batch,
                                                 const Logs& logs) const {
  std::map<std::string, detail::FormatValue, std::less<>> values;
  for (const auto& [name, value] : logs)
    values.emplace(name, value);
  // Keras: `filepath.format(epoch=epoch + 1, **logs)`, with `batch=batch + 1` when saving at
  // a batch whose logs have no `batch`.
  values.insert_or_assign("epoch", static_cast<std::int64_t>(epoch + 1));
  if (batch && !logs.contains("batch")) {
    values.insert_or_assign("batch", static_cast<std::int64_t>(*batch + 1));
  }
  return filepath_(values);
}

void ModelCheckpoint::save(std::size_t epoch, std::optional<std::size_t> batch, const Logs& logs) {
  const std::filesystem::path path = file_path(epoch, batch, logs);
  const std::string label = std::to_string(epoch + 1);
  if (options_.save_best_only) {
    const auto current = logs.get(options_.monitor);
    if (!current) {
      out() << "Can save best model only with " << options_.monitor << " available, skipping.\n";
      return;
    }
    if (!(maximize_ ? *current > best_ : *current < best_)) {
      if (options_.verbose > 0) {
        out() << "\nEpoch " << label << ": " << options_.monitor << " did not improve from "
              << fixed5(best_) << "\n";
      }
      return;
    }
    if (options_.verbose > 0) {
      out() << "\nEpoch " << label << ": " << options_.monitor << " improved from " << fixed5(best_)
            << " to " << fixed5(*current) << ", saving model to " << path.string() << "\n";
    }
    best_ = *current;
  } else if (options_.verbose > 0) {
    out() << "\nEpoch " << label << ": saving model to " << path.string() << "\n";
  }
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  if (options_.save_weights_only) {
    save_weights(model(), path);
  } else {
    save_model(model(), path, SaveOptions{.include_optimizer = true, .overwrite = true});
  }
  last_saved_ = path;
}

std::string ModelCheckpoint::fixed5(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.5f", value);
  return buffer;
}

}  // namespace loadstar::keras::callbacks
#endif
