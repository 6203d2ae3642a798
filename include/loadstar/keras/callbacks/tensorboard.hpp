/// \file
/// `TensorBoard`: Keras's callback that writes TensorBoard event files during `fit`. Not part of
/// `<loadstar/keras/callbacks.hpp>`: it needs Debian's protobuf library (link `loadstar-trial`, or
/// `protobuf` and `libprotoc`).
#pragma once

#include "loadstar/config.hpp"

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/tensorboard/event_writer.hpp"

namespace loadstar::keras::callbacks {

/// Keras's `update_freq`: `"epoch"`, `"batch"` (every batch) or a number of batches.
class UpdateFreq {
 public:
  UpdateFreq(const char* text) : UpdateFreq(std::string(text)) {}
  UpdateFreq(std::string text) : text_(std::move(text)) {
    if (text_ == "batch") batches_ = 1;
  }
  template <std::integral T>
  UpdateFreq(T batches)
      : text_(std::to_string(batches)), batches_(static_cast<long long>(batches)) {}

  /// The batches between two batch-level writes; none for `"epoch"`.
  std::optional<long long> batches() const { return text_ == "epoch" ? std::nullopt : batches_; }
  /// As given: `"epoch"`, `"batch"` or the number.
  const std::string& text() const noexcept { return text_; }

 private:
  std::string text_;
  std::optional<long long> batches_;
};

/// `TensorBoard`'s Keras arguments, with Keras's defaults.
struct TensorBoardOptions {
  std::filesystem::path log_dir = "logs";
  /// Weight histograms every this many epochs (0: none).
  std::size_t histogram_freq = 0;
  /// The model's Keras config for TensorBoard's graph dashboard (the conceptual graph).
  bool write_graph = true;
  /// Weights as images: not available, must stay false.
  bool write_images = false;
  /// Training steps per second as a scalar, per epoch (and per batch with a batch `update_freq`).
  bool write_steps_per_second = false;
  UpdateFreq update_freq = "epoch";
  /// Batches to profile: not available, must stay 0.
  std::size_t profile_batch = 0;
  /// Embedding projections every this many epochs: not available, must stay 0.
  std::size_t embeddings_freq = 0;
  /// Metadata of the embedding projections: not available, must stay unset.
  std::optional<std::string> embeddings_metadata = std::nullopt;
};

/// Keras 3's `TensorBoard` (keras/src/callbacks/tensorboard.py): event files in
/// `log_dir/train` and `log_dir/validation`, begun when first written to in each `fit`. At each
/// epoch's end the training logs (and the learning rate) as `epoch_<name>` in `train` and the
/// `val_` logs, without the prefix, as `epoch_<name>` in `validation`, at step `epoch`; with a
/// batch `update_freq` of N, `batch_<name>` every N-th batch at the batch's count since the
/// start of `fit` (1 for the first); after each evaluation, `evaluation_<name>_vs_iterations` in
/// `validation` at the optimizer's iterations. `histogram_freq` writes a histogram of every
/// weight, `<layer>/<weight>/histogram` (Keras 3's weight path; Keras 3 itself uses the bare
/// weight name, which repeats across layers), in `train`. `write_graph` writes the model's Keras
/// config as Keras's `keras_model_summary` does (tag `keras`, plugin `graph_keras_model`) when
/// training begins (Keras writes it when the model is set, from `evaluate` and `predict` too).
/// `write_images`, `profile_batch`, `embeddings_freq` and `embeddings_metadata` throw
/// `ConfigError` unless left at their defaults.
/// \code
/// auto board = std::make_shared<TensorBoard>(TensorBoardOptions{.log_dir = "logs/run1",
///                                                                .histogram_freq = 1});
/// model.fit(x, y, {.epochs = 5, .validation_split = 0.2, .callbacks = {board}});
/// // tensorboard --logdir logs
/// \endcode
class TensorBoard : public Callback {
 public:
  explicit TensorBoard(TensorBoardOptions options = {}) : options_(std::move(options)) {
    const auto refuse = [](const std::string& option, const std::string& expected,
                           const std::string& found) {
      throw ConfigError("callback (TensorBoard): " + option + ": expected " + expected +
                        " but found " + found);
    };
    if (options_.log_dir.empty()) refuse("log_dir", "a folder", "an empty path");
    const auto freq = options_.update_freq.batches();
    if (options_.update_freq.text() != "epoch" && (!freq || *freq < 1)) {
      refuse("update_freq", "\"epoch\", \"batch\" or a positive number of batches",
             "'" + options_.update_freq.text() + "'");
    }
    if (options_.write_images) {
      refuse("write_images", "false (loadstar writes no weight images)", "true");
    }
    if (options_.profile_batch != 0) {
      refuse("profile_batch", "0 (loadstar has no profiler to trace batches with)",
             std::to_string(options_.profile_batch));
    }
    if (options_.embeddings_freq != 0) {
      refuse("embeddings_freq", "0 (loadstar writes no embedding projector checkpoints)",
             std::to_string(options_.embeddings_freq));
    }
    if (options_.embeddings_metadata) {
      refuse("embeddings_metadata", "no value (loadstar writes no embedding projector checkpoints)",
             "'" + *options_.embeddings_metadata + "'");
    }
  }

