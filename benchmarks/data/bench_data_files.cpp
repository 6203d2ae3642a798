// File-source throughput on the "tfrecord" workload of `benchmarks/run data`: shards of
// tf.train.Example records (each an encoded-image-sized bytes feature, an int64 label and 8
// floats, as an image dataset's shards hold) read from the page cache by TFRecordDataset with
// both CRCs checked ("tfrecord/read/1"), and read and parsed with parse_single_example
// ("tfrecord/parse/1"). The rate is the shards' bytes per second (GB/s); the counter
// "page_cache" is the sequential read bandwidth of the same files from the page cache, measured
// in the same process, which the target compares against (at least 0.8 of it).
// The "csv" and "text" workloads parse a CSV file of 100000 rows (an int64 label and 8 floats)
// with CsvDataset ("csv/parse/1") and read a text file of 200000 lines with TextLineDataset
// ("text/lines/1"), in rows/s, beside pandas' read_csv and Python's line iteration
// (peers/data_files.py) on the same files, which both sides write alike.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <loadstar/data/dataset/csv.hpp>
#include <loadstar/data/dataset/text_line.hpp>
#include <loadstar/data/dataset/tfrecord.hpp>
#include <loadstar/data/example.hpp>
#include <loadstar/detail/crc32c.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr std::size_t shards = 4;
constexpr std::size_t examples_per_shard = 1250;
constexpr std::size_t image_bytes = 16 * 1024;

// The protobuf wire format, written by hand for the fixture only (the reader under test parses
// it with protobuf's own library): tag, varint, length-delimited fields.
void varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void field(std::string& out, int number, const std::string& bytes) {
  varint(out, static_cast<std::uint64_t>(number) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}
// Features.feature's map entry: key (1), value (2) a Feature whose list is field `kind`.
std::string entry(const std::string& key, int kind, const std::string& list) {
  std::string feature, e;
  field(feature, kind, list);
  field(e, 1, key);
  field(e, 2, feature);
  return e;
}

std::string example(std::mt19937_64& rng, std::int64_t label) {
  std::string image(image_bytes, '\0');
  for (auto& c : image)
    c = static_cast<char>(rng());
  std::string bytes_list, int64_list, packed, float_list, floats;
  field(bytes_list, 1, image);
  varint(packed, static_cast<std::uint64_t>(label));
  field(int64_list, 1, packed);
  for (int i = 0; i < 8; ++i) {
    const float value = static_cast<float>(i) * 0.5f;
    floats.append(reinterpret_cast<const char*>(&value), sizeof value);
  }
  field(float_list, 1, floats);
  std::string features;
  field(features, 1, entry("image/encoded", 1, bytes_list));
  field(features, 1, entry("image/class/label", 3, int64_list));
  field(features, 1, entry("image/object/bbox", 2, float_list));
  std::string out;
  field(out, 1, features);
  return out;
}

void put32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>(value >> (8 * i)));
}

struct Shards {
  std::filesystem::path dir;
  std::vector<std::string> files;
  std::uint64_t bytes = 0;

