/// \file
/// `RunningMetrics`: the loss means and metric objects of one purpose (training, or evaluation),
/// as Keras's `compile_utils.LossesContainer` and `MetricsContainer`.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/metrics/metric.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The running loss and metrics of training or of evaluation. A model keeps two, so that an
/// evaluation (a validation inside `fit`, or `evaluate` called from a callback) never touches the
/// training metrics.
///
/// As in Keras, the loss means are weighted by the batch size, the metrics given to `compile` in
/// `metrics` are unweighted, and those in `weighted_metrics` receive the sample weights (and the
/// weights `class_weight` gives). Their state (sums and counts, never a `result()` alone) can be
/// checkpointed and, for sums, merged across ranks.
class RunningMetrics {
 public:
  /// The metric objects of every output: unweighted, then weighted.
  std::vector<std::vector<std::shared_ptr<Metric>>> metrics, weighted;

  /// Whether the metric objects exist (they are made on the first batch, when the shapes that
  /// pick Keras's accuracy are known).
  bool created() const noexcept { return created_; }
  /// Marks the metric objects made; a state restored before then is applied now.
  LOADSTAR_DECL void set_created();

  /// Forgets every batch, and a restored state not applied yet.
  LOADSTAR_DECL void reset();

  /// Accumulates one batch of `rows` rows: its total loss, the loss of each output, and the
  /// metrics of each output from its targets and predictions (through `backend`) (`weights` only
  /// for the weighted metrics). Losses a device may still be computing are kept, in order, and
  /// added when the logs or the state are read (the same sums, bit for bit). For an output with
  /// a mask, `masks[o]` holds its weights per value (the mask) and `masked_weights[o]` the mask
  /// times `weights` (empty without sample weights), which the metrics that apply masks take
  /// instead (Keras 3's `MeanMetricWrapper`); empty spans or tensors where there is none.
  LOADSTAR_DECL void update(Backend& backend, const Deferred<double>& total,
                            std::span<const Deferred<double>> output_losses, std::size_t rows,
                            std::span<const Tensor<float>> targets,
                            std::span<const Tensor<float>> outputs, const Tensor<float>* weights,
                            std::span<const Tensor<float>> masks = {},
                            std::span<const Tensor<float>> masked_weights = {});

  /// Writes `loss`, `<output>_loss` for several outputs, then the metrics, into `logs` (waits
  /// for what a device may still be computing).
  LOADSTAR_DECL void fill(Logs& logs, std::span<const std::string> output_names);

  /// Whether some batch's loss or metric may still be computed on a device, so that `fill` and
  /// `state` may wait for it.
  LOADSTAR_DECL bool pending() const noexcept;

  /// The rows seen since the last `reset`.
  double rows() const noexcept { return rows_; }

  /// The state a checkpoint keeps: `{"loss_sum", "rows", "output_loss_sums", "metrics": [...]}`,
  /// the metrics' own states in `metrics_names` order (unweighted, then weighted, by output).
  LOADSTAR_DECL nlohmann::json state();

  /// Restores `state()`; throws `CheckpointError` when it does not fit these metrics.
  LOADSTAR_DECL void restore(const nlohmann::json& state);

  /// The names of the metrics in log order.
  LOADSTAR_DECL std::vector<std::string> names() const;

 private:
  /// Every metric in Keras's order: for each output, its metrics, then its weighted metrics.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t o = 0; o < std::max(metrics.size(), weighted.size()); ++o) {
      if (o < metrics.size()) {
        for (const auto& metric : metrics[o])
          f(*metric);
      }
      if (o < weighted.size()) {
        for (const auto& metric : weighted[o])
          f(*metric);
      }
    }
  }

  /// A batch whose losses a device may still be computing.
  struct PendingBatch {
    Deferred<double> total;
    std::vector<Deferred<double>> output_losses;
    double rows = 0.0;
    std::size_t batch = 0;  // counted from 0 since the last reset
  };
  /// Adds a batch's losses to the sums.
  LOADSTAR_DECL void add_losses(double total, std::span<const Deferred<double>> output_losses,
                                double rows);
  /// Adds the pending batches' losses, in order (waits for the device).
  LOADSTAR_DECL void settle();

  std::vector<PendingBatch> pending_batches_;
  std::size_t batches_ = 0;  // updates since the last reset
  double loss_sum_ = 0.0;
  double rows_ = 0.0;
  std::vector<double> output_loss_sums_;
  std::vector<std::string> loss_names_;
  bool created_ = false;
  std::optional<nlohmann::json> pending_;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RunningMetrics::set_created() {
  created_ = true;
  if (pending_) restore(*std::exchange(pending_, std::nullopt));
}

void RunningMetrics::reset() {
  pending_.reset();
  pending_batches_.clear();
  batches_ = 0;
  loss_sum_ = 0.0;
  rows_ = 0.0;
  std::fill(output_loss_sums_.begin(), output_loss_sums_.end(), 0.0);
  for_each([](Metric& m) { m.reset_state(); });
}

