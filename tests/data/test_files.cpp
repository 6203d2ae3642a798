// File sources of the pipelines: list_files, TFRecordDataset, tf.train.Example parsing,
// TextLineDataset and CsvDataset, against the fixtures of tests/data/files/ (written by
// make_fixtures.py with protobuf, crc32c, gzip, zlib and Python's csv module).
#include <doctest/doctest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/example.hpp>
#include <loadstar/data/npz.hpp>
#include <loadstar/detail/crc32c.hpp>
#include <loadstar/error.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dataset/resume_check.hpp"
#include "temp_dir.hpp"

using dataset_test::check_exact_resume;
using loadstar::CheckpointError;
using loadstar::ConfigError;
using loadstar::CsvColumn;
using loadstar::CsvDataset;
using loadstar::CsvOptions;
using loadstar::CsvType;
using loadstar::CsvValue;
using loadstar::ExampleDtype;
using loadstar::FixedLenFeature;
using loadstar::FixedLenSequenceFeature;
using loadstar::FormatError;
using loadstar::IoError;
using loadstar::Tensor;
using loadstar::TextLineDataset;
using loadstar::TFRecordDataset;
using loadstar::VarLenFeature;

static_assert(loadstar::Dataset<loadstar::ListFilesDataset>);
static_assert(loadstar::Dataset<TFRecordDataset>);
static_assert(loadstar::Dataset<TextLineDataset>);
static_assert(loadstar::Dataset<CsvDataset>);
static_assert(std::same_as<loadstar::element_t<CsvDataset>, std::vector<CsvValue>>);

