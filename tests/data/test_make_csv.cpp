// make_csv_dataset (tf.data.experimental.make_csv_dataset): column names from headers, tf.data's
// type inference (readers.py `_infer_type`: the least permissive of int32, int64, float32, float64
// and string, a float valid only below infinity once rounded), selection, labels, shuffling,
// epochs, parallel reads, exact resume and the refusals; and the stacking of strings and CSV
// fields that its batches rest on.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>
#include <map>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "dataset/resume_check.hpp"
#include "temp_dir.hpp"

using loadstar::ConfigError;
using loadstar::CsvBatch;
using loadstar::CsvColumn;
using loadstar::CsvColumnBatch;
using loadstar::CsvType;
using loadstar::FormatError;
using loadstar::IoError;
using loadstar::MakeCsvOptions;
using loadstar::Tensor;
using test_support::TempDir;

static_assert(loadstar::Dataset<loadstar::MakeCsvDataset>);
static_assert(std::same_as<loadstar::element_t<loadstar::MakeCsvDataset>, CsvBatch>);

namespace {

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The column's values, whatever its type, as text (numbers through their C++ value).
template <class T>
const T& column_as(const CsvColumnBatch& column) {
  REQUIRE_MESSAGE(std::holds_alternative<T>(column),
                  "the column holds alternative " << column.index());
  return std::get<T>(column);
}

template <class T>
std::vector<T> values_of(const Tensor<T>& t) {
  return {t.data(), t.data() + t.size()};
}

// Every record of a dataset, label included, one epoch: column name -> its values as text.
std::map<std::string, std::vector<std::string>> drain(loadstar::MakeCsvDataset& ds,
                                                      const std::string& label = {}) {
  std::map<std::string, std::vector<std::string>> out;
  const auto add = [&](const std::string& name, const CsvColumnBatch& column) {
    std::visit(
        [&](const auto& v) {
          using V = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::vector<std::string>>) {
            out[name].insert(out[name].end(), v.begin(), v.end());
          } else {
            for (std::size_t i = 0; i < v.size(); ++i)
              out[name].push_back(std::to_string(v.data()[i]));
          }
        },
        column);
  };
  while (auto batch = ds.next()) {
    for (const auto& [name, column] : batch->features)
      add(name, column);
    if (batch->label) add(label, *batch->label);
  }
  return out;
}

}  // namespace

TEST_CASE("make_csv_dataset infers names and types as tf.data and splits off the label") {
  TempDir dir;
  // Columns: i32 (int32), big (3000000000 does not fit int32: int64), f (float32), huge (1e40
  // overflows float32: float64), nan ('nan' is not below infinity: string), s (string),
  // empty (no value seen: string), mixed (an int then a float: float32), y (the label).
  write_text(dir / "a.csv",
             "i32,big,f,huge,nan,s,empty,mixed,y\n"
             "1,3000000000,0.5,1e40,nan,x,,2,0\n"
             "-2,5,,2.5,1,\"q,r\",,2.25,1\n"
             " 3 ,+7,1e3,1,2,z,,-1,1\n");
  auto ds = loadstar::make_csv_dataset({(dir / "*.csv").string()}, 2,
                                       {.label_name = "y", .num_epochs = 1, .shuffle = false});
  CHECK(ds.column_names() ==
        std::vector<std::string>{"i32", "big", "f", "huge", "nan", "s", "empty", "mixed", "y"});
  std::vector<CsvType> types;
  for (const auto& c : ds.column_defaults()) {
    types.push_back(c.type);
    CHECK(c.default_value.has_value());  // inferred columns are optional
  }
  CHECK(types == std::vector<CsvType>{CsvType::int32, CsvType::int64, CsvType::float32,
                                      CsvType::float64, CsvType::string, CsvType::string,
                                      CsvType::string, CsvType::float32, CsvType::int32});

  auto first = ds.next();
  REQUIRE(first);
  CHECK(first->features.size() == 8);
  CHECK(!first->features.contains("y"));
  REQUIRE(first->label);
  CHECK(values_of(column_as<Tensor<std::int32_t>>(*first->label)) ==
        std::vector<std::int32_t>{0, 1});
  CHECK(values_of(column_as<Tensor<std::int32_t>>(first->features.at("i32"))) ==
        std::vector<std::int32_t>{1, -2});
  CHECK(values_of(column_as<Tensor<std::int64_t>>(first->features.at("big"))) ==
        std::vector<std::int64_t>{3000000000, 5});
  // An empty field takes the inferred column's default, 0.
  CHECK(values_of(column_as<Tensor<float>>(first->features.at("f"))) ==
        std::vector<float>{0.5f, 0.0f});
  CHECK(values_of(column_as<Tensor<double>>(first->features.at("huge"))) ==
        std::vector<double>{1e40, 2.5});
  CHECK(column_as<std::vector<std::string>>(first->features.at("s")) ==
        std::vector<std::string>{"x", "q,r"});
  CHECK(column_as<std::vector<std::string>>(first->features.at("empty")) ==
        std::vector<std::string>{"", ""});
  CHECK(column_as<Tensor<std::int32_t>>(first->features.at("i32")).shape() == loadstar::Shape{2});
  // One epoch of three records: the last batch holds the one left.
  auto last = ds.next();
  REQUIRE(last);
  CHECK(values_of(column_as<Tensor<std::int32_t>>(last->features.at("i32"))) ==
        std::vector<std::int32_t>{3});
  CHECK(!ds.next());

  // The features of a batch as a model's named inputs; strings are refused by name.
  CHECK_THROWS_WITH_AS(loadstar::csv_features_as<float>(*first),
                       doctest::Contains("make_csv_dataset: column 'empty' holds strings"),
                       ConfigError);
  CsvBatch numeric = *first;
  for (const char* name : {"nan", "s", "empty"})
    numeric.features.erase(name);
  const auto x = loadstar::csv_features_as<float>(numeric);
  CHECK(values_of(x.at("big")) == std::vector<float>{3e9f, 5.0f});
  CHECK(values_of(loadstar::csv_column_as<float>(*first->label, "y")) ==
        std::vector<float>{0.0f, 1.0f});
}

