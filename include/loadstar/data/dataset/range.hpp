/// \file
/// `range`: the integers `[start, stop)` with a step, as a dataset.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The integers `start, start + step, ...` before `stop`, as `tf.data.Dataset.range`.
/// \code
/// auto ds = range(0, 10).map([](std::int64_t i) { return i * i; });
/// \endcode
class RangeDataset : public DatasetBase<RangeDataset> {
 public:
  using element_type = std::int64_t;

  /// Throws `ConfigError` for a step of 0.
  RangeDataset(std::int64_t start, std::int64_t stop, std::int64_t step)
      : start_(start), stop_(stop), step_(step), next_(start) {
    if (step == 0) throw ConfigError("range: step must be non-zero but is 0");
  }

  std::optional<element_type> next() noexcept {
    if (step_ > 0 ? next_ >= stop_ : next_ <= stop_) return std::nullopt;
    const std::int64_t value = next_;
    next_ += step_;
    return value;
  }
  void reset() noexcept { next_ = start_; }
  nlohmann::json state() const { return {{"op", "range"}, {"next", next_}}; }
  void restore(const nlohmann::json& state) {
    next_ = detail::expect_state(state, "range")["next"].get<std::int64_t>();
  }

 private:
  std::int64_t start_, stop_, step_, next_;
};

/// The integers `[start, stop)` with `step`.
inline RangeDataset range(std::int64_t start, std::int64_t stop, std::int64_t step = 1) {
  return RangeDataset(start, stop, step);
}

/// The integers `[0, stop)`.
inline RangeDataset range(std::int64_t stop) {
  return RangeDataset(0, stop, 1);
}

}  // namespace loadstar
