/// \file
/// `make_csv_dataset`: CSV files read into batches of named columns, as
/// `tf.data.experimental.make_csv_dataset`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/dataset/autotune.hpp"
#include "loadstar/data/dataset/batch.hpp"
#include "loadstar/data/dataset/csv.hpp"
#include "loadstar/data/dataset/interleave.hpp"
#include "loadstar/data/dataset/list_files.hpp"
#include "loadstar/data/dataset/map.hpp"
#include "loadstar/data/dataset/prefetch.hpp"
#include "loadstar/data/dataset/repeat.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// A column of `make_csv_dataset`'s selection, by index or by name (tf.data's `select_columns`
/// takes either).
struct CsvColumnRef {
  CsvColumnRef(std::size_t index) : value(index) {}  // NOLINT: implicit, as a list of indices
  CsvColumnRef(std::string name) : value(std::move(name)) {}    // NOLINT
  CsvColumnRef(const char* name) : value(std::string(name)) {}  // NOLINT
  std::variant<std::size_t, std::string> value;
};

/// The options of `make_csv_dataset`, named and defaulted as tf.data's.
struct MakeCsvOptions {
  /// One name per column of the files; empty: the first file's header line.
  std::vector<std::string> column_names = {};
  /// One per selected column (with `select_columns`) or per column; empty: the types are inferred
  /// from the first `num_rows_for_inference` records (the least permissive of int32, int64,
  /// float32, float64 and string that fits every value seen), every column optional with `0` or
  /// `""` for an empty field.
  std::vector<CsvColumn> column_defaults = {};
  /// The column given apart as the label; empty: none.
  std::string label_name = {};
  /// The columns to read, by index or name; empty: all.
  std::vector<CsvColumnRef> select_columns = {};
  std::string field_delim = ",";
  bool use_quote_delim = true;
  /// A field equal to this is missing (takes the column's default).
  std::string na_value = {};
  /// The files start with a header line (skipped, and the column names when `column_names` is
  /// empty).
  bool header = true;
  /// Passes over the files; absent: forever (tf.data's `None`), and then every batch is full.
  std::optional<std::size_t> num_epochs = {};
  /// Shuffle the files and, through a buffer of `shuffle_buffer_size`, the records.
  bool shuffle = true;
  std::size_t shuffle_buffer_size = 10000;
  /// The seed of both shuffles; drawn at random when absent.
  std::optional<std::uint64_t> shuffle_seed = {};
  /// Batches prefetched on a thread of their own; `AUTOTUNE` sizes the buffer; 0: none.
  std::size_t prefetch_buffer_size = AUTOTUNE;
  /// Files read at once, interleaved record by record (each on a thread of its own when more than
  /// one).
  std::size_t num_parallel_reads = 1;
  /// With several parallel reads, take a record from whichever file has one ready instead of in
  /// turn (faster, not deterministic).
  bool sloppy = false;
  /// Records read to infer the column types; absent: all of them.
  std::optional<std::size_t> num_rows_for_inference = 100;
  /// `""`, `"GZIP"` or `"ZLIB"`.
  std::string compression_type = {};
};

/// A batch of one column: int32, int64, float32 and float64 columns as tensors of shape
/// `(batch)`, string columns as lists.
using CsvColumnBatch = std::variant<Tensor<std::int32_t>, Tensor<std::int64_t>, Tensor<float>,
                                    Tensor<double>, std::vector<std::string>>;

/// An element of `make_csv_dataset`: the features by column name, and the label column when the
/// dataset has a `label_name`.
struct CsvBatch {
  std::map<std::string, CsvColumnBatch> features;
  std::optional<CsvColumnBatch> label;

  friend bool operator==(const CsvBatch&, const CsvBatch&) = default;

  /// The bytes held (what the prefetch's autotune counts).
  std::size_t bytes() const {
    std::size_t n = label ? element_bytes(*label) : 0;
    for (const auto& [name, column] : features)
      n += name.size() + element_bytes(column);
    return n;
  }
};

/// A numeric column batch as a tensor of `T` (a model's input or target); `name` is how errors
/// refer to it. Throws `ConfigError` for a string column.
template <TensorElement T>
Tensor<T> csv_column_as(const CsvColumnBatch& column, const std::string& name) {
  return std::visit(
      [&](const auto& values) -> Tensor<T> {
        using V = std::remove_cvref_t<decltype(values)>;
        if constexpr (std::is_same_v<V, std::vector<std::string>>) {
          throw ConfigError("make_csv_dataset: column '" + name +
                            "' holds strings but a tensor of numbers was asked for (leave it out "
                            "with select_columns, or map it to numbers first)");
        } else {
          return values.template cast<T>();
        }
      },
      column);
}

