/// \file
/// `ModelFile`: everything a Keras model or weights file holds (configs as JSON text, weights by
/// layer, the optimizer's state), read from any of the four layouts Keras has written, in a
/// sandbox child for untrusted files (it crosses back through a pipe, encoded).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/data/detail/sandbox.hpp"
#include "loadstar/data/hdf5_options.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/saving/detail/h5_io.hpp"
#include "loadstar/keras/saving/detail/zip_io.hpp"

namespace loadstar::keras::detail {

/// Which layout a file has.
enum class FileLayout : unsigned char {
  /// tf.keras 2.x `model.save("m.h5")`: root `model_config`, `/model_weights`,
  /// `/optimizer_weights`.
  legacy_model,
  /// tf.keras 2.x `model.save_weights("w.h5")`: root `layer_names` and layer groups.
  legacy_weights,
  /// Keras 3 `.keras` zip archive (`config.json` + `model.weights.h5`).
  keras3_archive,
  /// Keras 3 `model.save_weights("w.weights.h5")`: `layers/<key>/vars/<i>`.
  keras3_weights,
};

/// The weights of one layer as a file stores them: a legacy layer group (name from
/// `layer_names`), or a Keras 3 `layers/<key>` group.
struct StoredLayer {
  std::string name;
  std::vector<StoredArray> weights;
};

/// The contents of a model or weights file.
struct ModelFile {
  FileLayout layout = FileLayout::legacy_model;
  /// The legacy `model_config` attribute or the archive's `config.json` (empty in weights files).
  std::string model_config;
  /// The legacy `training_config` attribute (empty when absent).
  std::string training_config;
  std::string keras_version;
  /// Legacy: every layer of `layer_names`, in that order; Keras 3: every group with a `vars`
  /// group below `layers/`, named by its path there (`lstm`, `lstm/cell`).
  std::vector<StoredLayer> layers;
  /// Whether the file holds an optimizer state (`/optimizer_weights`, `optimizer/vars`).
  bool has_optimizer = false;
  std::vector<StoredArray> optimizer;
  /// A Keras 3 archive's vocabularies: every member `assets/**/vocabulary.txt`, by name.
  std::vector<std::pair<std::string, std::string>> assets;
};

// --- the pipe encoding (between a sandbox child and its parent, which trust each other)
// -----------

inline void put_u64(std::string& out, std::uint64_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}
LOADSTAR_DECL void put_text(std::string& out, const std::string& text);
LOADSTAR_DECL void put_array(std::string& out, const StoredArray& array);

LOADSTAR_DECL std::string encode(const ModelFile& file);

/// Reads what `encode` wrote (from our own child: a short read is a bug, asserted as an error).
class Decoder {
 public:
  explicit Decoder(const std::string& bytes) : bytes_(bytes) {}
  LOADSTAR_DECL std::uint64_t u64();
  LOADSTAR_DECL std::string text();
  LOADSTAR_DECL StoredArray array();
  LOADSTAR_DECL char byte();

