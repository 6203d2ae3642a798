/// \file
/// `timeseries_dataset_from_array`: Keras's sliding windows over a time series, as a dataset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/batch.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/error.hpp"
#include "loadstar/random.hpp"
#include "loadstar/tensor.hpp"

namespace loadstar {

/// `timeseries_dataset_from_array`'s Keras arguments after `sequence_length`, with Keras's
/// defaults. Keras's `batch_size=None` (unbatched windows) is `timeseries_windows`.
struct TimeseriesOptions {
  std::size_t sequence_stride = 1;
  std::size_t sampling_rate = 1;
  std::size_t batch_size = 128;
  bool shuffle = false;
  /// Without one, a shuffled dataset draws its seed at random, as Keras does.
  std::optional<std::uint64_t> seed = std::nullopt;
  std::optional<std::size_t> start_index = std::nullopt;
  std::optional<std::size_t> end_index = std::nullopt;
};

/// The windows of `timeseries_dataset_from_array`, one per element: window `i` holds the rows
/// `start_index + p_i + k * sampling_rate` (`k < sequence_length`) of `data`, where the start
/// positions `p_i` are `0, sequence_stride, ...` below `end_index - start_index - (sequence_length
/// - 1) * sampling_rate` (and below the number of targets); with targets, the element is
/// `(window, targets[start_index + p_i])`. The start positions are permuted once, with the seed,
/// when shuffled. The state is the index of the next window.
template <bool WithTargets>
class TimeseriesWindows : public DatasetBase<TimeseriesWindows<WithTargets>> {
 public:
  using element_type =
      std::conditional_t<WithTargets, std::tuple<Tensor<float>, Tensor<float>>, Tensor<float>>;

  /// Throws `ConfigError` for the arguments Keras refuses, with Keras's conditions and a message
  /// naming the argument, its value and the data's length; `ShapeError` for a scalar `data`.
  TimeseriesWindows(Tensor<float> data, std::optional<Tensor<float>> targets,
                    std::size_t sequence_length, const TimeseriesOptions& options)
      : data_(std::move(data)),
        targets_(std::move(targets)),
        sequence_length_(sequence_length),
        sampling_rate_(options.sampling_rate) {
    if (data_.rank() == 0) {
      throw ShapeError(
          "timeseries_dataset_from_array: expected data with a time axis but found "
          "a scalar");
    }
    const std::size_t length = data_.shape()[0];
    const auto refuse = [](const std::string& what) {
      throw ConfigError("timeseries_dataset_from_array: " + what);
    };
    const std::string of_length = ", for data of length " + std::to_string(length);
    // Keras's checks, which test start_index and end_index only when they are non-zero.
    const std::size_t start = options.start_index.value_or(0);
    if (start != 0 && start >= length) {
      refuse("start_index must be lower than the length of the data but is " +
             std::to_string(start) + of_length);
    }
    if (options.end_index && *options.end_index != 0) {
      const std::size_t end = *options.end_index;
      if (start != 0 && end <= start) {
        refuse("end_index must be higher than start_index " + std::to_string(start) + " but is " +
               std::to_string(end));
      }
      if (end >= length) {
        refuse("end_index must be lower than the length of the data but is " + std::to_string(end) +
               of_length);
      }
    }
    if (options.end_index && *options.end_index == 0) {
      refuse("end_index must be higher than 0 but is 0");
    }
    if (options.sampling_rate == 0) refuse("sampling_rate must be higher than 0 but is 0");
    if (options.sampling_rate >= length) {
      refuse("sampling_rate must be lower than the length of the data but is " +
             std::to_string(options.sampling_rate) + of_length);
    }
    if (options.sequence_stride == 0) refuse("sequence_stride must be higher than 0 but is 0");
    if (options.sequence_stride >= length) {
      refuse("sequence_stride must be lower than the length of the data but is " +
             std::to_string(options.sequence_stride) + of_length);
    }
    if (sequence_length == 0) refuse("sequence_length must be higher than 0 but is 0");
    if (options.batch_size == 0) refuse("batch_size must be higher than 0 but is 0");
    if constexpr (WithTargets) {
      if (targets_->rank() == 0) {
        throw ShapeError(
            "timeseries_dataset_from_array: expected targets with a time axis but "
            "found a scalar");
      }
    }
    start_ = static_cast<std::int64_t>(start);
    const auto end = static_cast<std::int64_t>(options.end_index.value_or(length));
    std::int64_t sequences =
        end - start_ -
        static_cast<std::int64_t>(sequence_length - 1) * static_cast<std::int64_t>(sampling_rate_);
    if (targets_) {
      sequences = std::min(sequences, static_cast<std::int64_t>(targets_->shape()[0]));
    }
    for (std::int64_t p = 0; p < sequences;
         p += static_cast<std::int64_t>(options.sequence_stride)) {
      positions_.push_back(p);
    }
    if (options.shuffle) {
      const std::uint64_t seed = options.seed ? *options.seed : std::random_device{}();
      const auto order = epoch_permutation(positions_.size(), seed, 0, true);
      std::vector<std::int64_t> permuted;
      permuted.reserve(order.size());
      for (std::size_t i : order)
        permuted.push_back(positions_[i]);
      positions_ = std::move(permuted);
    }
  }

