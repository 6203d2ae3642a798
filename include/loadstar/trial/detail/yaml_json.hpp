/// \file
/// YAML documents as JSON (typing plain scalars the way PyYAML, which Determined's CLI uses, types
/// them, except that `1e-3` is a float here as in YAML 1.2, where PyYAML reads text), and JSON
/// values shown back in YAML's flow style for messages (a mapping's keys sorted).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <system_error>

#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/detail/strings.hpp"
#include "loadstar/error.hpp"

namespace loadstar::trial::detail {

/// Whether `text` is all decimal digits (at least one), with single `_` separators allowed as
/// YAML 1.1 allows them.
LOADSTAR_DECL bool is_yaml_digits(std::string_view text);

/// A plain (unquoted) YAML scalar as JSON: null, a bool, an int, a float or a string, by the
/// rules of YAML 1.1 as PyYAML applies them (`yes`/`no`/`on`/`off` are bools), and `1e-3`, which
/// PyYAML leaves text for want of a point, a float.
LOADSTAR_DECL nlohmann::json yaml_plain_scalar(const std::string& text);

/// `ConfigError` (prefixed by `where`) naming `what` (a key's path), the byte and its offset in the
/// document when the scalar `node` is not UTF-8 text, as YAML requires.
LOADSTAR_DECL void check_yaml_text(const YAML::Node& node, const std::string& what,
                                   const std::string& where);

/// What `yaml_to_json` converts at most: aliases let a short document name a value inside itself
/// (`a: &a [*a]`) or nest references to lists of references, which would expand without end or
/// exponentially (the "billion laughs"); no experiment config comes near either bound.
struct YamlLimits {
  std::size_t depth = 64;
  std::size_t values = 100000;
};

/// `node` as JSON; `ConfigError` (prefixed by `where`) for a mapping with a key given twice, a
/// key that is not a scalar, text that is not UTF-8, or a document nested deeper or holding more
/// values (aliases expanded) than `limits`. `values` counts what was converted so far.
LOADSTAR_DECL nlohmann::json yaml_to_json(const YAML::Node& node, const std::string& where,
                                          const std::string& path = "",
                                          const YamlLimits& limits = {}, std::size_t depth = 0,
                                          std::size_t* values = nullptr);

/// Parses the YAML document `text`; `ConfigError` naming `where`, the line and the column for
/// text that is not YAML.
LOADSTAR_DECL nlohmann::json parse_yaml(std::string_view text, const std::string& where);

/// Whether `text` can be shown as a plain YAML scalar and still read back as the same string.
LOADSTAR_DECL bool yaml_plain_safe(const std::string& text);

/// `value` in YAML's flow style, as a user wrote it: `{bathces: 5}`, `[relu, tanh]`, `0.5`.
LOADSTAR_DECL std::string to_flow(const nlohmann::json& value);

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

bool is_yaml_digits(std::string_view text) {
  if (text.empty()) return false;
  for (const char c : text) {
    if (!(c >= '0' && c <= '9') && c != '_') return false;
  }
  return text.front() != '_';
}

nlohmann::json yaml_plain_scalar(const std::string& text) {
  static const std::set<std::string, std::less<>> nulls{"", "~", "null", "Null", "NULL"};
  static const std::set<std::string, std::less<>> trues{"true", "True", "TRUE", "yes", "Yes",
                                                        "YES",  "on",   "On",   "ON"};
  static const std::set<std::string, std::less<>> falses{"false", "False", "FALSE", "no", "No",
                                                         "NO",    "off",   "Off",   "OFF"};
  if (nulls.contains(text)) return nullptr;
  if (trues.contains(text)) return true;
  if (falses.contains(text)) return false;
  std::string_view body(text);
  const bool negative = !body.empty() && body.front() == '-';
  if (!body.empty() && (body.front() == '-' || body.front() == '+')) body.remove_prefix(1);
  if (body == ".inf" || body == ".Inf" || body == ".INF") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (text == ".nan" || text == ".NaN" || text == ".NAN") {
    return std::numeric_limits<double>::quiet_NaN();
  }
  std::string digits;
  for (const char c : body) {
    if (c != '_') digits += c;
  }
  if (is_yaml_digits(body)) {
    std::uint64_t magnitude = 0;
    const auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), magnitude);
    if (error == std::errc() && end == digits.data() + digits.size()) {
      if (!negative) {
        if (magnitude <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
          return static_cast<std::int64_t>(magnitude);
        }
        return magnitude;
      }
      if (magnitude <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) + 1) {
        return magnitude == 0 ? std::int64_t{0} : -static_cast<std::int64_t>(magnitude - 1) - 1;
      }
    }
  }
  // A float: digits with a point or an exponent (`1.5`, `.5`, `1e-3`, `1.0E+3`).
  bool has_digit = false;
  bool float_like = true;
  bool has_point_or_exponent = false;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    const char c = digits[i];
    if (c >= '0' && c <= '9') {
      has_digit = true;
    } else if (c == '.' || c == 'e' || c == 'E') {
      has_point_or_exponent = true;
    } else if ((c == '+' || c == '-') && i > 0 && (digits[i - 1] == 'e' || digits[i - 1] == 'E')) {
    } else {
      float_like = false;
    }
  }
  if (float_like && has_digit && has_point_or_exponent) {
    double value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (error == std::errc() && end == digits.data() + digits.size()) {
      return negative ? -value : value;
    }
  }
  return text;
}

