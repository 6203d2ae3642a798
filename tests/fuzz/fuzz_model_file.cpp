// libFuzzer harness: load_model on any bytes, both Keras model files it reads by their first
// bytes: Keras 3's `.keras` zip archive (metadata.json, config.json, model.weights.h5) and tf.keras
// 2.x's whole-model `.h5` (root model_config and training_config, /model_weights with layer_names
// and weight_names, /optimizer_weights). tools/fuzz builds it once and runs it as two harnesses,
// fuzz_keras_archive and fuzz_model_h5, each over its own seeds.
//
// The default (untrusted) load runs in a sandbox child, so a crash or a hang inside libhdf5 or
// libzip must come back as a loadstar::Error. When the child survived, the file is loaded again
// in this process (trusted), where the sanitizers and the fuzzer's coverage see loadstar's own
// code, and its weights and optimizer state are loaded into the model it gave. An archive that
// loads must also read back whole through libzip alone: a member that fails its CRC-32 or yields
// other than its declared size is a finding, though it loaded.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/keras/saving/detail/zip_io.hpp>  // <zip.h>, its warnings silenced
#include <string_view>

#include "fuzz_common.hpp"

namespace {

/// Whether the members load_model reads read back through libzip as their central directory
/// declares them: libzip checks the CRC-32 on the read after the last byte. True for a file
/// libzip does not open (a whole-model .h5 file).
bool members_intact(const std::filesystem::path& path) {
  int error = 0;
  zip_t* zip = zip_open(path.c_str(), ZIP_RDONLY, &error);
  if (zip == nullptr) return true;
  bool intact = true;
  for (const char* name : {"metadata.json", "config.json", "model.weights.h5"}) {
    const zip_int64_t index = zip_name_locate(zip, name, 0);
    zip_stat_t stat;
    if (index < 0 || zip_stat_index(zip, static_cast<zip_uint64_t>(index), 0, &stat) != 0) {
      continue;
    }
    zip_file_t* file = zip_fopen_index(zip, static_cast<zip_uint64_t>(index), 0);
    if (file == nullptr) {
      intact = false;
      continue;
    }
    char buffer[4096];
    zip_uint64_t total = 0;
    zip_int64_t got = 0;
    while ((got = zip_fread(file, buffer, sizeof buffer)) > 0)
      total += static_cast<zip_uint64_t>(got);
    if (got < 0 || total != stat.size) {
      std::fprintf(stderr, "member '%s' declares %llu bytes, reads %llu (%s)\n", name,
                   static_cast<unsigned long long>(stat.size),
                   static_cast<unsigned long long>(total), zip_file_strerror(file));
      intact = false;
    }
    zip_fclose(file);
  }
  zip_discard(zip);
  return intact;
}

/// Loads `path` with load_model as untrusted (the default: libhdf5 and libzip parse it in a
/// sandbox child, so a crash inside them must come back as a loadstar::Error). When the child
/// survived, loads it again in this process (trusted), where the sanitizers and the fuzzer's
/// coverage see loadstar's own code, and loads the file's weights and optimizer state into the
/// model it gave, by position and by name. Any loadstar::Error is an answer; anything else escapes.
/// Returns whether the trusted load_model gave a model.
bool load_model_file(const std::filesystem::path& path) {
  namespace keras = loadstar::keras;
  try {
    // libhdf5 loops forever on some corrupt global heaps: the deadline (below libFuzzer's
    // -timeout) turns that into a FormatError too.
    (void)keras::load_model(path, {}, {.sandbox_deadline = std::chrono::seconds(5)});
  } catch (const loadstar::FormatError& e) {
    if (std::string_view(e.what()).find("the sandbox process") != std::string_view::npos) {
      return false;
    }
  } catch (const loadstar::Error&) {
  }
  constexpr auto trusted = loadstar::Trust::trusted;
  try {
    const auto model = keras::load_model(path, {}, {.trust = trusted});
    try {
      model->load_weights(path, {.optimizer = model->compiled(), .trust = trusted});
    } catch (const loadstar::Error&) {
    }
    try {
      model->load_weights(path, {.by_name = true, .skip_mismatch = true, .trust = trusted});
    } catch (const loadstar::Error&) {
    }
    return true;
  } catch (const loadstar::Error&) {
    return false;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".model");
  if (load_model_file(path) && !members_intact(path)) {
    std::fprintf(stderr, "load_model accepted an archive libzip does not read back whole\n");
    std::abort();
  }
  return 0;
}