  std::string class_name() const override { return "TensorBoard"; }
  nlohmann::json get_config() const override {
    const auto freq = options_.update_freq.batches();
    return {{"log_dir", options_.log_dir.string()},
            {"histogram_freq", options_.histogram_freq},
            {"write_graph", options_.write_graph},
            {"write_images", options_.write_images},
            {"write_steps_per_second", options_.write_steps_per_second},
            {"update_freq",
             options_.update_freq.text() == "epoch" || options_.update_freq.text() == "batch"
                 ? nlohmann::json(options_.update_freq.text())
                 : nlohmann::json(*freq)},
            {"profile_batch", options_.profile_batch},
            {"embeddings_freq", options_.embeddings_freq},
            {"embeddings_metadata", nullptr}};
  }

  /// As Keras's `set_model`: the next writes begin new event files.
  void set_model(Model& model) override {
    Callback::set_model(model);
    train_.reset();
    validation_.reset();
  }

  void on_train_begin(const Logs&) override {
    global_train_batch_ = 0;
    if (options_.write_graph) {
      try {
        train().add_text_tensor("keras", model().to_json(), "graph_keras_model", "1", 0);
      } catch (const Error& e) {
        // Keras's keras_model_summary: a model that cannot be serialized writes no graph.
        out() << "TensorBoard: model failed to serialize as JSON, no graph written: " << e.what()
              << "\n";
      }
    }
  }

  void on_train_end(const Logs&) override {
    train_.reset();
    validation_.reset();
  }

  void on_epoch_begin(std::size_t, const Logs&) override {
    if (!options_.write_steps_per_second) return;
    epoch_iterations_ = model().compiled() ? model().optimizer().iterations() : 0;
    epoch_start_ = std::chrono::steady_clock::now();
  }

  void on_train_batch_begin(std::size_t, const Logs&) override {
    ++global_train_batch_;
    if (options_.write_steps_per_second) batch_start_ = std::chrono::steady_clock::now();
  }

  void on_train_batch_end(std::size_t, const Logs& logs) override {
    const auto freq = options_.update_freq.batches();
    if (!freq || global_train_batch_ % *freq != 0) return;
    const auto step = static_cast<std::int64_t>(global_train_batch_);
    if (options_.write_steps_per_second) {
      const std::chrono::duration<double> run = std::chrono::steady_clock::now() - batch_start_;
      train().add_scalar("batch_steps_per_second", 1.0 / run.count(), step);
    }
    for (const auto& [name, value] : logs)
      train().add_scalar("batch_" + name, value, step);
  }

  void on_test_end(const Logs& logs) override {
    if (!model().compiled()) return;
    const auto step = model().optimizer().iterations();
    for (const auto& [name, value] : logs)
      validation().add_scalar("evaluation_" + name + "_vs_iterations", value, step);
  }

  void on_epoch_end(std::size_t epoch, const Logs& logs) override {
    const auto step = static_cast<std::int64_t>(epoch);
    bool any = false;
    for (const auto& [name, value] : logs) {
      any = true;
      if (name.rfind("val_", 0) == 0) {
        validation().add_scalar("epoch_" + name.substr(4), value, step);
      } else if (name != "learning_rate") {
        train().add_scalar("epoch_" + name, value, step);
      }
    }
    if (any && model().compiled()) {
      train().add_scalar("epoch_learning_rate", model().optimizer().learning_rate(), step);
      if (options_.write_steps_per_second) {
        const std::chrono::duration<double> since = std::chrono::steady_clock::now() - epoch_start_;
        const auto steps = model().optimizer().iterations() - epoch_iterations_;
        train().add_scalar("epoch_steps_per_second", static_cast<double>(steps) / since.count(),
                           step);
      }
    }
    if (options_.histogram_freq != 0 && epoch % options_.histogram_freq == 0) log_weights(step);
  }

  /// The options, as given.
  const TensorBoardOptions& options() const noexcept { return options_; }

 private:
  tensorboard::EventWriter& train() {
    if (!train_) train_ = std::make_unique<tensorboard::EventWriter>(options_.log_dir / "train");
    return *train_;
  }
  tensorboard::EventWriter& validation() {
    if (!validation_) {
      validation_ = std::make_unique<tensorboard::EventWriter>(options_.log_dir / "validation");
    }
    return *validation_;
  }

  void log_weights(std::int64_t step) {
    const auto weights = model().get_weights();  // host copies, layer by layer in Keras's order
    std::size_t index = 0;
    for (const auto& layer : model().layers()) {
      for (const auto& weight : layer->weights()) {
        const auto& value = weights.at(index++);
        train().add_histogram(layer->name() + "/" + weight.name + "/histogram",
                              std::span<const float>(value.data(), value.size()), step);
      }
    }
  }

  TensorBoardOptions options_;
  std::unique_ptr<tensorboard::EventWriter> train_;
  std::unique_ptr<tensorboard::EventWriter> validation_;
  std::uint64_t global_train_batch_ = 0;
  std::int64_t epoch_iterations_ = 0;
  std::chrono::steady_clock::time_point epoch_start_{};
  std::chrono::steady_clock::time_point batch_start_{};
};

}  // namespace loadstar::keras::callbacks
