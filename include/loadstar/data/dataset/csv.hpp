/// \file
/// `CsvDataset`: the records of CSV files, as `tf.data.experimental.CsvDataset`.
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/file_cursor.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/detail/input_stream.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The column types of `CsvDataset` (tf.data's: int32, int64, float32, float64, string).
enum class CsvType { int32, int64, float32, float64, string };

/// One parsed field.
using CsvValue = std::variant<std::int32_t, std::int64_t, float, double, std::string>;

/// A column of `record_defaults`: its type and, for an optional column, the value an empty field
/// (or one equal to `na_value`) takes. A column without a default is required, as a
/// `record_defaults` entry that is an empty tensor of the type in tf.data.
struct CsvColumn {
  CsvType type = CsvType::string;
  std::optional<CsvValue> default_value = {};
};

/// The options of `CsvDataset`, named and defaulted as `tf.data.experimental.CsvDataset`'s.
struct CsvOptions {
  /// `""`, `"GZIP"` or `"ZLIB"`.
  std::string compression_type = {};
  /// Read buffer in bytes (tf.data's default, 4 MiB).
  std::size_t buffer_size = 4 * 1024 * 1024;
  /// Skip the first record of every file.
  bool header = false;
  /// The field separator: one character.
  std::string field_delim = ",";
  /// Double quotes quote fields (RFC 4180: a quoted field may hold the delimiter, line breaks and
  /// `""` for a quote); false makes `"` an ordinary character.
  bool use_quote_delim = true;
  /// A field equal to this is missing (takes the column's default).
  std::string na_value = {};
  /// The indices of the columns to parse, strictly increasing; empty parses every column.
  std::vector<std::size_t> select_cols = {};
};

namespace detail {

inline const char* csv_type_name(CsvType type) {
  switch (type) {
    case CsvType::int32:
      return "int32";
    case CsvType::int64:
      return "int64";
    case CsvType::float32:
      return "float32";
    case CsvType::float64:
      return "float64";
    default:
      return "string";
  }
}

/// The type's name with its article: "an int32", "a float32".
inline std::string csv_type_with_article(CsvType type) {
  const bool vowel = type == CsvType::int32 || type == CsvType::int64;
  return std::string(vowel ? "an " : "a ") + csv_type_name(type);
}

inline std::size_t csv_type_index(CsvType type) {
  return static_cast<std::size_t>(type);  // The order of CsvValue's alternatives.
}

/// `text` as a number of type `T`, as absl's SimpleAtoi / SimpleAtof (which tf.data uses) read
/// it: surrounding ASCII whitespace allowed, a leading `+` allowed, the whole text consumed;
/// floats also `inf`, `infinity` and `nan` in any case.
template <class T>
std::optional<T> csv_number(std::string_view text) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && space(text.back()))
    text.remove_suffix(1);
  if (text.size() > 1 && text.front() == '+' && text[1] != '-' && text[1] != '+') {
    text.remove_prefix(1);
  }
  if (text.empty()) return std::nullopt;
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

}  // namespace detail

/// The records of CSV files, file after file, each a `std::vector<CsvValue>` with one value per
/// column of `record_defaults` (the selected columns, with `select_cols`), as
/// `tf.data.experimental.CsvDataset`:
/// - records end at `\n`, `\r` or `\r\n`, outside quotes; a file's last record needs no line end;
/// - with `use_quote_delim`, a field that starts with `"` is quoted (RFC 4180): it ends at a `"`
///   followed by the delimiter, a line end or the end of the file, and `""` inside is one `"`;
///   a `"` inside an unquoted field is an error;
/// - an empty field, or one equal to `na_value`, takes its column's default; a required column
///   without one is an error;
/// - without `select_cols` a record must have exactly one field per column; with it, at least
///   up to the last selected column (other columns are not parsed).
///
/// Errors are `FormatError`s naming the file, the record's line (1-based, the line where the
/// record starts) and the column (1-based): `csv file 'a.csv' line 3 column 2: expected an int32
/// but found 'x7'`. The state is the file's index, the byte offset of the next record and its
/// line number.
/// \code
/// auto rows = CsvDataset({"train.csv"},
///                        {{CsvType::float32, 0.0f}, {CsvType::int64}, {CsvType::string, ""}},
///                        {.header = true});
/// \endcode
class CsvDataset : public DatasetBase<CsvDataset> {
 public:
  using element_type = std::vector<CsvValue>;