/// Every feature column as a tensor of `T`: the named inputs of a model
/// (`model.fit` takes a map from input name to tensor). Throws as `csv_column_as`.
template <TensorElement T>
std::map<std::string, Tensor<T>> csv_features_as(const CsvBatch& batch) {
  std::map<std::string, Tensor<T>> out;
  for (const auto& [name, column] : batch.features)
    out.emplace(name, csv_column_as<T>(column, name));
  return out;
}

namespace detail {

/// tf.data's inference (readers.py `_infer_type`): the least permissive of int32, int64,
/// float32, float64 and string that parses `text` and every value seen before (`seen`). A float
/// must be below infinity once rounded to its type (NumPy's `float32(text) < inf`), so an
/// overflow, `inf` and `nan` fall through to the next type.
inline std::optional<CsvType> csv_infer_type(const std::string& text, const std::string& na_value,
                                             std::optional<CsvType> seen) {
  if (text.empty() || text == na_value) return seen;
  const auto below_infinity = [](auto v) {
    return v && *v < std::numeric_limits<std::remove_cvref_t<decltype(*v)>>::infinity();
  };
  const bool fits[] = {
      csv_number<std::int32_t>(text).has_value(), csv_number<std::int64_t>(text).has_value(),
      below_infinity(csv_number<float>(text)), below_infinity(csv_number<double>(text)), true};
  for (std::size_t i = 0; i < 5; ++i) {
    const auto type = static_cast<CsvType>(i);
    if (fits[i] && (!seen || csv_type_index(*seen) <= i)) return type;
  }
  return CsvType::string;
}

/// The CSV options that a file reader of `make_csv_dataset` uses.
inline CsvOptions make_csv_reader_options(const MakeCsvOptions& o,
                                          std::vector<std::size_t> select_cols) {
  CsvOptions out;
  out.compression_type = o.compression_type;
  out.header = o.header;
  out.field_delim = o.field_delim;
  out.use_quote_delim = o.use_quote_delim;
  out.na_value = o.na_value;
  out.select_cols = std::move(select_cols);
  return out;
}

/// The columns of `make_csv_dataset` once the files are read: names, selected indices and types.
struct CsvPlan {
  std::vector<std::string> names;   // of the selected columns, in file order
  std::vector<std::size_t> select;  // empty: every column
  std::vector<CsvColumn> columns;   // one per selected column
};

inline std::string csv_join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names)
    out += (out.empty() ? "'" : ", '") + n + "'";
  return "(" + out + ")";
}

