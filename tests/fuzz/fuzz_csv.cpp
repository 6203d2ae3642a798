// libFuzzer harness: CsvDataset (with and without quoting, a header, select_cols and the na_value)
// and TextLineDataset over the input as a file.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/dataset/csv.hpp>
#include <loadstar/data/dataset/text_line.hpp>
#include <loadstar/error.hpp>
#include <string>
#include <vector>

#include "fuzz_common.hpp"

namespace {

void read_csv(const std::string& path, std::vector<loadstar::CsvColumn> columns,
              loadstar::CsvOptions options) {
  try {
    loadstar::CsvDataset ds({path}, std::move(columns), std::move(options));
    while (ds.next()) {
    }
  } catch (const loadstar::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".csv").string();
  using loadstar::CsvType;
  using loadstar::CsvValue;
  const std::vector<loadstar::CsvColumn> columns{{CsvType::int64, CsvValue{std::int64_t{0}}},
                                                 {CsvType::string, CsvValue{std::string()}},
                                                 {CsvType::float32, {}},
                                                 {CsvType::int32, CsvValue{std::int32_t{-1}}}};
  loadstar::CsvOptions options;
  options.buffer_size = 7;
  read_csv(path, columns, options);
  options.header = true;
  options.use_quote_delim = false;
  options.na_value = "NA";
  options.field_delim = ";";
  read_csv(path, columns, options);
  options.use_quote_delim = true;
  options.select_cols = {0, 2};
  read_csv(path, {columns[1], columns[3]}, options);
  try {
    loadstar::TextLineDataset lines({path}, "", 5);
    while (lines.next()) {
    }
  } catch (const loadstar::Error&) {
  }
  return 0;
}