  /// Throws `ConfigError` for no columns, a default of another type than its column, a
  /// `field_delim` that is not one character, `select_cols` that are not strictly increasing or
  /// whose number differs from the columns', or an unknown `compression_type`.
  CsvDataset(std::vector<std::string> filenames, std::vector<CsvColumn> record_defaults,
             CsvOptions options = {})
      : columns_(std::move(record_defaults)),
        options_(std::move(options)),
        files_(std::move(filenames),
               detail::parse_compression(options_.compression_type, "CsvDataset"),
               options_.buffer_size, "CsvDataset", "csv file") {
    if (columns_.empty()) {
      throw ConfigError("CsvDataset: record_defaults must name at least one column but is empty");
    }
    for (std::size_t i = 0; i < columns_.size(); ++i) {
      const auto& column = columns_[i];
      if (column.default_value &&
          column.default_value->index() != detail::csv_type_index(column.type)) {
        throw ConfigError("CsvDataset: record_defaults[" + std::to_string(i) +
                          "]: the default must be " + detail::csv_type_with_article(column.type) +
                          " like the column but is another type");
      }
    }
    if (options_.field_delim.size() != 1) {
      throw ConfigError("CsvDataset: field_delim must be one character but is \"" +
                        options_.field_delim + "\"");
    }
    if (options_.use_quote_delim && options_.field_delim == "\"") {
      throw ConfigError(
          "CsvDataset: field_delim must differ from the quote when use_quote_delim is true but "
          "is \"\\\"\"");
    }
    if (options_.field_delim == "\n" || options_.field_delim == "\r") {
      throw ConfigError("CsvDataset: field_delim must not be a line end");
    }
    if (!options_.select_cols.empty()) {
      if (options_.select_cols.size() != columns_.size()) {
        throw ConfigError(
            "CsvDataset: select_cols must have one index per column of "
            "record_defaults (" +
            std::to_string(columns_.size()) + ") but has " +
            std::to_string(options_.select_cols.size()));
      }
      for (std::size_t i = 1; i < options_.select_cols.size(); ++i) {
        if (options_.select_cols[i - 1] >= options_.select_cols[i]) {
          throw ConfigError("CsvDataset: select_cols must be strictly increasing but " +
                            std::to_string(options_.select_cols[i]) + " follows " +
                            std::to_string(options_.select_cols[i - 1]));
        }
      }
    }
    if (options_.buffer_size == 0) {
      throw ConfigError("CsvDataset: buffer_size must be positive but is 0");
    }
  }

  CsvDataset(const CsvDataset&) = default;
  CsvDataset(CsvDataset&&) noexcept = default;
  CsvDataset& operator=(CsvDataset&&) noexcept = default;

  std::optional<element_type> next() {
    if (!at_record()) return std::nullopt;
    return read_record(true);
  }

  /// The next record's fields as text, every column, unconverted and uncounted (after the header
  /// when `header`): what `make_csv_dataset` reads column names and infers types from.
  std::optional<std::vector<std::string>> next_fields() {
    if (!at_record()) return std::nullopt;
    std::vector<std::string> fields;
    read_record(false, &fields);
    return fields;
  }

  void reset() {
    files_.reset();
    line_ = 1;
  }

