/// \file
/// A trial's TensorBoard event files (`<trial folder>/tensorboard/`), as Determined writes them.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/tensorboard/event_writer.hpp"
#include "loadstar/trial/plot.hpp"

namespace loadstar::trial::detail {

/// The TensorBoard side of `metrics.jsonl`: every training and validation line of the trial as
/// scalars, named and stepped as Determined's `BatchMetricWriter` names them
/// (harness/determined/tensorboard/metric_writers/batch_metric_writer.py): tag
/// `Determined/<metric>`, validation metrics prefixed `val_` unless they begin with `val`, the step
/// being the batches trained when the line was written. The hyperparameters go through the
/// hparams plugin. Each run of the trial (a first start or a resume) begins a new event file; a
/// resumed one begins with a `SessionLog` START at the resumed batches, so that TensorBoard drops
/// what the earlier files hold from there on (what the metrics file lost when it was cut back to
/// the checkpoint), and then repeats the metrics file's lines at those batches, so that the
/// folder reads as an uninterrupted run's.
class TrialTensorBoard {
 public:
  explicit TrialTensorBoard(std::filesystem::path folder) : folder_(std::move(folder)) {}

  /// The folder of the event files.
  const std::filesystem::path& folder() const noexcept { return folder_; }

  /// Begins this run's event file at `batches` (0 for a first start), after `metrics_file` was cut
  /// back to them; writes the hparams plugin's experiment summary and session start for
  /// `hparams` (whose metric is `searcher_metric`).
  void open(std::uint64_t batches, const std::filesystem::path& metrics_file,
            const nlohmann::json& hparams, const std::string& searcher_metric) {
    const bool resumed = has_event_files();
    writer_ = std::make_unique<tensorboard::EventWriter>(folder_);
    const auto step = static_cast<std::int64_t>(batches);
    if (resumed) writer_->add_session_start(step);
    const double now = tensorboard::EventWriter::wall_time();
    const tensorboard::HParamsMetric metric{.tag = validation_tag(searcher_metric),
                                            .validation = true};
    writer_->add_hparams_config(hparams, {&metric, 1}, now);
    writer_->add_hparams(hparams, "", now);
    if (!resumed || !std::filesystem::exists(metrics_file)) return;
    // The lines the START dropped from the earlier files and the metrics file kept.
    for (const MetricsRecord& line : read_metrics(metrics_file)) {
      if (line.batches < batches) continue;
      for (const auto& [name, value] : line.metrics)
        write(line.kind == "validation", name, value, line.batches);
    }
  }

  /// A training workload's metrics at `batches`.
  void training(std::uint64_t batches, const keras::Logs& logs) {
    for (const auto& [name, value] : logs)
      write(false, name, value, batches);
  }

  /// A validation's metrics at `batches`.
  void validation(std::uint64_t batches, const keras::Logs& logs) {
    for (const auto& [name, value] : logs)
      write(true, name, value, batches);
  }

  /// Determined's tag of a validation metric.
  static std::string validation_tag(const std::string& name) {
    return "Determined/" + (name.rfind("val", 0) == 0 ? name : "val_" + name);
  }

 private:
  bool has_event_files() const {
    std::error_code error;
    if (!std::filesystem::is_directory(folder_, error)) return false;
    for (const auto& entry : std::filesystem::directory_iterator(folder_, error)) {
      if (entry.path().filename().string().rfind("events.out.tfevents.", 0) == 0) return true;
    }
    return false;
  }

  void write(bool validation, const std::string& name, double value, std::uint64_t batches) {
    if (!writer_) return;
    writer_->add_scalar(validation ? validation_tag(name) : "Determined/" + name, value,
                        static_cast<std::int64_t>(batches));
  }

  std::filesystem::path folder_;
  std::unique_ptr<tensorboard::EventWriter> writer_;
};

}  // namespace loadstar::trial::detail
