/// \file
/// Keras model files both ways: `save_model`, `load_model`, `save_weights` and `load_weights` for
/// tf.keras 2.x's legacy HDF5 layout (`.h5`, `.hdf5`) and Keras 3's `.keras` zip archive.
///
/// Writing goes by the extension: `.h5`/`.hdf5` writes what tf.keras 2.x's `model.save("m.h5")`
/// writes (root `model_config`, `training_config`, `keras_version`, `backend`; `/model_weights`
/// with `layer_names` and one group per layer holding `weight_names` and the datasets at those
/// paths; `/optimizer_weights` with OptimizerV2's names, `Adam/iter:0`, `Adam/dense/kernel/m:0`),
/// with h5py 3's attribute types, so that h5py and Keras read it; `.keras` writes Keras 3's archive
/// (`metadata.json`, `config.json` in Keras 3's serialization, `model.weights.h5` in Keras 3's
/// layout). Reading goes by the contents (HDF5 or zip signature): a legacy HDF5 file named
/// `.keras` loads as legacy HDF5. Every write goes to a temporary name in the same directory,
/// renamed into place.
/// \code
/// model.save("model.h5");                              // save_model(model, "model.h5")
/// auto copy = load_model("model.h5");                  // compiled, optimizer state restored
/// copy->fit(x, y, {.epochs = 1});                      // continues where `model` stopped
/// model.save_weights("weights.h5");
/// other.load_weights("weights.h5", {.by_name = true});
/// \endcode
#pragma once

#include <filesystem>
#include <memory>

#include "loadstar/config.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/saving/options.hpp"
#include "loadstar/keras/saving/unsupported_layers_error.hpp"

namespace loadstar::keras {

/// Saves a whole model (architecture, weights and, with `include_optimizer`, the compile
/// arguments and the optimizer's state) as Keras does: `.h5`/`.hdf5` in tf.keras 2.x's legacy
/// layout, `.keras` as Keras 3's archive. Throws `ConfigError` for another extension or a model
/// not built, `IoError` when the file cannot be written (nothing is left behind).
LOADSTAR_DECL void save_model(const Model& model, const std::filesystem::path& path,
                              const SaveOptions& options = {});

/// Loads a whole model from a legacy `.h5` file or a `.keras` archive (recognised by contents):
/// the architecture through the layer registry (`custom_objects` first), the weights, and, with
/// `options.compile` and a `training_config` (`compile_config`) naming a loss, compiled with the
/// optimizer's slots and iteration count restored, so that training continues exactly.
/// Throws `FormatError` for a corrupt, hostile or weights-only file, `ConfigError` for an unknown
/// layer class (naming class and layer), `ShapeError` for weights that do not fit, `IoError`
/// when the file cannot be read; every message names the file.
LOADSTAR_DECL std::unique_ptr<Model> load_model(const std::filesystem::path& path,
                                                const CustomObjects& custom_objects = {},
                                                const LoadOptions& options = {});

/// Saves the weights alone, as Keras's `model.save_weights`: a name ending in `.weights.h5` gets
/// Keras 3's layout (with the optimizer's state of a compiled model, as Keras 3 writes it), any
/// other `.h5`/`.hdf5` tf.keras 2.x's (root `layer_names` and layer groups). Throws
/// `ConfigError` for another extension, `IoError` when the file cannot be written.
LOADSTAR_DECL void save_weights(const Model& model, const std::filesystem::path& path);

/// Loads weights into `model` from any file Keras writes (legacy weights-only or whole-model
/// `.h5`, Keras 3 `.weights.h5` or `.keras` archive), by position, or by layer name with
/// `by_name` (legacy files), skipping layers that do not fit with `skip_mismatch`; with
/// `optimizer`, also the optimizer's state of a compiled model. Throws `FormatError` (a corrupt
/// file, a different number of layers with weights, a missing layer), `ShapeError` (a different
/// number or shape of weights, naming layer and weight), `IoError`; messages name the file.
LOADSTAR_DECL void load_weights(Model& model, const std::filesystem::path& path,
                                const LoadWeightsOptions& options = {});

}  // namespace loadstar::keras

// The definitions: in every translation unit when header-only, in the library alone when
// separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_KERAS_BODIES
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/data/detail/hdf5.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/layers/registry.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/saving/detail/formats.hpp"
#include "loadstar/keras/saving/detail/h5_io.hpp"
#include "loadstar/keras/saving/detail/model_file.hpp"
#include "loadstar/keras/saving/detail/text_inputs.hpp"
#include "loadstar/keras/saving/detail/zip_io.hpp"
#include "loadstar/keras/saving/model_config.hpp"
#include "loadstar/keras/saving/options.hpp"

