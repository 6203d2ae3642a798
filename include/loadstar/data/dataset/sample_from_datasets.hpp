/// \file
/// `sample_from_datasets` and `choose_from_datasets`: several datasets mixed into one.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/element_seed.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {
inline nlohmann::json states_of(const auto& datasets) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& d : datasets)
    out.push_back(d.state());
  return out;
}
inline void restore_all(auto& datasets, const nlohmann::json& states, const char* op) {
  if (!states.is_array() || states.size() != datasets.size()) {
    throw CheckpointError(std::string(op) + ": state has " + std::to_string(states.size()) +
                          " datasets but there are " + std::to_string(datasets.size()));
  }
  for (std::size_t i = 0; i < datasets.size(); ++i)
    datasets[i].restore(states[i]);
}
}  // namespace detail

/// Elements drawn at random from `datasets`, dataset `i` with probability `weights[i]` (uniform
/// by default; normalised), as `tf.data.Dataset.sample_from_datasets`. Draw `k` of epoch `e`
/// depends on `(seed, k)` only, so every epoch draws the same sequence, unless
/// `rerandomize_each_iteration` (then on `(seed, e, k)`). When a drawn dataset is exhausted the
/// epoch ends if `stop_on_empty_dataset` (tf.data recommends it); otherwise (tf.data's default)
/// that dataset's weight is dropped and the draw repeated over the others, until all are exhausted.
/// The state is the draw count, the exhausted datasets and every dataset's state: O(datasets) to
/// restore. \code auto mixed = sample_from_datasets(std::vector{range(0, 3), range(100, 103)},
/// {0.5, 0.5}, 7); \endcode
template <Dataset D>
class SampleFromDatasets : public DatasetBase<SampleFromDatasets<D>> {
 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for no datasets, weights of another count, or a weight that is
  /// negative or not finite, or weights that are all 0.
  SampleFromDatasets(std::vector<D> datasets, std::vector<double> weights, std::uint64_t seed,
                     bool stop_on_empty_dataset, bool rerandomize_each_iteration)
      : datasets_(std::move(datasets)),
        weights_(std::move(weights)),
        seed_(seed),
        stop_on_empty_(stop_on_empty_dataset),
        rerandomize_(rerandomize_each_iteration) {
    if (datasets_.empty()) throw ConfigError("sample_from_datasets: datasets is empty");
    if (weights_.empty()) weights_.assign(datasets_.size(), 1.0);
    if (weights_.size() != datasets_.size()) {
      throw ConfigError("sample_from_datasets: weights has " + std::to_string(weights_.size()) +
                        " entries but there are " + std::to_string(datasets_.size()) + " datasets");
    }
    double total = 0;
    for (std::size_t i = 0; i < weights_.size(); ++i) {
      if (!std::isfinite(weights_[i]) || weights_[i] < 0) {
        throw ConfigError("sample_from_datasets: weights[" + std::to_string(i) +
                          "] must be finite and non-negative but is " +
                          std::to_string(weights_[i]));
      }
      total += weights_[i];
    }
    if (total <= 0) throw ConfigError("sample_from_datasets: the weights are all 0");
    exhausted_.assign(datasets_.size(), false);
  }

  std::optional<element_type> next() {
    while (!ended_) {
      double total = 0;
      for (std::size_t i = 0; i < weights_.size(); ++i)
        total += exhausted_[i] ? 0.0 : weights_[i];
      if (total <= 0) break;
      SplitMix64 rng(element_seed(seed_, rerandomize_ ? epoch_ : 0, draws_++));
      const double u = rng.uniform() * total;
      std::size_t pick = 0;
      double sum = 0;
      for (std::size_t i = 0; i < weights_.size(); ++i) {
        if (exhausted_[i] || weights_[i] <= 0) continue;
        pick = i;
        sum += weights_[i];
        if (u < sum) break;
      }
      if (auto element = datasets_[pick].next()) return element;
      exhausted_[pick] = true;
      if (stop_on_empty_) break;
    }
    ended_ = true;
    return std::nullopt;
  }
  void reset() {
    for (auto& d : datasets_)
      d.reset();
    exhausted_.assign(datasets_.size(), false);
    ++epoch_;
    draws_ = 0;
    ended_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "sample_from_datasets"},
            {"epoch", epoch_},
            {"draws", draws_},
            {"ended", ended_},
            {"exhausted", exhausted_},
            {"datasets", detail::states_of(datasets_)}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "sample_from_datasets");
    detail::restore_all(datasets_, s["datasets"], "sample_from_datasets");
    epoch_ = s["epoch"];
    draws_ = s["draws"];
    ended_ = s["ended"];
    exhausted_ = s["exhausted"].get<std::vector<bool>>();
    if (exhausted_.size() != datasets_.size()) {
      throw CheckpointError("sample_from_datasets: state marks " +
                            std::to_string(exhausted_.size()) + " datasets but there are " +
                            std::to_string(datasets_.size()));
    }
  }

 private:
  std::vector<D> datasets_;
  std::vector<double> weights_;
  std::uint64_t seed_;
  bool stop_on_empty_;
  bool rerandomize_;
  std::vector<bool> exhausted_;
  std::uint64_t epoch_ = 0;
  std::uint64_t draws_ = 0;
  bool ended_ = false;
};

