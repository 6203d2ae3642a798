// Hostile model files: every Keras fixture (and an archive of ours) truncated at many offsets and
// with bytes flipped loads or fails with a typed error naming the file, never a crash or a hang.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <loadstar/keras.hpp>
#include <map>
#include <memory>
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

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

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
      for (const auto& [change, variant] : variants(bytes, big ? 6 : 12, big ? 6 : 12)) {
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
}