  nlohmann::json state() const {
    nlohmann::json state{{"op", "csv"}, {"line", line_}};
    files_.save(state);
    return state;
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "csv");
    line_ = 1;
    if (files_.restore(s)) line_ = s["line"];
  }

 private:
  detail::CharReader& reader() { return files_.reader(); }

  /// Moves to the next record, opening files, skipping their headers and leaving ended ones;
  /// `false` when every file has ended.
  bool at_record() {
    while (!files_.done()) {
      if (files_.open_if_closed()) {
        line_ = 1;
        if (options_.header && reader().peek() != -1) read_record(false);
      }
      if (reader().peek() != -1) return true;
      files_.next_file();
    }
    return false;
  }

  [[noreturn]] void fail(std::size_t line, std::size_t column, const std::string& what) const {
    throw FormatError(files_.reader().where() + " line " + std::to_string(line) + " column " +
                      std::to_string(column) + ": " + what);
  }

  /// Consumes the line end `c` (a `\r` takes a following `\n` with it).
  void end_line(int c) {
    if (c == '\r' && reader().peek() == '\n') reader().get();
    ++line_;
  }

  /// Reads one record; converts its fields when `convert` (the header is read without), and
  /// gives every field's text to `raw` when there is one.
  element_type read_record(bool convert, std::vector<std::string>* raw = nullptr) {
    const char delim = options_.field_delim[0];
    const std::size_t record_line = line_;
    element_type out;
    if (convert) out.reserve(columns_.size());
    std::size_t field = 0;  // 0-based index of the field being read.
    std::size_t selected = 0;
    std::string text;
    bool end_of_record = false;
    while (!end_of_record) {
      text.clear();
      const std::size_t column = field + 1;
      int c = reader().peek();
      if (options_.use_quote_delim && c == '"') {
        reader().get();
        while (true) {
          c = reader().get();
          if (c == -1) {
            fail(record_line, column,
                 "expected a closing quote but the file ends inside the quoted field");
          }
          if (c == '\n' || (c == '\r' && reader().peek() != '\n')) ++line_;
          if (c != '"') {
            text.push_back(static_cast<char>(c));
            continue;
          }
          const int after = reader().peek();
          if (after == '"') {
            reader().get();
            text.push_back('"');
            continue;
          }
          reader().get();
          if (after == -1 || after == '\n' || after == '\r') {
            end_of_record = true;
            if (after != -1) end_line(after);
          } else if (after != static_cast<unsigned char>(delim)) {
            fail(record_line, column,
                 "a quote inside a quoted field must be escaped by another quote but found "
                 "'\"" +
                     std::string(1, static_cast<char>(after)) + "'");
          }
          break;
        }
      } else {
        c = reader().read_until(delim, '\n', '\r', text);
        if (c == '\n' || c == '\r' || c == -1) {
          end_of_record = true;
          if (c != -1) end_line(c);
        }
        if (options_.use_quote_delim && text.find('"') != std::string::npos) {
          fail(record_line, column,
               "unquoted fields cannot have quotes inside but found '" + text + "'");
        }
      }
      if (raw != nullptr) raw->push_back(text);
      const bool include =
          options_.select_cols.empty()
              ? true
              : selected < options_.select_cols.size() && options_.select_cols[selected] == field;
      if (include && convert) {
        if (selected >= columns_.size()) {
          fail(record_line, column,
               "expected " + std::to_string(columns_.size()) + " fields but the record has more");
        }
        out.push_back(to_value(text, columns_[selected], record_line, column));
      }
      if (include) ++selected;
      ++field;
    }
    if (convert && out.size() != columns_.size()) {
      fail(record_line, field,
           "expected " +
               (options_.select_cols.empty()
                    ? std::to_string(columns_.size())
                    : "at least " + std::to_string(options_.select_cols.back() + 1)) +
               " fields but the record has " + std::to_string(field));
    }
    return out;
  }

  CsvValue to_value(const std::string& text, const CsvColumn& column, std::size_t line,
                    std::size_t index) const {
    if (text.empty() || text == options_.na_value) {
      if (!column.default_value) {
        fail(line, index,
             "expected " + detail::csv_type_with_article(column.type) +
                 " (a required column) but the field is " +
                 (text.empty() ? "empty" : "the na_value '" + text + "'"));
      }
      return *column.default_value;
    }
    const auto bad = [&]() {
      fail(line, index,
           "expected " + detail::csv_type_with_article(column.type) + " but found '" + text + "'");
    };
    switch (column.type) {
      case CsvType::int32: {
        auto v = detail::csv_number<std::int32_t>(text);
        if (!v) bad();
        return *v;
      }
      case CsvType::int64: {
        auto v = detail::csv_number<std::int64_t>(text);
        if (!v) bad();
        return *v;
      }
      case CsvType::float32: {
        auto v = detail::csv_number<float>(text);
        if (!v) bad();
        return *v;
      }
      case CsvType::float64: {
        auto v = detail::csv_number<double>(text);
        if (!v) bad();
        return *v;
      }
      default:
        return text;
    }
  }

  std::vector<CsvColumn> columns_;
  CsvOptions options_;
  detail::FileCursor files_;
  std::size_t line_ = 1;
};

}  // namespace loadstar