TEST_CASE("make_csv_dataset selects columns by name or index and takes given types") {
  TempDir dir;
  write_text(dir / "a.csv", "a,b,c,d\n1,2,3,4\n5,6,7,8\n");
  // By name and index, in any order: read in file order.
  auto ds = loadstar::make_csv_dataset({(dir / "a.csv").string()}, 4,
                                       {.label_name = "d",
                                        .select_columns = {"d", std::size_t{1}},
                                        .num_epochs = 1,
                                        .shuffle = false});
  CHECK(ds.column_names() == std::vector<std::string>{"b", "d"});
  auto batch = ds.next();
  REQUIRE(batch);
  CHECK(batch->features.size() == 1);
  CHECK(values_of(column_as<Tensor<std::int32_t>>(batch->features.at("b"))) ==
        std::vector<std::int32_t>{2, 6});
  CHECK(values_of(column_as<Tensor<std::int32_t>>(*batch->label)) ==
        std::vector<std::int32_t>{4, 8});

  // Given names (the header line is then skipped, not read) and given types.
  auto typed = loadstar::make_csv_dataset(
      {(dir / "a.csv").string()}, 2,
      {.column_names = {"w", "x", "y", "z"},
       .column_defaults = {CsvColumn{CsvType::float64}, CsvColumn{CsvType::string},
                           CsvColumn{CsvType::int64}, CsvColumn{CsvType::float32}},
       .num_epochs = 1,
       .shuffle = false});
  auto t = typed.next();
  REQUIRE(t);
  CHECK(values_of(column_as<Tensor<double>>(t->features.at("w"))) == std::vector<double>{1.0, 5.0});
  CHECK(column_as<std::vector<std::string>>(t->features.at("x")) ==
        std::vector<std::string>{"2", "6"});
  CHECK(!t->label);
}

TEST_CASE("make_csv_dataset without num_epochs repeats forever in full batches") {
  TempDir dir;
  write_text(dir / "a.csv", "v\n0\n1\n2\n3\n4\n");
  auto ds = loadstar::make_csv_dataset({(dir / "a.csv").string()}, 2, {.shuffle = false});
  std::vector<std::int32_t> seen;
  for (int i = 0; i < 10; ++i) {
    auto batch = ds.next();
    REQUIRE(batch);
    const auto v = values_of(column_as<Tensor<std::int32_t>>(batch->features.at("v")));
    REQUIRE(v.size() == 2);
    seen.insert(seen.end(), v.begin(), v.end());
  }
  // Records run on across epochs: batches straddle them and none is short.
  CHECK(seen ==
        std::vector<std::int32_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4});
}

