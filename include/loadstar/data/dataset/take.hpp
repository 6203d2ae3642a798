/// \file
/// `take`: the first elements of every epoch.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"

namespace loadstar {

/// At most `count` elements of every epoch of `D`. The state is the count taken and the
/// upstream's state.
/// \code
/// auto first_ten = range(100).take(10);
/// \endcode
template <Dataset D>
class TakeDataset : public DatasetBase<TakeDataset<D>> {
 public:
  using element_type = element_t<D>;

  TakeDataset(D upstream, std::size_t count) : upstream_(std::move(upstream)), count_(count) {}

  std::optional<element_type> next() {
    if (taken_ >= count_) return std::nullopt;
    auto element = upstream_.next();
    if (element) {
      ++taken_;
    } else {
      taken_ = count_;
    }
    return element;
  }
  void reset() {
    upstream_.reset();
    taken_ = 0;
  }
  nlohmann::json state() const {
    return {{"op", "take"}, {"taken", taken_}, {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "take");
    upstream_.restore(s["upstream"]);
    taken_ = s["taken"];
  }

 private:
  D upstream_;
  std::size_t count_;
  std::size_t taken_ = 0;
};

}  // namespace loadstar