void check_yaml_text(const YAML::Node& node, const std::string& what, const std::string& where) {
  const std::string& text = node.Scalar();
  const auto bad = loadstar::detail::invalid_utf8(text);
  if (!bad) return;
  const YAML::Mark mark = node.Mark();
  const std::string starts = mark.pos >= 0
                                 ? " (which starts at line " + std::to_string(mark.line + 1) +
                                       ", column " + std::to_string(mark.column + 1) + ")"
                                 : "";
  throw ConfigError(where + ": " + what + ": expected UTF-8 text but found the byte " +
                    loadstar::detail::byte_text(static_cast<unsigned char>(text[*bad])) +
                    " at byte offset " + std::to_string(*bad) + " of the text '" +
                    loadstar::detail::shown_text(text) + "'" + starts);
}

nlohmann::json yaml_to_json(const YAML::Node& node, const std::string& where,
                            const std::string& path, const YamlLimits& limits, std::size_t depth,
                            std::size_t* values) {
  std::size_t count = 0;
  if (values == nullptr) values = &count;
  const std::string at = path.empty() ? std::string("the top level") : path;
  if (depth > limits.depth) {
    throw ConfigError(where + ": " + at + ": expected values nested at most " +
                      std::to_string(limits.depth) + " deep but found deeper ones (an alias " +
                      "inside the value it names?)");
  }
  if (++*values > limits.values) {
    throw ConfigError(where + ": " + at + ": expected at most " + std::to_string(limits.values) +
                      " values in the document but found more (aliases expanding "
                      "exponentially?)");
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar:
      check_yaml_text(node, path.empty() ? "the document" : path, where);
      // A quoted scalar (tag "!") is a string whatever it looks like.
      if (node.Tag() == "!") return node.Scalar();
      return yaml_plain_scalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      nlohmann::json out = nlohmann::json::array();
      std::size_t i = 0;
      for (const auto& item : node) {
        out.push_back(yaml_to_json(item, where, path + "[" + std::to_string(i++) + "]", limits,
                                   depth + 1, values));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      nlohmann::json out = nlohmann::json::object();
      for (const auto& item : node) {
        if (!item.first.IsScalar()) {
          throw ConfigError(where + ": " + at + ": expected text keys but found a " +
                            (item.first.IsMap() ? "mapping" : "sequence") + " as a key");
        }
        check_yaml_text(item.first, "a key of " + at, where);
        const std::string key = item.first.Scalar();
        const std::string child = path.empty() ? key : path + "." + key;
        if (out.contains(key)) {
          throw ConfigError(where + ": " + child + ": expected each key once but found it twice");
        }
        out[key] = yaml_to_json(item.second, where, child, limits, depth + 1, values);
      }
      return out;
    }
  }
  return nullptr;
}

nlohmann::json parse_yaml(std::string_view text, const std::string& where) {
  // YAML is Unicode text: a byte that is not UTF-8 is named with its key where it is inside a
  // key or value, else (a comment, or text YAML cannot parse) by its place in the document.
  const auto bad = loadstar::detail::invalid_utf8(text);
  const auto refuse_bad_byte = [&] {
    const std::size_t line = static_cast<std::size_t>(
        std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(*bad), '\n'));
    const std::size_t line_start = text.rfind('\n', *bad);  // text[*bad] is no newline
    const std::size_t column = line_start == std::string_view::npos ? *bad : *bad - line_start - 1;
    throw ConfigError(where + ": line " + std::to_string(line + 1) + ", column " +
                      std::to_string(column + 1) + ": expected UTF-8 text but found the byte " +
                      loadstar::detail::byte_text(static_cast<unsigned char>(text[*bad])) +
                      " at byte offset " + std::to_string(*bad) + " of the document");
  };
  YAML::Node node;
  try {
    node = YAML::Load(std::string(text));
  } catch (const YAML::Exception& error) {
    if (bad) refuse_bad_byte();
    throw ConfigError(
        where + ": line " + std::to_string(error.mark.line + 1) + ", column " +
        std::to_string(error.mark.column + 1) +
        ": expected YAML but found an error: " + loadstar::detail::shown_text(error.msg));
  }
  nlohmann::json json = yaml_to_json(node, where);
  if (bad) refuse_bad_byte();
  return json;
}

bool yaml_plain_safe(const std::string& text) {
  if (text.empty() || !yaml_plain_scalar(text).is_string()) return false;
  if (text.front() == ' ' || text.back() == ' ') return false;
  for (const char c : text) {
    if (std::string_view(":#{}[],&*!|>'\"%@`\n\t").find(c) != std::string_view::npos) return false;
  }
  return std::string_view("-?").find(text.front()) == std::string_view::npos;
}

std::string to_flow(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::object: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        out += (yaml_plain_safe(key) ? key : loadstar::detail::shown(key)) + ": " + to_flow(item);
      }
      return out + "}";
    }
    case nlohmann::json::value_t::array: {
      std::string out = "[";
      bool first = true;
      for (const auto& item : value) {
        if (!first) out += ", ";
        first = false;
        out += to_flow(item);
      }
      return out + "]";
    }
    case nlohmann::json::value_t::string: {
      const auto& text = value.get_ref<const std::string&>();
      return yaml_plain_safe(text) ? text : loadstar::detail::shown(value);
    }
    case nlohmann::json::value_t::number_float: {
      const double x = value.get<double>();
      if (std::isnan(x)) return ".nan";
      if (std::isinf(x)) return x > 0 ? ".inf" : "-.inf";
      return loadstar::detail::shown(value);
    }
    case nlohmann::json::value_t::null:
      return "null";
    default:
      return loadstar::detail::shown(value);
  }
}

}  // namespace loadstar::trial::detail
#endif
