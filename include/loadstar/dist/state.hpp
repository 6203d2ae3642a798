/// \file
/// Keeping ranks alike: the model's weights and the optimizer's state broadcast from one rank
/// (Horovod's `BroadcastGlobalVariablesCallback`, done before the first step rather than after
/// it), and running metrics merged across ranks into the exact global values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/dist/collective.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/running_metrics.hpp"

namespace loadstar::dist {

namespace detail {

inline std::span<std::byte> bytes_of(Tensor<float>& t) {
  return {reinterpret_cast<std::byte*>(t.data()), t.size() * sizeof(float)};
}

/// Every number of `state`, depth first (object members in key order, which `nlohmann::json`
/// keeps sorted), into `out`; or, with `in`, back from it.
inline void flatten(nlohmann::json& state, std::vector<double>& out, const double* in,
                    std::size_t& at) {
  if (state.is_number()) {
    if (in) {
      state = in[at];
    } else {
      out.push_back(state.get<double>());
    }
    ++at;
  } else if (state.is_array() || state.is_object()) {
    for (auto& member : state)
      flatten(member, out, in, at);
  }
}

}  // namespace detail

/// Copies the weights of `model`, the slots and iteration count of its optimizer (built first
/// if it was not) from rank `root` to every rank, so that all ranks start from the same state:
/// after building a model (initial weights drawn differently) and after loading a checkpoint.
/// Throws `DistributedError` when the ranks' models differ in shape.
inline void broadcast_state(keras::Model& model, Collective& collective, int root = 0) {
  if (collective.size() == 1) return;
  std::vector<Tensor<float>> weights = model.get_weights();
  detail::ShapeFingerprint shapes;
  for (const auto& w : weights)
    shapes.add(w.shape());
  collective.require_same(weights.size(), "the number of weights of model '" + model.name() + "'");
  collective.require_same(shapes.value(),
                          "the shapes of the weights of model '" + model.name() + "'");
  for (auto& w : weights)
    collective.broadcast(detail::bytes_of(w), root);
  model.set_weights(weights);
  if (!model.compiled()) return;
  auto& optimizer = model.optimizer();
  if (!optimizer.built()) optimizer.build(model.trainable_variables());
  auto slots = optimizer.variables();
  collective.require_same(slots.size(), "the number of optimizer slots");
  for (auto& slot : slots) {
    if (!slot.value.is_host()) {
      throw DeviceError("broadcast_state: optimizer slot '" + slot.name + "' is in " +
                        slot.value.device().str() + " memory; the collectives take host memory");
    }
    collective.broadcast(detail::bytes_of(slot.value), root);
  }
  std::int64_t iterations = optimizer.iterations();
  collective.broadcast({reinterpret_cast<std::byte*>(&iterations), sizeof iterations}, root);
  optimizer.set_iterations(iterations);
}

/// Merges `metrics` across ranks: every sum and count of its state (the loss sums, the rows, each
/// metric's accumulators) is summed over the ranks, so that every rank then holds the exact
/// metrics of all ranks' rows together, not a mean of per-rank means. Metrics whose state is not
/// sums and counts (a user's metric that keeps a running mean) must not be merged this way.
inline void merge_metrics(keras::RunningMetrics& metrics, Collective& collective) {
  if (collective.size() == 1) return;
  nlohmann::json state = metrics.state();
  std::vector<double> values;
  std::size_t at = 0;
  detail::flatten(state, values, nullptr, at);
  collective.require_same(values.size(), "the size of the metrics state");
  collective.allreduce_sum(std::span<double>(values));
  at = 0;
  detail::flatten(state, values, values.data(), at);
  metrics.restore(state);
}

/// The logs of `metrics` merged across ranks, leaving `metrics` as it was on this rank.
inline keras::Logs merged_logs(keras::Model& model, keras::RunningMetrics& metrics,
                               Collective& collective) {
  keras::Logs logs;
  if (collective.size() == 1 || !metrics.created()) {
    metrics.fill(logs, model.output_names());
    return logs;
  }
  const nlohmann::json local = metrics.state();
  merge_metrics(metrics, collective);
  metrics.fill(logs, model.output_names());
  metrics.restore(local);
  return logs;
}

}  // namespace loadstar::dist
