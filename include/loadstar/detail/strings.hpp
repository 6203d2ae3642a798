/// \file
/// Small text helpers shared by messages: one list joiner, and UTF-8 validation for text that
/// comes from files (JSON and YAML libraries throw when asked to show text that is not UTF-8).
#pragma once

#include <cstddef>
#include <cstdio>
#include <optional>
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

/// The offset of the first byte of `text` that does not begin a well-formed UTF-8 sequence (RFC
/// 3629: no overlong forms, no surrogates, nothing above U+10FFFF), or nothing when all is UTF-8.
inline std::optional<std::size_t> invalid_utf8(std::string_view text) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
    if (lead < 0x80) {
      ++i;
      continue;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else {
      return i;
    }
    if (i + length > text.size()) return i;
    if (byte(i + 1) < low || byte(i + 1) > high) return i;
    for (std::size_t k = 2; k < length; ++k) {
      if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return i;
    }
    i += length;
  }
  return std::nullopt;
}

/// `"0x91"`: a byte for messages.
inline std::string byte_text(unsigned char byte) {
  char out[5];
  std::snprintf(out, sizeof out, "0x%02X", static_cast<unsigned>(byte));
  return out;
}

/// `text` safe to put in any message, and in JSON: unchanged when UTF-8, each byte of a
/// malformed sequence otherwise shown as `\xNN`.
inline std::string shown_text(std::string_view text) {
  std::string out;
  for (auto bad = invalid_utf8(text); bad; bad = invalid_utf8(text)) {
    out.append(text.substr(0, *bad));
    out += "\\x" + byte_text(static_cast<unsigned char>(text[*bad])).substr(2);
    text.remove_prefix(*bad + 1);
  }
  out.append(text);
  return out;
}

}  // namespace loadstar::detail