namespace loadstar::keras {

namespace detail {

/// The file's extension in lower case (`".h5"`), and whether its name ends in `.weights.h5`.
LOADSTAR_DECL std::string lower_extension(const std::filesystem::path& path);

LOADSTAR_DECL bool is_keras3_weights_name(const std::filesystem::path& path);

LOADSTAR_DECL void require_built(const Model& model, const std::string& what);

/// Runs `body`, prefixing the message of any `loadstar::Error` it throws with `where` (the file)
/// unless the message names it already, keeping the type.
template <class Body>
decltype(auto) naming_file(const std::string& where, Body&& body) {
  const auto prefixed = [&](const std::exception& e) {
    const std::string message = e.what();
    return message.find(where) != std::string::npos ? message : where + ": " + message;
  };
  try {
    return body();
  } catch (const FormatError& e) {
    throw FormatError(prefixed(e));
  } catch (const ShapeError& e) {
    throw ShapeError(prefixed(e));
  } catch (const UnsupportedLayersError& e) {
    if (e.where().find(where) != std::string::npos) throw;
    throw UnsupportedLayersError(where + ": " + e.where(), e.layers());
  } catch (const ConfigError& e) {
    throw ConfigError(prefixed(e));
  } catch (const IoError& e) {
    throw IoError(prefixed(e));
  }
}

/// Throws `UnsupportedLayersError` naming every layer of a model config whose class neither
/// `custom` nor the layer registry knows, with its class.
LOADSTAR_DECL void check_layer_classes(const nlohmann::json& config, const CustomObjects& custom,
                                       const std::string& where);

/// The `.keras` members of `model`'s adapted `TextVectorization` vocabularies: Keras's
/// `assets/layers/<key>/vocabulary.txt`, also under `_lookup_layer/` (the layer's `StringLookup`
/// writes its own), the tokens with the special ones joined by newlines.
LOADSTAR_DECL std::vector<std::pair<std::string, std::string>> text_assets(const Model& model);

/// Gives `model`'s adapted `TextVectorization` layers the vocabularies `file` keeps: a `.keras`
/// archive's assets and `idf_weights` variables. Throws `FormatError` naming the file and the
/// member for one that is missing or is not a vocabulary the layer takes, for a `.h5` file whose
/// layer has none in its config, and for a vocabulary of another size than the model's input.
LOADSTAR_DECL void load_text_vocabularies(Model& model, const ModelFile& file,
                                          const std::string& where);

/// Parses JSON text of a file; throws `FormatError` naming the file and `what`.
LOADSTAR_DECL nlohmann::json parse_file_json(const std::string& text, const std::string& where,
                                             const std::string& what);

}  // namespace detail

void save_model(const Model& model, const std::filesystem::path& path, const SaveOptions& options) {
  const std::string ext = detail::lower_extension(path);
  detail::require_built(model, "save_model '" + path.string() + "'");
  const bool with_optimizer = options.include_optimizer && model.compiled();
  if (ext == ".keras") {
    const std::string where = detail::archive_name(path);
    const std::string config = detail::keras3_model_config(model, with_optimizer).dump();
    const std::string metadata =
        nlohmann::json{{"keras_version", detail::keras3_version}, {"date_saved", ""}}.dump();
    std::string weights;
    {
      const loadstar::detail::Hdf5Lock lock;
      detail::H5Writer writer(where + ": member 'model.weights.h5'");
      detail::write_keras3_weights(writer, model, with_optimizer);
      weights = writer.image();
      writer.close();
    }
    detail::write_atomically(path, options.overwrite, where, [&](const auto& temporary) {
      detail::ZipWriter zip(temporary, path);
      zip.add("metadata.json", metadata);
      zip.add("config.json", config);
      zip.add("model.weights.h5", std::move(weights));
      for (auto& [name, text] : detail::text_assets(model))
        zip.add(name, std::move(text));
      zip.close();
    });
    return;
  }
  if (ext != ".h5" && ext != ".hdf5") {
    throw ConfigError("save_model '" + path.string() +
                      "': expected a path ending in .h5, .hdf5 or .keras but found '" + ext + "'");
  }
  const std::string where = detail::H5Reader::hdf5_name(path);
  // A .h5 file keeps an adapted TextVectorization's vocabulary in the layer's config.
  nlohmann::json config_json = detail::numeric_model_config(model);
  detail::join_text_inputs(config_json, model, true);
  const std::string model_config = config_json.dump();
  const std::string training_config =
      with_optimizer ? detail::training_config(model).dump() : std::string();
  const loadstar::detail::Hdf5Lock lock;
  detail::write_atomically(path, options.overwrite, where, [&](const auto& temporary) {
    detail::H5Writer writer(temporary, path);
    const hid_t root = writer.root();
    // tf.keras >= 2.2.4-tf writes these two as str (vlen UTF-8), the configs as bytes (ASCII).
    writer.string_attribute(root, "keras_version", detail::legacy_keras_version, true);
    writer.string_attribute(root, "backend", "tensorflow", true);
    writer.string_attribute(root, "model_config", model_config, false);
    if (with_optimizer) writer.string_attribute(root, "training_config", training_config, false);
    {
      detail::H5Id weights = writer.create_group(root, "model_weights");
      detail::write_legacy_layers(writer, weights.get(), model);
    }
    if (with_optimizer) detail::write_legacy_optimizer(writer, model);
    writer.close();
  });
}

std::unique_ptr<Model> load_model(const std::filesystem::path& path,
                                  const CustomObjects& custom_objects, const LoadOptions& options) {
  const std::string signature = detail::file_signature(path);
  const std::string where = detail::model_file_name(path, signature);
  const detail::ModelFile file =
      detail::read_model_file(path, options.trust, options.sandbox_deadline);
  return detail::naming_file(where, [&]() -> std::unique_ptr<Model> {
    if (file.layout == detail::FileLayout::legacy_weights ||
        file.layout == detail::FileLayout::keras3_weights) {
      throw FormatError(where +
                        ": holds weights only, no model_config (build the model, e.g. with "
                        "model_from_json, and call load_weights)");
    }
    const bool keras3 = file.layout == detail::FileLayout::keras3_archive;
    nlohmann::json config =
        detail::parse_file_json(file.model_config, where, keras3 ? "config.json" : "model_config");
    nlohmann::json training = nullptr;
    if (keras3) {
      if (config.is_object() && config.contains("compile_config")) {
        training = config["compile_config"];
      }
      config = detail::legacy_model_config(std::move(config));
    } else if (!file.training_config.empty()) {
      training = detail::parse_file_json(file.training_config, where, "training_config");
    }
    detail::check_layer_classes(config, custom_objects, where);
    std::unique_ptr<Model> model = model_from_config(config, &custom_objects);
    detail::assign_weights(*model, file, {}, where);
    detail::load_text_vocabularies(*model, file, where);
    if (options.compile && !training.is_null()) {
      bool compiled = false;
      try {
        compiled = detail::compile_from_config(*model, training, &custom_objects);
      } catch (const ConfigError& e) {
        throw ConfigError(where + ": " + (keras3 ? "compile_config" : "training_config") + ": " +
                          e.what());
      }
      if (compiled && file.has_optimizer) detail::restore_optimizer(*model, file, where);
    }
    return model;
  });
}

void save_weights(const Model& model, const std::filesystem::path& path) {
  const std::string ext = detail::lower_extension(path);
  if (ext != ".h5" && ext != ".hdf5") {
    throw ConfigError("save_weights '" + path.string() +
                      "': expected a path ending in .h5, .hdf5 or .weights.h5 but found '" + ext +
                      "'");
  }
  detail::require_built(model, "save_weights '" + path.string() + "'");
  const std::string where = detail::H5Reader::hdf5_name(path);
  const bool keras3 = detail::is_keras3_weights_name(path);
  const loadstar::detail::Hdf5Lock lock;
  detail::write_atomically(path, true, where, [&](const auto& temporary) {
    detail::H5Writer writer(temporary, path);
    if (keras3) {
      detail::write_keras3_weights(writer, model, true);
    } else {
      detail::write_legacy_layers(writer, writer.root(), model);
    }
    writer.close();
  });
}

void load_weights(Model& model, const std::filesystem::path& path,
                  const LoadWeightsOptions& options) {
  detail::require_built(model, "load_weights '" + path.string() + "'");
  const std::string signature = detail::file_signature(path);
  const std::string where = detail::model_file_name(path, signature);
  const detail::ModelFile file =
      detail::read_model_file(path, options.trust, options.sandbox_deadline);
  detail::naming_file(where, [&] {
    detail::assign_weights(model, file, options, where);
    if (options.optimizer && file.has_optimizer) {
      if (!model.compiled()) {
        throw ConfigError(where + ": load_weights with optimizer needs a compiled model");
      }
      detail::restore_optimizer(model, file, where);
    }
  });
}

void Model::save(const std::filesystem::path& path, const SaveOptions& options) const {
  save_model(*this, path, options);
}

void Model::save_weights(const std::filesystem::path& path) const {
  keras::save_weights(*this, path);
}

void Model::load_weights(const std::filesystem::path& path, const LoadWeightsOptions& options) {
  keras::load_weights(*this, path, options);
}

}  // namespace loadstar::keras