  Shards() {
    dir = std::filesystem::temp_directory_path() /
          ("loadstar-bench-tfrecord-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    std::mt19937_64 rng(35);
    for (std::size_t s = 0; s < shards; ++s) {
      std::string data;
      for (std::size_t i = 0; i < examples_per_shard; ++i) {
        const std::string record = example(rng, static_cast<std::int64_t>(i % 1000));
        std::string length;
        for (int b = 0; b < 8; ++b)
          length.push_back(static_cast<char>(static_cast<std::uint64_t>(record.size()) >> (8 * b)));
        data += length;
        put32(data, loadstar::detail::masked_crc32c(length));
        data += record;
        put32(data, loadstar::detail::masked_crc32c(record));
      }
      const auto path = dir / ("train-" + std::to_string(s) + ".tfrecord");
      std::ofstream(path, std::ios::binary) << data;
      files.push_back(path.string());
      bytes += data.size();
    }
  }
  ~Shards() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

// Sequential read() of every shard through a 256 KiB buffer (TFRecordDataset's default), the
// files already in the page cache: GB/s over about 0.5 s.
double page_cache_bandwidth(const Shards& data) {
  std::vector<char> buffer(256 * 1024);
  const auto read_all = [&] {
    std::uint64_t total = 0;
    for (const auto& file : data.files) {
      const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      ssize_t got = 0;
      while ((got = ::read(fd, buffer.data(), buffer.size())) > 0)
        total += static_cast<std::uint64_t>(got);
      ::close(fd);
    }
    return total;
  };
  read_all();  // Into the page cache.
  const auto start = std::chrono::steady_clock::now();
  std::uint64_t bytes = 0;
  do {
    bytes += read_all();
  } while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) / seconds / 1e9;
}

template <bool Parse>
void run(benchmark::State& state, const Shards& data, double page_cache) {
  const loadstar::FeatureSpecs features = {
      {"image/encoded", loadstar::FixedLenFeature{{}, loadstar::ExampleDtype::string}},
      {"image/class/label", loadstar::FixedLenFeature{{}, loadstar::ExampleDtype::int64}},
      {"image/object/bbox", loadstar::VarLenFeature{loadstar::ExampleDtype::float32}}};
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    loadstar::TFRecordDataset records(data.files);
    while (auto record = records.next()) {
      if constexpr (Parse) {
        auto parsed = loadstar::parse_single_example(*record, features);
        benchmark::DoNotOptimize(parsed);
      } else {
        benchmark::DoNotOptimize(record);
      }
    }
    bytes += data.bytes;
  }
  state.counters["rate"] =
      benchmark::Counter(static_cast<double>(bytes) / 1e9, benchmark::Counter::kIsRate);
  state.counters["page_cache"] = page_cache;
  state.SetLabel("GB/s");
}

// The CSV and text files of the "csv" and "text" workloads, written as peers/data_files.py
// writes them: row i's label is i % 10 and its floats (i * 7 + j) % 1000 / 8 with three decimals;
// line i of the text is "line i: " and 52 letters.
struct TextFiles {
  static constexpr std::size_t csv_rows = 100000;
  static constexpr std::size_t text_lines = 200000;
  std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("bench_data_text_" + std::to_string(::getpid()));
  std::string csv = (dir / "rows.csv").string();
  std::string text = (dir / "lines.txt").string();

  TextFiles() {
    std::filesystem::create_directories(dir);
    std::string out = "label,f0,f1,f2,f3,f4,f5,f6,f7\n";
    char field[32];
    for (std::size_t i = 0; i < csv_rows; ++i) {
      out += std::to_string(i % 10);
      for (std::size_t j = 0; j < 8; ++j) {
        std::snprintf(field, sizeof field, ",%.3f", static_cast<double>((i * 7 + j) % 1000) / 8);
        out += field;
      }
      out += '\n';
    }
    std::ofstream(csv, std::ios::binary) << out;
    out.clear();
    const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    for (std::size_t i = 0; i < text_lines; ++i)
      out += "line " + std::to_string(i) + ": " + letters + '\n';
    std::ofstream(text, std::ios::binary) << out;
  }
  ~TextFiles() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
};

template <class Make>
void run_rows(benchmark::State& state, Make make) {
  std::uint64_t rows = 0;
  for (auto _ : state) {
    auto dataset = make();
    while (auto row = dataset.next()) {
      benchmark::DoNotOptimize(row);
      ++rows;
    }
  }
  state.counters["rate"] =
      benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsRate);
  state.SetLabel("rows/s");
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  static const Shards data;
  const double page_cache = page_cache_bandwidth(data);
  benchmark::RegisterBenchmark("tfrecord/read/1", [page_cache](benchmark::State& s) {
    run<false>(s, data, page_cache);
  })->UseRealTime();
  benchmark::RegisterBenchmark("tfrecord/parse/1", [page_cache](benchmark::State& s) {
    run<true>(s, data, page_cache);
  })->UseRealTime();
  static const TextFiles text;
  benchmark::RegisterBenchmark("csv/parse/1", [](benchmark::State& s) {
    run_rows(s, [] {
      std::vector<loadstar::CsvColumn> columns{{loadstar::CsvType::int64}};
      for (int j = 0; j < 8; ++j)
        columns.push_back({loadstar::CsvType::float32});
      return loadstar::CsvDataset({text.csv}, columns, {.header = true});
    });
  })->UseRealTime();
  benchmark::RegisterBenchmark("text/lines/1", [](benchmark::State& s) {
    run_rows(s, [] { return loadstar::TextLineDataset({text.text}); });
  })->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
