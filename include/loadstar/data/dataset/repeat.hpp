/// \file
/// `repeat`: the upstream's epochs one after another.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"

namespace loadstar {

/// `count` epochs of `D` as one (forever when `count < 0`): the upstream is reset between
/// repetitions, so a reshuffling `shuffle` upstream gives a new order each time. An upstream
/// epoch with no elements ends the repetition (instead of spinning forever). The state is the
/// repetition and the upstream's state.
/// \code
/// auto three_epochs = from_tensor_slices(x).shuffle(100, 7).repeat(3);
/// \endcode
template <Dataset D>
class RepeatDataset : public DatasetBase<RepeatDataset<D>> {
 public:
  using element_type = element_t<D>;

  RepeatDataset(D upstream, std::int64_t count) : upstream_(std::move(upstream)), count_(count) {}

  std::optional<element_type> next() {
    while (count_ < 0 || repetition_ < count_) {
      if (auto element = upstream_.next()) {
        produced_in_repetition_ = true;
        return element;
      }
      if (!produced_in_repetition_) break;  // An empty upstream ends the repetition.
      ++repetition_;
      produced_in_repetition_ = false;
      if (count_ >= 0 && repetition_ >= count_) break;
      upstream_.reset();
    }
    return std::nullopt;
  }
  void reset() {
    upstream_.reset();
    repetition_ = 0;
    produced_in_repetition_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "repeat"},
            {"repetition", repetition_},
            {"produced", produced_in_repetition_},
            {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "repeat");
    upstream_.restore(s["upstream"]);
    repetition_ = s["repetition"];
    produced_in_repetition_ = s["produced"];
  }

 private:
  D upstream_;
  std::int64_t count_;
  std::int64_t repetition_ = 0;
  bool produced_in_repetition_ = false;
};

}  // namespace loadstar
