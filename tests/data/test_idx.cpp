#include <doctest/doctest.h>

#include <unistd.h>
#include <zlib.h>
#include "temp_dir.hpp"
#include "test_helpers.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/data/idx.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <string>
#include <vector>

using loadstar::FormatError;
using loadstar::IoError;
using loadstar::read_idx;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;

namespace {

namespace fs = std::filesystem;

using test_support::TempDir;

using Bytes = std::vector<unsigned char>;

/// An IDX header: magic 0x00 0x00 type rank, then each dimension as a big-endian u32.
Bytes idx_header(unsigned char type, const std::vector<std::uint32_t>& dims) {
  Bytes out{0, 0, type, static_cast<unsigned char>(dims.size())};
  for (auto d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<unsigned char>(d >> shift));
  }
  return out;
}

/// `values` as big-endian bytes of their own size.
template <class V>
Bytes big_endian(const std::vector<V>& values) {
  Bytes out;
  for (V v : values) {
    unsigned char raw[sizeof(V)];
    std::memcpy(raw, &v, sizeof(V));
    for (std::size_t i = sizeof(V); i-- > 0;)
      out.push_back(raw[i]);
  }
  return out;
}

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void write_plain(const fs::path& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
}

void write_gzip(const fs::path& path, const Bytes& bytes) {
  gzFile out = gzopen(path.c_str(), "wb");
  REQUIRE(out != nullptr);
  REQUIRE(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())) ==
          static_cast<int>(bytes.size()));
  REQUIRE(gzclose(out) == Z_OK);
}

using test_support::contains;

