#include <doctest/doctest.h>

#include "temp_dir.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <loadstar/data/npy.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <string>
#include <type_traits>
#include <vector>

using loadstar::FormatError;
using loadstar::IoError;
using loadstar::read_npy;
using loadstar::read_npy_header;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::write_npy;

namespace {

namespace fs = std::filesystem;

using test_support::TempDir;

/// A doctest matcher for messages that contain `text`.
doctest::Contains has(const std::string& text) {
  return doctest::Contains(text.c_str());
}

/// tests/data/npy/, written by NumPy through tests/data/generate_npy.py.
fs::path npy_dir() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  return fs::path(root) / "tests" / "data" / "npy";
}

/// The generator's pattern: value(i) = (i % 11) - 3 for signed and float dtypes, i % 11 for
/// unsigned ones, i % 3 == 0 for bool.
double pattern(std::size_t i, char kind) {
  if (kind == 'b') return i % 3 == 0 ? 1.0 : 0.0;
  if (kind == 'u') return static_cast<double>(i % 11);
  return static_cast<double>(i % 11) - 3.0;
}

template <class T>
void check_pattern(const Tensor<T>& t, const Shape& shape, char kind, const std::string& file) {
  REQUIRE_MESSAGE(t.shape() == shape, file << ": shape " << t.shape().str());
  for (std::size_t i = 0; i < t.size(); ++i) {
    const double want = pattern(i, kind);
    if (static_cast<double>(t.data()[i]) != want) {
      FAIL(file << ": element " << i << " is " << t.data()[i] << " but NumPy wrote " << want);
    }
  }
}

