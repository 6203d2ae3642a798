// Hostile model files: every Keras fixture (and an archive of ours) truncated at many offsets and
// with bytes flipped loads or fails with a typed error naming the file, never a crash or a hang;
// crafted archives (sizes the zip directory declares, a bad CRC-32) and a sandbox deadline.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <loadstar/keras/callbacks/detail/files.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/detail/zip_io.hpp>  // <zip.h>, its warnings silenced
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "keras/saving_support.hpp"
#include "temp_dir.hpp"

using namespace loadstar;
using namespace loadstar::keras;
using namespace saving_support;
using test_support::TempDir;

namespace {

using loadstar::keras::detail::read_bytes;

void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

/// The variants of a file: truncated at `cuts` offsets, and with `flips` bytes inverted, spread
/// over the first and last 8 KiB (where HDF5 keeps its metadata and a zip its directory) and over
/// the whole file.
std::vector<std::pair<std::string, std::string>> variants(const std::string& bytes,
                                                          std::size_t cuts, std::size_t flips) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::size_t n = bytes.size();
  std::set<std::size_t> lengths{0, 1, 4, 7, 8, 9, 64, 512, 1024};
  for (std::size_t i = 1; i < cuts; ++i)
    lengths.insert(n * i / cuts);
  for (std::size_t i = 1; i < 8; ++i)
    lengths.insert(n > i * 97 ? n - i * 97 : 0);
  for (std::size_t length : lengths)
    if (length < n)
      out.emplace_back("truncated to " + std::to_string(length), bytes.substr(0, length));
  std::set<std::size_t> positions;
  for (std::size_t i = 0; i < flips; ++i) {
    positions.insert((i * 8191 + 13) % std::min<std::size_t>(n, 8192));
    positions.insert(n - 1 - (i * 4099 + 5) % std::min<std::size_t>(n, 8192));
    positions.insert(n * i / flips);
  }
  for (std::size_t at : positions) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(~flipped[at]);
    out.emplace_back("byte " + std::to_string(at) + " flipped", std::move(flipped));
  }
  return out;
}

/// A little-endian field of a zip image.
std::uint32_t le(const std::string& bytes, std::size_t at, std::size_t width) {
  std::uint32_t value = 0;
  for (std::size_t i = 0; i < width; ++i)
    value |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[at + i])) << (8 * i);
  return value;
}

void set_le32(std::string& bytes, std::size_t at, std::uint32_t value) {
  for (std::size_t i = 0; i < 4; ++i)
    bytes[at + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
}

/// Where member `name` of a zip image is described: its central directory entry, its local
/// header and the first byte of its data.
struct ZipMember {
  std::size_t central = 0;
  std::size_t local = 0;
  std::size_t data = 0;
};

ZipMember find_member(const std::string& zip, const std::string& name) {
  const std::size_t end = zip.rfind(std::string("PK\x05\x06", 4));
  REQUIRE(end != std::string::npos);
  std::size_t at = le(zip, end + 16, 4);
  for (std::size_t i = 0, n = le(zip, end + 10, 2); i < n; ++i) {
    REQUIRE(le(zip, at, 4) == 0x02014b50u);
    const std::size_t name_length = le(zip, at + 28, 2);
    const std::size_t next = at + 46 + name_length + le(zip, at + 30, 2) + le(zip, at + 32, 2);
    if (zip.compare(at + 46, name_length, name) == 0) {
      ZipMember member{at, le(zip, at + 42, 4), 0};
      member.data =
          member.local + 30 + le(zip, member.local + 26, 2) + le(zip, member.local + 28, 2);
      return member;
    }
    at = next;
  }
  FAIL("no member " << name);
  return {};
}

/// `zip` with member `name` declaring `size` uncompressed bytes, in its central directory entry and
/// its local header alike (so that the archive stays consistent).
std::string declaring(std::string zip, const std::string& name, std::uint32_t size) {
  const ZipMember member = find_member(zip, name);
  set_le32(zip, member.central + 24, size);
  set_le32(zip, member.local + 22, size);
  return zip;
}

/// Writes a `.keras` archive with the members of `source` (read back through libzip), whose
/// `model.weights.h5` is replaced by `weights`, deflated.
void write_deflated(const std::filesystem::path& path, const std::filesystem::path& source,
                    const std::string& weights) {
  int error = 0;
  zip_t* in = zip_open(source.c_str(), ZIP_RDONLY, &error);
  REQUIRE(in != nullptr);
  zip_t* out = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  REQUIRE(out != nullptr);
  std::vector<std::string> kept;
  kept.reserve(3);
  for (const char* name : {"metadata.json", "config.json"}) {
    zip_stat_t stat;
    REQUIRE(zip_stat(in, name, 0, &stat) == 0);
    std::string bytes(stat.size, '\0');
    zip_file_t* file = zip_fopen(in, name, 0);
    REQUIRE(zip_fread(file, bytes.data(), stat.size) == static_cast<zip_int64_t>(stat.size));
    zip_fclose(file);
    kept.push_back(std::move(bytes));
  }
  kept.push_back(weights);
  const char* names[] = {"metadata.json", "config.json", "model.weights.h5"};
  for (std::size_t i = 0; i < kept.size(); ++i) {
    zip_source_t* member = zip_source_buffer(out, kept[i].data(), kept[i].size(), 0);
    const zip_int64_t index = zip_file_add(out, names[i], member, 0);
    REQUIRE(index >= 0);
    REQUIRE(zip_set_file_compression(out, static_cast<zip_uint64_t>(index), ZIP_CM_DEFLATE, 9) ==
            0);
  }
  REQUIRE(zip_close(out) == 0);
  zip_discard(in);
}

/// The process's virtual memory size in bytes (`VmSize` of /proc/self/status).
[[maybe_unused]] std::size_t virtual_memory_size() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

/// The message of the `FormatError` that `load` throws, for both trusts.
template <class Load>
std::vector<std::string> format_errors(Load&& load) {
  std::vector<std::string> messages;
  for (const Trust trust : {Trust::untrusted, Trust::trusted}) {
    try {
      load(trust);
      messages.emplace_back("(loaded)");
    } catch (const FormatError& e) {
      messages.emplace_back(e.what());
    }
  }
  return messages;
}

}  // namespace

