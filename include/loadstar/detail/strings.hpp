/// \file
/// Small text helpers shared by messages: one list joiner.
#pragma once

#include <string>
#include <string_view>

namespace loadstar::detail {

/// The items of `range` joined by `separator`, each passed through `text` (a function returning
/// something `std::string` can append) and wrapped in `quote`: `join(names, ", ", "'")` gives
/// `'a', 'b'`.
template <class Range, class Text>
std::string join(const Range& range, std::string_view separator, std::string_view quote,
                 Text&& text) {
  std::string out;
  bool first = true;
  for (const auto& item : range) {
    if (!first) out += separator;
    first = false;
    out += quote;
    out += text(item);
    out += quote;
  }
  return out;
}

/// `join` of items that are text already.
template <class Range>
std::string join(const Range& range, std::string_view separator = ", ",
                 std::string_view quote = "") {
  return join(
      range, separator, quote, [](const auto& item) -> const auto& { return item; });
}

}  // namespace loadstar::detail