/// tf.data's preparation in `make_csv_dataset`: the column names (given, or every file's header
/// line, which must agree), the selected columns sorted by index, and the column types (given, or
/// inferred from the first records of the files in order).
inline CsvPlan make_csv_plan(const std::vector<std::string>& files, const MakeCsvOptions& o) {
  const std::string who = "make_csv_dataset";
  CsvOptions raw = make_csv_reader_options(o, {});
  std::vector<std::string> names = o.column_names;
  if (names.empty()) {
    if (!o.header) {
      throw ConfigError(who +
                        ": column_names must be given when header is false (there is no "
                        "header line to read them from)");
    }
    raw.header = false;
    for (const auto& file : files) {
      CsvDataset reader({file}, {CsvColumn{}}, raw);
      auto fields = reader.next_fields();
      if (!fields) {
        throw FormatError(who + ": csv file '" + file +
                          "' is empty but a header line (the column names) was expected");
      }
      if (names.empty()) {
        names = std::move(*fields);
      } else if (*fields != names) {
        throw FormatError(who + ": csv file '" + file + "' has the header " +
                          csv_join_names(*fields) + " but '" + files[0] + "' has " +
                          csv_join_names(names) + " (every file must have the same columns)");
      }
    }
    raw.header = true;
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (names[i] == names[j]) {
        throw ConfigError(who + ": column names must differ but '" + names[i] + "' names columns " +
                          std::to_string(j) + " and " + std::to_string(i));
      }
    }
  }

  CsvPlan plan;
  for (const auto& ref : o.select_columns) {
    if (const auto* index = std::get_if<std::size_t>(&ref.value)) {
      if (*index >= names.size()) {
        throw ConfigError(who + ": select_columns names column " + std::to_string(*index) +
                          " but the files have " + std::to_string(names.size()) + " columns");
      }
      plan.select.push_back(*index);
    } else {
      const auto& name = std::get<std::string>(ref.value);
      const auto it = std::find(names.begin(), names.end(), name);
      if (it == names.end()) {
        throw ConfigError(who + ": select_columns names '" + name + "', which is not a column of " +
                          csv_join_names(names));
      }
      plan.select.push_back(static_cast<std::size_t>(it - names.begin()));
    }
  }
  std::sort(plan.select.begin(), plan.select.end());
  for (std::size_t i = 1; i < plan.select.size(); ++i) {
    if (plan.select[i] == plan.select[i - 1]) {
      throw ConfigError(who + ": select_columns names column " + std::to_string(plan.select[i]) +
                        " ('" + names[plan.select[i]] + "') twice");
    }
  }
  const std::size_t selected = plan.select.empty() ? names.size() : plan.select.size();

  if (!o.column_defaults.empty()) {
    if (o.column_defaults.size() != selected) {
      throw ConfigError(who + ": column_defaults must have one entry per " +
                        (plan.select.empty() ? "column" : "selected column") + " (" +
                        std::to_string(selected) + ") but has " +
                        std::to_string(o.column_defaults.size()));
    }
    plan.columns = o.column_defaults;
  } else {
    std::vector<std::optional<CsvType>> types(selected);
    CsvDataset reader(files, {CsvColumn{}}, raw);
    for (std::size_t row = 0; !o.num_rows_for_inference || row < *o.num_rows_for_inference; ++row) {
      auto fields = reader.next_fields();
      if (!fields) break;
      if (fields->size() != names.size()) {
        throw FormatError(who + ": inferring the column types, record " + std::to_string(row + 1) +
                          " has " + std::to_string(fields->size()) + " fields but there are " +
                          std::to_string(names.size()) + " columns " + csv_join_names(names));
      }
      for (std::size_t j = 0; j < selected; ++j) {
        const std::size_t column = plan.select.empty() ? j : plan.select[j];
        types[j] = csv_infer_type((*fields)[column], o.na_value, types[j]);
      }
    }
    for (const auto& type : types) {
      const CsvType t = type.value_or(CsvType::string);
      CsvColumn column{t, {}};
      switch (t) {
        case CsvType::int32:
          column.default_value = std::int32_t{0};
          break;
        case CsvType::int64:
          column.default_value = std::int64_t{0};
          break;
        case CsvType::float32:
          column.default_value = 0.0f;
          break;
        case CsvType::float64:
          column.default_value = 0.0;
          break;
        default:
          column.default_value = std::string();
      }
      plan.columns.push_back(std::move(column));
    }
  }
  for (std::size_t j = 0; j < selected; ++j)
    plan.names.push_back(names[plan.select.empty() ? j : plan.select[j]]);
  if (!o.label_name.empty() &&
      std::find(plan.names.begin(), plan.names.end(), o.label_name) == plan.names.end()) {
    throw ConfigError(who + ": label_name '" + o.label_name + "' must be one of the columns " +
                      csv_join_names(plan.names));
  }
  return plan;
}

/// The pipeline of `make_csv_dataset` before its prefetch: files (shuffled), their records
/// interleaved, shuffled, repeated, batched and named.
inline auto make_csv_pipeline(ListFilesDataset files, const CsvPlan& plan, const MakeCsvOptions& o,
                              std::size_t batch_size, std::uint64_t seed) {
  const CsvOptions reader_options = make_csv_reader_options(o, plan.select);
  const std::vector<CsvColumn> columns = plan.columns;
  std::optional<std::size_t> label;
  for (std::size_t j = 0; j < plan.names.size(); ++j) {
    if (plan.names[j] == o.label_name) label = j;
  }
  return std::move(files)
      .interleave(
          [columns, reader_options](std::string file) {
            return CsvDataset({std::move(file)}, columns, reader_options);
          },
          o.num_parallel_reads, 1,
          InterleaveOptions{.num_parallel_calls = o.num_parallel_reads, .deterministic = !o.sloppy})
      // A buffer of one element passes the records through in order.
      .shuffle(o.shuffle ? o.shuffle_buffer_size : 1, seed)
      .repeat(o.num_epochs ? static_cast<std::int64_t>(*o.num_epochs) : -1)
      .batch(batch_size, !o.num_epochs.has_value())
      .map([names = plan.names, label](std::vector<CsvColumnBatch> batch) {
        CsvBatch out;
        for (std::size_t j = 0; j < batch.size(); ++j) {
          if (label && j == *label) {
            out.label = std::move(batch[j]);
          } else {
            out.features.emplace(names[j], std::move(batch[j]));
          }
        }
        return out;
      });
}

}  // namespace detail

