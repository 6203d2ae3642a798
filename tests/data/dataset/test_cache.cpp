#include <doctest/doctest.h>
#include <zlib.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <loadstar/data/dataset.hpp>
#include <loadstar/data/hdf5.hpp>
#include <loadstar/data/serialize.hpp>
#include <loadstar/error.hpp>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "resume_check.hpp"
#include "temp_dir.hpp"
#include "test_helpers.hpp"

using dataset_test::check_exact_resume;
using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::IoError;
using loadstar::Tensor;
using test_support::TempDir;

namespace {

using test_support::contains;

using test_support::drain;

// Rows (x, y) whose upstream counts how often it is read.
auto counted_rows(std::atomic<int>& reads, std::size_t n = 20) {
  Tensor<float> x({n, 3});
  std::iota(x.begin(), x.end(), 0.f);
  Tensor<std::int64_t> y({n});
  std::iota(y.begin(), y.end(), std::int64_t{0});
  return loadstar::from_tensor_slices(x, y).map([&reads](Tensor<float> a, Tensor<std::int64_t> b) {
    ++reads;
    return std::tuple{a.clone(), b.clone()};
  });
}

/// A cache file of the format of `detail/cache_file.hpp`, with a correct CRC32 over whatever
/// it is given: a crafted file, as anyone can write one.
struct CraftedCache {
  std::uint32_t reserved0 = 0;
  std::uint64_t count = 0;
  std::uint64_t payload_bytes = 0;
  std::vector<unsigned char> payload;
  std::vector<std::uint64_t> offsets;

  void write(const std::filesystem::path& path) const {
    std::string body(reinterpret_cast<const char*>(payload.data()), payload.size());
    body.append(reinterpret_cast<const char*>(offsets.data()),
                offsets.size() * sizeof(std::uint64_t));
    const auto crc = static_cast<std::uint32_t>(::crc32(::crc32(0, nullptr, 0),
                                                        reinterpret_cast<const Bytef*>(body.data()),
                                                        static_cast<uInt>(body.size())));
    std::string header = "LDSCACHE";
    const auto put = [&header](auto value) {
      header.append(reinterpret_cast<const char*>(&value), sizeof value);
    };
    put(std::uint32_t{1});
    put(reserved0);
    put(count);
    put(payload_bytes);
    put(crc);
    put(std::uint32_t{0});
    put(std::uint64_t{0});
    std::ofstream(path, std::ios::binary) << header << body;
  }
};

/// The bytes `serialize` writes for a tensor of the given dimensions and no data.
std::vector<unsigned char> tensor_record(const std::vector<std::uint64_t>& dims) {
  std::vector<unsigned char> out{static_cast<unsigned char>(dims.size())};
  for (const std::uint64_t d : dims) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(&d);
    out.insert(out.end(), bytes, bytes + sizeof d);
  }
  out.resize(loadstar::serialized_alignment);
  return out;
}

}  // namespace

