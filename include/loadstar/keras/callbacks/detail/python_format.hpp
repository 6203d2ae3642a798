/// \file
/// Python's `str.format` over named integers and floats, for Keras's checkpoint file paths
/// (`"ckpt-{epoch:02d}-{val_loss:.2f}.h5"`).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// The value of a named field: `epoch` and `batch` are Python `int`s, logs are `float`s.
using FormatValue = std::variant<std::int64_t, double>;

/// One replacement field of a template: its name and format spec.
struct FormatField {
  std::string name;
  std::string spec;
};

/// The parsed format spec `[[fill]align][sign][z][#][0][width][grouping][.precision][type]`.
struct FormatSpec {
  char fill = ' ';
  char align = '\0';  // '<', '>', '=', '^', or none
  char sign = '-';
  bool alternate = false;
  std::size_t width = 0;
  char grouping = '\0';  // ',' or '_'
  std::optional<std::size_t> precision;
  char type = '\0';
};

/// Python's `template.format(**values)` for templates of named fields with the spec mini-language
/// (fill, alignment, sign, `#`, zero-padding, width, `,`/`_` grouping, precision, and the types
/// `d`, `f`, `F`, `e`, `E`, `g`, `G`, `%` or none), `{{` and `}}` for braces. `owner` names the
/// template's user in messages. Throws `ConfigError` naming the template and the field for an
/// unknown name, a bad spec, a spec that does not fit the value's type (`d` of a float) or a
/// malformed template.
class PythonFormat {
 public:
  PythonFormat(std::string owner, std::string text)
      : owner_(std::move(owner)), text_(std::move(text)) {
    parse([](std::string_view) {}, [](const FormatField&) {});
  }

  const std::string& text() const noexcept { return text_; }

  /// The names of the template's fields, in order.
  LOADSTAR_DECL std::vector<std::string> names() const;

  /// The template with every field replaced by its value.
  LOADSTAR_DECL std::string operator()(
      const std::map<std::string, FormatValue, std::less<>>& values) const;

 private:
  [[noreturn]] LOADSTAR_DECL void fail(const std::string& what) const;

  template <class Literal, class Field>
  void parse(Literal&& literal, Field&& field) const {
    const std::string_view t = text_;
    std::size_t i = 0;
    while (i < t.size()) {
      const std::size_t brace = t.find_first_of("{}", i);
      if (brace == std::string_view::npos) {
        literal(t.substr(i));
        break;
      }
      literal(t.substr(i, brace - i));
      if (brace + 1 < t.size() && t[brace + 1] == t[brace]) {  // `{{` or `}}`
        literal(t.substr(brace, 1));
        i = brace + 2;
        continue;
      }
      if (t[brace] == '}') fail("single '}' encountered (write '}}' for a brace)");
      const std::size_t close = t.find('}', brace + 1);
      if (close == std::string_view::npos) fail("a '{' without its '}'");
      const std::string_view inside = t.substr(brace + 1, close - brace - 1);
      if (inside.find('{') != std::string_view::npos) {
        fail("nested fields in '{" + std::string(inside) + "}' are not supported");
      }
      const std::size_t colon = inside.find(':');
      FormatField f{
          std::string(inside.substr(0, colon)),
          colon == std::string_view::npos ? std::string() : std::string(inside.substr(colon + 1))};
      if (f.name.empty()) fail("a field without a name ('{}'): only named fields have values");
      for (const char c : f.name) {
        if (!(std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_')) {
          fail("the field '" + f.name +
               "' is not a plain name (conversions, attributes and indices are not supported)");
        }
      }
      static_cast<void>(spec_of(f));  // a bad spec fails when the template is made
      field(f);
      i = close + 1;
    }
  }

  LOADSTAR_DECL FormatSpec spec_of(const FormatField& field) const;

  LOADSTAR_DECL std::string format(const FormatField& field, const FormatValue& value) const;

  /// A non-negative float as Python formats it with `spec` (without the sign).
  LOADSTAR_DECL static std::string float_body(double x, const FormatSpec& spec);

  /// Python's `repr` of a non-negative finite float: the shortest digits that read back the same,
  /// in fixed notation for decimal exponents -4 to 15, otherwise as `d.ddde+XX`.
  LOADSTAR_DECL static std::string python_repr(double x);

  /// `digits` with `separator` between groups of three in its leading run of digits.
  LOADSTAR_DECL static std::string grouped(const std::string& digits, char separator);

  std::string owner_;
  std::string text_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::vector<std::string> PythonFormat::names() const {
  std::vector<std::string> out;
  parse([](std::string_view) {}, [&](const FormatField& f) { out.push_back(f.name); });
  return out;
}

std::string PythonFormat::operator()(
    const std::map<std::string, FormatValue, std::less<>>& values) const {
  std::string out;
  parse([&](std::string_view literal) { out += literal; },
        [&](const FormatField& field) {
          const auto it = values.find(field.name);
          if (it == values.end()) {
            std::string known;
            for (const auto& [name, value] : values)
              known += (known.empty() ? "" : ", ") + name;
            fail("the field '" + field.name + "' is not among the values (" + known + ")");
          }
          out += format(field, it->second);
        });
  return out;
}

void PythonFormat::fail(const std::string& what) const {
  throw ConfigError(owner_ + ": file path template '" + text_ + "': " + what);
}

FormatSpec PythonFormat::spec_of(const FormatField& field) const {
  const std::string_view s = field.spec;
  const auto bad = [&](const std::string& why) {
    fail("the field '" + field.name + "' has the format spec '" + field.spec + "': " + why);
  };
  FormatSpec spec;
  std::size_t i = 0;
  const auto is_align = [](char c) { return c == '<' || c == '>' || c == '=' || c == '^'; };
  bool fill_given = false;
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = s[1];
    fill_given = true;
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < s.size() && s[i] == '0') {
    if (!fill_given) spec.fill = '0';
    if (spec.align == '\0') spec.align = '=';
    ++i;
  }
  const auto digits = [&]() -> std::optional<std::size_t> {
    const std::size_t start = i;
    std::size_t value = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      value = value * 10 + static_cast<std::size_t>(s[i++] - '0');
      if (value > 10000) bad("the width or precision is too large");
    }
    if (i == start) return std::nullopt;
    return value;
  };
  spec.width = digits().value_or(0);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = digits();
    if (!spec.precision) bad("format specifier missing precision");
  }
  if (i < s.size()) spec.type = s[i++];
  if (i < s.size()) bad("invalid format specifier");
  if (spec.type != '\0' && std::string_view("dfFeEgG%").find(spec.type) == std::string_view::npos) {
    bad(std::string("the type '") + spec.type +
        "' is not supported (d, f, F, e, E, g, G, % or none)");
  }
  return spec;
}