  std::optional<element_type> next() {
    if (index_ >= positions_.size()) return std::nullopt;
    const std::int64_t p = start_ + positions_[index_++];
    Shape shape = data_.shape();
    shape[0] = sequence_length_;
    Tensor<float> window = Tensor<float>::uninitialized(shape);
    const std::size_t row = data_.row_size();
    for (std::size_t k = 0; k < sequence_length_; ++k) {
      const auto source = static_cast<std::size_t>(p) + k * sampling_rate_;
      std::copy_n(data_.data() + source * row, row, window.data() + k * row);
    }
    if constexpr (WithTargets) {
      return element_type(std::move(window), targets_->row(static_cast<std::size_t>(p)).clone());
    } else {
      return window;
    }
  }
  void reset() noexcept { index_ = 0; }
  nlohmann::json state() const { return {{"op", "timeseries"}, {"index", index_}}; }
  void restore(const nlohmann::json& state) {
    const std::size_t index = detail::expect_state(state, "timeseries")["index"];
    if (index > positions_.size()) {
      throw CheckpointError("timeseries: state is at window " + std::to_string(index) +
                            " but there are " + std::to_string(positions_.size()));
    }
    index_ = index;
  }

  /// The number of windows of an epoch.
  std::size_t size() const noexcept { return positions_.size(); }

 private:
  Tensor<float> data_;
  std::optional<Tensor<float>> targets_;
  std::size_t sequence_length_, sampling_rate_;
  std::int64_t start_ = 0;
  std::vector<std::int64_t> positions_;
  std::size_t index_ = 0;
};

/// Keras's `timeseries_dataset_from_array` with `batch_size=None`: the windows one by one (with
/// their targets), the start positions permuted once when shuffled.
inline TimeseriesWindows<false> timeseries_windows(Tensor<float> data, std::size_t sequence_length,
                                                   const TimeseriesOptions& options = {}) {
  return TimeseriesWindows<false>(std::move(data), std::nullopt, sequence_length, options);
}
inline TimeseriesWindows<true> timeseries_windows(Tensor<float> data, Tensor<float> targets,
                                                  std::size_t sequence_length,
                                                  const TimeseriesOptions& options = {}) {
  return TimeseriesWindows<true>(std::move(data), std::move(targets), sequence_length, options);
}

/// Keras's `timeseries_dataset_from_array`: batches of `batch_size` windows of
/// `sequence_length` rows of `data` (and, with `targets`, of `(windows, targets)`), in time order,
/// or when `shuffle` is set with the start positions permuted once and the windows shuffled
/// locally in a buffer of `8 * batch_size`, reshuffled each epoch, as Keras does. The same seed
/// gives the same batches in every run; the shuffled order is not Keras's, whose second stage is
/// tf.data's shuffle.
/// \code
/// // Inputs: 10 steps of a series; target: the step after them.
/// auto ds = timeseries_dataset_from_array(series.slice_rows(0, n - 10),
///                                         series.slice_rows(10, n), 10);
/// \endcode
inline auto timeseries_dataset_from_array(Tensor<float> data, std::size_t sequence_length,
                                          const TimeseriesOptions& options = {}) {
  TimeseriesOptions fixed = options;
  if (options.shuffle && !options.seed) fixed.seed = std::random_device{}();
  return timeseries_windows(std::move(data), sequence_length, fixed)
      .shuffle(options.shuffle ? 8 * options.batch_size : 1, fixed.seed.value_or(0))
      .batch(options.batch_size);
}
inline auto timeseries_dataset_from_array(Tensor<float> data, Tensor<float> targets,
                                          std::size_t sequence_length,
                                          const TimeseriesOptions& options = {}) {
  TimeseriesOptions fixed = options;
  if (options.shuffle && !options.seed) fixed.seed = std::random_device{}();
  return timeseries_windows(std::move(data), std::move(targets), sequence_length, fixed)
      .shuffle(options.shuffle ? 8 * options.batch_size : 1, fixed.seed.value_or(0))
      .batch(options.batch_size);
}

}  // namespace loadstar
