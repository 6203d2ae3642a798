/// \file
/// `filter`: the elements that satisfy a predicate.
#pragma once

#include <concepts>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"

namespace loadstar {

/// The elements of `D` for which `predicate(element)` is true, in order. The state is the
/// upstream's: restoring costs what the upstream's restore costs.
/// \code
/// auto even = range(10).filter([](std::int64_t i) { return i % 2 == 0; });
/// \endcode
template <Dataset D, class P>
class FilterDataset : public DatasetBase<FilterDataset<D, P>> {
 public:
  using element_type = element_t<D>;
  static_assert(std::predicate<const P&, const element_type&>,
                "filter: the predicate must be callable with a const element and return a bool");

  FilterDataset(D upstream, P predicate)
      : upstream_(std::move(upstream)), predicate_(std::move(predicate)) {}

  std::optional<element_type> next() {
    while (auto element = upstream_.next()) {
      if (predicate_(std::as_const(*element))) return element;
    }
    return std::nullopt;
  }
  void reset() { upstream_.reset(); }
  nlohmann::json state() const { return {{"op", "filter"}, {"upstream", upstream_.state()}}; }
  void restore(const nlohmann::json& state) {
    upstream_.restore(detail::expect_state(state, "filter")["upstream"]);
  }

 private:
  D upstream_;
  P predicate_;
};

}  // namespace loadstar
