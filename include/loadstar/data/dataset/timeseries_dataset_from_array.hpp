/// \file
/// `timeseries_dataset_from_array`: Keras's `keras.utils.timeseries_dataset_from_array` as a
/// resumable dataset of `(sequences, targets)` batches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <variant>

#include "loadstar/data/dataset/batch.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/from_tensor_slices.hpp"
#include "loadstar/data/dataset/map.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/data/numpy_random_state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The options of `timeseries_dataset_from_array`, named and defaulted as Keras's arguments.
struct TimeseriesDatasetOptions {
  /// Steps between the starts of consecutive sequences.
  std::size_t sequence_stride = 1;
  /// Steps between consecutive elements of a sequence.
  std::size_t sampling_rate = 1;
  /// Sequences per batch; `std::nullopt` yields one sequence at a time.
  std::optional<std::size_t> batch_size = 128;
  /// Shuffle the start positions (NumPy's `RandomState(seed)`, as Keras) and, each epoch, the
  /// sequences through a buffer of `8 * batch_size` (1024 unbatched).
  bool shuffle = false;
  /// The seed of the shuffles; drawn at random when absent.
  std::optional<std::uint64_t> seed = {};
  /// The first step used (Keras's `start_index`; 0 by default).
  std::optional<std::size_t> start_index = {};
  /// One past the last step used (Keras's `end_index`: lower than the data's length when given).
  std::optional<std::size_t> end_index = {};
};

namespace detail {

struct TimeseriesData {
  Tensor<float> data;
  std::optional<Tensor<float>> targets;
  std::size_t start = 0, end = 0, sequence_length = 0, sampling_rate = 1;
};

// The sequence starting at a position: rows start + p + k * sampling_rate; its target: row
// start + p of the targets.
struct TimeseriesWindow {
  std::shared_ptr<const TimeseriesData> series;
  std::pair<Tensor<float>, Tensor<float>> operator()(const Tensor<std::int64_t>& row) const {
    const auto p = static_cast<std::size_t>(row.data()[0]);
    const auto& d = *series;
    const std::size_t row_size = d.data.row_size();
    auto sequence = Tensor<float>::uninitialized(d.data.shape().with_rows(d.sequence_length));
    for (std::size_t k = 0; k < d.sequence_length; ++k) {
      std::memcpy(sequence.data() + k * row_size,
                  d.data.data() + (d.start + p + k * d.sampling_rate) * row_size,
                  row_size * sizeof(float));
    }
    Tensor<float> target = d.targets ? d.targets->row(d.start + p).clone() : Tensor<float>();
    return {std::move(sequence), std::move(target)};
  }
};

using TimeseriesStream =
    MapDataset<ShuffleDataset<TensorSlices<Tensor<std::int64_t>>>, TimeseriesWindow, false>;

}  // namespace detail

/// Sliding windows over a time series as a dataset of `(sequences, targets)`, as Keras's
/// `timeseries_dataset_from_array`: sequence `i` holds the steps `start + p_i + k *
/// sampling_rate` for `k < sequence_length`, where the start positions `p_i` are `0, stride,
/// 2 * stride, ...` below `end - start - (sequence_length - 1) * sampling_rate` (and below the
/// number of targets), shuffled with NumPy's `RandomState(seed)` when `shuffle` is set, so that
/// they come in Keras's order; its target is the targets' step `start + p_i`. Elements:
/// sequences `(batch, sequence_length, features...)` and targets `(batch, target...)`, or
/// `(batch, 0)` without targets (Keras yields the sequences alone).
class TimeseriesDataset : public DatasetBase<TimeseriesDataset> {
  using Batched = BatchDataset<detail::TimeseriesStream>;
  using Single = detail::TimeseriesStream;

 public:
  using element_type = std::pair<Tensor<float>, Tensor<float>>;

  /// Built by `timeseries_dataset_from_array`.
  TimeseriesDataset(std::shared_ptr<const detail::TimeseriesData> series,
                    Tensor<std::int64_t> positions, const TimeseriesDatasetOptions& options,
                    std::uint64_t seed)
      : positions_(positions), seed_(seed), stream_(make(std::move(series), options, seed)) {}

  std::optional<element_type> next() {
    return std::visit([](auto& s) { return s.next(); }, stream_);
  }
  void reset() {
    std::visit([](auto& s) { s.reset(); }, stream_);
  }
  nlohmann::json state() const {
    return {{"op", "timeseries_dataset_from_array"},
            {"sequences", positions_.size()},
            {"seed", seed_},
            {"upstream", std::visit([](const auto& s) { return s.state(); }, stream_)}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "timeseries_dataset_from_array");
    if (s["sequences"] != positions_.size() || s["seed"] != seed_) {
      throw CheckpointError("timeseries_dataset_from_array: state is of " + s["sequences"].dump() +
                            " sequences with seed " + s["seed"].dump() + " but this dataset has " +
                            std::to_string(positions_.size()) + " sequences with seed " +
                            std::to_string(seed_));
    }
    std::visit([&](auto& stream) { stream.restore(s["upstream"]); }, stream_);
  }