Bytes read_plain(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("read_idx reads plain and gzip-compressed uint8 files") {
    TempDir dir;
    const Bytes bytes = concat(idx_header(0x08, {2, 3}), {0, 1, 2, 253, 254, 255});
    write_plain(dir / "plain-idx2-ubyte", bytes);
    write_gzip(dir / "packed-idx2-ubyte.gz", bytes);
    const Tensor<std::uint8_t> expected({2, 3}, {0, 1, 2, 253, 254, 255});
    for (const char* name : {"plain-idx2-ubyte", "packed-idx2-ubyte.gz"}) {
      CAPTURE(name);
      const auto t = read_idx<std::uint8_t>(dir / name);
      CHECK(t.shape() == Shape{2, 3});
      CHECK(t == expected);
      CHECK(read_idx<std::uint8_t>(dir / name, 2) == expected);
    }
  }

  TEST_CASE("read_idx converts big-endian int32 float32 and float64 data") {
    TempDir dir;
    const std::vector<std::int32_t> ints{-2147483647 - 1, -1, 0, 1, 2147483647, 0x01020304};
    write_gzip(dir / "i32.gz", concat(idx_header(0x0C, {3, 2}), big_endian(ints)));
    CHECK(read_idx<std::int32_t>(dir / "i32.gz") == Tensor<std::int32_t>({3, 2}, ints));

    const std::vector<float> floats{-1.5f, 0.0f, 3.25f, 1e-30f};
    write_plain(dir / "f32", concat(idx_header(0x0D, {4}), big_endian(floats)));
    CHECK(read_idx<float>(dir / "f32", 1) == Tensor<float>({4}, floats));

    const std::vector<double> doubles{-1.0 / 3.0, 2.5e300, 0.125, -0.0, 7.0, 8.0, 9.0, 10.0};
    write_gzip(dir / "f64.gz", concat(idx_header(0x0E, {2, 2, 2}), big_endian(doubles)));
    const auto d = read_idx<double>(dir / "f64.gz", 3);
    CHECK(d.shape() == Shape{2, 2, 2});
    CHECK(d == Tensor<double>({2, 2, 2}, doubles));
  }

  TEST_CASE("read_idx widens int8 and int16 into int32 keeping the sign") {
    TempDir dir;
    const std::vector<std::int8_t> bytes{-128, -1, 0, 1, 127};
    write_plain(dir / "i8", concat(idx_header(0x09, {5}), big_endian(bytes)));
    CHECK(read_idx<std::int32_t>(dir / "i8") == Tensor<std::int32_t>({5}, {-128, -1, 0, 1, 127}));

    const std::vector<std::int16_t> shorts{-32768, -300, -1, 0, 258, 32767};
    write_gzip(dir / "i16.gz", concat(idx_header(0x0B, {2, 3}), big_endian(shorts)));
    CHECK(read_idx<std::int32_t>(dir / "i16.gz") ==
          Tensor<std::int32_t>({2, 3}, {-32768, -300, -1, 0, 258, 32767}));
  }

  TEST_CASE("read_idx reads empty arrays and scalars") {
    TempDir dir;
    write_plain(dir / "empty", idx_header(0x08, {0, 28, 28}));
    const auto empty = read_idx<std::uint8_t>(dir / "empty");
    CHECK(empty.shape() == Shape{0, 28, 28});
    CHECK(empty.empty());
    write_gzip(dir / "scalar.gz",
               concat(idx_header(0x0C, {}), big_endian(std::vector<std::int32_t>{-7})));
    const auto scalar = read_idx<std::int32_t>(dir / "scalar.gz", 0);
    CHECK(scalar.shape() == Shape{});
    CHECK(scalar.data()[0] == -7);
  }

  TEST_CASE("read_idx reports a missing or unreadable file as IoError naming the path") {
    TempDir dir;
    const auto missing = dir / "no-such-file.gz";
    CHECK_THROWS_WITH_AS(
        read_idx<std::uint8_t>(missing),
        contains("idx file '" + missing.string() + "': cannot open (No such file or directory)"),
        IoError);
    fs::create_directory(dir / "folder");
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "folder"),
                         doctest::Contains("folder': cannot open (is a directory)"), IoError);
  }

  TEST_CASE("read_idx rejects a bad magic number an unknown type code and a rank beyond eight") {
    TempDir dir;
    write_plain(dir / "magic",
                concat({0x01, 0x00, 0x08, 0x01}, big_endian(std::vector<std::uint32_t>{1})));
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "magic"),
                         doctest::Contains("magic': expected a magic number starting with 0x00 "
                                           "0x00 but found 0x01 0x00"),
                         FormatError);
    write_plain(dir / "type", concat(idx_header(0x0A, {1}), {0}));
    CHECK_THROWS_WITH_AS(
        read_idx<std::uint8_t>(dir / "type"),
        doctest::Contains("expected a type code of 0x08, 0x09, 0x0b, 0x0c, 0x0d or "
                          "0x0e but found 0x0a"),
        FormatError);
    write_gzip(dir / "rank.gz", idx_header(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}));
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "rank.gz"),
                         doctest::Contains("expected a rank of at most 8 but found 9"),
                         FormatError);
  }

  TEST_CASE("read_idx rejects truncated headers") {
    TempDir dir;
    write_plain(dir / "empty-file", {});
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "empty-file"),
                         doctest::Contains("empty-file': expected a header of at least 4 bytes but "
                                           "the file ends after 0"),
                         FormatError);
    write_gzip(dir / "short.gz", {0, 0});
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "short.gz"),
                         doctest::Contains("expected a header of at least 4 bytes but the file "
                                           "ends after 2"),
                         FormatError);
    Bytes dims = idx_header(0x08, {60000, 28, 28});
    dims.resize(9);
    write_gzip(dir / "dims.gz", dims);
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "dims.gz"),
                         doctest::Contains("dims.gz': expected a header of 16 bytes for rank 3 but "
                                           "the file ends after 9"),
                         FormatError);
  }

  TEST_CASE("read_idx rejects truncated data and trailing data in plain and gzip files") {
    TempDir dir;
    const Bytes header = idx_header(0x0C, {2, 3});
    const Bytes data = big_endian(std::vector<std::int32_t>{1, 2, 3, 4, 5, 6});
    const Bytes short_data(data.begin(), data.begin() + 10);
    write_plain(dir / "short", concat(header, short_data));
    write_gzip(dir / "short.gz", concat(header, short_data));
    for (const char* name : {"short", "short.gz"}) {
      CAPTURE(name);
      CHECK_THROWS_WITH_AS(
          read_idx<std::int32_t>(dir / name),
          contains(std::string(name) + "': expected 24 bytes of data but the file ends "
                                       "after 10"),
          FormatError);
    }
    const Bytes long_data = concat(data, {0xAB});
    write_plain(dir / "long", concat(header, long_data));
    write_gzip(dir / "long.gz", concat(header, long_data));
    for (const char* name : {"long", "long.gz"}) {
      CAPTURE(name);
      CHECK_THROWS_WITH_AS(
          read_idx<std::int32_t>(dir / name),
          contains(std::string(name) + "': expected the file to end after 24 bytes of data "
                                       "but it holds more"),
          FormatError);
    }
  }

  TEST_CASE("read_idx refuses a gzip header declaring more than the file can decompress to") {
    // Found by fuzzing: a gzip file of a few dozen bytes whose header declares 1 GiB made
    // read_idx allocate the gigabyte before reading anything.
    TempDir dir;
    write_gzip(dir / "huge.gz", idx_header(0x08, {1024, 1024, 1024}));
    const auto size = fs::file_size(dir / "huge.gz");
    CHECK(size < 64);
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "huge.gz"),
                         contains("huge.gz': header declares shape (1024, 1024, 1024) "
                                  "(1073741824 bytes) but a gzip file of " +
                                  std::to_string(size) + " bytes decompresses to at most " +
                                  std::to_string(1032 * size)),
                         FormatError);
    // The bound is deflate's own (1032:1): the most compressible data still read.
    const Bytes zeros(std::size_t{4} << 20, 0);
    write_gzip(dir / "zeros.gz", concat(idx_header(0x08, {4, 1024, 1024}), zeros));
    CHECK(fs::file_size(dir / "zeros.gz") * 900 < zeros.size());
    const auto t = read_idx<std::uint8_t>(dir / "zeros.gz");
    CHECK(t.shape() == Shape{4, 1024, 1024});
    CHECK(std::all_of(t.begin(), t.end(), [](std::uint8_t v) { return v == 0; }));
  }

  TEST_CASE("read_idx rejects gzip data whose checksum or stream is corrupt") {
    TempDir dir;
    write_gzip(dir / "crc.gz", concat(idx_header(0x08, {4}), {1, 2, 3, 4}));
    Bytes packed = read_plain(dir / "crc.gz");
    REQUIRE(packed.size() > 8);
    packed[packed.size() - 8] ^= 0xFF;  // the gzip trailer: CRC-32, then the length
    write_plain(dir / "crc.gz", packed);
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "crc.gz"),
                         doctest::Contains("crc.gz': corrupt gzip data (incorrect "
                                           "data check)"),
                         FormatError);

    // A gzip header followed by bytes that are not a deflate stream.
    write_plain(dir / "stream.gz",
                {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 0x03, 0xff, 0xff, 0xff, 0xff});
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "stream.gz"),
                         doctest::Contains("stream.gz': corrupt gzip data"), FormatError);
  }

  TEST_CASE("read_idx rejects a stored type other than the requested one") {
    TempDir dir;
    write_gzip(dir / "f32.gz", concat(idx_header(0x0D, {1}), big_endian(std::vector<float>{1.0f})));
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "f32.gz"),
                         doctest::Contains("f32.gz': holds float32 values but uint8 was requested"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(read_idx<double>(dir / "f32.gz"),
                         doctest::Contains("holds float32 values but float64 was requested"),
                         ShapeError);
    write_plain(dir / "i16", concat(idx_header(0x0B, {1}), {0, 1}));
    CHECK_THROWS_WITH_AS(read_idx<std::int64_t>(dir / "i16"),
                         doctest::Contains("holds int16 values but int64 was requested (int8 and "
                                           "int16 read as int32)"),
                         ShapeError);
    write_plain(dir / "u8", concat(idx_header(0x08, {1}), {0}));
    CHECK_THROWS_WITH_AS(read_idx<std::int32_t>(dir / "u8"),
                         doctest::Contains("holds uint8 values but int32 was requested"),
                         ShapeError);
  }

  TEST_CASE("read_idx rejects a rank other than the expected one") {
    TempDir dir;
    write_gzip(dir / "labels.gz", concat(idx_header(0x08, {3}), {7, 8, 9}));
    CHECK_THROWS_WITH_AS(read_idx<std::uint8_t>(dir / "labels.gz", 3),
                         doctest::Contains("labels.gz': expected rank 3 but the file holds a uint8 "
                                           "array of shape (3,)"),
                         ShapeError);
  }

  TEST_CASE("read_idx reads Fashion-MNIST as NumPy does") {
    const char* env = std::getenv("LOADSTAR_FASHION_MNIST_DIR");
    if (env == nullptr || *env == '\0') {
      MESSAGE("skipped: LOADSTAR_FASHION_MNIST_DIR is not set");
      return;
    }
    const fs::path dir(env);
    if (!fs::exists(dir / "train-images-idx3-ubyte.gz") ||
        !fs::exists(dir / "t10k-labels-idx1-ubyte.gz")) {
      MESSAGE("skipped: the Fashion-MNIST files are missing from "
              << dir.string() << " (install dataset-fashion-mnist)");
      return;
    }
    // Expected values printed by tests/data/generate_reference.py, which reads the same files with
    // Python's gzip module and NumPy.
    struct Split {
      const char* name;
      std::size_t rows;
      std::size_t per_class;
      std::vector<int> first_labels;
      std::uint64_t first_image_sum;
      std::vector<int> first_image_row14;  // pixels (14, 10..17) of image 0
      std::uint64_t last_image_sum;
      int last_label;
      std::uint64_t pixel_sum;
    };
    const std::vector<Split> splits{
        {"train",
         60000,
         6000,
         {9, 0, 0, 3, 0, 2, 7, 2, 5, 5},
         76247,
         {0, 0, 237, 226, 217, 223, 222, 219},
         16684,
         5,
         3431114169u},
        {"t10k",
         10000,
         1000,
         {9, 2, 1, 1, 6, 1, 4, 6, 5, 7},
         33456,
         {0, 0, 98, 136, 110, 109, 110, 162},
         24390,
         5,
         573469082u},
    };
    for (const auto& split : splits) {
      CAPTURE(split.name);
      const auto images =
          read_idx<std::uint8_t>(dir / (std::string(split.name) + "-images-idx3-ubyte.gz"), 3);
      const auto labels =
          read_idx<std::uint8_t>(dir / (std::string(split.name) + "-labels-idx1-ubyte.gz"), 1);
      REQUIRE(images.shape() == Shape{split.rows, 28, 28});
      REQUIRE(labels.shape() == Shape{split.rows});

      std::vector<std::size_t> counts(10, 0);
      std::size_t out_of_range = 0;
      for (auto label : labels) {
        if (label < 10) {
          ++counts[label];
        } else {
          ++out_of_range;
        }
      }
      CHECK(out_of_range == 0);
      for (std::size_t c = 0; c < 10; ++c) {
        CAPTURE(c);
        CHECK(counts[c] == split.per_class);
      }
      for (std::size_t i = 0; i < 10; ++i)
        CHECK(int{labels(i)} == split.first_labels[i]);
      CHECK(int{labels(split.rows - 1)} == split.last_label);

      const auto sum = [](const Tensor<std::uint8_t>& t) {
        std::uint64_t s = 0;
        for (auto v : t)
          s += v;
        return s;
      };
      CHECK(sum(images.row(0)) == split.first_image_sum);
      CHECK(sum(images.row(split.rows - 1)) == split.last_image_sum);
      CHECK(sum(images) == split.pixel_sum);
      for (std::size_t j = 0; j < 8; ++j) {
        CAPTURE(j);
        CHECK(int{images(0, 14, 10 + j)} == split.first_image_row14[j]);
      }
    }
  }
}