 private:
  LOADSTAR_DECL void need(std::uint64_t n) const;
  const std::string& bytes_;
  std::size_t at_ = 0;
};

LOADSTAR_DECL ModelFile decode(const std::string& bytes);

// --- readers
// ----------------------------------------------------------------------------------------

/// Reads the legacy layouts (whole model or weights only) from an open file.
LOADSTAR_DECL ModelFile read_legacy(const H5Reader& reader);

/// The datasets `0`, `1`, ... of a Keras 3 `vars` group, in index order.
LOADSTAR_DECL std::vector<StoredArray> read_keras3_vars(const H5Reader& reader, hid_t parent,
                                                        const std::string& path);

/// Reads Keras 3's weights layout (`model.weights.h5` of an archive, or a `.weights.h5` file).
LOADSTAR_DECL ModelFile read_keras3_weights(const H5Reader& reader, FileLayout layout);

/// The first bytes of a file, to tell HDF5 from zip by contents.
LOADSTAR_DECL std::string file_signature(const std::filesystem::path& path);

/// Whether a file is a zip archive (a `.keras` archive) rather than HDF5, by its first bytes.
LOADSTAR_DECL bool is_zip(const std::string& signature);

/// How messages name a file of this signature.
inline std::string model_file_name(const std::filesystem::path& path,
                                   const std::string& signature) {
  return is_zip(signature) ? archive_name(path) : H5Reader::hdf5_name(path);
}

/// Reads any layout in this process (caller holds the HDF5 lock, or is a sandbox child).
LOADSTAR_DECL ModelFile read_model_file_here(const std::filesystem::path& path,
                                             const std::string& signature);

/// Reads a model or weights file of any layout, recognised by its contents (HDF5 or zip
/// signature), not its name. An untrusted file is parsed in a forked child, whose death is a
/// `FormatError` naming the file; such a child is also killed at `sandbox_deadline`, so that a
/// file on which a library loops cannot hang the caller.
LOADSTAR_DECL ModelFile read_model_file(const std::filesystem::path& path, Trust trust,
                                        std::chrono::milliseconds sandbox_deadline);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::uint64_t Decoder::u64() {
  std::uint64_t value = 0;
  need(sizeof value);
  std::memcpy(&value, bytes_.data() + at_, sizeof value);
  at_ += sizeof value;
  return value;
}

std::string Decoder::text() {
  const std::uint64_t n = u64();
  need(n);
  std::string out = bytes_.substr(at_, n);
  at_ += n;
  return out;
}

StoredArray Decoder::array() {
  StoredArray a;
  a.name = text();
  std::vector<std::size_t> dims(u64());
  for (auto& d : dims)
    d = u64();
  a.shape = Shape(dims);
  const bool integer = u64() != 0;
  const auto value = static_cast<std::int64_t>(u64());
  if (integer) a.integer = value;
  a.values.resize(u64());
  need(a.values.size() * 4);
  // An empty array has no storage to copy into (memcpy takes no null pointer, even for 0 bytes).
  if (!a.values.empty()) std::memcpy(a.values.data(), bytes_.data() + at_, a.values.size() * 4);
  at_ += a.values.size() * 4;
  return a;
}

char Decoder::byte() {
  need(1);
  return bytes_[at_++];
}

void Decoder::need(std::uint64_t n) const {
  if (n > bytes_.size() - at_) throw Error("model file: the sandbox's report is truncated");
}

void put_text(std::string& out, const std::string& text) {
  put_u64(out, text.size());
  out += text;
}

void put_array(std::string& out, const StoredArray& array) {
  put_text(out, array.name);
  put_u64(out, array.shape.rank());
  for (std::size_t d : array.shape)
    put_u64(out, d);
  put_u64(out, array.integer ? 1 : 0);
  put_u64(out, static_cast<std::uint64_t>(array.integer.value_or(0)));
  put_u64(out, array.values.size());
  out.append(reinterpret_cast<const char*>(array.values.data()), array.values.size() * 4);
}

std::string encode(const ModelFile& file) {
  std::string out;
  out.push_back(static_cast<char>(file.layout));
  put_text(out, file.model_config);
  put_text(out, file.training_config);
  put_text(out, file.keras_version);
  put_u64(out, file.layers.size());
  for (const auto& layer : file.layers) {
    put_text(out, layer.name);
    put_u64(out, layer.weights.size());
    for (const auto& w : layer.weights)
      put_array(out, w);
  }
  put_u64(out, file.has_optimizer ? 1 : 0);
  put_u64(out, file.optimizer.size());
  for (const auto& w : file.optimizer)
    put_array(out, w);
  put_u64(out, file.assets.size());
  for (const auto& [name, text] : file.assets) {
    put_text(out, name);
    put_text(out, text);
  }
  return out;
}

ModelFile decode(const std::string& bytes) {
  Decoder in(bytes);
  ModelFile file;
  file.layout = static_cast<FileLayout>(in.byte());
  file.model_config = in.text();
  file.training_config = in.text();
  file.keras_version = in.text();
  file.layers.resize(in.u64());
  for (auto& layer : file.layers) {
    layer.name = in.text();
    layer.weights.resize(in.u64());
    for (auto& w : layer.weights)
      w = in.array();
  }
  file.has_optimizer = in.u64() != 0;
  file.optimizer.resize(in.u64());
  for (auto& w : file.optimizer)
    w = in.array();
  file.assets.resize(in.u64());
  for (auto& [name, text] : file.assets) {
    name = in.text();
    text = in.text();
  }
  return file;
}

ModelFile read_legacy(const H5Reader& reader) {
  ModelFile file;
  const hid_t root = reader.root();
  H5Id weights_group;
  hid_t weights = root;
  if (reader.has_attribute(root, "model_config")) {
    file.layout = FileLayout::legacy_model;
    file.model_config = reader.string_attribute(root, "model_config", "root");
    if (reader.has_attribute(root, "training_config")) {
      file.training_config = reader.string_attribute(root, "training_config", "root");
    }
    // Keras 3's loader descends into /model_weights when the root has no layer_names.
    weights_group = reader.open_group(root, "model_weights", "root");
    weights = weights_group.get();
  } else {
    file.layout = FileLayout::legacy_weights;
  }
  if (reader.has_attribute(root, "keras_version")) {
    file.keras_version = reader.string_attribute(root, "keras_version", "root");
  }
  const std::string group_name = weights == root ? std::string("/") : std::string("/model_weights");
  const auto layer_names = reader.string_list_attribute(weights, "layer_names", group_name);
  for (const auto& name : layer_names) {
    const std::string what = "layer '" + name + "'";
    H5Id group = reader.open_group(weights, name, group_name);
    StoredLayer layer{name, {}};
    for (const auto& weight_name : reader.string_list_attribute(group.get(), "weight_names", what))
      layer.weights.push_back(reader.dataset(group.get(), weight_name, what));
    file.layers.push_back(std::move(layer));
  }
  if (reader.is_group(root, "optimizer_weights")) {
    file.has_optimizer = true;
    H5Id group = reader.open_group(root, "optimizer_weights", "root");
    const std::string what = "group '/optimizer_weights'";
    for (const auto& name : reader.string_list_attribute(group.get(), "weight_names", what))
      file.optimizer.push_back(reader.dataset(group.get(), name, what));
  }
  return file;
}

std::vector<StoredArray> read_keras3_vars(const H5Reader& reader, hid_t parent,
                                          const std::string& path) {
  H5Id vars = reader.open_group(parent, path, "group '" + path + "'");
  const auto names = reader.children(vars.get(), "group '" + path + "'");
  std::vector<StoredArray> out(names.size());
  // Variables a layer stores by name (`store["idf_weights"]`, a StringLookup's), in name order.
  const bool named = std::none_of(names.begin(), names.end(), [](const std::string& name) {
    return !name.empty() && name[0] >= '0' && name[0] <= '9';
  });
  if (named) {
    for (std::size_t i = 0; i < names.size(); ++i) {
      out[i] = reader.dataset(vars.get(), names[i], "group '" + path + "'");
      out[i].name = path + "/" + names[i];
    }
    return out;
  }
  for (const auto& name : names) {
    std::size_t index = 0;
    bool digits = !name.empty() && name.size() < 10;
    for (char c : name) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) index = index * 10 + static_cast<std::size_t>(c - '0');
    }
    if (!digits || index >= names.size() || !out[index].name.empty()) {
      reader.fail("group '" + path + "': expected datasets named 0 to " +
                  std::to_string(names.size() - 1) + " but found '" + name + "'");
    }
    out[index] = reader.dataset(vars.get(), name, "group '" + path + "'");
    out[index].name = path + "/" + name;
  }
  return out;
}

