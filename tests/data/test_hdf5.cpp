#include <H5Cpp.h>
#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "temp_dir.hpp"
#include "test_helpers.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/concepts.hpp>
#include <loadstar/data/detail/sandbox.hpp>
#include <loadstar/data/hdf5.hpp>
#include <loadstar/data/hdf5_options.hpp>
#include <loadstar/data/hdf5_sequence.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <mutex>
#include <new>
#include <numeric>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using loadstar::ArrayOptions;
using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::Hdf5Options;
using loadstar::Hdf5Sequence;
using loadstar::IoError;
using loadstar::read_hdf5;
using loadstar::Shape;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::write_hdf5;

static_assert(loadstar::KerasSequence<Hdf5Sequence<float, std::int64_t>>);
static_assert(loadstar::Sequence<Hdf5Sequence<std::uint8_t, double>>);
static_assert(std::same_as<loadstar::batch_t<Hdf5Sequence<float, std::int32_t>>,
                           std::tuple<Tensor<float>, Tensor<std::int32_t>>>);
static_assert(std::copy_constructible<Hdf5Sequence<float, float>>);

namespace {

namespace fs = std::filesystem;

using test_support::TempDir;

using test_support::contains;

/// A tensor of the given shape holding `start, start + step, ...`.
template <class T>
Tensor<T> iota(const Shape& shape, T start = T{0}, T step = T{1}) {
  Tensor<T> t(shape);
  T value = start;
  for (T& v : t) {
    v = value;
    value = static_cast<T>(value + step);
  }
  return t;
}

/// Writes `values` as a dataset of HDF5 type `type` with the HDF5 C++ API directly, for stored
/// types `write_hdf5` does not produce.
template <class V>
void write_raw(const fs::path& file, const std::string& name, const H5::PredType& file_type,
               const H5::PredType& memory_type, const std::vector<hsize_t>& dims,
               const std::vector<V>& values) {
  H5::H5File h5(file.c_str(), fs::exists(file) ? H5F_ACC_RDWR : H5F_ACC_TRUNC);
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  const H5::DataSet data = h5.createDataSet(name, file_type, space);
  data.write(values.data(), memory_type);
}

/// A crafted file of `tests/data/hostile/`, found by fuzzing the readers.
fs::path hostile_file(const std::string& name) {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  return fs::path(root) / "tests" / "data" / "hostile" / name;
}

/// Creates an empty float32 dataset of shape `dims`, chunked as `chunk` (or contiguous when
/// `chunk` is empty), of which nothing is ever written: a file of a few kilobytes.
void write_unwritten(const fs::path& file, const std::string& name,
                     const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk) {
  H5::H5File h5(file.c_str(), fs::exists(file) ? H5F_ACC_RDWR : H5F_ACC_TRUNC);
  H5::DSetCreatPropList create;
  if (!chunk.empty()) create.setChunk(static_cast<int>(chunk.size()), chunk.data());
  const H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  h5.createDataSet(name, H5::PredType::IEEE_F32LE, space, create);
}

constexpr loadstar::Hdf5Options trusted{.trust = loadstar::Trust::trusted};
constexpr loadstar::Hdf5Options untrusted{.trust = loadstar::Trust::untrusted};

/// Rows `[begin, end)` of `t` as a new tensor, to compare batches with.
template <class T>
Tensor<T> rows(const Tensor<T>& t, std::size_t begin, std::size_t end) {
  return t.slice_rows(begin, end).clone();
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE_TEMPLATE("write_hdf5 and read_hdf5 round-trip every element type and rank", T, float,
                     double, std::int32_t, std::int64_t, std::uint8_t, loadstar::float16,
                     loadstar::bfloat16) {
    TempDir dir;
    const auto file = dir / "round-trip.h5";
    const auto vector = iota<T>({7}, T{1});
    const auto matrix = iota<T>({3, 4}, T{2}, T{3});
    const auto cube = iota<T>({2, 3, 5});
    const Tensor<T> scalar(Shape{}, T{42});
    const Tensor<T> empty(Shape{0, 4});
    write_hdf5(file, "vector", vector);
    write_hdf5(file, "/matrix", matrix);
    write_hdf5(file, "/nested/group/cube", cube);
    write_hdf5(file, "scalar", scalar);
    write_hdf5(file, "empty", empty);
    CHECK(read_hdf5<T>(file, "vector") == vector);
    CHECK(read_hdf5<T>(file, "/vector", 1) == vector);
    CHECK(read_hdf5<T>(file, "matrix", 2) == matrix);
    const auto read_cube = read_hdf5<T>(file, "/nested/group/cube", 3);
    CHECK(read_cube.shape() == Shape{2, 3, 5});
    CHECK(read_cube == cube);
    const auto read_scalar = read_hdf5<T>(file, "scalar", 0);
    CHECK(read_scalar.shape() == Shape{});
    CHECK(read_scalar.data()[0] == T{42});
    const auto read_empty = read_hdf5<T>(file, "empty");
    CHECK(read_empty.shape() == Shape{0, 4});
  }

  TEST_CASE("read_hdf5 converts sizes and signedness within a type class") {
    TempDir dir;
    const auto file = dir / "convert.h5";
    write_hdf5(file, "f64", Tensor<double>({3}, {0.5, -1.25, 1e10}));
    write_hdf5(file, "f32", Tensor<float>({2}, {0.1f, -3.5f}));
    write_hdf5(file, "u8", Tensor<std::uint8_t>({2, 2}, {0, 1, 200, 255}));
    write_hdf5(file, "i64", Tensor<std::int64_t>({3}, {-5, 7, 300}));
    write_raw<std::int16_t>(file, "i16", H5::PredType::STD_I16BE, H5::PredType::NATIVE_INT16, {4},
                            {-32768, -1, 258, 32767});
    write_raw<std::int8_t>(file, "i8", H5::PredType::STD_I8LE, H5::PredType::NATIVE_INT8, {2},
                           {-128, 127});

    CHECK(read_hdf5<float>(file, "f64") == Tensor<float>({3}, {0.5f, -1.25f, 1e10f}));
    CHECK(read_hdf5<double>(file, "f32") == Tensor<double>({2}, {static_cast<double>(0.1f), -3.5}));
    CHECK(read_hdf5<std::int64_t>(file, "u8") == Tensor<std::int64_t>({2, 2}, {0, 1, 200, 255}));
    CHECK(read_hdf5<std::int32_t>(file, "u8") == Tensor<std::int32_t>({2, 2}, {0, 1, 200, 255}));
    CHECK(read_hdf5<std::int32_t>(file, "i64") == Tensor<std::int32_t>({3}, {-5, 7, 300}));
    // Big-endian int16 on disk, native int32 in memory.
    CHECK(read_hdf5<std::int32_t>(file, "i16") ==
          Tensor<std::int32_t>({4}, {-32768, -1, 258, 32767}));
    CHECK(read_hdf5<std::int64_t>(file, "i8") == Tensor<std::int64_t>({2}, {-128, 127}));
    // HDF5 saturates integers out of range of the requested type.
    CHECK(read_hdf5<std::uint8_t>(file, "i64") == Tensor<std::uint8_t>({3}, {0, 7, 255}));
  }

  TEST_CASE("write_hdf5 stores float16 as h5py does, and 16-bit floats widen exactly on reading") {
    using loadstar::bfloat16;
    using loadstar::float16;
    TempDir dir;
    const auto file = dir / "half.h5";
    const Tensor<float> values({6}, {0.5f, -1.25f, 65504.0f, 6.103515625e-05f, 3.0f, -0.0f});
    write_hdf5(file, "half", values.cast<float16>());
    write_hdf5(file, "brain", values.cast<bfloat16>());
    // Each value is exact in both types except 65504 (bfloat16: 65536) and 6.1e-5 (bfloat16:
    // rounded to 8 bits of mantissa); widening through HDF5's conversion loses nothing.
    CHECK(read_hdf5<float>(file, "half") == values);
    CHECK(read_hdf5<float>(file, "brain") == values.cast<bfloat16>().cast<float>());
    CHECK(read_hdf5<double>(file, "half") == values.cast<double>());
    CHECK_THROWS_WITH_AS(read_hdf5<std::int32_t>(file, "half"),
                         doctest::Contains("dataset '/half' holds float16 values but int32 was "
                                           "requested (an integer type is needed)"),
                         loadstar::ShapeError);
    if (std::system("/usr/bin/python3 -c 'import h5py' >/dev/null 2>&1") != 0) {
      MESSAGE("skipped the h5py half: /usr/bin/python3 cannot import h5py");
      return;
    }
    // h5py, an independent reader, sees numpy.float16 with the same values; it also writes one
    // that read_hdf5 reads bit for bit.
    const std::string script =
        "import h5py, numpy as np\n"
        "f = h5py.File('" +
        file.string() +
        "', 'a')\n"
        "a = f['half'][()]\n"
        "assert a.dtype == np.float16, a.dtype\n"
        "assert a.tolist() == [0.5, -1.25, 65504.0, 6.103515625e-05, 3.0, -0.0], a.tolist()\n"
        "f['from_h5py'] = np.array([1.5, -2.0, 0.099975586, 60000.0], dtype=np.float16)\n"
        "f.close()\n";
    CHECK(std::system(("/usr/bin/python3 -c \"" + script + "\"").c_str()) == 0);
    const auto from_h5py = read_hdf5<float16>(file, "from_h5py");
    REQUIRE(from_h5py.size() == 4);
    CHECK(from_h5py.cast<float>() == Tensor<float>({4}, {1.5f, -2.0f, 0.0999755859375f, 60000.0f}));
  }

  TEST_CASE("read_hdf5 rejects a stored type class other than the requested one") {
    TempDir dir;
    const auto file = dir / "classes.h5";
    write_hdf5(file, "x", Tensor<double>({2}, {1.0, 2.0}));
    write_hdf5(file, "labels", Tensor<std::uint8_t>({2}, {1, 2}));
    {
      H5::H5File h5(file.c_str(), H5F_ACC_RDWR);
      const H5::StrType text(H5::PredType::C_S1, 8);
      const hsize_t dims[1] = {2};
      const char values[16] = "alpha\0\0\0beta";
      h5.createDataSet("names", text, H5::DataSpace(1, dims)).write(values, text);
    }
    CHECK_THROWS_WITH_AS(read_hdf5<std::int32_t>(file, "x"),
                         contains("hdf5 file '" + file.string() +
                                  "': dataset '/x' holds float64 values but int32 was requested "
                                  "(an integer type is needed)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "/labels"),
                         doctest::Contains("dataset '/labels' holds uint8 values but float32 was "
                                           "requested (a floating-point type is needed)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(read_hdf5<std::uint8_t>(file, "names"),
                         doctest::Contains("dataset '/names' holds string values but uint8 was "
                                           "requested"),
                         ShapeError);
  }

  TEST_CASE("read_hdf5 rejects a rank other than the expected one") {
    TempDir dir;
    const auto file = dir / "rank.h5";
    write_hdf5(file, "x", Tensor<float>({3, 4}));
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "x", 3),
                         doctest::Contains("dataset '/x' has rank 2 (shape (3, 4)) but rank 3 was "
                                           "expected"),
                         ShapeError);
  }

  TEST_CASE("read_hdf5 reports missing files and datasets and files that are not hdf5") {
    TempDir dir;
    const auto missing = dir / "missing.h5";
    CHECK_THROWS_WITH_AS(
        read_hdf5<float>(missing, "x"),
        contains("hdf5 file '" + missing.string() + "': cannot open (No such file or directory)"),
        IoError);
    fs::create_directory(dir / "folder.h5");
    CHECK_THROWS_WITH_AS(read_hdf5<float>(dir / "folder.h5", "x"),
                         doctest::Contains("folder.h5': cannot open (is a directory)"), IoError);
    std::ofstream(dir / "text.h5") << "not an hdf5 file\n";
    CHECK_THROWS_WITH_AS(read_hdf5<float>(dir / "text.h5", "x"),
                         doctest::Contains("text.h5': expected an hdf5 file but found no hdf5 "
                                           "signature"),
                         FormatError);

    const auto file = dir / "data.h5";
    write_hdf5(file, "/group/x", Tensor<float>({2}));
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "y"),
                         contains("hdf5 file '" + file.string() + "': dataset '/y' missing"),
                         FormatError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "/other/x"),
                         doctest::Contains("dataset '/other/x' missing"), FormatError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "/group/x/deeper"),
                         doctest::Contains("dataset '/group/x/deeper' missing"), FormatError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "/"), doctest::Contains("dataset '/' missing"),
                         FormatError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "group"),
                         doctest::Contains("expected '/group' to be a dataset but it is a group"),
                         FormatError);
  }

  TEST_CASE("write_hdf5 keeps other datasets replaces its own and leaves no temporary file") {
    TempDir dir;
    const auto file = dir / "data.h5";
    write_hdf5(file, "a", Tensor<float>({2}, {1.f, 2.f}));
    write_hdf5(file, "b", Tensor<std::int64_t>({1}, {9}));
    write_hdf5(file, "a", Tensor<std::uint8_t>({3}, {4, 5, 6}));
    CHECK(read_hdf5<std::uint8_t>(file, "a") == Tensor<std::uint8_t>({3}, {4, 5, 6}));
    CHECK(read_hdf5<std::int64_t>(file, "b") == Tensor<std::int64_t>({1}, {9}));
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}) == 1);

    // A file that is not HDF5 is left as it was.
    std::ofstream(dir / "notes.txt") << "keep me\n";
    CHECK_THROWS_WITH_AS(write_hdf5(dir / "notes.txt", "x", Tensor<float>({1})),
                         doctest::Contains("notes.txt': expected an hdf5 file but found no hdf5 "
                                           "signature"),
                         FormatError);
    std::string line;
    std::getline(std::ifstream(dir / "notes.txt"), line);
    CHECK(line == "keep me");
    CHECK_THROWS_WITH_AS(write_hdf5(dir / "missing-folder" / "x.h5", "x", Tensor<float>({1})),
                         doctest::Contains("x.h5': cannot write dataset '/x' (unable to open file"),
                         IoError);
    CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}) == 2);
  }

  TEST_CASE("Hdf5Sequence delivers batches equal to the rows of the datasets") {
    TempDir dir;
    const auto file = dir / "train.h5";
    const auto x = iota<float>({10, 3, 2}, 0.5f);
    const auto y = iota<std::int64_t>({10}, 100);
    write_hdf5(file, "/train/x", x);
    write_hdf5(file, "/train/y", y);

    SUBCASE("with a partial last batch") {
      const Hdf5Sequence<float, std::int64_t> seq(file, "train/x", "/train/y", 4);
      CHECK(seq.size() == 3);
      CHECK(seq.rows() == 10);
      CHECK(seq.batch_size() == 4);
      CHECK(seq.x_shape() == Shape{10, 3, 2});
      CHECK(seq.y_shape() == Shape{10});
      for (std::size_t i = 0; i < seq.size(); ++i) {
        CAPTURE(i);
        const auto [bx, by] = seq[i];
        const std::size_t end = std::min<std::size_t>(4 * i + 4, 10);
        CHECK(bx == rows(x, 4 * i, end));
        CHECK(by == rows(y, 4 * i, end));
      }
      CHECK(std::get<0>(seq[2]).shape() == Shape{2, 3, 2});
      CHECK_THROWS_WITH_AS(seq[3],
                           contains("hdf5 sequence over '" + file.string() +
                                    "': batch 3 is out of range for a sequence of 3 batches"),
                           ConfigError);
    }
    SUBCASE("with drop_leftovers") {
      const Hdf5Sequence<float, std::int64_t> seq(file, "/train/x", "/train/y", 4,
                                                  ArrayOptions{.drop_leftovers = true});
      CHECK(seq.size() == 2);
      CHECK(std::get<1>(seq[1]) == rows(y, 4, 8));
      CHECK_THROWS_AS(seq[2], ConfigError);
    }
    SUBCASE("with one batch of all rows") {
      const Hdf5Sequence<double, std::int32_t> seq(file, "/train/x", "/train/y", 10);
      CHECK(seq.size() == 1);
      CHECK(std::get<0>(seq[0]) == x.cast<double>());
      CHECK(std::get<1>(seq[0]) == y.cast<std::int32_t>());
    }
    SUBCASE("with copies sharing the open file") {
      std::optional<Hdf5Sequence<float, std::int64_t>> original(std::in_place, file, "/train/x",
                                                                "/train/y", 3);
      const auto copy = *original;
      original.reset();
      CHECK(copy.size() == 4);
      CHECK(std::get<0>(copy[3]) == rows(x, 9, 10));
    }
  }

  TEST_CASE("Hdf5Sequence converts stored sizes within a type class") {
    TempDir dir;
    const auto file = dir / "images.h5";
    const auto images = iota<double>({6, 2, 2}, 0.0, 0.25);
    write_hdf5(file, "x", images);
    write_hdf5(file, "y", Tensor<std::uint8_t>({6}, {0, 1, 2, 3, 4, 255}));
    const Hdf5Sequence<float, std::int64_t> seq(file, "x", "y", 4);
    CHECK(std::get<0>(seq[1]) == rows(images, 4, 6).cast<float>());
    CHECK(std::get<1>(seq[1]) == Tensor<std::int64_t>({2}, {4, 255}));
  }

  TEST_CASE("Hdf5Sequence rejects bad batch sizes mismatched rows and bad datasets") {
    TempDir dir;
    const auto file = dir / "bad.h5";
    const std::string owner = "hdf5 sequence over '" + file.string() + "'";
    write_hdf5(file, "x", Tensor<float>({5, 2}));
    write_hdf5(file, "y", Tensor<std::int64_t>({5}));
    write_hdf5(file, "y4", Tensor<std::int64_t>({4}));
    write_hdf5(file, "x0", Tensor<float>({0, 2}));
    write_hdf5(file, "y0", Tensor<std::int64_t>({0}));
    write_hdf5(file, "scalar", Tensor<std::int64_t>(Shape{}, 3));
    using Seq = Hdf5Sequence<float, std::int64_t>;
    CHECK_THROWS_WITH_AS(Seq(file, "x", "y", 0),
                         contains(owner + ": batch_size must be positive but is 0"), ConfigError);
    CHECK_THROWS_WITH_AS(Seq(file, "x", "y", 6),
                         contains(owner + ": batch_size 6 is larger than the 5 rows of the data"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(Seq(file, "x", "y4", 2),
                         contains(owner + ": dataset '/y4' has 4 rows but dataset '/x' has 5"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(Seq(file, "x0", "y0", 1),
                         contains(owner + ": datasets '/x0' and '/y0' have no rows"), ShapeError);
    CHECK_THROWS_WITH_AS(Seq(file, "x", "scalar", 1),
                         contains(owner + ": dataset '/scalar' is a scalar but a sequence needs a "
                                          "batch axis (rank >= 1)"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(Seq(file, "x", "labels", 1),
                         contains("hdf5 file '" + file.string() + "': dataset '/labels' missing"),
                         FormatError);
    CHECK_THROWS_WITH_AS((Hdf5Sequence<std::int32_t, std::int64_t>(file, "x", "y", 1)),
                         doctest::Contains("dataset '/x' holds float32 values but int32 was "
                                           "requested"),
                         ShapeError);
    CHECK_THROWS_WITH_AS(Seq(dir / "none.h5", "x", "y", 1),
                         doctest::Contains("none.h5': cannot open (No such file or directory)"),
                         IoError);
  }

  TEST_CASE("Hdf5Sequence serves four threads at once with correct batches" *
            doctest::timeout(60)) {
    TempDir dir;
    const auto file = dir / "concurrent.h5";
    const auto x = iota<float>({1000, 16});
    const auto y = iota<std::int32_t>({1000}, -500);
    write_hdf5(file, "x", x);
    write_hdf5(file, "y", y);
    const Hdf5Sequence<float, std::int32_t> seq(file, "x", "y", 7);
    REQUIRE(seq.size() == 143);
    std::atomic<int> wrong{0};
    std::atomic<int> read{0};
    std::vector<std::thread> threads;
    for (std::size_t t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        // Each thread walks all batches, starting at a different place, three times.
        for (std::size_t k = 0; k < 3 * seq.size(); ++k) {
          const std::size_t i = (k * (2 * t + 1) + 37 * t) % seq.size();
          const auto [bx, by] = seq[i];
          const std::size_t end = std::min<std::size_t>(7 * i + 7, 1000);
          if (!(bx == rows(x, 7 * i, end)) || !(by == rows(y, 7 * i, end))) ++wrong;
          ++read;
        }
      });
    }
    for (auto& thread : threads)
      thread.join();
    CHECK(read == 4 * 3 * 143);
    CHECK(wrong == 0);
  }

  TEST_CASE("Hdf5Sequence reads correct batches in a forked child" * doctest::timeout(60)) {
    TempDir dir;
    const auto file = dir / "forked.h5";
    const auto x = iota<double>({50, 3});
    const auto y = iota<std::uint8_t>({50});
    write_hdf5(file, "x", x);
    write_hdf5(file, "y", y);
    const Hdf5Sequence<double, std::uint8_t> seq(file, "x", "y", 8);
    // The parent has the file open before it forks, so the child inherits the handles.
    REQUIRE(std::get<0>(seq[0]) == rows(x, 0, 8));

    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // No doctest assertions in the child: its exit status is the verdict.
      int status = 0;
      try {
        for (std::size_t i = seq.size(); i-- > 0;) {
          const auto [bx, by] = seq[i];
          const std::size_t end = std::min<std::size_t>(8 * i + 8, 50);
          if (!(bx == rows(x, 8 * i, end)) || !(by == rows(y, 8 * i, end))) status = 2;
        }
      } catch (...) {
        status = 3;
      }
      ::_exit(status);
    }
    int status = -1;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // The parent's handles still work after the child closed its inherited copies.
    CHECK(std::get<1>(seq[6]) == rows(y, 48, 50));
  }

  TEST_CASE("read_hdf5 turns a file that crashes libhdf5 into a FormatError naming the file") {
    // Found by fuzzing: libhdf5 1.10 dereferences a corrupt heap address in H5F__accum_read,
    // reached from H5Lexists, and the process dies of SIGSEGV (release builds too). Parsed in a
    // sandbox child, the file costs the child only.
    const auto file = hostile_file("h5lexists-segv.h5");
    const std::string where = "hdf5 file '" + file.string() + "': corrupt or hostile file: ";
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "x"), contains(where + "the sandbox process"),
                         FormatError);
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "x"),
                         doctest::Contains("reading dataset '/x' was killed by SIGSEGV"),
                         FormatError);
    CHECK_THROWS_WITH_AS((Hdf5Sequence<float, float>(file, "x", "y", 1)),
                         contains(where + "the sandbox process"), FormatError);
    CHECK_THROWS_WITH_AS((Hdf5Sequence<float, float>(file, "x", "y", 1)),
                         doctest::Contains("checking datasets '/x' and '/y' was killed by SIGSEGV"),
                         FormatError);
    // The process goes on reading other files.
    TempDir dir;
    write_hdf5(dir / "fine.h5", "x", Tensor<float>({2}, {1.f, 2.f}));
    CHECK(read_hdf5<float>(dir / "fine.h5", "x") == Tensor<float>({2}, {1.f, 2.f}));
  }

  TEST_CASE("read_hdf5 refuses a compact dataset holding fewer bytes than its shape needs") {
    // Found by fuzzing: a float type of 49 bytes over 20 bytes of compact data; libhdf5 copied
    // 245 bytes out of the 20-byte buffer (a heap over-read AddressSanitizer reports, silent
    // garbage otherwise).
    const auto file = hostile_file("compact-overread.h5");
    for (const Hdf5Options& options : {trusted, untrusted}) {
      CAPTURE(static_cast<int>(options.trust));
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "y", {}, options),
                           contains("hdf5 file '" + file.string() +
                                    "': dataset '/y' has shape (5,) of 49-byte elements (245 "
                                    "bytes) but its compact storage holds 20 bytes"),
                           FormatError);
      CHECK(read_hdf5<float>(file, "x", {}, options).shape() == Shape{5, 3});
    }
  }

  TEST_CASE("read_hdf5 and Hdf5Sequence refuse a dataset whose element count overflows") {
    // (2^32, 2^32) has 2^64 elements: the count used to wrap to 0, a 1-byte tensor came back
    // claiming the whole shape, and reading it faulted.
    TempDir dir;
    const auto file = dir / "huge.h5";
    write_unwritten(file, "x", {hsize_t{1} << 32, hsize_t{1} << 32}, {1, 1024});
    write_unwritten(file, "y", {hsize_t{1} << 32}, {1024});
    const std::string expected = "hdf5 file '" + file.string() +
                                 "': dataset '/x' declares shape (4294967296, 4294967296), more "
                                 "elements than memory can address";
    for (const Hdf5Options& options : {trusted, untrusted}) {
      CAPTURE(static_cast<int>(options.trust));
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "x", {}, options), contains(expected),
                           FormatError);
      CHECK_THROWS_WITH_AS((Hdf5Sequence<float, float>(file, "x", "y", 1, {}, options)),
                           contains(expected), FormatError);
    }
  }

  TEST_CASE("read_hdf5 refuses a dataset whose data the file does not store") {
    // A file of under 2 KB declaring a 1 GiB dataset whose chunks were never written: HDF5 used
    // to fill the whole gigabyte with the fill value (or throw std::bad_alloc).
    TempDir dir;
    const auto file = dir / "unwritten.h5";
    write_unwritten(file, "chunked", {16384, 16384}, {64, 64});
    write_unwritten(file, "contiguous", {16384, 16384}, {});
    write_unwritten(file, "small", {4, 4}, {2, 2});
    CHECK(fs::file_size(file) < 8192);
    for (const Hdf5Options& options : {trusted, untrusted}) {
      CAPTURE(static_cast<int>(options.trust));
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "chunked", {}, options),
                           contains("hdf5 file '" + file.string() +
                                    "': dataset '/chunked' has shape (16384, 16384) (1073741824 "
                                    "bytes to read) but the file stores 0 chunks of 4096 "
                                    "elements: 1073741824 bytes would be fill value never "
                                    "written, more than the limit of 67108864 bytes "
                                    "(Hdf5Options::max_fill_bytes)"),
                           FormatError);
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "contiguous", {}, options),
                           doctest::Contains("the file stores no data (its storage was never "
                                             "allocated): 1073741824 bytes would be fill value"),
                           FormatError);
      // Within the limit, unwritten data read as the fill value, as h5py reads them.
      CHECK(read_hdf5<float>(file, "small", {}, options) == Tensor<float>({4, 4}));
      Hdf5Options strict = options;
      strict.max_fill_bytes = 32;
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "small", {}, strict),
                           doctest::Contains("64 bytes would be fill value never written, more "
                                             "than the limit of 32 bytes"),
                           FormatError);
    }
  }

  TEST_CASE("read_hdf5 and Hdf5Sequence check their allocations against max_bytes first") {
    TempDir dir;
    const auto file = dir / "data.h5";
    write_hdf5(file, "x", iota<float>({6, 4}));
    write_hdf5(file, "y", iota<std::int64_t>({6}));
    for (const Hdf5Options& options : {trusted, untrusted}) {
      CAPTURE(static_cast<int>(options.trust));
      Hdf5Options small = options;
      small.max_bytes = 64;
      CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "x", {}, small),
                           contains("hdf5 file '" + file.string() +
                                    "': dataset '/x' of shape (6, 4) needs 96 bytes, more than "
                                    "the limit of 64 bytes (Hdf5Options::max_bytes)"),
                           FormatError);
      CHECK(read_hdf5<std::int64_t>(file, "y", {}, small).shape() == Shape{6});
      CHECK((Hdf5Sequence<float, std::int64_t>(file, "x", "y", 4, {}, small).size()) == 2);
      CHECK_THROWS_WITH_AS((Hdf5Sequence<float, std::int64_t>(file, "x", "y", 5, {}, small)),
                           contains("hdf5 sequence over '" + file.string() +
                                    "': a batch of dataset '/x' of shape (5, 4) needs 80 bytes, "
                                    "more than the limit of 64 bytes (Hdf5Options::max_bytes)"),
                           FormatError);
    }
    // A batch of rows larger than memory is refused when the sequence is made, not by a
    // std::bad_alloc escaping the first operator[].
    const auto huge = dir / "rows.h5";
    write_unwritten(huge, "x", {4, hsize_t{1} << 40}, {1, 1024});
    write_unwritten(huge, "y", {4}, {4});
    Hdf5Options unlimited_fill = trusted;
    unlimited_fill.max_fill_bytes = std::numeric_limits<std::size_t>::max();
    CHECK_THROWS_WITH_AS(
        (Hdf5Sequence<float, float>(huge, "x", "y", 1, {}, unlimited_fill)),
        doctest::Contains("a batch of dataset '/x' of shape (1, 1099511627776) needs "
                          "4398046511104 bytes, more than the limit of 17179869184 bytes"),
        FormatError);
  }

  TEST_CASE("read_hdf5 leaves no library state behind when opening a corrupt dataset fails" *
            doctest::timeout(60)) {
    // Found by fuzzing: with an automatic error handler installed, libhdf5 1.10 kept state from
    // a failed dataset open and printed "HDF5: infinite loop closing library" when the process
    // ended. A child reads the file in this process (trusted), closes the library and reports
    // what HDF5 printed.
    const auto file = hostile_file("failed-dataset-open.h5");
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // No doctest assertions in the child: its exit status and output are the verdict.
      ::dup2(pipe_fds[1], 2);
      ::close(pipe_fds[0]);
      int status = 0;
      try {
        read_hdf5<float>(file, "x", {}, trusted);
        status = 2;
      } catch (const FormatError& e) {
        if (std::string(e.what()).find("chunk size must be < 4GB") == std::string::npos) {
          status = 3;
        }
      } catch (...) {
        status = 4;
      }
      H5close();
      ::_exit(status);
    }
    ::close(pipe_fds[1]);
    std::string printed;
    char buffer[256];
    for (ssize_t got; (got = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
      printed.append(buffer, static_cast<std::size_t>(got));
    ::close(pipe_fds[0]);
    int status = -1;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(printed.find("infinite loop") == std::string::npos);
  }

  TEST_CASE("read_hdf5 and Hdf5Sequence read a Keras-written file as h5py does") {
    const char* env = std::getenv("LOADSTAR_SHARED_DIR");
    if (env == nullptr || *env == '\0') {
      MESSAGE("skipped: LOADSTAR_SHARED_DIR is not set");
      return;
    }
    const fs::path file =
        fs::path(env) / "fixtures" / "keras" / "dl4j_mnist_mlp_tf_keras_2_inputs_and_outputs.h5";
    if (!fs::exists(file)) {
      MESSAGE("skipped: the conformance fixture " << file.string() << " is missing");
      return;
    }
    // Expected values from h5py 3 on the same file:
    //   f['inputs/dense_1_input'].shape == (100, 784), dtype float32, sum (float64) 10233.7765615,
    //   row 0 nonzero from index 125: 0.07450980693101883, 0.9960784316062927, 0.7686274647712708;
    //   f['outputs/dense_3'][0] is one-hot at 1, [99] one-hot at 8;
    //   f['scores/loss'][()] == [0.20765221118927002].
    const auto inputs = read_hdf5<float>(file, "inputs/dense_1_input", 2);
    REQUIRE(inputs.shape() == Shape{100, 784});
    CHECK(inputs(0, 124) == 0.0f);
    CHECK(inputs(0, 125) == 0.07450980693101883f);
    CHECK(inputs(0, 126) == 0.9960784316062927f);
    CHECK(inputs(0, 127) == 0.7686274647712708f);
    double sum = 0;
    for (float v : inputs)
      sum += v;
    CHECK(sum == doctest::Approx(10233.77656153962).epsilon(1e-12));

    const auto outputs = read_hdf5<double>(file, "/outputs/dense_3");
    REQUIRE(outputs.shape() == Shape{100, 10});
    for (std::size_t j = 0; j < 10; ++j) {
      CAPTURE(j);
      CHECK(outputs(0, j) == (j == 1 ? 1.0 : 0.0));
      CHECK(outputs(99, j) == (j == 8 ? 1.0 : 0.0));
    }
    CHECK(read_hdf5<float>(file, "scores/loss") == Tensor<float>({1}, {0.20765221118927002f}));
    CHECK_THROWS_WITH_AS(read_hdf5<float>(file, "scores/dense_3"),
                         doctest::Contains("expected '/scores/dense_3' to be a dataset but it is a "
                                           "group"),
                         FormatError);

    const Hdf5Sequence<float, float> seq(file, "inputs/dense_1_input", "outputs/dense_3", 32);
    CHECK(seq.size() == 4);
    for (std::size_t i = 0; i < seq.size(); ++i) {
      CAPTURE(i);
      const auto [bx, by] = seq[i];
      const std::size_t end = std::min<std::size_t>(32 * i + 32, 100);
      CHECK(bx == rows(inputs, 32 * i, end));
      CHECK(by == rows(outputs, 32 * i, end).cast<float>());
    }
  }
  TEST_CASE("run_sandboxed kills a child that outlives its deadline, whatever signals say") {
    // A program with its own SIGALRM handler (a test framework, a fuzzer, a server) and signals
    // blocked: the child starts with defaults, and the deadline is kept from outside.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    struct sigaction old_alarm {
    }, old_term{};
    ::sigaction(SIGALRM, &ignore, &old_alarm);
    ::sigaction(SIGTERM, &ignore, &old_term);
    sigset_t blocked, old_mask;
    ::sigemptyset(&blocked);
    ::sigaddset(&blocked, SIGUSR1);
    ::pthread_sigmask(SIG_BLOCK, &blocked, &old_mask);
    std::mutex mutex;
    SUBCASE("the child's signals are a new process's") {
      const std::string report = loadstar::detail::run_sandboxed("file 'x'", "checking", mutex, [] {
        std::string wrong;
        for (int signal = 1; signal < NSIG; ++signal) {
          struct sigaction action {};
          if (::sigaction(signal, nullptr, &action) == 0 && action.sa_handler != SIG_DFL)
            wrong += " " + std::to_string(signal);
        }
        sigset_t mask;
        ::sigprocmask(SIG_SETMASK, nullptr, &mask);
        if (::sigismember(&mask, SIGUSR1) == 1) wrong += " blocked";
        return wrong;
      });
      CHECK(report == "");
    }
    SUBCASE("a child that never ends") {
      const auto start = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS(
          loadstar::detail::run_sandboxed(
              "file 'x'", "parsing it", mutex,
              []() -> std::string {
                ::alarm(1);  // ignored when inherited: the deadline must not depend on it
                sigset_t all;
                ::sigfillset(&all);
                ::sigprocmask(SIG_BLOCK, &all, nullptr);
                for (;;)
                  ::pause();
              },
              std::chrono::milliseconds(300)),
          doctest::Contains("file 'x': corrupt or hostile file: the sandbox process "),
          FormatError);
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
      CHECK_THROWS_WITH_AS(
          loadstar::detail::run_sandboxed(
              "file 'x'", "parsing it", mutex,
              []() -> std::string {
                for (;;)
                  ::pause();
              },
              std::chrono::milliseconds(2500)),
          doctest::Contains("parsing it did not finish within 2.5 s and was killed"), FormatError);
    }
    SUBCASE("a report larger than a pipe holds, before the deadline") {
      const std::string report = loadstar::detail::run_sandboxed(
          "file 'x'", "reading", mutex, [] { return std::string(std::size_t{1} << 22, 'r'); },
          std::chrono::seconds(60));
      CHECK(report == std::string(std::size_t{1} << 22, 'r'));
    }
    SUBCASE("a negative deadline is refused") {
      TempDir dir;
      write_hdf5(dir / "fine.h5", "x", Tensor<float>({2}, {1.f, 2.f}));
      CHECK_THROWS_WITH_AS(
          read_hdf5<float>(dir / "fine.h5", "x", {},
                           {.sandbox_deadline = std::chrono::milliseconds(-5)}),
          contains("hdf5 file '" + (dir / "fine.h5").string() +
                   "': sandbox_deadline should be zero (none) or positive but is -5 ms"),
          ConfigError);
    }
    SUBCASE("out of memory names the file") {
      CHECK_THROWS_WITH_AS(
          loadstar::detail::run_sandboxed("file 'x'", "reading it", mutex,
                                          []() -> std::string { throw std::bad_alloc(); }),
          doctest::Contains("file 'x': out of memory reading it"), FormatError);
    }
    ::pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
    ::sigaction(SIGALRM, &old_alarm, nullptr);
    ::sigaction(SIGTERM, &old_term, nullptr);
  }
}