void RunningMetrics::update(Backend& backend, const Deferred<double>& total,
                            std::span<const Deferred<double>> output_losses, std::size_t rows,
                            std::span<const Tensor<float>> targets,
                            std::span<const Tensor<float>> outputs, const Tensor<float>* weights,
                            std::span<const Tensor<float>> masks,
                            std::span<const Tensor<float>> masked_weights) {
  const auto n = static_cast<double>(rows);
  const bool known = pending_batches_.empty() && total.ready() &&
                     std::all_of(output_losses.begin(), output_losses.end(),
                                 [](const Deferred<double>& v) { return v.ready(); });
  if (known) {
    add_losses(total.get(), output_losses, n);
  } else {
    pending_batches_.push_back(
        {total, std::vector<Deferred<double>>(output_losses.begin(), output_losses.end()), n,
         batches_});
  }
  ++batches_;
  rows_ += n;
  const auto masked = [&](std::size_t o, const std::shared_ptr<Metric>& metric) {
    return o < masks.size() && !masks[o].empty() && metric->applies_masks();
  };
  for (std::size_t o = 0; o < metrics.size(); ++o) {
    for (auto& metric : metrics[o])
      metric->update_state(backend, targets[o], outputs[o],
                           masked(o, metric) ? &masks[o] : nullptr);
  }
  for (std::size_t o = 0; o < weighted.size(); ++o) {
    for (auto& metric : weighted[o]) {
      const Tensor<float>* w = weights;
      if (masked(o, metric)) w = weights == nullptr ? &masks[o] : &masked_weights[o];
      metric->update_state(backend, targets[o], outputs[o], w);
    }
  }
}

void RunningMetrics::add_losses(double total, std::span<const Deferred<double>> output_losses,
                                double rows) {
  loss_sum_ += total * rows;
  output_loss_sums_.resize(output_losses.size(), 0.0);
  for (std::size_t o = 0; o < output_losses.size(); ++o)
    output_loss_sums_[o] += output_losses[o].get() * rows;
}

void RunningMetrics::settle() {
  // A batch whose value throws stays pending (with those after it), so that every later read
  // reports it again.
  std::size_t done = 0;
  try {
    for (; done < pending_batches_.size(); ++done) {
      const PendingBatch& batch = pending_batches_[done];
      const double total = batch.total.get();
      for (const auto& value : batch.output_losses)
        static_cast<void>(value.get());
      add_losses(total, batch.output_losses, batch.rows);
    }
  } catch (const ConfigError& e) {
    // Found by a device after its step returned: say which batch it was.
    const std::size_t batch = pending_batches_[done].batch;
    pending_batches_.erase(pending_batches_.begin(),
                           pending_batches_.begin() + static_cast<std::ptrdiff_t>(done));
    throw ConfigError("batch " + std::to_string(batch) +
                      " since the metrics were reset (its loss was computed on the device and "
                      "read after its step; rows counted within the batch): " +
                      e.what());
  } catch (...) {
    pending_batches_.erase(pending_batches_.begin(),
                           pending_batches_.begin() + static_cast<std::ptrdiff_t>(done));
    throw;
  }
  pending_batches_.clear();
}

bool RunningMetrics::pending() const noexcept {
  bool any = !pending_batches_.empty();
  for_each([&](const Metric& m) { any = any || m.pending(); });
  return any;
}

void RunningMetrics::fill(Logs& logs, std::span<const std::string> output_names) {
  settle();
  const double rows = std::max(rows_, 1.0);
  logs.set("loss", loss_sum_ / rows);
  if (output_names.size() > 1) {
    loss_names_.resize(output_names.size());
    for (std::size_t o = 0; o < output_names.size(); ++o) {
      if (loss_names_[o].empty()) loss_names_[o] = output_names[o] + "_loss";
      logs.set(loss_names_[o], o < output_loss_sums_.size() ? output_loss_sums_[o] / rows : 0.0);
    }
  }
  for_each([&](Metric& m) { logs.set(m.name(), m.result()); });
}

nlohmann::json RunningMetrics::state() {
  settle();
  nlohmann::json metric_states = nlohmann::json::array();
  for_each([&](const Metric& m) { metric_states.push_back(m.get_state()); });
  return {{"loss_sum", loss_sum_},
          {"rows", rows_},
          {"output_loss_sums", output_loss_sums_},
          {"metrics", std::move(metric_states)}};
}

void RunningMetrics::restore(const nlohmann::json& state) {
  if (!created_) {
    pending_ = state;  // applied once the first batch has made the metric objects
    return;
  }
  const loadstar::detail::StateReader read("running metrics", state);
  pending_batches_.clear();
  loss_sum_ = read.get<double>("loss_sum");
  rows_ = read.get<double>("rows");
  output_loss_sums_ = read.get<std::vector<double>>("output_loss_sums");
  const auto states = read.get<nlohmann::json>("metrics");
  std::size_t count = 0;
  for_each([&](const Metric&) { ++count; });
  if (!states.is_array() || states.size() != count) {
    throw CheckpointError("running metrics state: expected the states of " + std::to_string(count) +
                          " metrics but found " + loadstar::detail::shown(states));
  }
  std::size_t i = 0;
  for_each([&](Metric& m) { m.set_state(states[i++]); });
}

std::vector<std::string> RunningMetrics::names() const {
  std::vector<std::string> out;
  for_each([&](const Metric& m) { out.push_back(m.name()); });
  return out;
}

}  // namespace loadstar::keras
#endif
