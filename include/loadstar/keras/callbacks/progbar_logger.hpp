/// \file
/// `ProgbarLogger`: Keras's progress bar, with steps, ETA and running metrics.
#pragma once

#include "loadstar/config.hpp"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include "loadstar/keras/callbacks/callback.hpp"

namespace loadstar::keras::callbacks {

/// Prints training progress as Keras's `ProgbarLogger` (keras/utils/generic_utils.py `Progbar`):
///
/// ```
/// Epoch 1/5
/// 1688/1688 [==============================] - 3s 2ms/step - loss: 0.4963 - accuracy: 0.8251 -
/// val_loss: 0.4012 - val_accuracy: 0.8547
/// ```
///
/// With `verbose = 1` on a terminal the bar is redrawn in place (at most every 50 ms) with an
/// ETA; when the output is not a terminal (a log file, a pipe) only the final line of each epoch
/// is printed. `verbose = 2` prints one line per epoch without the bar. `fit`, `evaluate` and
/// `predict` add one when their `verbose` is not 0; validation inside `fit` prints no bar, as in
/// Keras.
/// \code
/// std::ostringstream out;
/// model.fit(x, y, {.epochs = 2, .verbose = 0,
///                  .callbacks = {std::make_shared<ProgbarLogger>(2, out)}});
/// \endcode
class ProgbarLogger : public Callback {
 public:
  /// `verbose`: 1 for the bar, 2 for one line per epoch; writes to the stream `fit` was given
  /// (`FitOptions::output`, `std::cout` by default). `interactive`: whether to redraw in place;
  /// by default, whether the stream is `std::cout` and standard output is a terminal.
  explicit ProgbarLogger(int verbose = 1, std::optional<bool> interactive = std::nullopt)
      : verbose_(verbose), interactive_option_(interactive) {}
  /// A progress bar that writes to `out` whatever `fit` was given.
  ProgbarLogger(int verbose, std::ostream& out, std::optional<bool> interactive = std::nullopt)
      : verbose_(verbose), own_out_(&out), interactive_option_(interactive) {}

  std::string class_name() const override { return "ProgbarLogger"; }
  /// `{"count_mode": "steps", "verbose": 1}`; a logger built from a config prints to `std::cout`.
  nlohmann::json get_config() const override {
    return {{"count_mode", "steps"}, {"stateful_metrics", nullptr}, {"verbose", verbose_}};
  }
  /// The callback described by a config (`Registry<Callback>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<Callback> from_config(const nlohmann::json& config);

  LOADSTAR_DECL void set_params(const CallbackParams& params) override;

  void on_train_begin(const Logs&) override { in_fit_ = true; }
  void on_train_end(const Logs&) override { in_fit_ = false; }

  LOADSTAR_DECL void on_epoch_begin(std::size_t epoch, const Logs&) override;
  void on_train_batch_end(std::size_t batch, const Logs& logs) override {
    update(batch + 1, logs, false);
  }
  void on_epoch_end(std::size_t, const Logs& logs) override { update(seen_, logs, true); }

  void on_test_begin(const Logs&) override {
    if (!in_fit_) start(params_.steps);
  }
  void on_test_batch_end(std::size_t batch, const Logs& logs) override {
    if (!in_fit_) update(batch + 1, logs, false);
  }
  void on_test_end(const Logs& logs) override {
    if (!in_fit_) update(seen_, logs, true);
  }
  void on_predict_begin(const Logs&) override { start(params_.steps); }
  void on_predict_batch_end(std::size_t batch, const Logs&) override {
    update(batch + 1, Logs{}, false);
  }
  void on_predict_end(const Logs&) override { update(seen_, Logs{}, true); }

 private:
  using Clock = std::chrono::steady_clock;

  LOADSTAR_DECL void start(std::optional<std::size_t> target);

  LOADSTAR_DECL static std::string format(const char* pattern, double value);

  LOADSTAR_DECL static std::string per_step(double seconds);

  LOADSTAR_DECL static std::string values(const Logs& logs);

  LOADSTAR_DECL std::string counter(std::size_t current) const;

  LOADSTAR_DECL void update(std::size_t current, const Logs& logs, bool finalize);

  LOADSTAR_DECL std::string bar(std::size_t current) const;