ModelFile read_keras3_weights(const H5Reader& reader, FileLayout layout) {
  ModelFile file;
  file.layout = layout;
  const hid_t root = reader.root();
  if (reader.is_group(root, "layers")) {
    H5Id layers = reader.open_group(root, "layers", "root");
    // A layer's tracked sublayers keep their variables in groups of their own below it
    // (`layers/lstm/cell/vars`, `layers/bidirectional/forward_layer/cell/vars`): each `vars`
    // group is read under its path below `layers/`, down to the depth Keras's layers nest
    // (nested models add two levels each: `layers/functional/layers/bidirectional/...`).
    constexpr int max_depth = 12;
    constexpr std::size_t max_groups = std::size_t{1} << 16;
    std::vector<std::pair<std::string, int>> pending;
    for (const auto& key : reader.children(layers.get(), "group '/layers'"))
      pending.emplace_back(key, 0);
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const std::string path = pending[i].first;
      const int depth = pending[i].second;
      if (!reader.is_group(layers.get(), path)) continue;
      if (reader.is_group(layers.get(), path + "/vars")) {
        file.layers.push_back({path, read_keras3_vars(reader, root, "layers/" + path + "/vars")});
      }
      if (depth == max_depth) continue;
      H5Id group = reader.open_group(layers.get(), path, "group '/layers/" + path + "'");
      for (const auto& child : reader.children(group.get(), "group '/layers/" + path + "'")) {
        if (child != "vars") pending.emplace_back(path + "/" + child, depth + 1);
      }
      // Hard links may name one group many times over: a bound keeps the walk finite.
      if (pending.size() > max_groups) {
        reader.fail("group '/layers': expected at most " + std::to_string(max_groups) +
                    " groups below it but found more");
      }
    }
  }
  if (reader.is_group(root, "optimizer/vars")) {
    file.has_optimizer = true;
    file.optimizer = read_keras3_vars(reader, root, "optimizer/vars");
  }
  return file;
}