TEST_SUITE("keras") {
  TEST_CASE("load_model and load_weights survive truncated and corrupted files" *
            doctest::timeout(300)) {
    TempDir dir;
    // What loads each file: load_model, or load_weights into its architecture.
    struct Subject {
      std::filesystem::path path;
      std::function<std::unique_ptr<Model>()> architecture;  // null: load_model
    };
    std::vector<Subject> subjects;
    auto ours = sequential_mlp();
    ours->compile("adam", "sparse_categorical_crossentropy");
    ours->train_on_batch(inputs(8, 6), labels(8, 3));
    ours->save(dir / "ours.keras");
    ours->save_weights(dir / "ours.weights.h5");
    const std::string ours_json = ours->to_json();
    subjects.push_back({dir / "ours.keras", nullptr});
    subjects.push_back({dir / "ours.weights.h5", [&] { return model_from_json(ours_json); }});
    const char* shared = std::getenv("LOADSTAR_SHARED_DIR");
    const auto fixtures = shared != nullptr ? std::filesystem::path(shared) / "fixtures" / "keras"
                                            : std::filesystem::path();
    if (shared == nullptr || !std::filesystem::exists(fixtures / "MANIFEST.tsv")) {
      MESSAGE("Keras fixtures skipped: LOADSTAR_SHARED_DIR is not set or has no fixtures");
    } else {
      const auto json_of = [&](const char* name) {
        return [path = fixtures / name] { return model_from_json(read_bytes(path)); };
      };
      for (const char* name :
           {"dl4j_cnn_batch_norm.h5", "dl4j_simple_sparse_xent_mlp_keras_2_model.h5",
            "purinat33_mnist_cnn_keras2.10.h5", "hls4ml_mlp_streaming_keras_model.keras",
            "dl4j_simpleconv2d.hdf5", "dl4j_tfkeras_issue_9349.hdf5", "hls4ml_conv2d_1layer.h5"}) {
        subjects.push_back({fixtures / name, nullptr});
      }
      subjects.push_back({fixtures / "dl4j_mnist_mlp_tf_keras_2_weights.h5",
                          json_of("dl4j_mnist_mlp_tf_keras_2_config.json")});
      subjects.push_back({fixtures / "hls4ml_KERAS_conv2d_model_weights.h5",
                          json_of("hls4ml_KERAS_conv2d_model.json")});
      const auto sparse = fixtures / "dl4j_simple_sparse_xent_mlp_keras_2_model.h5";
      subjects.push_back({fixtures / "dl4j_simple_sparse_xent_mlp_keras_2_weights.h5",
                          [sparse] { return model_from_json(load_model(sparse)->to_json()); }});
    }
    std::map<std::string, std::size_t> outcomes;
    std::size_t count = 0;
    for (const auto& subject : subjects) {
      if (!std::filesystem::exists(subject.path)) continue;
      const std::string bytes = read_bytes(subject.path);
      // Big files get fewer variants: their middle is weights, which load as other weights.
      // (The case's budget is under a minute in a plain build: about 600 variants.)
      const bool big = bytes.size() > (1 << 18);
      for (const auto& entry : variants(bytes, big ? 6 : 12, big ? 6 : 12)) {
        const std::string& change = entry.first;
        const std::string& variant = entry.second;
        const auto path = dir / ("hostile" + subject.path.extension().string());
        write_bytes(path, variant);
        INFO(subject.path.filename().string() << " " << change);
        ++count;
        try {
          if (subject.architecture) {
            auto model = subject.architecture();
            model->load_weights(path);
          } else {
            load_model(path);
          }
          ++outcomes["loaded"];
        } catch (const FormatError& e) {
          CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
          ++outcomes["FormatError"];
        } catch (const ShapeError& e) {
          CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
          ++outcomes["ShapeError"];
        } catch (const ConfigError& e) {
          CHECK(std::string(e.what()).find(path.string()) != std::string::npos);
          ++outcomes["ConfigError"];
        }
      }
    }
    std::string summary;
    for (const auto& [kind, n] : outcomes)
      summary += kind + ": " + std::to_string(n) + "  ";
    MESSAGE(count << " hostile variants: " << summary);
    CHECK(outcomes["FormatError"] > 0);
  }
  TEST_CASE("a .keras member declaring more than the archive can hold is refused unread") {
    TempDir dir;
    auto model = sequential_mlp();
    model->save(dir / "ours.keras");
    const std::string ours = read_bytes(dir / "ours.keras");
    const auto path = dir / "declares.keras";
    SUBCASE("stored: more bytes than it stores") {
      write_bytes(path, declaring(ours, "model.weights.h5", 0xFFFFFFF0u));
      for (const auto& message :
           format_errors([&](Trust trust) { load_model(path, {}, {.trust = trust}); })) {
        CHECK(message.find("keras archive '" + path.string() +
                           "': member 'model.weights.h5' declares 4294967280 bytes but its ") !=
              std::string::npos);
        CHECK(message.find(" stored bytes can hold at most ") != std::string::npos);
      }
    }
    SUBCASE("deflated: more than deflate's 1,032 to 1") {
      write_deflated(dir / "deflated.keras", dir / "ours.keras", std::string(4096, 'w'));
      write_bytes(path,
                  declaring(read_bytes(dir / "deflated.keras"), "model.weights.h5", 0x7FFFFFFFu));
      for (const auto& message :
           format_errors([&](Trust trust) { load_model(path, {}, {.trust = trust}); })) {
        CHECK(message.find("member 'model.weights.h5' declares 2147483647 bytes but its ") !=
              std::string::npos);
        CHECK(message.find(" deflated bytes can hold at most ") != std::string::npos);
        CHECK(message.find(path.string()) != std::string::npos);
      }
    }
    SUBCASE("config.json within the ratio but shorter than declared") {
      write_deflated(dir / "deflated.keras", dir / "ours.keras", std::string(4096, 'w'));
      const std::string deflated = read_bytes(dir / "deflated.keras");
      const std::uint32_t declared =
          le(deflated, find_member(deflated, "config.json").central + 24, 4);
      write_bytes(path, declaring(deflated, "config.json", declared + 100));
      for (const auto& message :
           format_errors([&](Trust trust) { load_model(path, {}, {.trust = trust}); })) {
        CHECK(message.find("member 'config.json' declares " + std::to_string(declared + 100) +
                           " bytes but yields " + std::to_string(declared)) != std::string::npos);
      }
    }
  }

  TEST_CASE("a .keras member is read as its data arrives, not at the size it declares") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    MESSAGE("skipped: an address-space limit cannot be set under a sanitizer's shadow memory");
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
    MESSAGE("skipped: an address-space limit cannot be set under a sanitizer's shadow memory");
#else
#define LOADSTAR_TEST_ADDRESS_LIMIT 1
#endif
#else
#define LOADSTAR_TEST_ADDRESS_LIMIT 1
#endif
#ifdef LOADSTAR_TEST_ADDRESS_LIMIT
    // 2 MiB of incompressible weights, deflated, declaring 1 GiB (within deflate's ratio): in a
    // child limited to 768 MiB more address space than it has, a reader that allocated the
    // declared size would fail with std::bad_alloc ("out of memory") instead of a short read.
    TempDir dir;
    auto model = sequential_mlp();
    model->save(dir / "ours.keras");
    std::string noise(std::size_t{2} << 20, '\0');
    std::mt19937_64 random(3);
    for (auto& c : noise)
      c = static_cast<char>(random() & 0xFF);
    write_deflated(dir / "deflated.keras", dir / "ours.keras", noise);
    const auto path = dir / "bomb.keras";
    write_bytes(path, declaring(read_bytes(dir / "deflated.keras"), "model.weights.h5", 1u << 30));
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const rlimit limit{virtual_memory_size() + (std::size_t{768} << 20),
                         virtual_memory_size() + (std::size_t{768} << 20)};
      if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(3);
      try {
        load_model(path, {}, {.trust = Trust::trusted});
      } catch (const FormatError& e) {
        const std::string message = e.what();
        ::_exit(message.find("declares 1073741824 bytes but yields 2097152") != std::string::npos
                    ? 0
                : message.find("out of memory") != std::string::npos ? 2
                                                                     : 4);
      } catch (...) {
        ::_exit(5);
      }
      ::_exit(6);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
#endif
  }

  TEST_CASE("a .keras member whose data fails its CRC-32 is refused") {
    TempDir dir;
    auto model = sequential_mlp();  // named "mlp"
    model->save(dir / "ours.keras");
    std::string zip = read_bytes(dir / "ours.keras");
    const ZipMember config = find_member(zip, "config.json");
    const std::size_t at = zip.find("\"mlp\"", config.data);
    REQUIRE(at != std::string::npos);
    REQUIRE(at < config.data + le(zip, config.central + 20, 4));
    zip[at + 1] = 'M';  // still JSON, still a model: only the CRC-32 tells
    const auto path = dir / "altered.keras";
    write_bytes(path, zip);
    for (const auto& message :
         format_errors([&](Trust trust) { load_model(path, {}, {.trust = trust}); })) {
      CHECK(message.find("keras archive '" + path.string() +
                         "': member 'config.json': expected data matching its CRC-32 but found "
                         "other data") != std::string::npos);
    }
  }

  TEST_CASE("load_model ends a file on which libhdf5 loops forever at its deadline") {
    // Found by fuzzing load_model: a corrupt global heap behind a variable-length string
    // attribute of a legacy Keras .h5 file (its layer and weight names) makes libhdf5 1.10 loop in
    // H5HG_read. The deadline is kept by this process, so a SIGALRM handler of the program's (a
    // test framework's, a server's) cannot defeat it.
    const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
    REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
    const auto file =
        std::filesystem::path(root) / "tests" / "data" / "hostile" / "legacy-model-heap-loop.h5";
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    struct sigaction old_alarm {};
    ::sigaction(SIGALRM, &ignore, &old_alarm);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(load_model(file, {}, {.sandbox_deadline = std::chrono::seconds(2)}),
                         doctest::Contains(("hdf5 file '" + file.string() +
                                            "': corrupt or hostile file: the sandbox process ")
                                               .c_str()),
                         FormatError);
    CHECK_THROWS_WITH_AS(load_model(file, {}, {.sandbox_deadline = std::chrono::seconds(2)}),
                         doctest::Contains("parsing the file did not finish within 2 s and was "
                                           "killed"),
                         FormatError);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
    ::sigaction(SIGALRM, &old_alarm, nullptr);
  }

  TEST_CASE("load_model kills a sandbox child that outlives its deadline") {
    // A file whose parse takes far longer than 1 ms (64 MiB of weights to read, encode and send
    // back): the deadline, kept by this process, ends the child.
    TempDir dir;
    Sequential big{Input({4096}), layers::Dense(4096)};
    big.save(dir / "big.h5");
    CHECK_THROWS_WITH_AS(
        load_model(dir / "big.h5", {}, {.sandbox_deadline = std::chrono::milliseconds(1)}),
        doctest::Contains("did not finish within 1 ms and was killed"), FormatError);
    CHECK(load_model(dir / "big.h5")->count_params() == 4096 * 4096 + 4096);
  }
}