TEST_SUITE("dataset") {
  TEST_CASE("cache in memory reads the upstream once and resumes exactly") {
    std::atomic<int> reads{0};
    auto ds = counted_rows(reads).cache();
    const auto first = drain(ds);
    CHECK(reads.load() == 20);
    ds.reset();
    CHECK(drain(ds) == first);
    ds.reset();
    CHECK(drain(ds) == first);
    CHECK(reads.load() == 20);
    // An epoch cut short does not finish the cache.
    std::atomic<int> partial_reads{0};
    auto partial = counted_rows(partial_reads).cache();
    partial.next();
    partial.reset();
    CHECK(drain(partial).size() == 20);
    check_exact_resume([] { return loadstar::range(30).shuffle(8, 4).cache().repeat(3); }, 2, 15);
    check_exact_resume([] { return loadstar::range(25).shuffle(25, 4).cache(); }, 3, 15);
  }

  TEST_CASE("cache on disk serves later epochs and later runs from the file") {
    TempDir dir;
    const auto path = dir / "rows.cache";
    std::atomic<int> reads{0};
    auto ds = counted_rows(reads).cache(path);
    const auto first = drain(ds);
    CHECK(std::filesystem::exists(path));
    ds.reset();
    CHECK(drain(ds) == first);
    CHECK(reads.load() == 20);
    std::atomic<int> later_reads{0};
    auto later = counted_rows(later_reads).cache(path);
    CHECK(drain(later) == first);
    CHECK(later_reads.load() == 0);
    // No temporary or partial file is left behind.
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
      names.insert(entry.path().filename().string());
    }
    CHECK(names == std::set<std::string>{"rows.cache", "rows.cache.lock"});
  }

  TEST_CASE("cache on disk resumes exactly while filling and while serving") {
    TempDir dir;
    int run = 0;
    // A new file per resume check run while filling: each check's reference run builds it.
    check_exact_resume(
        [&] {
          return loadstar::range(40).shuffle(10, 3).cache(dir / ("a" + std::to_string(run++)));
        },
        1, 10);
    // One shared file: every resumed run finds it finished.
    check_exact_resume([&] { return loadstar::range(40).shuffle(10, 3).cache(dir / "shared"); }, 3,
                       15);
  }

  TEST_CASE("cache on disk rejects a path that cannot be written") {
    auto ds = loadstar::range(3).cache("/nonexistent-loadstar-dir/x.cache");
    CHECK_THROWS_WITH_AS(ds.next(),
                         doctest::Contains("cache '/nonexistent-loadstar-dir/x.cache': cannot "
                                           "write"),
                         IoError);
  }

  TEST_CASE("cache on disk rejects a corrupt or truncated file") {
    TempDir dir;
    const auto path = dir / "rows.cache";
    {
      auto ds = loadstar::range(100).cache(path);
      drain(ds);
    }
    const auto size = std::filesystem::file_size(path);
    SUBCASE("with a flipped byte") {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(60);
      f.put('\x7f');
      f.close();
      auto ds = loadstar::range(100).cache(path);
      CHECK_THROWS_WITH_AS(ds.next(), doctest::Contains("rows.cache': checksum mismatch"),
                           FormatError);
    }
    SUBCASE("with a truncated tail") {
      std::filesystem::resize_file(path, size - 8);
      auto ds = loadstar::range(100).cache(path);
      CHECK_THROWS_WITH_AS(ds.next(), doctest::Contains("rows.cache': truncated or corrupt"),
                           FormatError);
    }
    SUBCASE("with another magic number") {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.write("NOTCACHE", 8);
      f.close();
      auto ds = loadstar::range(100).cache(path);
      CHECK_THROWS_WITH_AS(ds.next(), doctest::Contains("not a loadstar cache (bad magic)"),
                           FormatError);
    }
    SUBCASE("with a header only") {
      std::filesystem::resize_file(path, 10);
      auto ds = loadstar::range(100).cache(path);
      CHECK_THROWS_WITH_AS(ds.next(),
                           doctest::Contains("truncated: 10 bytes is less than the 48-byte header"),
                           FormatError);
    }
  }

  TEST_CASE("cache on disk refuses a crafted file with a valid checksum") {
    // The CRC32 guards against accidents only: each file below carries a correct one.
    TempDir dir;
    const auto path = dir / "crafted.cache";
    const std::string where = "cache '" + path.string() + "': ";
    std::vector<unsigned char> seven(8, 0);
    seven[0] = 7;
    SUBCASE("with a record offset beyond the payload") {
      // Found by fuzzing: the reader resized its buffer to what the offsets said (3.16 GB of
      // zeros over 25 s, or std::length_error for 2^63) before reading anything.
      for (const std::uint64_t end : {std::uint64_t{3160000000}, std::uint64_t{1} << 63}) {
        CAPTURE(end);
        CraftedCache{.count = 1, .payload_bytes = 8, .payload = seven, .offsets = {0, end}}.write(
            path);
        auto ds = loadstar::range(1).cache(path);
        CHECK_THROWS_WITH_AS(ds.next(),
                             contains(where +
                                      "corrupt offsets: expected them to run from 0 to the "
                                      "payload's 8 bytes but they run from 0 to " +
                                      std::to_string(end)),
                             FormatError);
      }
    }
    SUBCASE("with offsets that decrease") {
      std::vector<unsigned char> two(16, 0);
      CraftedCache{.count = 3, .payload_bytes = 16, .payload = two, .offsets = {0, 16, 8, 16}}
          .write(path);
      auto ds = loadstar::range(3).cache(path);
      CHECK_THROWS_WITH_AS(
          ds.next(),
          contains(where + "corrupt offsets: record 1 ends at 8, before it begins at 16"),
          FormatError);
    }
    SUBCASE("with a payload size that wraps the file size around") {
      // 48 + (2^64 - 8) + 16 wraps to the file's 56 bytes.
      CraftedCache{
          .count = 1, .payload_bytes = ~std::uint64_t{0} - 7, .payload = seven, .offsets = {}}
          .write(path);
      REQUIRE(std::filesystem::file_size(path) == 56);
      auto ds = loadstar::range(1).cache(path);
      CHECK_THROWS_WITH_AS(
          ds.next(),
          contains(where + "truncated or corrupt: the header describes 1 records in "
                           "18446744073709551608 bytes but the file has 56"),
          FormatError);
    }
    SUBCASE("with a reserved header field that is not zero") {
      CraftedCache{
          .reserved0 = 1, .count = 1, .payload_bytes = 8, .payload = seven, .offsets = {0, 8}}
          .write(path);
      auto ds = loadstar::range(1).cache(path);
      CHECK_THROWS_WITH_AS(
          ds.next(),
          contains(where + "corrupt header: reserved fields must be 0 but hold 1, 0 and 0"),
          FormatError);
    }
    SUBCASE("with a tensor shape whose element count overflows") {
      // (2^63, 2) has 2^64 elements: the count wrapped to 0 and passed the size check, and a
      // tensor claiming the whole shape came back from 64 bytes.
      const auto record = tensor_record({std::uint64_t{1} << 63, 2});
      CraftedCache{.count = 1,
                   .payload_bytes = record.size(),
                   .payload = record,
                   .offsets = {0, record.size()}}
          .write(path);
      auto ds = loadstar::from_tensor_slices(Tensor<float>({1, 2})).cache(path);
      CHECK_THROWS_WITH_AS(
          ds.next(),
          contains(where + "record 0: serialized tensor: shape (9223372036854775808, "
                           "2) has more elements than memory can address"),
          FormatError);
    }
  }

  TEST_CASE("deserialize refuses tensor shapes whose sizes overflow or exceed the bytes") {
    const auto bytes = [](const std::vector<unsigned char>& record) {
      return std::span<const std::byte>(reinterpret_cast<const std::byte*>(record.data()),
                                        record.size());
    };
    CHECK_THROWS_WITH_AS(
        loadstar::deserialize<Tensor<float>>(
            bytes(tensor_record({std::uint64_t{1} << 32, std::uint64_t{1} << 32}))),
        doctest::Contains("shape (4294967296, 4294967296) has more elements than memory can "
                          "address"),
        FormatError);
    // 2^62 elements fit in std::size_t but 2^62 floats are more bytes than it holds.
    CHECK_THROWS_WITH_AS(
        loadstar::deserialize<Tensor<float>>(bytes(tensor_record({std::uint64_t{1} << 62}))),
        doctest::Contains("shape (4611686018427387904,) needs more than 2^64 bytes but only 0 "
                          "remain"),
        FormatError);
    CHECK(loadstar::deserialize<Tensor<float>>(bytes(tensor_record({0, std::uint64_t{1} << 62})))
              .shape() == loadstar::Shape{0, std::size_t{1} << 62});
  }

  TEST_CASE("DataLayer cache_train_dataset builds once and streams shuffled shards") {
    TempDir dir;
    std::atomic<int> builds{0};
    auto make = [&] {
      ++builds;
      return loadstar::range(10);
    };
    loadstar::DataLayerOptions options{.storage_path = dir.path(), .seed = 3};
    auto whole = loadstar::DataLayer(options).cache_train_dataset("ints", "1", true)(make);
    CHECK(builds.load() == 1);
    CHECK(std::filesystem::exists(dir / "ints/1_train.ldscache"));
    auto epoch0 = drain(whole);
    whole.reset();
    auto epoch1 = drain(whole);
    CHECK(epoch0 != epoch1);
    auto sorted = epoch0;
    std::sort(sorted.begin(), sorted.end());
    CHECK(sorted == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});

    // Three ranks: each sees 3 of the 9 records kept (the remainder dropped), disjointly.
    std::set<std::int64_t> seen;
    for (std::size_t rank = 0; rank < 3; ++rank) {
      auto o = options;
      o.distributed = {rank, 3};
      auto shard = loadstar::DataLayer(o).cache_train_dataset("ints", "1", true)(make);
      auto rows = drain(shard);
      CHECK(rows.size() == 3);
      for (auto r : rows)
        CHECK(seen.insert(r).second);
    }
    CHECK(seen.size() == 9);
    CHECK(builds.load() == 1);

    // The start offset continues the stream where training stopped.
    auto o = options;
    o.per_slot_batch_size = 4;
    o.batches_trained = 3;  // 12 records: epoch 1, position 2.
    auto resumed = loadstar::DataLayer(o).cache_train_dataset("ints", "1", true)(make);
    CHECK(drain(resumed) == std::vector<std::int64_t>(epoch1.begin() + 2, epoch1.end()));

    // skip_shuffle_at_epoch_end keeps one order.
    auto fixed = loadstar::DataLayer(options).cache_train_dataset("ints", "1", true, true)(make);
    auto f0 = drain(fixed);
    fixed.reset();
    CHECK(drain(fixed) == f0);
    check_exact_resume(
        [&] { return loadstar::DataLayer(options).cache_train_dataset("ints", "1", true)(make); },
        3, 10);
  }

  TEST_CASE("DataLayer cache_validation_dataset covers every record once across ranks") {
    TempDir dir;
    auto make = [] { return loadstar::range(10).map([](std::int64_t i) { return i * 2; }); };
    std::vector<std::int64_t> all;
    for (std::size_t rank = 0; rank < 3; ++rank) {
      loadstar::DataLayer layer({.storage_path = dir.path(), .distributed = {rank, 3}});
      auto val = layer.cache_validation_dataset("ints", "1")(make);
      for (auto v : drain(val))
        all.push_back(v);
    }
    std::sort(all.begin(), all.end());
    CHECK(all == std::vector<std::int64_t>{0, 2, 4, 6, 8, 10, 12, 14, 16, 18});
    CHECK(std::filesystem::exists(dir / "ints/1_val.ldscache"));
  }

  TEST_CASE("DataLayer rejects ids that are not plain names and unwritable storage") {
    loadstar::DataLayer layer({.storage_path = "/tmp"});
    CHECK_THROWS_WITH_AS(layer.cache_train_dataset("a/b", "1"),
                         doctest::Contains("data layer: dataset_id must be a non-empty name "
                                           "without '/' but is 'a/b'"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(layer.cache_validation_dataset("a", ""),
                         doctest::Contains("dataset_version must be a non-empty name"),
                         ConfigError);
    loadstar::DataLayer unwritable({.storage_path = "/proc/loadstar-no"});
    CHECK_THROWS_WITH_AS(
        unwritable.cache_train_dataset("a", "1")([] { return loadstar::range(3); }),
        doctest::Contains("cannot write"), IoError);
    loadstar::DataLayer bad_rank({.storage_path = "/tmp", .distributed = {3, 2}});
    TempDir dir;
    loadstar::DataLayer bad({.storage_path = dir.path(), .distributed = {3, 2}});
    CHECK_THROWS_WITH_AS(bad.cache_train_dataset("a", "1")([] { return loadstar::range(3); }),
                         doctest::Contains("cached dataset: rank must be less than the "
                                           "distributed size 2 but is 3"),
                         ConfigError);
  }
}

TEST_SUITE("dataset") {
  TEST_CASE("from_hdf5 reads rows lazily and resumes exactly") {
    TempDir dir;
    const auto file = dir / "data.h5";
    Tensor<float> x({23, 2, 2});
    std::iota(x.begin(), x.end(), 0.f);
    Tensor<std::int64_t> y({23});
    std::iota(y.begin(), y.end(), std::int64_t{100});
    loadstar::write_hdf5(file, "/x", x);
    loadstar::write_hdf5(file, "/y", y);
    auto ds = loadstar::from_hdf5<float, std::int64_t>(file, "/x", "/y", 5);
    auto in_memory = loadstar::from_tensor_slices(x, y);
    CHECK(drain(ds) == drain(in_memory));
    auto whole = loadstar::from_hdf5<float, std::int64_t>(file, "/x", "/y");
    CHECK(drain(whole).size() == 23);
    check_exact_resume(
        [&] { return loadstar::from_hdf5<float, std::int64_t>(file, "/x", "/y", 4).batch(3); }, 2,
        8);
    CHECK_THROWS_WITH_AS((loadstar::from_hdf5<float, std::int64_t>(file, "/x", "/y", 0)),
                         doctest::Contains("from_hdf5: read_rows must be positive but is 0"),
                         ConfigError);
  }
}