  int verbose_;
  std::ostream* own_out_ = nullptr;
  std::ostream* out_ = &std::cout;
  std::optional<bool> interactive_option_;
  bool interactive_ = false;
  bool in_fit_ = false;
  CallbackParams params_;
  std::optional<std::size_t> target_;
  std::size_t seen_ = 0;
  std::size_t width_ = 0;
  Clock::time_point start_{};
  Clock::time_point last_update_{};
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

std::shared_ptr<Callback> ProgbarLogger::from_config(const nlohmann::json& config) {
  const auto read = detail::callback_config(config, "ProgbarLogger");
  read.expect("count_mode", "steps", "loadstar counts steps");
  const int verbose = read.get("verbose", 1);
  if (verbose != 1 && verbose != 2) read.fail("verbose", "1 or 2");
  return std::make_shared<ProgbarLogger>(verbose);
}

void ProgbarLogger::set_params(const CallbackParams& params) {
  Callback::set_params(params);
  params_ = params;
  out_ = own_out_ ? own_out_ : &out();
  interactive_ =
      interactive_option_ ? *interactive_option_ : (out_ == &std::cout && ::isatty(STDOUT_FILENO));
}

void ProgbarLogger::on_epoch_begin(std::size_t epoch, const Logs&) {
  if (verbose_ != 0 && params_.epochs > 1) {
    *out_ << "Epoch " << epoch + 1 << "/" << params_.epochs << "\n";
    out_->flush();
  }
  start(params_.steps);
}

void ProgbarLogger::start(std::optional<std::size_t> target) {
  target_ = target;
  seen_ = 0;
  width_ = 0;
  start_ = Clock::now();
  last_update_ = start_ - std::chrono::seconds(1);
}

std::string ProgbarLogger::format(const char* pattern, double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, pattern, value);
  return buffer;
}

std::string ProgbarLogger::per_step(double seconds) {
  if (seconds >= 1 || seconds == 0) return format(" %.0fs/step", seconds);
  if (seconds >= 1e-3) return format(" %.0fms/step", seconds * 1e3);
  return format(" %.0fus/step", seconds * 1e6);
}

std::string ProgbarLogger::values(const Logs& logs) {
  std::string info;
  for (const auto& [name, value] : logs) {
    info += " - " + name + ":";
    info += std::abs(value) > 1e-3 ? format(" %.4f", value) : format(" %.4e", value);
  }
  return info;
}

std::string ProgbarLogger::counter(std::size_t current) const {
  const std::size_t digits = target_ ? std::to_string(*target_).size() : 7;
  std::string count = std::to_string(current);
  if (count.size() < digits) count.insert(0, digits - count.size(), ' ');
  return target_ ? count + "/" + std::to_string(*target_) : count + "/Unknown";
}

void ProgbarLogger::update(std::size_t current, const Logs& logs, bool finalize) {
  seen_ = current;
  if (verbose_ == 0) return;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double per_unit = current > 0 ? elapsed / static_cast<double>(current) : 0.0;
  if (verbose_ == 2 || !interactive_) {
    if (!finalize) return;
    std::string line = counter(current);
    if (verbose_ == 1 && target_) line += " " + bar(current);
    line += format(" - %.0fs", elapsed) + per_step(per_unit) + values(logs);
    *out_ << line << "\n";
    out_->flush();
    return;
  }
  if (!finalize && now - last_update_ < std::chrono::milliseconds(50)) return;
  last_update_ = now;
  std::string line = counter(current) + (target_ ? " " + bar(current) : std::string());
  if (finalize || !target_) {
    line += format(" - %.0fs", elapsed) + per_step(per_unit);
  } else {
    const double eta = per_unit * static_cast<double>(*target_ - std::min(current, *target_));
    char buffer[64];
    const auto whole = static_cast<long long>(eta);
    if (eta > 3600) {
      std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", whole / 3600, (whole % 3600) / 60,
                    whole % 60);
    } else if (eta > 60) {
      std::snprintf(buffer, sizeof buffer, "%lld:%02lld", whole / 60, whole % 60);
    } else {
      std::snprintf(buffer, sizeof buffer, "%llds", whole);
    }
    line += std::string(" - ETA: ") + buffer;
  }
  line += values(logs);
  const std::size_t previous = width_;
  width_ = line.size();
  if (previous > width_) line += std::string(previous - width_, ' ');
  *out_ << "\r" << line;
  if (finalize) *out_ << "\n";
  out_->flush();
}

std::string ProgbarLogger::bar(std::size_t current) const {
  constexpr std::size_t width = 30;
  const std::size_t target = *target_;
  const std::size_t filled = target == 0 ? width : std::min(width, width * current / target);
  std::string bar = "[";
  if (filled > 0) {
    bar += std::string(filled - 1, '=');
    bar += current < target ? '>' : '=';
  }
  bar += std::string(width - filled, '.');
  return bar + "]";
}

}  // namespace loadstar::keras::callbacks
#endif