/// Elements of `datasets` samples at random with `weights` (see `SampleFromDatasets`).
template <Dataset D>
SampleFromDatasets<D> sample_from_datasets(std::vector<D> datasets,
                                           std::vector<double> weights = {}, std::uint64_t seed = 0,
                                           bool stop_on_empty_dataset = false,
                                           bool rerandomize_each_iteration = false) {
  return SampleFromDatasets<D>(std::move(datasets), std::move(weights), seed, stop_on_empty_dataset,
                               rerandomize_each_iteration);
}

/// The element of `datasets[c]` for each element `c` of `choice_dataset`, as
/// `tf.data.Dataset.choose_from_datasets`: the epoch ends with `choice_dataset`, or, with
/// `stop_on_empty_dataset` (the default), as soon as a chosen dataset is exhausted; without it an
/// exhausted dataset's choices are skipped. A choice outside `[0, datasets.size())` throws
/// `ConfigError` when it is read. The state is every dataset's state and the choices'.
/// \code
/// auto abc = choose_from_datasets(std::vector{a, b, c}, range(3).repeat(3));
/// \endcode
template <Dataset D, Dataset C>
class ChooseFromDatasets : public DatasetBase<ChooseFromDatasets<D, C>> {
  static_assert(std::is_integral_v<element_t<C>>,
                "choose_from_datasets: choice_dataset must yield integers");

 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for no datasets.
  ChooseFromDatasets(std::vector<D> datasets, C choices, bool stop_on_empty_dataset)
      : datasets_(std::move(datasets)),
        choices_(std::move(choices)),
        stop_on_empty_(stop_on_empty_dataset) {
    if (datasets_.empty()) throw ConfigError("choose_from_datasets: datasets is empty");
    exhausted_.assign(datasets_.size(), false);
  }

  std::optional<element_type> next() {
    while (!ended_) {
      auto choice = choices_.next();
      if (!choice) break;
      const auto c = static_cast<std::int64_t>(*choice);
      if (c < 0 || c >= static_cast<std::int64_t>(datasets_.size())) {
        throw ConfigError("choose_from_datasets: choice_dataset gave " + std::to_string(c) +
                          " but there are " + std::to_string(datasets_.size()) +
                          " datasets (choices must be in [0, " + std::to_string(datasets_.size()) +
                          "))");
      }
      const auto i = static_cast<std::size_t>(c);
      if (exhausted_[i]) {
        if (stop_on_empty_) break;
        continue;
      }
      if (auto element = datasets_[i].next()) return element;
      exhausted_[i] = true;
      if (stop_on_empty_) break;
    }
    ended_ = true;
    return std::nullopt;
  }
  void reset() {
    for (auto& d : datasets_)
      d.reset();
    choices_.reset();
    exhausted_.assign(datasets_.size(), false);
    ended_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "choose_from_datasets"},
            {"ended", ended_},
            {"exhausted", exhausted_},
            {"choices", choices_.state()},
            {"datasets", detail::states_of(datasets_)}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "choose_from_datasets");
    detail::restore_all(datasets_, s["datasets"], "choose_from_datasets");
    choices_.restore(s["choices"]);
    ended_ = s["ended"];
    exhausted_ = s["exhausted"].get<std::vector<bool>>();
    if (exhausted_.size() != datasets_.size()) {
      throw CheckpointError("choose_from_datasets: state marks " +
                            std::to_string(exhausted_.size()) + " datasets but there are " +
                            std::to_string(datasets_.size()));
    }
  }

 private:
  std::vector<D> datasets_;
  C choices_;
  bool stop_on_empty_;
  std::vector<bool> exhausted_;
  bool ended_ = false;
};

/// The elements of `datasets` in the order `choice_dataset` gives (see `ChooseFromDatasets`).
template <Dataset D, Dataset C>
ChooseFromDatasets<D, C> choose_from_datasets(std::vector<D> datasets, C choice_dataset,
                                              bool stop_on_empty_dataset = true) {
  return ChooseFromDatasets<D, C>(std::move(datasets), std::move(choice_dataset),
                                  stop_on_empty_dataset);
}

}  // namespace loadstar
