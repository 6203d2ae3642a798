/// \file
/// `skip`: every epoch without its first elements.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"

namespace loadstar {

/// Every epoch of `D` without its first `count` elements (skipped on the first `next()`). The
/// state is whether they were skipped and the upstream's state.
/// \code
/// auto rest = range(100).skip(10);
/// \endcode
template <Dataset D>
class SkipDataset : public DatasetBase<SkipDataset<D>> {
 public:
  using element_type = element_t<D>;

  SkipDataset(D upstream, std::size_t count) : upstream_(std::move(upstream)), count_(count) {}

  std::optional<element_type> next() {
    if (!skipped_) {
      skipped_ = true;
      for (std::size_t i = 0; i < count_; ++i) {
        if (!upstream_.next()) return std::nullopt;
      }
    }
    return upstream_.next();
  }
  void reset() {
    upstream_.reset();
    skipped_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "skip"}, {"skipped", skipped_}, {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "skip");
    upstream_.restore(s["upstream"]);
    skipped_ = s["skipped"];
  }

 private:
  D upstream_;
  std::size_t count_;
  bool skipped_ = false;
};

}  // namespace loadstar