namespace loadstar::keras::detail {

std::string lower_extension(const std::filesystem::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return ext;
}

bool is_keras3_weights_name(const std::filesystem::path& path) {
  std::string name = path.filename().string();
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.size() > 11 && name.ends_with(".weights.h5");
}

void require_built(const Model& model, const std::string& what) {
  if (model.inputs().empty()) {
    throw ConfigError(what + ": model '" + model.name() +
                      "' is not built (give it an Input or train it on a batch first)");
  }
}

void check_layer_classes(const nlohmann::json& config, const CustomObjects& custom,
                         const std::string& where) {
  const CustomObjectScope scope(&custom);
  require_supported_layers(config, where);
}

std::vector<std::pair<std::string, std::string>> text_assets(const Model& model) {
  std::vector<std::pair<std::string, std::string>> out;
  const auto keys = text_layer_keys(model);
  for (std::size_t k = 0; k < keys.size(); ++k) {
    const auto& layer = model.text_inputs()[k].layer;
    if (layer.has_input_vocabulary()) continue;  // in the config, as Keras's save_assets
    std::string text;
    const auto vocabulary = layer.get_vocabulary(true);
    for (std::size_t i = 0; i < vocabulary.size(); ++i)
      text += (i == 0 ? "" : "\n") + vocabulary[i];
    out.emplace_back("assets/layers/" + keys[k] + "/vocabulary.txt", text);
    out.emplace_back("assets/layers/" + keys[k] + "/_lookup_layer/vocabulary.txt", text);
  }
  return out;
}

void load_text_vocabularies(Model& model, const ModelFile& file, const std::string& where) {
  const auto keys = text_layer_keys(model);
  for (std::size_t k = 0; k < keys.size(); ++k) {
    layers::TextVectorization& layer = model.text_vectorization(k);
    const std::string label = "TextVectorization '" + layer.options().name + "'";
    if (!layer.has_input_vocabulary()) {
      if (file.layout != FileLayout::keras3_archive) {
        throw FormatError(where + ": " + label +
                          " has no vocabulary in its config (a .h5 file keeps one only as the "
                          "layer's vocabulary argument; Keras keeps an adapted one in a .keras "
                          "file's assets)");
      }
      const std::string member = "assets/layers/" + keys[k] + "/vocabulary.txt";
      const std::string nested = "assets/layers/" + keys[k] + "/_lookup_layer/vocabulary.txt";
      const std::pair<std::string, std::string>* found = nullptr;
      for (const auto& asset : file.assets) {
        if (asset.first == member || (found == nullptr && asset.first == nested)) found = &asset;
      }
      if (found == nullptr) {
        throw FormatError(where + ": " + label + " keeps its vocabulary in the member '" + member +
                          "', which the archive lacks");
      }
      const auto lines = vocabulary_lines(found->second);
      std::optional<std::vector<float>> idf;
      if (layer.options().output_mode == "tf_idf") {
        for (const auto& stored : file.layers) {
          if (stored.name != keys[k]) continue;
          const std::string suffix = "/idf_weights";
          for (const auto& array : stored.weights) {
            if (array.name.size() >= suffix.size() &&
                array.name.compare(array.name.size() - suffix.size(), suffix.size(), suffix) == 0)
              idf = array.values;
          }
        }
        if (!idf) {
          throw FormatError(where + ": " + label +
                            " (tf_idf) keeps its weights in the variable 'layers/" + keys[k] +
                            "/vars/idf_weights', which the archive lacks");
        }
        if (idf->size() < lines.size()) {
          throw FormatError(where + ": 'layers/" + keys[k] + "/vars/idf_weights' holds " +
                            std::to_string(idf->size()) + " weights but the vocabulary has " +
                            std::to_string(lines.size()) + " entries");
        }
        idf->resize(lines.size());  // the rest pads to max_tokens
      }
      try {
        layer.load_vocabulary(lines, idf);
      } catch (const ConfigError& e) {
        throw FormatError(where + ": member '" + found->first + "': " + e.what());
      }
    }
    const Shape made = layer.output_sample_shape();
    const Shape declared = model.inputs()[model.text_inputs()[k].input].shape();
    if (made[0] != 0 && declared[0] != 0 && made[0] != declared[0]) {
      throw FormatError(where + ": " + label + " gives rows of " + sample_shape_str(made) +
                        " but its model's input takes " + sample_shape_str(declared));
    }
  }
}

nlohmann::json parse_file_json(const std::string& text, const std::string& where,
                               const std::string& what) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(where + ": " + what + " is not JSON (" + e.what() + ")");
  }
}

}  // namespace loadstar::keras::detail
#endif