namespace {

std::filesystem::path fixtures() {
  const char* source = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(source != nullptr, "LOADSTAR_SOURCE_DIR must name the source tree");
  return std::filesystem::path(source) / "tests" / "data" / "files";
}

std::string fixture(const std::string& name) {
  return (fixtures() / name).string();
}

nlohmann::json read_json(const std::string& name) {
  std::ifstream in(fixtures() / name);
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

template <class D>
std::vector<std::string> drain(D& dataset) {
  std::vector<std::string> out;
  while (auto element = dataset.next())
    out.push_back(*element);
  return out;
}

// The file suffixes and compression types of the fixtures' three variants.
std::vector<std::pair<std::string, std::string>> compressions() {
  return {{"", ""}, {".gz", "GZIP"}, {".zlib", "ZLIB"}};
}

doctest::Contains contains(const std::string& text) {
  return doctest::Contains(text.c_str());
}

std::vector<std::string> record_files(const std::string& suffix = "") {
  return {fixture("records-0.tfrecord" + suffix), fixture("records-1.tfrecord" + suffix),
          fixture("records-2.tfrecord" + suffix)};
}

// Checks a record against its length, first bytes and zlib CRC-32 in records.json.
void check_record(const std::string& record, const nlohmann::json& expected) {
  REQUIRE(record.size() == expected["length"].get<std::size_t>());
  CHECK(record.substr(0, 24) == expected["prefix"].get<std::string>());
  const auto crc =
      crc32(0L, reinterpret_cast<const Bytef*>(record.data()), static_cast<uInt>(record.size()));
  CHECK(crc == expected["crc32"].get<std::uint64_t>());
}

// The order tf.data's interleave(cycle_length, block_length=1) reads the files' records in,
// computed from records.json: (file, record) pairs.
std::vector<std::pair<std::size_t, std::size_t>> interleaved(const nlohmann::json& files,
                                                             std::size_t cycle) {
  std::vector<std::pair<std::size_t, std::size_t>> order;
  struct Slot {
    bool open = false;
    std::size_t file = 0, next = 0;
  };
  std::vector<Slot> slots(cycle);
  std::size_t next_file = 0, current = 0, open = 0;
  while (next_file < files.size() || open > 0) {
    Slot& s = slots[current];
    if (s.open) {
      if (s.next < files[s.file].size()) {
        order.emplace_back(s.file, s.next++);
      } else {
        s.open = false;
        --open;
      }
      current = (current + 1) % cycle;
    } else if (next_file < files.size()) {
      s = Slot{true, next_file++, 0};
      ++open;
    } else {
      current = (current + 1) % cycle;
    }
  }
  return order;
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("list_files matches tf.data's glob sorted and shuffles per epoch") {
    test_support::TempDir dir;
    for (const char* name : {"b.txt", "a.txt", "c.dat", ".hidden.txt", "ab.txt"})
      write_bytes(dir / name, "x");
    std::filesystem::create_directories(dir / "sub1");
    std::filesystem::create_directories(dir / "sub2");
    std::filesystem::create_directories(dir / "other");
    write_bytes(dir / "sub1" / "x.txt", "x");
    write_bytes(dir / "sub2" / "y.txt", "x");
    write_bytes(dir / "other" / "z.txt", "x");
    const std::string root = dir.path().string();

    auto all = loadstar::list_files(root + "/*.txt", false);
    CHECK(drain(all) == std::vector<std::string>{root + "/.hidden.txt", root + "/a.txt",
                                                 root + "/ab.txt", root + "/b.txt"});
    auto one = loadstar::list_files(root + "/?.txt", false);
    CHECK(drain(one) == std::vector<std::string>{root + "/a.txt", root + "/b.txt"});
    auto set = loadstar::list_files(root + "/[ac].*", false);
    CHECK(drain(set) == std::vector<std::string>{root + "/a.txt", root + "/c.dat"});
    auto dirs = loadstar::list_files(root + "/sub*/*.txt", false);
    CHECK(drain(dirs) == std::vector<std::string>{root + "/sub1/x.txt", root + "/sub2/y.txt"});
    auto literal = loadstar::list_files(root + "/c.dat", false);
    CHECK(drain(literal) == std::vector<std::string>{root + "/c.dat"});

    CHECK_THROWS_WITH_AS(loadstar::list_files(root + "/*.csv"),
                         contains("no files matched pattern '" + root + "/*.csv'"), IoError);

    SUBCASE("shuffled: the same files in a new order each epoch, the same in every run") {
      auto a = loadstar::list_files(root + "/*/*.txt", true, 5);
      auto b = loadstar::list_files(root + "/*/*.txt", true, 5);
      std::vector<std::vector<std::string>> epochs;
      for (int e = 0; e < 6; ++e) {
        if (e > 0) {
          a.reset();
          b.reset();
        }
        auto got = drain(a);
        CHECK(got == drain(b));
        std::vector<std::string> sorted = got;
        std::sort(sorted.begin(), sorted.end());
        CHECK(sorted == std::vector<std::string>{root + "/other/z.txt", root + "/sub1/x.txt",
                                                 root + "/sub2/y.txt"});
        epochs.push_back(got);
      }
      CHECK(std::set<std::vector<std::string>>(epochs.begin(), epochs.end()).size() > 1);
      check_exact_resume([&] { return loadstar::list_files(root + "/*/*.txt", true, 5); }, 4, 8);
    }
    SUBCASE("sharded by rank the shards partition the files") {
      std::vector<std::string> together;
      for (std::size_t rank = 0; rank < 2; ++rank) {
        auto mine = loadstar::list_files(root + "/*.txt", false).shard(2, rank);
        for (auto& f : drain(mine))
          together.push_back(f);
      }
      std::sort(together.begin(), together.end());
      CHECK(together == loadstar::list_files(root + "/*.txt", false).files());
    }
  }

  TEST_CASE("TFRecordDataset reads the records of plain GZIP and ZLIB files") {
    const auto expected = read_json("records.json");
    for (const auto& variant : compressions()) {
      // Named, not bound: clang 14 lets no lambda (CAPTURE) capture a binding.
      const std::string& suffix = variant.first;
      const std::string& compression = variant.second;
      CAPTURE(compression);
      for (const std::size_t buffer : {std::size_t{0}, std::size_t{5}, std::size_t{256 * 1024}}) {
        CAPTURE(buffer);
        TFRecordDataset ds(record_files(suffix), compression, buffer);
        const auto records = drain(ds);
        std::size_t i = 0;
        for (std::size_t f = 0; f < expected.size(); ++f) {
          for (const auto& e : expected[f]) {
            REQUIRE(i < records.size());
            check_record(records[i++], e);
          }
        }
        CHECK(i == records.size());
      }
    }
  }

  TEST_CASE("TFRecordDataset interleaves files as tf.data with num_parallel_reads") {
    const auto expected = read_json("records.json");
    for (const std::size_t parallel : {std::size_t{2}, std::size_t{3}, std::size_t{5}}) {
      CAPTURE(parallel);
      TFRecordDataset ds(record_files(), "", 1024, parallel);
      const auto records = drain(ds);
      const auto order = interleaved(expected, parallel);
      REQUIRE(records.size() == order.size());
      for (std::size_t i = 0; i < order.size(); ++i)
        check_record(records[i], expected[order[i].first][order[i].second]);
    }
  }

  TEST_CASE("TFRecordDataset resumes exactly at random points across epochs") {
    for (const auto& variant : compressions()) {
      // Named, not bound: clang 14 lets no lambda (CAPTURE) capture a binding.
      const std::string& suffix = variant.first;
      const std::string& compression = variant.second;
      for (const std::size_t parallel : {std::size_t{1}, std::size_t{2}}) {
        CAPTURE(compression);
        CAPTURE(parallel);
        const auto files = record_files(suffix);
        check_exact_resume([&] { return TFRecordDataset(files, compression, 64, parallel); }, 3,
                           10);
      }
    }
    SUBCASE("sharded by rank, resumed on the same ranks") {
      std::vector<std::string> together;
      for (std::size_t rank = 0; rank < 2; ++rank) {
        check_exact_resume([&] { return TFRecordDataset(record_files()).shard(2, rank); }, 2, 6);
        auto mine = TFRecordDataset(record_files()).shard(2, rank);
        for (auto& r : drain(mine))
          together.push_back(r);
      }
      TFRecordDataset all(record_files());
      auto everything = drain(all);
      std::sort(together.begin(), together.end());
      std::sort(everything.begin(), everything.end());
      CHECK(together == everything);
    }
    SUBCASE("files sharded by rank before the records") {
      std::size_t total = 0;
      for (std::size_t rank = 0; rank < 2; ++rank) {
        auto files = loadstar::list_files(fixture("records-*.tfrecord"), true, 3).shard(2, rank);
        auto make = [files] {
          return files.interleave([](std::string f) { return TFRecordDataset({f}); }, 2);
        };
        check_exact_resume(make, 3, 6);
        auto ds = make();
        total += drain(ds).size();
      }
      CHECK(total == 5 + 9 + 3);
    }
    SUBCASE("a copy goes on from the same place") {
      TFRecordDataset ds(record_files(".gz"), "GZIP");
      for (int i = 0; i < 7; ++i)
        ds.next();
      TFRecordDataset copy = ds;
      CHECK(drain(copy) == drain(ds));
    }
  }

  TEST_CASE("TFRecordDataset refuses bad options and states") {
    CHECK_THROWS_WITH_AS(TFRecordDataset(record_files(), "BZIP2"),
                         doctest::Contains("compression_type must be \"\", \"GZIP\" or \"ZLIB\" "
                                           "but is \"BZIP2\""),
                         ConfigError);
    CHECK_THROWS_WITH_AS(TFRecordDataset(record_files(), "", 10, 0),
                         doctest::Contains("num_parallel_reads must be positive but is 0"),
                         ConfigError);
    TFRecordDataset missing({fixture("no-such-file.tfrecord")});
    CHECK_THROWS_WITH_AS(missing.next(), doctest::Contains("no-such-file.tfrecord': cannot open"),
                         IoError);
    TFRecordDataset two(record_files(), "", 10, 2);
    two.next();
    TFRecordDataset one(record_files());
    CHECK_THROWS_WITH_AS(one.restore(two.state()),
                         doctest::Contains("state has 2 parallel reads but the dataset has "
                                           "num_parallel_reads 1"),
                         CheckpointError);
    CHECK_THROWS_WITH_AS(one.restore(loadstar::range(3).state()),
                         doctest::Contains("state was taken from a 'range' dataset"),
                         CheckpointError);
  }

  TEST_CASE("TFRecordDataset names the file and offset of corrupt and truncated records") {
    test_support::TempDir dir;
    const std::string bytes = read_bytes(fixture("records-0.tfrecord"));
    const auto expected = read_json("records.json")[0];
    // Offsets of the records: 16 bytes of framing around each one's data.
    std::vector<std::size_t> offsets{0};
    for (const auto& e : expected)
      offsets.push_back(offsets.back() + 16 + e["length"].get<std::size_t>());
    const auto path = dir / "bad.tfrecord";
    const std::string name = "tfrecord file '" + path.string() + "'";

    SUBCASE("a flipped data byte") {
      std::string bad = bytes;
      bad[offsets[3] + 12 + 2] ^= 0x20;
      write_bytes(path, bad);
      TFRecordDataset ds({path.string()});
      for (int i = 0; i < 3; ++i)
        CHECK(ds.next());
      CHECK_THROWS_WITH_AS(ds.next(),
                           contains(name + ": corrupt record at byte offset " +
                                    std::to_string(offsets[3]) + ": the data's masked CRC-32C is"),
                           FormatError);
    }
    SUBCASE("a flipped length byte") {
      std::string bad = bytes;
      bad[offsets[1]] ^= 0x01;
      write_bytes(path, bad);
      TFRecordDataset ds({path.string()});
      CHECK(ds.next());
      CHECK_THROWS_WITH_AS(
          ds.next(),
          contains(name + ": corrupt record at byte offset " + std::to_string(offsets[1]) +
                   ": the length's masked CRC-32C is"),
          FormatError);
    }
    SUBCASE("truncated inside the data, the header and the footer") {
      for (const std::size_t cut : {offsets[2] + 12 + 3, offsets[2] + 5, offsets[3] - 2}) {
        CAPTURE(cut);
        write_bytes(path, bytes.substr(0, cut));
        TFRecordDataset ds({path.string()});
        CHECK(ds.next());
        CHECK(ds.next());
        CHECK_THROWS_WITH_AS(
            ds.next(),
            contains(name + ": truncated record at byte offset " + std::to_string(offsets[2])),
            FormatError);
      }
    }
    SUBCASE("a truncated GZIP file") {
      const std::string gz = read_bytes(fixture("examples.tfrecord.gz"));
      write_bytes(path, gz.substr(0, gz.size() / 2));
      TFRecordDataset ds({path.string()}, "GZIP");
      CHECK_THROWS_WITH_AS(drain(ds), contains(name + ": truncated"), FormatError);
    }
    SUBCASE("a corrupt ZLIB file") {
      std::string z = read_bytes(fixture("examples.tfrecord.zlib"));
      z[0] = 'A';  // Not a zlib header (which starts with 0x78).
      write_bytes(path, z);
      TFRecordDataset ds({path.string()}, "ZLIB");
      CHECK_THROWS_WITH_AS(ds.next(),
                           contains(name + ": corrupt ZLIB data at compressed byte "
                                           "offset"),
                           FormatError);
    }
  }

  TEST_CASE("parse_single_example reads the features make_fixtures.py wrote") {
    const auto expected = read_json("examples.json");
    const loadstar::FeatureSpecs features = {
        {"label", FixedLenFeature{{}, ExampleDtype::int64}},
        {"weights", FixedLenFeature{{3}, ExampleDtype::float32}},
        {"name", FixedLenFeature{{1}, ExampleDtype::string}},
        {"score", FixedLenFeature{{}, ExampleDtype::float32, std::vector<float>{-1.f}}},
        {"tags", VarLenFeature{ExampleDtype::string}},
        {"ids", VarLenFeature{ExampleDtype::int64}},
        {"boxes", FixedLenSequenceFeature{{2}, ExampleDtype::float32, true}},
        {"absent", FixedLenFeature{{2}, ExampleDtype::int64, std::vector<std::int64_t>{4, 5}}}};
    for (const auto& variant : compressions()) {
      // Named, not bound: clang 14 lets no lambda (CAPTURE) capture a binding.
      const std::string& suffix = variant.first;
      const std::string& compression = variant.second;
      CAPTURE(compression);
      TFRecordDataset ds({fixture("examples.tfrecord" + suffix)}, compression);
      std::size_t i = 0;
      while (auto record = ds.next()) {
        CAPTURE(i);
        REQUIRE(i < expected.size());
        const auto& e = expected[i++];
        auto parsed = loadstar::parse_single_example(*record, features);
        CHECK(parsed.size() == features.size());
        const auto& label = std::get<Tensor<std::int64_t>>(parsed["label"].values);
        CHECK(label.shape().rank() == 0);
        CHECK(label.data()[0] == e["label"][0].get<std::int64_t>());
        const auto& weights = std::get<Tensor<float>>(parsed["weights"].values);
        REQUIRE(weights.shape() == loadstar::Shape{3});
        for (std::size_t j = 0; j < 3; ++j)
          CHECK(weights.data()[j] == e["weights"][j].get<float>());
        const auto& name = std::get<loadstar::BytesTensor>(parsed["name"].values);
        CHECK(name.shape == loadstar::Shape{1});
        CHECK(name.values == e["name"].get<std::vector<std::string>>());
        const auto& score = std::get<Tensor<float>>(parsed["score"].values);
        CHECK(score.data()[0] == (e.contains("score") ? e["score"][0].get<float>() : -1.f));
        const auto& tags = parsed["tags"];
        CHECK(std::get<loadstar::BytesTensor>(tags.values).values ==
              e["tags"].get<std::vector<std::string>>());
        REQUIRE(tags.indices);
        CHECK(tags.indices->shape() == loadstar::Shape{e["tags"].size(), 1});
        for (std::size_t j = 0; j < e["tags"].size(); ++j)
          CHECK(tags.indices->data()[j] == static_cast<std::int64_t>(j));
        CHECK(tags.dense_shape ==
              std::vector<std::int64_t>{static_cast<std::int64_t>(e["tags"].size())});
        const auto& ids = std::get<Tensor<std::int64_t>>(parsed["ids"].values);
        CHECK(std::vector<std::int64_t>(ids.begin(), ids.end()) ==
              e["ids"].get<std::vector<std::int64_t>>());
        const auto& boxes = std::get<Tensor<float>>(parsed["boxes"].values);
        CHECK(boxes.shape() == loadstar::Shape{e["boxes"].size() / 2, 2});
        CHECK(std::vector<float>(boxes.begin(), boxes.end()) ==
              e["boxes"].get<std::vector<float>>());
        const auto& absent = std::get<Tensor<std::int64_t>>(parsed["absent"].values);
        CHECK(std::vector<std::int64_t>(absent.begin(), absent.end()) ==
              std::vector<std::int64_t>{4, 5});
      }
      CHECK(i == expected.size());
    }
  }

  TEST_CASE("parse_example batches and pads as tf.io.parse_example") {
    const auto expected = read_json("examples.json");
    TFRecordDataset ds({fixture("examples.tfrecord")});
    const auto records = drain(ds);
    const std::vector<std::string> batch(records.begin(), records.begin() + 5);
    const loadstar::FeatureSpecs features = {
        {"label", FixedLenFeature{{}, ExampleDtype::int64}},
        {"ids", VarLenFeature{ExampleDtype::int64}},
        {"boxes",
         FixedLenSequenceFeature{{2}, ExampleDtype::float32, true, std::vector<float>{9.f}}}};
    auto parsed = loadstar::parse_example(batch, features);
    const auto& label = std::get<Tensor<std::int64_t>>(parsed["label"].values);
    REQUIRE(label.shape() == loadstar::Shape{5});
    std::size_t longest_boxes = 0, longest_ids = 0, total_ids = 0;
    for (std::size_t b = 0; b < 5; ++b) {
      CHECK(label.data()[b] == expected[b]["label"][0].get<std::int64_t>());
      longest_boxes = std::max(longest_boxes, expected[b]["boxes"].size() / 2);
      longest_ids = std::max(longest_ids, expected[b]["ids"].size());
      total_ids += expected[b]["ids"].size();
    }
    const auto& boxes = std::get<Tensor<float>>(parsed["boxes"].values);
    REQUIRE(boxes.shape() == loadstar::Shape{5, longest_boxes, 2});
    for (std::size_t b = 0; b < 5; ++b) {
      const auto row = expected[b]["boxes"].get<std::vector<float>>();
      for (std::size_t j = 0; j < longest_boxes * 2; ++j)
        CHECK(boxes.data()[b * longest_boxes * 2 + j] == (j < row.size() ? row[j] : 9.f));
    }
    const auto& ids = parsed["ids"];
    REQUIRE(ids.indices);
    CHECK(ids.indices->shape() == loadstar::Shape{total_ids, 2});
    CHECK(ids.dense_shape == std::vector<std::int64_t>{5, static_cast<std::int64_t>(longest_ids)});
    std::size_t at = 0;
    for (std::size_t b = 0; b < 5; ++b) {
      for (std::size_t j = 0; j < expected[b]["ids"].size(); ++j, ++at) {
        CHECK(ids.indices->data()[at * 2] == static_cast<std::int64_t>(b));
        CHECK(ids.indices->data()[at * 2 + 1] == static_cast<std::int64_t>(j));
        CHECK(std::get<Tensor<std::int64_t>>(ids.values).data()[at] ==
              expected[b]["ids"][j].get<std::int64_t>());
      }
    }
  }

  TEST_CASE("TensorFlow-written files: the TFRecord tutorial's records and image records") {
    // tests/data/files/tensorflow/: files written by TensorFlow's TFRecordWriter (see MANIFEST),
    // described independently by describe.py (crc32c, protobuf, PIL) in expected.json.
    const auto expected = read_json("tensorflow/expected.json");
    SUBCASE("42 records of four scalar features, one at a time and as one batch") {
      const auto& table = expected["test.tfrecord"];
      REQUIRE(table.size() == 42);
      const loadstar::FeatureSpecs features = {
          {"feature0", FixedLenFeature{{}, ExampleDtype::int64}},
          {"feature1", FixedLenFeature{{}, ExampleDtype::int64}},
          {"feature2", FixedLenFeature{{}, ExampleDtype::string}},
          {"feature3", FixedLenFeature{{}, ExampleDtype::float32}}};
      TFRecordDataset ds({fixture("tensorflow/test.tfrecord")});
      const auto records = drain(ds);
      REQUIRE(records.size() == table.size());
      for (std::size_t i = 0; i < records.size(); ++i) {
        CAPTURE(i);
        auto parsed = loadstar::parse_single_example(records[i], features);
        CHECK(std::get<Tensor<std::int64_t>>(parsed["feature0"].values).data()[0] ==
              table[i]["feature0"].get<std::int64_t>());
        CHECK(std::get<Tensor<std::int64_t>>(parsed["feature1"].values).data()[0] ==
              table[i]["feature1"].get<std::int64_t>());
        CHECK(std::get<loadstar::BytesTensor>(parsed["feature2"].values).values ==
              std::vector<std::string>{table[i]["feature2"].get<std::string>()});
        CHECK(std::get<Tensor<float>>(parsed["feature3"].values).data()[0] ==
              table[i]["feature3"].get<float>());
      }
      auto batch = loadstar::parse_example(records, features);
      const auto& floats = std::get<Tensor<float>>(batch["feature3"].values);
      REQUIRE(floats.shape() == loadstar::Shape{42});
      for (std::size_t i = 0; i < 42; ++i)
        CHECK(floats.data()[i] == table[i]["feature3"].get<float>());
      check_exact_resume([&] { return TFRecordDataset({fixture("tensorflow/test.tfrecord")}); }, 2,
                         20);
    }
    SUBCASE("two JPEG images with their sizes and labels") {
      const auto& images = expected["images.tfrecord"];
      const loadstar::FeatureSpecs features = {
          {"height", FixedLenFeature{{}, ExampleDtype::int64}},
          {"width", FixedLenFeature{{}, ExampleDtype::int64}},
          {"depth", FixedLenFeature{{}, ExampleDtype::int64}},
          {"label", FixedLenFeature{{}, ExampleDtype::int64}},
          {"image_raw", FixedLenFeature{{}, ExampleDtype::string}}};
      TFRecordDataset ds({fixture("tensorflow/images.tfrecord")});
      const auto records = drain(ds);
      REQUIRE(records.size() == images.size());
      for (std::size_t i = 0; i < records.size(); ++i) {
        CAPTURE(i);
        auto parsed = loadstar::parse_single_example(records[i], features);
        for (const char* key : {"height", "width", "depth", "label"})
          CHECK(std::get<Tensor<std::int64_t>>(parsed[key].values).data()[0] ==
                images[i][key].get<std::int64_t>());
        const auto& jpeg = std::get<loadstar::BytesTensor>(parsed["image_raw"].values).values;
        REQUIRE(jpeg.size() == 1);
        CHECK(jpeg[0].size() == images[i]["jpeg_bytes"].get<std::size_t>());
        CHECK(crc32(0L, reinterpret_cast<const Bytef*>(jpeg[0].data()),
                    static_cast<uInt>(jpeg[0].size())) == images[i]["jpeg_crc32"].get<uLong>());
      }
    }
  }

  TEST_CASE("parse_single_example names the feature in its refusals") {
    TFRecordDataset ds({fixture("examples.tfrecord")});
    const std::string first = *ds.next();  // Example 0 has no "score".
    using loadstar::parse_single_example;
    CHECK_THROWS_WITH_AS(
        parse_single_example(first, {{"score", FixedLenFeature{{}, ExampleDtype::float32}}}),
        doctest::Contains("example feature 'score': expected 1 float32 (float_list) values (a "
                          "required FixedLenFeature) but the feature is missing"),
        FormatError);
    CHECK_THROWS_WITH_AS(
        parse_single_example(first, {{"label", FixedLenFeature{{}, ExampleDtype::float32}}}),
        doctest::Contains("example feature 'label': expected float32 (float_list) values but "
                          "found int64 (int64_list)"),
        FormatError);
    CHECK_THROWS_WITH_AS(
        parse_single_example(first, {{"weights", FixedLenFeature{{2}, ExampleDtype::float32}}}),
        doctest::Contains("example feature 'weights': expected 2 values (shape (2,)) but found 3"),
        FormatError);
    CHECK_THROWS_WITH_AS(
        parse_single_example(
            first, {{"weights", FixedLenSequenceFeature{{2}, ExampleDtype::float32, true}}}),
        doctest::Contains("example feature 'weights': expected a multiple of 2 values (rows of "
                          "shape (2,)) but found 3"),
        FormatError);
    CHECK_THROWS_WITH_AS(
        parse_single_example(first,
                             {{"boxes", FixedLenSequenceFeature{{2}, ExampleDtype::float32}}}),
        doctest::Contains("FixedLenSequenceFeature requires allow_missing to be true"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        parse_single_example(
            first,
            {{"label", FixedLenFeature{{2}, ExampleDtype::int64, std::vector<std::int64_t>{1}}}}),
        doctest::Contains("example feature 'label': default_value must have 2 values (shape "
                          "(2,)) but has 1"),
        ConfigError);
    CHECK_THROWS_WITH_AS(
        parse_single_example("\xff\xff\xff", {{"label", VarLenFeature{ExampleDtype::int64}}}),
        doctest::Contains("parse_single_example: expected a serialized tf.train.Example but 3 "
                          "bytes do not parse as one"),
        FormatError);
    std::vector<std::string> batch{first, "\x0a\x03\xff"};
    CHECK_THROWS_WITH_AS(loadstar::parse_example(batch, {{"label", VarLenFeature{}}}),
                         doctest::Contains("parse_example: example 1: expected a serialized "
                                           "tf.train.Example"),
                         FormatError);
  }

  TEST_CASE("TextLineDataset splits lines as TensorFlow does") {
    const auto expected = read_json("lines.json").get<std::vector<std::string>>();
    for (const auto& variant : compressions()) {
      // Named, not bound: clang 14 lets no lambda (CAPTURE) capture a binding.
      const std::string& suffix = variant.first;
      const std::string& compression = variant.second;
      CAPTURE(compression);
      const std::vector<std::string> files{fixture("lines.txt" + suffix),
                                           fixture("lines.txt" + suffix)};
      TextLineDataset ds(files, compression, 7);
      auto both = expected;
      both.insert(both.end(), expected.begin(), expected.end());
      CHECK(drain(ds) == both);
      check_exact_resume([&] { return TextLineDataset(files, compression, 7); }, 3, 10);
      check_exact_resume([&] { return TextLineDataset(files, compression).shard(3, 1); }, 2, 5);
    }
    CHECK_THROWS_WITH_AS(TextLineDataset({"x"}, "gzip"),
                         doctest::Contains("TextLineDataset: compression_type must be"),
                         ConfigError);
  }

  TEST_CASE("CsvDataset parses RFC 4180 records as Python's csv module") {
    const auto rows = read_json("table.json");
    const std::vector<CsvColumn> columns{{CsvType::int64, {}},
                                         {CsvType::string, CsvValue{std::string("?")}},
                                         {CsvType::float32, CsvValue{-1.f}},
                                         {CsvType::int32, CsvValue{std::int32_t{0}}}};
    for (const auto& variant : compressions()) {
      // Named, not bound: clang 14 lets no lambda (CAPTURE) capture a binding.
      const std::string& suffix = variant.first;
      const std::string& compression = variant.second;
      CAPTURE(compression);
      CsvOptions options;
      options.compression_type = compression;
      options.header = true;
      options.na_value = "NA";
      options.buffer_size = 16;
      const std::vector<std::string> files{fixture("table.csv" + suffix)};
      CsvDataset ds(files, columns, options);
      for (std::size_t r = 1; r < rows.size(); ++r) {
        CAPTURE(r);
        const auto row = rows[r].get<std::vector<std::string>>();
        auto got = ds.next();
        REQUIRE(got);
        REQUIRE(got->size() == 4);
        CHECK(std::get<std::int64_t>((*got)[0]) == std::strtoll(row[0].c_str(), nullptr, 10));
        CHECK(std::get<std::string>((*got)[1]) ==
              (row[1].empty() || row[1] == "NA" ? std::string("?") : row[1]));
        CHECK(std::get<float>((*got)[2]) ==
              (row[2].empty() ? -1.f : std::strtof(row[2].c_str(), nullptr)));
        CHECK(std::get<std::int32_t>((*got)[3]) ==
              (row[3].empty()
                   ? 0
                   : static_cast<std::int32_t>(std::strtol(row[3].c_str(), nullptr, 10))));
      }
      CHECK(!ds.next());
      check_exact_resume([&] { return CsvDataset(files, columns, options); }, 3, 10);
      check_exact_resume(
          [&] {
            return CsvDataset({files[0], files[0]}, columns, options).shard(2, 0);
          },
          2, 6);

      options.select_cols = {1, 3};
      CsvDataset selected(files, {columns[1], columns[3]}, options);
      auto first = selected.next();
      REQUIRE(first);
      CHECK(*first == std::vector<CsvValue>{std::string("plain"), std::int32_t{10}});
    }
  }

  TEST_CASE("CsvDataset names the file line and column of a bad field") {
    test_support::TempDir dir;
    const auto path = dir / "bad.csv";
    const std::string name = "csv file '" + path.string() + "'";
    const std::vector<CsvColumn> columns{{CsvType::int32, {}}, {CsvType::string, {}}};
    const auto first_error = [&](const std::string& text) {
      write_bytes(path, text);
      CsvDataset ds({path.string()}, columns);
      while (ds.next()) {
      }
    };
    CHECK_THROWS_WITH_AS(first_error("1,a\n2,b\nx7,c\n"),
                         contains(name + " line 3 column 1: expected an int32 but found 'x7'"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,\"a\nb\"\n3,c\"d\n"),
                         contains(name + " line 3 column 2: unquoted fields cannot have "
                                         "quotes inside but found 'c\"d'"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,\"a\"b\"\n"),
                         contains(name + " line 1 column 2: a quote inside a quoted field "
                                         "must be escaped by another quote"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,\"abc\n"),
                         contains(name + " line 1 column 2: expected a closing quote but "
                                         "the file ends inside the quoted field"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,a,b\n"),
                         contains(name + " line 1 column 3: expected 2 fields but the "
                                         "record has more"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,a\r\n2\r\n"),
                         contains(name + " line 2 column 1: expected 2 fields but the "
                                         "record has 1"),
                         FormatError);
    CHECK_THROWS_WITH_AS(first_error("1,a\n,b\n"),
                         contains(name + " line 2 column 1: expected an int32 (a required "
                                         "column) but the field is empty"),
                         FormatError);
    CHECK_THROWS_WITH_AS(CsvDataset({"x"}, {{CsvType::int32, CsvValue{1.f}}}),
                         doctest::Contains("record_defaults[0]: the default must be an int32"),
                         ConfigError);
    CsvOptions two_chars;
    two_chars.field_delim = ";;";
    CHECK_THROWS_WITH_AS(CsvDataset({"x"}, columns, two_chars),
                         doctest::Contains("field_delim must be one character but is \";;\""),
                         ConfigError);
    CsvOptions unordered;
    unordered.select_cols = {2, 1};
    CHECK_THROWS_WITH_AS(
        CsvDataset({"x"}, columns, unordered),
        doctest::Contains("select_cols must be strictly increasing but 1 follows 2"), ConfigError);
  }

  TEST_CASE("NpzFile reads numpy savez and savez_compressed archives") {
    const auto expected = read_json("arrays.json");
    for (const char* archive : {"arrays.npz", "arrays_compressed.npz"}) {
      CAPTURE(archive);
      const auto arrays = loadstar::read_npz<double>(fixture(archive));
      REQUIRE(arrays.size() == expected.size());
      for (const auto& item : expected.items()) {
        const std::string name = item.key();
        const auto& e = item.value();
        CAPTURE(name);
        const auto& got = arrays.at(name);
        CHECK(std::vector<std::size_t>(got.shape().begin(), got.shape().end()) ==
              e["shape"].get<std::vector<std::size_t>>());
        CHECK(std::vector<double>(got.begin(), got.end()) ==
              e["values"].get<std::vector<double>>());
      }
      loadstar::NpzFile npz(fixture(archive));
      CHECK(npz.names() == std::vector<std::string>{"arr_0", "flag", "x", "y"});
      CHECK(npz.header("y").dtype_name() == "int64");
      CHECK(npz.read<std::int64_t>("y").data()[2] == (std::int64_t{1} << 40));
      CHECK(npz.read<float>("x").shape() == loadstar::Shape{2, 3});
      CHECK_THROWS_WITH_AS(npz.read<float>("z"),
                           doctest::Contains("expected an array 'z' but the archive has 'arr_0', "
                                             "'flag', 'x', 'y'"),
                           FormatError);
      CHECK_THROWS_WITH_AS(npz.read<std::int32_t>("x"),
                           doctest::Contains("member 'x.npy': holds float32 values but int32 was "
                                             "requested"),
                           loadstar::ShapeError);
    }
    test_support::TempDir dir;
    const auto path = dir / "bad.npz";
    const std::string name = "npz archive '" + path.string() + "'";
    write_bytes(path, "not a zip archive at all");
    CHECK_THROWS_WITH_AS(loadstar::NpzFile{path}, contains(name + ": expected a zip archive"),
                         FormatError);
    const std::string stored = read_bytes(fixture("arrays.npz"));
    write_bytes(path, stored.substr(0, stored.size() - 30));
    CHECK_THROWS_AS(loadstar::NpzFile{path}, FormatError);
    // A flipped byte in the data of the stored member "x.npy" (its header ends with a newline
    // before the data): libzip's CRC-32 check refuses it.
    std::string flipped = stored;
    const auto member = flipped.find("x.npy");
    const auto data = flipped.find("\n", flipped.find("{'descr'", member)) + 1;
    flipped[data + 5] ^= 0x40;
    write_bytes(path, flipped);
    loadstar::NpzFile bad(path);
    CHECK_THROWS_WITH_AS(bad.read<float>("x"), contains(name + ": member 'x.npy' cannot be read"),
                         FormatError);
  }

  TEST_CASE("crc32c gives the table's CRC over every length and alignment") {
    // Every path against the byte-at-a-time definition: the dispatched one (folding, the crc32
    // instruction or the table, whichever this CPU takes) and, where the CPU has them, the
    // instruction and folding paths themselves. Every length up to 3 long rounds of the
    // instruction path and past 4 folding rounds, at 8 alignments, then longer ones.
    namespace detail = loadstar::detail;
    std::mt19937 rng(35);
    std::string bytes(100011, '\0');
    for (auto& c : bytes)
      c = static_cast<char>(rng());
    const auto check = [](std::string_view view) {
      const std::uint32_t expected = detail::crc32c_portable(view);
      CHECK(detail::crc32c(view) == expected);
      CHECK((detail::crc32c_update_portable(0xFFFFFFFFU, view) ^ 0xFFFFFFFFU) == expected);
#if LOADSTAR_CRC32C_X86
      if (detail::crc32c_level() >= 1) {
        CHECK((detail::crc32c_update_instruction(0xFFFFFFFFU, view) ^ 0xFFFFFFFFU) == expected);
      }
      const std::size_t folded =
          view.size() / detail::crc32c_fold_round * detail::crc32c_fold_round;
      if (detail::crc32c_level() >= 2 && folded > 0) {
        const std::uint32_t head = detail::crc32c_update_folded(0xFFFFFFFFU, view.data(), folded);
        CHECK((detail::crc32c_update_instruction(head, view.substr(folded)) ^ 0xFFFFFFFFU) ==
              expected);
      }
#endif
    };
    for (std::size_t n = 0; n <= 3 * 3072 + 8; ++n) {
      for (std::size_t offset = 0; offset < 8; offset += (n < 1200 ? 1 : 3)) {
        CAPTURE(n);
        CAPTURE(offset);
        check(std::string_view(bytes.data() + offset, n));
      }
    }
    for (const std::size_t n : {16384, 16450, 65536, 70000, 100003}) {
      CAPTURE(n);
      check(std::string_view(bytes.data() + 3, n));
    }
    CHECK(detail::crc32c(std::string(5000, 'a')) ==
          detail::crc32c_portable(std::string(5000, 'a')));
    CHECK(detail::crc32c(std::string(5000, 'a')) != detail::crc32c(std::string(5000, 'b')));
  }

  TEST_CASE("crc32c_update goes on over pieces as over the whole and copies as it goes") {
    // Fuzz-style: random data, lengths, alignments and split points, each piece through the
    // dispatched path, against the table over the whole.
    namespace detail = loadstar::detail;
    std::mt19937_64 rng(36);
    std::string bytes(70000, '\0');
    for (int round = 0; round < 300; ++round) {
      for (auto& c : bytes)
        c = static_cast<char>(rng());
      const std::size_t offset = rng() % 64;
      const std::size_t n = rng() % (bytes.size() - offset);
      const std::string_view view(bytes.data() + offset, n);
      std::uint32_t crc = 0xFFFFFFFFU;
      std::size_t done = 0;
      while (done < n) {
        const std::size_t take = std::min<std::size_t>(n - done, rng() % 9000);
        crc = detail::crc32c_update(crc, view.substr(done, take));
        done += take;
      }
      CAPTURE(round);
      CAPTURE(n);
      CHECK((crc ^ 0xFFFFFFFFU) == detail::crc32c_portable(view));
    }
    // crc32c_update_copy copies as it goes on, from and to every alignment.
    for (int round = 0; round < 200; ++round) {
      const std::size_t from = rng() % 64, to = rng() % 64;
      const std::size_t n = round < 100 ? rng() % 4096 : rng() % (bytes.size() - 64);
      const std::string_view view(bytes.data() + from, n);
      std::string out(n + to, '\x5a');
      const std::uint32_t crc = detail::crc32c_update_copy(0xFFFFFFFFU, view, out.data() + to);
      CAPTURE(round);
      CAPTURE(n);
      CHECK((crc ^ 0xFFFFFFFFU) == detail::crc32c_portable(view));
      CHECK(std::string_view(out).substr(to) == view);
      CHECK(out.substr(0, to) == std::string(to, '\x5a'));
    }
    // A register is the same as 0 with it xored into the first 4 bytes, and all-zero data keep
    // a zero register: edge values of the folding path.
    const std::string zeros(4096, '\0');
    CHECK(detail::crc32c_update(0, zeros) == 0);
    CHECK(detail::crc32c(zeros) == detail::crc32c_portable(zeros));
    CHECK(detail::crc32c(std::string(4096, '\xff')) ==
          detail::crc32c_portable(std::string(4096, '\xff')));
  }

  TEST_CASE("TFRecordDataset reads records of every size from a mapped file") {
    // Records of sizes around the 64 KiB pieces a mapped record is copied and checked in, written
    // with the table's CRC; read whole, resumed at every record, and corrupt in a late piece.
    test_support::TempDir dir;
    std::mt19937_64 rng(37);
    const auto frame = [](const std::string& data) {
      std::string out;
      for (int b = 0; b < 8; ++b)
        out.push_back(static_cast<char>(static_cast<std::uint64_t>(data.size()) >> (8 * b)));
      const auto put = [&out](std::uint32_t crc) {
        const std::uint32_t masked = ((crc >> 15) | (crc << 17)) + 0xA282EAD8U;
        for (int b = 0; b < 4; ++b)
          out.push_back(static_cast<char>(masked >> (8 * b)));
      };
      put(loadstar::detail::crc32c_portable(out));
      out += data;
      put(loadstar::detail::crc32c_portable(data));
      return out;
    };
    std::vector<std::string> records;
    std::string file;
    std::vector<std::size_t> offsets;
    for (const std::size_t n : {0, 1, 100, 16450, 65535, 65536, 65537, 200003, 7}) {
      std::string data(n, '\0');
      for (auto& c : data)
        c = static_cast<char>(rng());
      offsets.push_back(file.size());
      file += frame(data);
      records.push_back(std::move(data));
    }
    const auto path = dir / "sizes.tfrecord";
    write_bytes(path, file);
    TFRecordDataset ds({path.string()});
    CHECK(drain(ds) == records);
    check_exact_resume([&] { return TFRecordDataset({path.string()}); }, 3, 9);

    const std::string name = "tfrecord file '" + path.string() + "'";
    SUBCASE("a flipped byte in the last piece of a long record") {
      std::string bad = file;
      bad[offsets[7] + 12 + 200000] ^= 0x04;
      write_bytes(path, bad);
      TFRecordDataset corrupt({path.string()});
      for (int i = 0; i < 7; ++i)
        CHECK(corrupt.next());
      CHECK_THROWS_WITH_AS(corrupt.next(),
                           contains(name + ": corrupt record at byte offset " +
                                    std::to_string(offsets[7]) + ": the data's masked CRC-32C is"),
                           FormatError);
    }
    SUBCASE("a state past the end of the file") {
      TFRecordDataset one({path.string()});
      one.next();
      auto state = one.state();
      state["slots"][0]["offset"] = file.size() + 5;
      CHECK_THROWS_WITH_AS(
          one.restore(state),
          contains(name + ": state is at byte offset " + std::to_string(file.size() + 5) +
                   " but the data end at " + std::to_string(file.size())),
          CheckpointError);
    }
    SUBCASE("an empty file has no records") {
      write_bytes(path, "");
      TFRecordDataset empty({path.string(), path.string()});
      CHECK(!empty.next());
    }
  }

  TEST_CASE("TFRecordDataset throws for a file that shrinks while it is read") {
    // A mapped file is read as it was when opened; one truncated since throws where read() would
    // have come short, instead of the SIGBUS that reading the lost pages would raise. The
    // records are over 1 MiB, so that the second one's end lies past the size last checked.
    test_support::TempDir dir;
    std::string file;
    std::vector<std::size_t> offsets;
    for (int r = 0; r < 3; ++r) {
      const std::string data(1536 * 1024, static_cast<char>('a' + r));
      std::string framed;
      for (int b = 0; b < 8; ++b)
        framed.push_back(static_cast<char>(static_cast<std::uint64_t>(data.size()) >> (8 * b)));
      const auto put = [&framed](std::uint32_t crc) {
        const std::uint32_t masked = loadstar::detail::mask_crc32c(crc);
        for (int b = 0; b < 4; ++b)
          framed.push_back(static_cast<char>(masked >> (8 * b)));
      };
      put(loadstar::detail::crc32c_portable(framed));
      framed += data;
      put(loadstar::detail::crc32c_portable(data));
      offsets.push_back(file.size());
      file += framed;
    }
    const auto path = dir / "shrinking.tfrecord";
    write_bytes(path, file);
    TFRecordDataset ds({path.string()});
    CHECK(ds.next());
    std::filesystem::resize_file(path, offsets[1] + 1024 * 1024);
    CHECK_THROWS_WITH_AS(
        ds.next(),
        contains("tfrecord file '" + path.string() + "': truncated record at byte offset " +
                 std::to_string(offsets[1]) + ": the file had " + std::to_string(file.size()) +
                 " bytes when opened but has " + std::to_string(offsets[1] + 1024 * 1024) + " now"),
        FormatError);
  }
}