std::string PythonFormat::format(const FormatField& field, const FormatValue& value) const {
  const FormatSpec spec = spec_of(field);
  std::string body;  // the digits, without the sign
  bool negative = false;
  if (const auto* integer = std::get_if<std::int64_t>(&value);
      integer && (spec.type == '\0' || spec.type == 'd')) {
    if (spec.precision) {
      fail("the field '" + field.name + "' has the format spec '" + field.spec +
           "': precision not allowed in integer format specifier");
    }
    negative = *integer < 0;
    const std::uint64_t magnitude =
        negative ? 0 - static_cast<std::uint64_t>(*integer) : static_cast<std::uint64_t>(*integer);
    body = std::to_string(magnitude);
  } else {
    if (spec.type == 'd') {
      fail("the field '" + field.name + "' has the format spec '" + field.spec +
           "': unknown format code 'd' for object of type 'float'");
    }
    const double x = std::holds_alternative<double>(value)
                         ? std::get<double>(value)
                         : static_cast<double>(std::get<std::int64_t>(value));
    negative = std::signbit(x) && !std::isnan(x);
    body = float_body(std::fabs(x), spec);
  }
  if (spec.grouping != '\0') body = grouped(body, spec.grouping);
  std::string sign;
  if (negative) {
    sign = "-";
  } else if (spec.sign != '-') {
    sign = std::string(1, spec.sign);
  }
  const std::size_t length = sign.size() + body.size();
  if (length >= spec.width) return sign + body;
  const std::size_t pad = spec.width - length;
  switch (spec.align == '\0' ? '>' : spec.align) {
    case '<':
      return sign + body + std::string(pad, spec.fill);
    case '^':
      return std::string(pad / 2, spec.fill) + sign + body + std::string(pad - pad / 2, spec.fill);
    case '=':
      return sign + std::string(pad, spec.fill) + body;
    default:
      return std::string(pad, spec.fill) + sign + body;
  }
}

std::string PythonFormat::float_body(double x, const FormatSpec& spec) {
  const bool upper = spec.type == 'F' || spec.type == 'E' || spec.type == 'G';
  if (std::isnan(x) || std::isinf(x)) {
    std::string text = std::isnan(x) ? "nan" : "inf";
    if (upper) std::transform(text.begin(), text.end(), text.begin(), ::toupper);
    return spec.type == '%' ? text + "%" : text;
  }
  if (spec.type == '\0' && !spec.precision) return python_repr(x);
  std::string format = "%";
  if (spec.alternate) format += '#';
  const std::size_t precision = spec.precision.value_or(6);
  format += "." + std::to_string(precision);
  char type = spec.type;
  double shown = x;
  if (type == '%') {
    shown = x * 100.0;
    type = 'f';
  } else if (type == '\0') {
    type = 'g';
  }
  format += type;
  char buffer[512];
  std::snprintf(buffer, sizeof buffer, format.c_str(), shown);
  std::string text = buffer;
  if (spec.type == '%') text += '%';
  // Python's format without a type keeps a digit after the point of a fixed-point result.
  if (spec.type == '\0' && text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string PythonFormat::python_repr(double x) {
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, x, std::chars_format::scientific);
  const std::string_view text(buffer, static_cast<std::size_t>(result.ptr - buffer));
  const std::size_t e = text.find('e');
  std::string digits;
  for (const char c : text.substr(0, e))
    if (c != '.') digits += c;
  const int exponent = std::stoi(std::string(text.substr(e + 1)));
  const int point = exponent + 1;  // digits before the decimal point
  if (point > -4 && point <= 16) {
    if (point <= 0) return "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
    if (static_cast<std::size_t>(point) >= digits.size()) {
      return digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
    }
    return digits.substr(0, static_cast<std::size_t>(point)) + "." +
           digits.substr(static_cast<std::size_t>(point));
  }
  std::string mantissa = digits.substr(0, 1);
  if (digits.size() > 1) mantissa += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return mantissa + exp;
}

std::string PythonFormat::grouped(const std::string& digits, char separator) {
  std::size_t end = 0;
  while (end < digits.size() && digits[end] >= '0' && digits[end] <= '9')
    ++end;
  std::string out;
  for (std::size_t i = 0; i < end; ++i) {
    if (i > 0 && (end - i) % 3 == 0) out += separator;
    out += digits[i];
  }
  return out + digits.substr(end);
}

}  // namespace loadstar::keras::detail
#endif