  /// The start positions in Keras's order (relative to `start_index`).
  const Tensor<std::int64_t>& start_positions() const noexcept { return positions_; }

 private:
  std::variant<Batched, Single> make(std::shared_ptr<const detail::TimeseriesData> series,
                                     const TimeseriesDatasetOptions& options, std::uint64_t seed) {
    const std::size_t buffer =
        options.shuffle ? (options.batch_size ? 8 * *options.batch_size : 1024) : 1;
    Single single(ShuffleDataset<TensorSlices<Tensor<std::int64_t>>>(
                      TensorSlices<Tensor<std::int64_t>>(positions_), buffer, seed, true),
                  detail::TimeseriesWindow{std::move(series)}, 0, MapOptions{});
    if (options.batch_size) return Batched(std::move(single), *options.batch_size, false);
    return single;
  }

  Tensor<std::int64_t> positions_;
  std::uint64_t seed_;
  std::variant<Batched, Single> stream_;
};

/// Keras's `timeseries_dataset_from_array(data, targets, sequence_length, ...)` over the rows of
/// `data` (one row per step). Throws `ConfigError` where Keras raises (a `start_index` not below
/// the data's length, an `end_index` not above `start_index` or not below the length, a
/// `sampling_rate` or `sequence_stride` of 0 or not below the length) and for a batch size or
/// sequence length of 0 or no complete sequence.
/// \code
/// auto windows = timeseries_dataset_from_array(x, y, 10, {.batch_size = 32, .shuffle = true,
///                                                          .seed = 1});
/// \endcode
inline TimeseriesDataset timeseries_dataset_from_array(
    Tensor<float> data, std::optional<Tensor<float>> targets, std::size_t sequence_length,
    const TimeseriesDatasetOptions& options = {}) {
  const std::string utility = "timeseries_dataset_from_array";
  const std::size_t n = data.rank() == 0 ? 0 : data.rows();
  auto refuse = [&](const std::string& what) { return ConfigError(utility + ": " + what); };
  if (data.rank() == 0 || n == 0) throw refuse("data must have at least one step");
  const std::size_t start = options.start_index.value_or(0);
  if (start >= n) {
    throw refuse("start_index must be lower than the length of the data but is " +
                 std::to_string(start) + " for data of length " + std::to_string(n));
  }
  if (options.end_index) {
    const std::size_t end = *options.end_index;
    if (end == 0 || (start > 0 && end <= start)) {
      throw refuse("end_index must be higher than start_index and 0 but is " + std::to_string(end) +
                   " (start_index " + std::to_string(start) + ")");
    }
    if (end >= n) {
      throw refuse("end_index must be lower than the length of the data but is " +
                   std::to_string(end) + " for data of length " + std::to_string(n));
    }
  }
  if (options.sampling_rate == 0 || options.sampling_rate >= n) {
    throw refuse("sampling_rate must be higher than 0 and lower than the length of the data (" +
                 std::to_string(n) + ") but is " + std::to_string(options.sampling_rate));
  }
  if (options.sequence_stride == 0 || options.sequence_stride >= n) {
    throw refuse("sequence_stride must be higher than 0 and lower than the length of the data (" +
                 std::to_string(n) + ") but is " + std::to_string(options.sequence_stride));
  }
  if (sequence_length == 0) throw refuse("sequence_length must be positive but is 0");
  if (options.batch_size && *options.batch_size == 0) {
    throw refuse("batch_size must be positive (or nullopt) but is 0");
  }
  const std::size_t end = options.end_index.value_or(n);
  const auto span = static_cast<std::int64_t>(end - start) -
                    static_cast<std::int64_t>((sequence_length - 1) * options.sampling_rate);
  std::int64_t sequences = span;
  if (targets) {
    if (targets->rank() == 0) throw refuse("targets must have one row per step");
    // Keras slices the targets from start_index too.
    const auto available =
        static_cast<std::int64_t>(targets->rows()) - static_cast<std::int64_t>(start);
    sequences = std::min(sequences, available);
  }
  if (sequences <= 0) {
    throw refuse("no complete sequence of length " + std::to_string(sequence_length) +
                 " with sampling_rate " + std::to_string(options.sampling_rate) +
                 " fits in steps [" + std::to_string(start) + ", " + std::to_string(end) + ")");
  }
  std::vector<std::int64_t> positions;
  for (std::int64_t p = 0; p < sequences; p += static_cast<std::int64_t>(options.sequence_stride))
    positions.push_back(p);
  const std::uint64_t seed = options.seed ? *options.seed : std::random_device{}() % 1000000;
  if (options.shuffle) NumpyRandomState(seed).shuffle(positions);
  auto series = std::make_shared<detail::TimeseriesData>(detail::TimeseriesData{
      std::move(data), std::move(targets), start, end, sequence_length, options.sampling_rate});
  Tensor<std::int64_t> position_tensor(Shape{positions.size()},
                                       std::span<const std::int64_t>(positions));
  return TimeseriesDataset(std::move(series), std::move(position_tensor), options, seed);
}

}  // namespace loadstar