TEST_CASE("make_csv_dataset shuffles files and records by seed, every record once per epoch") {
  TempDir dir;
  std::string a = "v\n", b = "v\n";
  for (int i = 0; i < 20; ++i)
    a += std::to_string(i) + "\n";
  for (int i = 100; i < 120; ++i)
    b += std::to_string(i) + "\n";
  write_text(dir / "a.csv", a);
  write_text(dir / "b.csv", b);
  const auto make = [&](std::uint64_t seed) {
    return loadstar::make_csv_dataset(
        {(dir / "*.csv").string()}, 8,
        {.num_epochs = 2, .shuffle_buffer_size = 10, .shuffle_seed = seed});
  };
  auto one = make(3), same = make(3), other = make(4);
  const auto got = drain(one)["v"];
  CHECK(got == drain(same)["v"]);
  CHECK(got != drain(other)["v"]);
  REQUIRE(got.size() == 80);
  const std::vector<std::string> first(got.begin(), got.begin() + 40),
      second(got.begin() + 40, got.end());
  CHECK(first != second);  // reshuffled each epoch
  CHECK(std::multiset<std::string>(first.begin(), first.end()) ==
        std::multiset<std::string>(second.begin(), second.end()));
  CHECK(std::set<std::string>(first.begin(), first.end()).size() == 40);

  // Unshuffled, two parallel reads interleave the sorted files record by record.
  auto both =
      loadstar::make_csv_dataset({(dir / "b.csv").string(), (dir / "a.csv").string()}, 4,
                                 {.num_epochs = 1, .shuffle = false, .num_parallel_reads = 2});
  const auto v = drain(both)["v"];
  REQUIRE(v.size() == 40);
  CHECK(std::vector<std::string>(v.begin(), v.begin() + 4) ==
        std::vector<std::string>{"0", "100", "1", "101"});
}

TEST_CASE("make_csv_dataset resumes exactly, prefetched or not") {
  TempDir dir;
  for (const char* name : {"a.csv", "b.csv"}) {
    std::string text = "x,y\n";
    for (int i = 0; i < 15; ++i)
      text += std::to_string(name[0] == 'a' ? i : 100 + i) + "," + std::to_string(i % 3) + "\n";
    write_text(dir / name, text);
  }
  for (const std::size_t prefetch : {std::size_t{0}, std::size_t{2}, loadstar::AUTOTUNE}) {
    CAPTURE(prefetch);
    dataset_test::check_exact_resume(
        [&] {
          return loadstar::make_csv_dataset({(dir / "*.csv").string()}, 4,
                                            {.label_name = "y",
                                             .num_epochs = 1,
                                             .shuffle_buffer_size = 7,
                                             .shuffle_seed = 11,
                                             .prefetch_buffer_size = prefetch});
        },
        2, 6);
  }
  auto ds = loadstar::make_csv_dataset({(dir / "*.csv").string()}, 4, {.shuffle_seed = 1});
  auto state = ds.state();
  state["seed"] = 2;
  CHECK_THROWS_WITH_AS(ds.restore(state),
                       "make_csv_dataset: state was taken with shuffle_seed 2 but this dataset "
                       "has 1",
                       loadstar::CheckpointError);
}