std::string file_signature(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw IoError("file '" + path.string() + "': cannot open (is a directory)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw IoError("file '" + path.string() + "': cannot open (" + std::strerror(errno) + ")");
  }
  std::string head(8, '\0');
  in.read(head.data(), 8);
  head.resize(static_cast<std::size_t>(in.gcount()));
  return head;
}

bool is_zip(const std::string& signature) {
  return signature.size() >= 4 && signature[0] == 'P' && signature[1] == 'K' &&
         (signature[2] == 3 || signature[2] == 5) && (signature[3] == 4 || signature[3] == 6);
}

ModelFile read_model_file_here(const std::filesystem::path& path, const std::string& signature) {
  if (is_zip(signature)) {
    const ZipReader zip(path);
    // Keras's loader reads these three, and the vocabularies among the assets.
    constexpr std::uint64_t max_bytes = std::uint64_t{1} << 34;
    std::string config = zip.read("config.json", std::uint64_t{1} << 30);
    std::string metadata = zip.has("metadata.json") ? zip.read("metadata.json", 1 << 20) : "";
    ModelFile file;
    file.layout = FileLayout::keras3_archive;
    if (zip.has("model.weights.h5")) {
      const std::string image = zip.read("model.weights.h5", max_bytes);
      const H5Reader reader(image, zip.where() + ": member 'model.weights.h5'");
      file = read_keras3_weights(reader, FileLayout::keras3_archive);
    }
    file.model_config = std::move(config);
    file.keras_version = std::move(metadata);  // the JSON of metadata.json
    // A TextVectorization's vocabulary (Keras's `save_assets`).
    const std::string suffix = "/vocabulary.txt";
    for (const auto& name : zip.names()) {
      if (name.rfind("assets/", 0) == 0 && name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        file.assets.emplace_back(name, zip.read(name, std::uint64_t{1} << 30));
    }
    return file;
  }
  const H5Reader reader(path);
  const hid_t root = reader.root();
  if (reader.has_attribute(root, "model_config") || reader.has_attribute(root, "layer_names") ||
      reader.has_attribute(root, "layer_names0")) {
    return read_legacy(reader);
  }
  if (reader.is_group(root, "layers") || reader.is_group(root, "vars")) {
    return read_keras3_weights(reader, FileLayout::keras3_weights);
  }
  reader.fail(
      "expected a Keras model or weights file (a 'model_config' or 'layer_names' attribute at the "
      "root, or Keras 3's 'layers' group) but found none");
}

ModelFile read_model_file(const std::filesystem::path& path, Trust trust,
                          std::chrono::milliseconds sandbox_deadline) {
  const std::string signature = file_signature(path);
  if (trust == Trust::trusted) {
    const loadstar::detail::Hdf5Lock lock;
    try {
      return read_model_file_here(path, signature);
    } catch (const std::bad_alloc&) {
      throw FormatError(model_file_name(path, signature) + ": out of memory parsing the file");
    }
  }
  const std::string where = model_file_name(path, signature);
  const std::string report = loadstar::detail::run_sandboxed(
      where, "parsing the file", loadstar::detail::hdf5_mutex(),
      [&]() -> std::string {
        loadstar::detail::Hdf5Lock::configure_errors();
        return encode(read_model_file_here(path, signature));
      },
      sandbox_deadline);
  return decode(report);
}

}  // namespace loadstar::keras::detail
#endif