/// Writes a `.npy` file of version 1.0 with header text `dict` (padded and ended with a
/// newline) followed by `data`.
void write_raw(const fs::path& path, const std::string& dict, const std::string& data,
               int major = 1) {
  std::string header = dict;
  const std::size_t preamble = major == 1 ? 10 : 12;
  while ((preamble + header.size() + 1) % 64 != 0)
    header += ' ';
  header += '\n';
  std::string bytes = "\x93NUMPY";
  bytes += static_cast<char>(major);
  bytes += '\0';
  bytes += static_cast<char>(header.size() & 0xff);
  bytes += static_cast<char>((header.size() >> 8) & 0xff);
  if (major != 1) bytes += std::string(2, '\0');
  bytes += header + data;
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string floats(std::initializer_list<float> values) {
  std::string out(values.size() * sizeof(float), '\0');
  std::memcpy(out.data(), std::data(values), out.size());
  return out;
}

/// Whether /usr/bin/python3 can import numpy.
bool have_numpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

/// Runs `script` with /usr/bin/python3 and returns its standard output.
std::string python(const std::string& script) {
  const std::string command = "/usr/bin/python3 -c \"" + script + "\"";
  std::FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe))
    out.append(buffer, n);
  REQUIRE_MESSAGE(::pclose(pipe) == 0, "python failed: " << script);
  return out;
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("read_npy reads every dtype and byte order NumPy writes") {
    const Shape shape{2, 3, 4};
    for (const std::string kind :
         {"f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"}) {
      for (const std::string order : {"le", "be", "na"}) {
        const fs::path file = npy_dir() / ("pattern_" + kind + "_" + order + ".npy");
        if ((order == "na") != (kind[1] == '1')) continue;
        CAPTURE(file);
        check_pattern(read_npy<float>(file), shape, kind[0], file.string());
        check_pattern(read_npy<double>(file), shape, kind[0], file.string());
        const auto header = read_npy_header(file);
        CHECK(header.shape == shape);
        CHECK(header.item_size == static_cast<std::size_t>(kind[1] - '0'));
        CHECK(header.big_endian == (order == "be"));
        if (kind[0] != 'f') {
          check_pattern(read_npy<std::int64_t>(file), shape, kind[0], file.string());
          check_pattern(read_npy<std::int32_t>(file), shape, kind[0], file.string());
        }
      }
    }
  }

  TEST_CASE("read_npy reads NumPy's float16 in either byte order into every floating type") {
    using loadstar::bfloat16;
    using loadstar::float16;
    for (const std::string order : {"le", "be"}) {
      const fs::path file = npy_dir() / ("pattern_f2_" + order + ".npy");
      CAPTURE(file);
      const auto header = read_npy_header(file);
      CHECK(header.dtype_name() == "float16");
      CHECK(header.big_endian == (order == "be"));
      const auto as_float = read_npy<float>(file);
      const auto as_half = read_npy<float16>(file);
      const auto as_brain = read_npy<bfloat16>(file);
      const auto as_double = read_npy<double>(file);
      REQUIRE(as_float.shape() == Shape{2, 3, 4});
      REQUIRE(as_half.shape() == Shape{2, 3, 4});
      for (std::size_t i = 0; i < as_float.size(); ++i) {
        // (i % 11 - 3) / 4: exact in every one of the four types.
        const float expected = static_cast<float>(static_cast<int>(i % 11) - 3) * 0.25f;
        CHECK(as_float.data()[i] == expected);
        CHECK(static_cast<float>(as_half.data()[i]) == expected);
        CHECK(static_cast<float>(as_brain.data()[i]) == expected);
        CHECK(as_double.data()[i] == static_cast<double>(expected));
      }
    }
    CHECK_THROWS_WITH_AS(read_npy<std::int32_t>(npy_dir() / "pattern_f2_le.npy"),
                         has("holds float16 values but int32 was requested"), ShapeError);
  }

  TEST_CASE("Tensor::cast rounds float32 to float16 as NumPy does and to bfloat16 as PyTorch") {
    using loadstar::bfloat16;
    using loadstar::float16;
    const auto inputs = read_npy<float>(npy_dir() / "half_inputs_f4.npy");
    const auto numpy_half = read_npy<float16>(npy_dir() / "half_numpy_f2.npy");
    // PyTorch's bfloat16 bit patterns, stored as uint16 (NumPy has no bfloat16).
    const auto torch_brain = read_npy<std::int32_t>(npy_dir() / "bfloat16_torch_u2.npy");
    REQUIRE(inputs.size() > 250);
    REQUIRE(numpy_half.size() == inputs.size());
    REQUIRE(torch_brain.size() == inputs.size());
    const auto half = inputs.cast<float16>();
    const auto brain = inputs.cast<bfloat16>();
    static_assert(std::is_same_v<decltype(half)::value_type, float16>);
    CHECK(half.description() == "float16 tensor of shape (" + std::to_string(inputs.size()) + ",)");
    CHECK(brain.description() ==
          "bfloat16 tensor of shape (" + std::to_string(inputs.size()) + ",)");
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      CAPTURE(i);
      CAPTURE(inputs.data()[i]);
      if (std::isnan(inputs.data()[i])) {
        CHECK(Eigen::numext::isnan(half.data()[i]));
        CHECK(Eigen::numext::isnan(brain.data()[i]));
        continue;
      }
      CHECK(Eigen::numext::bit_cast<std::uint16_t>(half.data()[i]) ==
            Eigen::numext::bit_cast<std::uint16_t>(numpy_half.data()[i]));
      CHECK(Eigen::numext::bit_cast<std::uint16_t>(brain.data()[i]) ==
            static_cast<std::uint16_t>(torch_brain.data()[i]));
    }
    // Widening back is exact: float16 and bfloat16 values are float32 values.
    const auto back = numpy_half.cast<float>();
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (std::isnan(inputs.data()[i])) continue;
      CHECK(back.data()[i] == static_cast<float>(numpy_half.data()[i]));
    }
  }

  TEST_CASE("write_npy writes float16 that NumPy reads back") {
    using loadstar::float16;
    TempDir dir;
    const auto half = read_npy<float16>(npy_dir() / "half_numpy_f2.npy");
    write_npy(dir / "h.npy", half);
    CHECK(read_npy_header(dir / "h.npy").dtype_name() == "float16");
    const auto again = read_npy<float16>(dir / "h.npy");
    REQUIRE(again.size() == half.size());
    CHECK(std::memcmp(again.data(), half.data(), half.bytes()) == 0);
    if (!have_numpy()) {
      MESSAGE("skipped the NumPy half: /usr/bin/python3 cannot import numpy");
      return;
    }
    const std::string out = python(
        "import numpy as np\n"
        "a = np.load('" +
        (dir / "h.npy").string() +
        "')\n"
        "b = np.load('" +
        (npy_dir() / "half_numpy_f2.npy").string() +
        "')\n"
        "print(a.dtype, a.shape == b.shape, a.tobytes() == b.tobytes())\n");
    CHECK(out == "float16 True True\n");
  }

  TEST_CASE("read_npy reads format versions 2.0 and 3.0") {
    const auto v2 = read_npy<float>(npy_dir() / "pattern_f4_le_v2.npy");
    check_pattern(v2, Shape{5, 7}, 'f', "v2");
    CHECK(read_npy_header(npy_dir() / "pattern_f4_le_v2.npy").major_version == 2);
    const auto v3 = read_npy<float>(npy_dir() / "pattern_f8_be_v3.npy");
    check_pattern(v3, Shape{5, 7}, 'f', "v3");
    CHECK(read_npy_header(npy_dir() / "pattern_f8_be_v3.npy").major_version == 3);
  }

  TEST_CASE("read_npy reads scalars vectors empty arrays and rank 8") {
    const auto scalar = read_npy<float>(npy_dir() / "scalar_f8.npy");
    CHECK(scalar.shape().rank() == 0);
    CHECK(scalar.data()[0] == 2.5f);
    check_pattern(read_npy<float>(npy_dir() / "vector_f4.npy"), Shape{6}, 'f', "vector");
    const auto empty = read_npy<float>(npy_dir() / "empty_f4.npy");
    CHECK(empty.shape() == Shape{0, 3});
    check_pattern(read_npy<std::int32_t>(npy_dir() / "rank8_i2.npy"), Shape{1, 2, 1, 2, 1, 2, 1, 3},
                  'i', "rank8");
  }

  TEST_CASE("read_npy converts extreme integers and special floats") {
    const auto i8 = read_npy<double>(npy_dir() / "extremes_i8.npy");
    REQUIRE(i8.size() == 4);
    CHECK(i8.data()[0] == -9223372036854775808.0);
    CHECK(i8.data()[1] == -1.0);
    CHECK(i8.data()[3] == 9223372036854775807.0);
    const auto exact = read_npy<std::int64_t>(npy_dir() / "extremes_i8.npy");
    CHECK(exact.data()[0] == std::numeric_limits<std::int64_t>::min());
    CHECK(exact.data()[3] == std::numeric_limits<std::int64_t>::max());
    const auto u8 = read_npy<float>(npy_dir() / "extremes_u8.npy");
    CHECK(u8.data()[2] == 18446744073709551615.0f);
    const auto special = read_npy<float>(npy_dir() / "special_f4.npy");
    CHECK(std::isnan(special.data()[0]));
    CHECK(special.data()[1] == std::numeric_limits<float>::infinity());
    CHECK(special.data()[2] == -std::numeric_limits<float>::infinity());
    CHECK(std::signbit(special.data()[3]));
    CHECK(special.data()[4] == std::numeric_limits<float>::denorm_min());
  }

  TEST_CASE("read_npy refuses conversions that lose values") {
    CHECK_THROWS_WITH_AS(read_npy<std::int32_t>(npy_dir() / "pattern_f4_le.npy"),
                         has("holds float32 values but int32 was requested"), ShapeError);
    CHECK_THROWS_WITH_AS(read_npy<std::int32_t>(npy_dir() / "extremes_i8.npy"),
                         has("element 0 (-9223372036854775808) does not fit in int32"), ShapeError);
    CHECK_THROWS_WITH_AS(read_npy<std::uint8_t>(npy_dir() / "pattern_i1_na.npy"),
                         has("element 0 (-3) does not fit in uint8"), ShapeError);
  }

  TEST_CASE("read_npy refuses what NumPy writes but loadstar does not read") {
    CHECK_THROWS_WITH_AS(read_npy<float>(npy_dir() / "fortran_f4.npy"),
                         has("fortran_order is True (column-major data), which is "
                             "not supported"),
                         FormatError);
    CHECK_THROWS_WITH_AS(read_npy<float>(npy_dir() / "structured.npy"), has("a structured dtype"),
                         FormatError);
    CHECK_THROWS_WITH_AS(read_npy<float>(npy_dir() / "complex_c8.npy"),
                         has("unsupported descr '<c8'"), FormatError);
  }

  TEST_CASE("read_npy names the file and the fault of every malformed file") {
    TempDir dir;
    const fs::path file = dir / "bad.npy";
    const std::string name = "npy file '" + file.string() + "'";
    const std::string good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
    const std::string two = floats({1.0f, 2.0f});
    struct Case {
      const char* title;
      std::string dict;
      std::string data;
      std::string message;
    };
    const std::vector<Case> cases = {
        {"a missing key", "{'descr': '<f4', 'shape': (2,), }", two, "missing key 'fortran_order'"},
        {"an unknown key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", two,
         "unexpected key 'x'"},
        {"a bad fortran_order", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", two,
         "expected False or True for fortran_order"},
        {"a negative dimension", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", two,
         "expected a non-negative integer in the shape"},
        {"a parenthesised integer", "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", two,
         "expected ',' after the only dimension"},
        {"nine dimensions",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,2), }", two,
         "more than 8 dimensions"},
        {"an overflowing element count",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", two,
         "element count does not fit in 64 bits"},
        {"an overflowing byte count",
         "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }", two,
         "is too large to address"},
        {"a dimension past 64 bits",
         "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", two,
         "does not fit in 64 bits"},
        {"an unterminated string", "{'descr: '<f4', 'fortran_order': False, 'shape': (2,), }", two,
         "expected ':' after key 'descr: '"},
        {"text after the dict", good + " x", two, "unexpected text after the header dict"},
        {"not a dict", "['descr']", two, "expected '{' opening the header dict"},
        {"a 3-byte float", "{'descr': '<f3', 'fortran_order': False, 'shape': (2,), }", "abcdef",
         "unsupported descr '<f3'; expected f2, f4, f8, i1, i2, i4, i8, u1, u2, u4, u8 or b1"},
        {"a truncated data section", good, floats({1.0f}),
         "shape (2,) of float32 needs 8 bytes of data but the file holds 4"},
        {"trailing bytes", good, floats({1.0f, 2.0f, 3.0f}), "(4 trailing bytes)"},
        {"a non-ASCII header", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), '\xe9'}",
         two, "not printable ASCII"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.title);
      write_raw(file, c.dict, c.data);
      CHECK_THROWS_WITH_AS(read_npy<float>(file), has(name + ": "), FormatError);
      CHECK_THROWS_WITH_AS(read_npy<float>(file), has(c.message), FormatError);
    }

    std::ofstream(file, std::ios::binary) << std::string("\x93NUMPZ\x01\x00\x00\x00", 10);
    CHECK_THROWS_WITH_AS(read_npy<float>(file), has(name + ": expected the magic string"),
                         FormatError);
    std::ofstream(file, std::ios::binary) << "\x93NUMPY";
    CHECK_THROWS_WITH_AS(read_npy<float>(file),
                         has("expected a preamble of at least 10 bytes but the file "
                             "holds 6"),
                         FormatError);
    std::ofstream(file, std::ios::binary) << std::string("\x93NUMPY\x04\x00\x10\x00", 10);
    CHECK_THROWS_WITH_AS(read_npy<float>(file),
                         has("expected format version 1.0, 2.0 or 3.0 but found 4.0"), FormatError);
    std::ofstream(file, std::ios::binary) << std::string("\x93NUMPY\x01\x00\xff\x00{}\n", 13);
    CHECK_THROWS_WITH_AS(read_npy<float>(file),
                         has("header length 255 runs past the end of the file (13 "
                             "bytes)"),
                         FormatError);
    std::ofstream(file, std::ios::binary) << std::string("\x93NUMPY\x02\x00\xff\xff\xff\x7f", 12);
    CHECK_THROWS_WITH_AS(read_npy<float>(file), has("header length 2147483647 exceeds the limit"),
                         FormatError);
    std::ofstream(file, std::ios::binary) << std::string("\x93NUMPY\x01\x00\x03\x00{} ", 13);
    CHECK_THROWS_WITH_AS(read_npy<float>(file), has("expected the header to end with a newline"),
                         FormatError);
    write_raw(file, good, two, 2);
    CHECK(read_npy<float>(file).data()[1] == 2.0f);
    // A bool byte other than 0 and 1 (NumPy writes only those) reads as true.
    write_raw(file, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
              std::string("\x00\x08\x01", 3));
    const auto flags = read_npy<float>(file);
    CHECK(flags.data()[0] == 0.0f);
    CHECK(flags.data()[1] == 1.0f);
    CHECK(flags.data()[2] == 1.0f);
  }

  TEST_CASE("read_npy reports missing files and directories as IoError") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(read_npy<float>(dir / "absent.npy"),
                         has("npy file '" + (dir / "absent.npy").string() +
                             "': cannot open (No such file or directory)"),
                         IoError);
    CHECK_THROWS_WITH_AS(read_npy<float>(dir.path()), has("is a directory"), IoError);
  }

  TEST_CASE("write_npy writes files NumPy reads back") {
    TempDir dir;
    Tensor<float> x({2, 3});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i) * 0.5f - 1.0f;
    Tensor<std::uint8_t> bytes({4});
    for (std::size_t i = 0; i < 4; ++i)
      bytes.data()[i] = static_cast<std::uint8_t>(250 + i);
    Tensor<double> scalar = Tensor<double>::uninitialized(Shape{});
    scalar.data()[0] = 0.1;
    write_npy(dir / "x.npy", x);
    write_npy(dir / "b.npy", bytes);
    write_npy(dir / "s.npy", scalar);
    write_npy(dir / "e.npy", Tensor<std::int64_t>({0, 5}));

    // Our own reader agrees.
    CHECK(read_npy<float>(dir / "x.npy") == x);
    CHECK(read_npy<std::uint8_t>(dir / "b.npy") == bytes);
    // The data start at a multiple of 64 bytes, as NumPy aligns them.
    CHECK(read_npy_header(dir / "x.npy").data_offset % 64 == 0);
    // Overwriting replaces the file and leaves no temporary behind.
    write_npy(dir / "x.npy", x);
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path()))
      ++files;
    CHECK(files == 4);

    if (!have_numpy()) {
      MESSAGE("skipped the NumPy half: /usr/bin/python3 cannot import numpy");
      return;
    }
    const std::string d = dir.path().string();
    const std::string out = python(
        "import numpy as np\n"
        "for n in ['x', 'b', 's', 'e']:\n"
        "    a = np.load('" +
        d +
        "/' + n + '.npy')\n"
        "    print(n, a.dtype, a.shape, a.flags.c_contiguous, a.ravel().tolist())\n");
    CHECK(out ==
          "x float32 (2, 3) True [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]\n"
          "b uint8 (4,) True [250, 251, 252, 253]\n"
          "s float64 () True [0.1]\n"
          "e int64 (0, 5) True []\n");
  }

  TEST_CASE("write_npy leaves an existing file alone when it cannot write") {
    TempDir dir;
    CHECK_THROWS_WITH_AS(
        write_npy(dir / "absent" / "x.npy", Tensor<float>({2})),
        has("npy file '" + (dir / "absent" / "x.npy").string() + "': cannot create"), IoError);
    write_npy(dir / "x.npy", Tensor<float>({2}));
    // A directory in the way of the rename.
    fs::create_directory(dir / "d.npy");
    fs::create_directory(dir / "d.npy" / "inside");
    CHECK_THROWS_WITH_AS(write_npy(dir / "d.npy", Tensor<float>({2})), has("cannot rename"),
                         IoError);
    CHECK(fs::is_directory(dir / "d.npy" / "inside"));
    std::size_t files = 0;
    for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.path()))
      ++files;
    CHECK(files == 2);
  }
}