TEST_CASE("make_csv_dataset refuses bad options and files, naming them") {
  TempDir dir;
  write_text(dir / "a.csv", "a,b\n1,2\n");
  write_text(dir / "b.csv", "a,c\n1,2\n");
  write_text(dir / "ragged.csv", "a,b\n1,2\n3\n");
  const auto a = (dir / "a.csv").string();
  const std::string headers = "csv file '" + (dir / "b.csv").string() +
                              "' has the header ('a', 'c') but '" + a + "' has ('a', 'b')";
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({(dir / "*.csv").string()}, 2),
                       doctest::Contains(headers.c_str()), FormatError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({(dir / "ragged.csv").string()}, 2),
                       "make_csv_dataset: inferring the column types, record 2 has 1 fields but "
                       "there are 2 columns ('a', 'b')",
                       FormatError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 2, {.header = false}),
                       doctest::Contains("column_names must be given when header is false"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 2, {.label_name = "z"}),
                       "make_csv_dataset: label_name 'z' must be one of the columns ('a', 'b')",
                       ConfigError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 2, {.select_columns = {"a", "q"}}),
                       "make_csv_dataset: select_columns names 'q', which is not a column of "
                       "('a', 'b')",
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      loadstar::make_csv_dataset({a}, 2, {.select_columns = {"a", std::size_t{0}}}),
      "make_csv_dataset: select_columns names column 0 ('a') twice", ConfigError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 2, {.select_columns = {std::size_t{2}}}),
                       "make_csv_dataset: select_columns names column 2 but the files have 2 "
                       "columns",
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      loadstar::make_csv_dataset({a}, 2, {.column_defaults = {CsvColumn{CsvType::int32}}}),
      "make_csv_dataset: column_defaults must have one entry per column (2) but has 1",
      ConfigError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 2, {.column_names = {"x", "x"}}),
                       "make_csv_dataset: column names must differ but 'x' names columns 0 and 1",
                       ConfigError);
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({a}, 0),
                       "make_csv_dataset: batch_size must be positive but is 0", ConfigError);
  const std::string unmatched =
      "list_files: no files matched pattern '" + (dir / "*.tsv").string() + "'";
  CHECK_THROWS_WITH_AS(loadstar::make_csv_dataset({(dir / "*.tsv").string()}, 2), unmatched.c_str(),
                       IoError);
  // A bad value past the inferred rows is the reader's error, with file, line and column.
  std::string rows = "a\n";
  for (int i = 0; i < 5; ++i)
    rows += "1\n";
  write_text(dir / "late.csv", rows + "oops\n");
  auto late =
      loadstar::make_csv_dataset({(dir / "late.csv").string()}, 8,
                                 {.num_epochs = 1, .shuffle = false, .num_rows_for_inference = 3});
  CHECK_THROWS_WITH_AS(late.next(),
                       doctest::Contains("late.csv' line 7 column 1: expected an int32 but found "
                                         "'oops'"),
                       FormatError);
}

TEST_CASE("batch stacks strings into lists and CSV fields by their type") {
  TempDir dir;
  write_text(dir / "a.csv", "1,x\n2,y\n3,z\n");
  auto rows = loadstar::CsvDataset({(dir / "a.csv").string()},
                                   {CsvColumn{CsvType::int64}, CsvColumn{CsvType::string}})
                  .batch(2);
  auto batch = rows.next();
  REQUIRE(batch);
  REQUIRE(batch->size() == 2);
  CHECK(values_of(std::get<Tensor<std::int64_t>>((*batch)[0])) == std::vector<std::int64_t>{1, 2});
  CHECK(std::get<std::vector<std::string>>((*batch)[1]) == std::vector<std::string>{"x", "y"});

  write_text(dir / "t.txt", "one\ntwo\nthree\n");
  auto lines = loadstar::TextLineDataset({(dir / "t.txt").string()}).batch(2);
  CHECK(lines.next() == std::vector<std::string>{"one", "two"});
  CHECK(lines.next() == std::vector<std::string>{"three"});

  // Elements holding different alternatives cannot stack.
  using Field = std::variant<std::int32_t, std::string>;
  CHECK_THROWS_WITH_AS(loadstar::detail::Stacker<Field>::stack({Field{1}, Field{"a"}}),
                       "batch: element 1 holds alternative 1 of its variant but element 0 holds "
                       "alternative 0",
                       loadstar::ShapeError);
}

TEST_CASE("list_files takes several patterns, sorted together") {
  TempDir dir;
  for (const char* name : {"b.csv", "a.txt", "c.csv"})
    write_text(dir / name, "");
  auto files = loadstar::list_files(
      std::vector<std::string>{(dir / "*.txt").string(), (dir / "*.csv").string()}, false);
  CHECK(files.files() == std::vector<std::string>{(dir / "a.txt").string(),
                                                  (dir / "b.csv").string(),
                                                  (dir / "c.csv").string()});
  CHECK_THROWS_WITH_AS(loadstar::list_files(std::vector<std::string>{}),
                       "list_files: expected a pattern but the list is empty", ConfigError);
}