/// CSV files read into batches of named columns, as `tf.data.experimental.make_csv_dataset`:
/// the files matching `file_patterns` (sorted; shuffled each epoch with `shuffle`) are read
/// `num_parallel_reads` at a time by `CsvDataset` and interleaved record by record; the records
/// go through a shuffle buffer, are repeated `num_epochs` times (forever when absent, and then the
/// last partial batch is dropped, as tf.data does), batched, split into the features by column
/// name and the label column, and prefetched.
///
/// Column names come from the first file's header unless given (every file's header must agree);
/// column types are inferred from the first `num_rows_for_inference` records unless given. The
/// state is the pipeline's, so a restore resumes at the next batch.
/// \code
/// auto train = make_csv_dataset({"data/train-*.csv"}, 32,
///                               {.label_name = "survived", .num_epochs = 1, .shuffle_seed = 7});
/// while (auto batch = train.next()) {
///   auto x = csv_features_as<float>(*batch);                  // {"age": (32), "fare": (32), ...}
///   auto y = csv_column_as<float>(*batch->label, "survived");  // (32)
/// }
/// \endcode
class MakeCsvDataset : public DatasetBase<MakeCsvDataset> {
  using Pipeline = decltype(detail::make_csv_pipeline(std::declval<ListFilesDataset>(),
                                                      std::declval<const detail::CsvPlan&>(),
                                                      std::declval<const MakeCsvOptions&>(), 1, 0));

  // Runs `f` on the stream in use (defined before the members that call it, which deduce its
  // return type).
  template <class F>
  decltype(auto) with_stream(F f) {
    return prefetched_ ? f(*prefetched_) : f(*plain_);
  }

 public:
  using element_type = CsvBatch;

  /// Throws `ConfigError` for bad options, `IoError` when no file matches, `FormatError` for
  /// files whose headers differ or whose first records do not fit the columns.
  MakeCsvDataset(const std::vector<std::string>& file_patterns, std::size_t batch_size,
                 const MakeCsvOptions& options)
      : seed_(options.shuffle_seed ? *options.shuffle_seed : std::random_device{}() % 1000000) {
    if (batch_size == 0) {
      throw ConfigError("make_csv_dataset: batch_size must be positive but is 0");
    }
    if (options.num_parallel_reads == 0) {
      throw ConfigError("make_csv_dataset: num_parallel_reads must be positive but is 0");
    }
    ListFilesDataset files(file_patterns, options.shuffle, seed_);
    plan_ = detail::make_csv_plan(files.files(), options);
    auto pipeline = detail::make_csv_pipeline(std::move(files), plan_, options, batch_size, seed_);
    if (options.prefetch_buffer_size == 0) {
      plain_.emplace(std::move(pipeline));
    } else {
      prefetched_.emplace(std::move(pipeline), options.prefetch_buffer_size);
    }
  }

  std::optional<element_type> next() {
    return with_stream([](auto& s) { return s.next(); });
  }
  void reset() {
    with_stream([](auto& s) { s.reset(); });
  }
  nlohmann::json state() const {
    return {{"op", "make_csv_dataset"},
            {"seed", seed_},
            {"upstream", prefetched_ ? prefetched_->state() : plain_->state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "make_csv_dataset");
    if (s["seed"] != seed_) {
      throw CheckpointError("make_csv_dataset: state was taken with shuffle_seed " +
                            s["seed"].dump() + " but this dataset has " + std::to_string(seed_));
    }
    with_stream([&](auto& stream) { stream.restore(s["upstream"]); });
  }

  /// The names of the columns read (the label's included), in file order.
  const std::vector<std::string>& column_names() const noexcept { return plan_.names; }
  /// Their types and defaults, given or inferred.
  const std::vector<CsvColumn>& column_defaults() const noexcept { return plan_.columns; }

 private:
  std::uint64_t seed_;
  detail::CsvPlan plan_;
  // One of the two: the pipeline, or the pipeline prefetched (`prefetch_buffer_size` > 0).
  std::optional<Pipeline> plain_;
  std::optional<PrefetchDataset<Pipeline>> prefetched_;
};

/// `tf.data.experimental.make_csv_dataset(file_pattern, batch_size, ...)`: see `MakeCsvDataset`.
inline MakeCsvDataset make_csv_dataset(const std::vector<std::string>& file_patterns,
                                       std::size_t batch_size, const MakeCsvOptions& options = {}) {
  return MakeCsvDataset(file_patterns, batch_size, options);
}

}  // namespace loadstar
