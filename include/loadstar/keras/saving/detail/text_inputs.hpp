/// \file
/// String inputs in model configs and files: Keras's `Input(dtype="string")` read by a
/// `TextVectorization` is taken out of a config before the layers are built (the model's input
/// takes the layer's output, and `Model::set_text_input` keeps the layer), and put back when the
/// model is written. A `.keras` file keeps an adapted vocabulary as the asset
/// `assets/layers/<key>/vocabulary.txt` (Keras's `save_assets`, also under `_lookup_layer/`, the
/// layer's `StringLookup`) and TF-IDF weights as the variable `idf_weights`; a `.h5` file keeps
/// it in the config (Keras's `vocabulary` argument).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/shape_text.hpp"
#include "loadstar/keras/layers/text_vectorization.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::keras {
class Model;
}

namespace loadstar::keras::detail {

/// A string input of a model config and the layer that reads it.
struct TextFront {
  /// The `InputLayer`'s name (the model's input keeps it).
  std::string input;
  layers::TextVectorization layer;
  /// A sample's shape as the string input declares it: `(1)` or `()`.
  Shape string_shape;
};

/// Keras 2's `InputLayer` config for an input of sample shape `shape` (model_config.hpp).
LOADSTAR_DECL nlohmann::json input_layer_config(const Shape& shape, const std::string& name);

/// Whether a layer config's `dtype` names strings (`"string"`, or a policy of that name).
LOADSTAR_DECL bool is_string_dtype(const nlohmann::json& config);

/// Takes the string inputs and their `TextVectorization` layers out of a model config (Keras 2's
/// form, a `Sequential` or functional one): each string `InputLayer` becomes an input of the
/// layer's output shape, and the calls that read the layer read the input. Returns them in the
/// config's order (empty, the config untouched, when it has none). Throws `ConfigError` naming
/// the layer for a string input read by anything but one `TextVectorization`, a
/// `TextVectorization` that reads anything else (or sits in a nested model), and a string input
/// whose samples are not of shape `(1)` or `()`.
LOADSTAR_DECL std::vector<TextFront> split_text_inputs(nlohmann::json& model_config,
                                                       const std::string& where);

/// Puts `model`'s string inputs and their layers back into `model_config` (`model_get_config`'s,
/// which shows the inputs as the layers' outputs). With `inline_vocabulary` an adapted layer's
/// vocabulary (and TF-IDF weights) goes into its config, as a `.h5` file must keep it.
LOADSTAR_DECL void join_text_inputs(nlohmann::json& model_config, const Model& model,
                                    bool inline_vocabulary);

/// The Keras 3 keys of the model's `TextVectorization` layers, in `text_inputs()` order:
/// `text_vectorization`, `text_vectorization_1`, ... (`saving_lib`'s names by class).
LOADSTAR_DECL std::vector<std::string> text_layer_keys(const Model& model);

/// The lines of a `vocabulary.txt` as Keras's `load_assets` reads them: Python's
/// `str.splitlines` of the text (universal newlines), trailing empty lines dropped.
LOADSTAR_DECL std::vector<std::string> vocabulary_lines(const std::string& text);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

namespace text_inputs {

inline bool is_class(const nlohmann::json& entry, const char* name) {
  return entry.is_object() && entry.contains("class_name") && entry["class_name"].is_string() &&
         entry["class_name"].get<std::string>() == name;
}

// A layer entry's config (null when the entry has none), and its class name ("?").
inline const nlohmann::json& config_of(const nlohmann::json& entry) {
  static const nlohmann::json none;
  const auto found = entry.is_object() ? entry.find("config") : entry.end();
  return entry.is_object() && found != entry.end() ? *found : none;
}
inline std::string class_of(const nlohmann::json& entry) {
  return entry.is_object() && entry.contains("class_name") && entry["class_name"].is_string()
             ? entry["class_name"].get<std::string>()
             : std::string("?");
}

inline std::string entry_name(const nlohmann::json& entry) {
  if (entry.contains("name") && entry["name"].is_string()) return entry["name"].get<std::string>();
  if (entry.contains("config") && entry["config"].is_object() && entry["config"].contains("name") &&
      entry["config"]["name"].is_string())
    return entry["config"]["name"].get<std::string>();
  return "?";
}

inline bool is_reference(const nlohmann::json& value, const std::string& name) {
  return value.is_array() && value.size() >= 3 && value[0].is_string() &&
         value[0].get<std::string>() == name && !value[1].is_array();
}

// Whether `value` holds a tensor reference `[name, node, tensor, ...]`.
inline bool mentions(const nlohmann::json& value, const std::string& name) {
  if (is_reference(value, name)) return true;
  if (value.is_array() || value.is_object()) {
    for (const auto& item : value)
      if (mentions(item, name)) return true;
  }
  return false;
}

// Makes every reference to `from` in `value` a reference to `to`'s only output.
inline void rename(nlohmann::json& value, const std::string& from, const std::string& to) {
  if (is_reference(value, from)) {
    value[0] = to;
    value[1] = 0;
    value[2] = 0;
    return;
  }
  if (value.is_array() || value.is_object()) {
    for (auto& item : value)
      rename(item, from, to);
  }
}

// Whether a nested model's config holds a TextVectorization anywhere.
inline bool holds_text_vectorization(const nlohmann::json& value) {
  if (is_class(value, "TextVectorization")) return true;
  if (value.is_array() || value.is_object()) {
    for (const auto& item : value)
      if (holds_text_vectorization(item)) return true;
  }
  return false;
}

// The sample shape of a string InputLayer's config: (1) or ().
inline Shape string_shape(const nlohmann::json& config, const std::string& label) {
  const char* key = config.contains("batch_shape") ? "batch_shape" : "batch_input_shape";
  const nlohmann::json shape = config.contains(key) ? config[key] : nlohmann::json(nullptr);
  if (shape.is_array() && shape.size() == 1) return Shape{};
  if (shape.is_array() && shape.size() == 2 && shape[1].is_number_unsigned() &&
      shape[1].get<std::size_t>() == 1)
    return Shape{1};
  throw ConfigError(label + ": a string input's batch shape must be [null] or [null, 1] but is " +
                    shape.dump());
}

// The layer of a TextVectorization entry, and the sample shape of its output.
inline std::pair<layers::TextVectorization, Shape> read_layer(const nlohmann::json& entry,
                                                              const std::string& label) {
  const nlohmann::json config =
      config_of(entry).is_null() ? nlohmann::json::object() : config_of(entry);
  try {
    layers::TextVectorization layer = layers::TextVectorization::from_config(config);
    Shape shape = layer.output_sample_shape();
    if (layer.options().output_mode != "int" && !layer.options().pad_to_max_tokens &&
        !layer.has_tokens()) {
      // Adapted: the vocabulary comes later (a .keras file's asset); its size is in the config.
      if (!config.contains("vocabulary_size") || !config["vocabulary_size"].is_number_unsigned()) {
        throw ConfigError("output_mode \"" + layer.options().output_mode +
                          "\" gives rows as wide as the vocabulary, but the config has neither "
                          "a vocabulary nor vocabulary_size");
      }
      shape = Shape{config["vocabulary_size"].get<std::size_t>()};
    }
    return {std::move(layer), shape};
  } catch (const ConfigError& e) {
    throw ConfigError(label + ": " + e.what());
  }
}

}  // namespace text_inputs

bool is_string_dtype(const nlohmann::json& config) {
  if (!config.is_object() || !config.contains("dtype")) return false;
  const nlohmann::json& dtype = config["dtype"];
  if (dtype.is_string()) return dtype.get<std::string>() == "string";
  return dtype.is_object() && dtype.contains("config") && dtype["config"].is_object() &&
         dtype["config"].contains("name") && dtype["config"]["name"] == "string";
}

std::vector<TextFront> split_text_inputs(nlohmann::json& model_config, const std::string& where) {
  using namespace text_inputs;
  std::vector<TextFront> fronts;
  if (!model_config.is_object() || !model_config.contains("config")) return fronts;
  nlohmann::json& inner = model_config["config"];
  nlohmann::json* layers = inner.is_array() ? &inner : nullptr;
  if (inner.is_object() && inner.contains("layers")) layers = &inner["layers"];
  if (layers == nullptr || !layers->is_array()) return fronts;
  const bool sequential = is_class(model_config, "Sequential");
  const auto label = [&](std::size_t i) {
    return where + ": layers[" + std::to_string(i) + "] ('" + entry_name((*layers)[i]) + "')";
  };
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& entry = (*layers)[i];
    if ((is_class(entry, "Sequential") || is_class(entry, "Functional") ||
         is_class(entry, "Model")) &&
        holds_text_vectorization(config_of(entry))) {
      throw ConfigError(label(i) +
                        ": a nested model holds a TextVectorization; loadstar reads strings only "
                        "at the outer model's inputs");
    }
  }
  if (sequential) {
    for (std::size_t i = 0; i < layers->size(); ++i) {
      const nlohmann::json& entry = (*layers)[i];
      const bool string_input = is_class(entry, "InputLayer") && is_string_dtype(config_of(entry));
      if (string_input && i != 0) {
        throw ConfigError(label(i) + ": a string InputLayer after the first layer");
      }
      if (string_input && (layers->size() < 2 || !is_class((*layers)[1], "TextVectorization"))) {
        throw ConfigError(
            label(i) + ": the input takes strings (dtype string) but the next layer is " +
            (layers->size() < 2
                 ? std::string("none")
                 : "'" + entry_name((*layers)[1]) + "' (" + class_of((*layers)[1]) + ")") +
            "; loadstar reads strings only through a TextVectorization");
      }
      if (!is_class(entry, "TextVectorization")) continue;
      const bool after_input = i == 1 && is_class((*layers)[0], "InputLayer") &&
                               is_string_dtype(config_of((*layers)[0]));
      if (i > 1 || (i == 1 && !after_input)) {
        throw ConfigError(label(i) +
                          ": a TextVectorization must be the first layer, reading the model's "
                          "string input");
      }
      auto [layer, shape] = read_layer(entry, label(i));
      std::string name;
      Shape strings;
      if (after_input) {
        name = entry_name((*layers)[0]);
        strings = string_shape(config_of((*layers)[0]), label(0));
      } else {
        // Keras 2 puts the input's shape on the first layer: the input is `<layer>_input`.
        name = entry_name(entry) + "_input";
        const nlohmann::json& config = config_of(entry);
        strings = config.contains("batch_input_shape") ? string_shape(config, label(i)) : Shape{1};
      }
      layers->erase(layers->begin(), layers->begin() + static_cast<std::ptrdiff_t>(i + 1));
      layers->insert(layers->begin(), nlohmann::json{{"class_name", "InputLayer"},
                                                     {"config", input_layer_config(shape, name)}});
      fronts.push_back({name, std::move(layer), strings});
      return fronts;
    }
    return fronts;
  }
  nlohmann::json* outputs =
      inner.is_object() && inner.contains("output_layers") ? &inner["output_layers"] : nullptr;
  for (std::size_t i = 0; i < layers->size(); ++i) {
    nlohmann::json& entry = (*layers)[i];
    if (!is_class(entry, "InputLayer") || !is_string_dtype(config_of(entry))) continue;
    const std::string input = entry_name(entry);
    std::vector<std::size_t> readers;
    for (std::size_t j = 0; j < layers->size(); ++j) {
      if (j != i && (*layers)[j].contains("inbound_nodes") &&
          mentions((*layers)[j]["inbound_nodes"], input))
        readers.push_back(j);
    }
    if (outputs != nullptr && mentions(*outputs, input)) {
      throw ConfigError(label(i) + ": the string input is an output of the model");
    }
    if (readers.size() != 1 || !is_class((*layers)[readers[0]], "TextVectorization")) {
      std::string found = readers.empty() ? std::string("no layer") : std::string();
      for (std::size_t r : readers) {
        found += (found.empty() ? "" : ", ") + std::string("'") + entry_name((*layers)[r]) + "' (" +
                 class_of((*layers)[r]) + ")";
      }
      throw ConfigError(label(i) +
                        ": the input takes strings (dtype string) and must be read by one "
                        "TextVectorization, but is read by " +
                        found);
    }
    const std::size_t r = readers[0];
    const nlohmann::json& nodes = (*layers)[r]["inbound_nodes"];
    if (!nodes.is_array() || nodes.size() != 1 || !nodes[0].is_array() || nodes[0].size() != 1 ||
        !is_reference(nodes[0][0], input)) {
      throw ConfigError(label(r) + ": expected one call on the string input '" + input +
                        "' alone but found " + nodes.dump());
    }
    auto [layer, shape] = read_layer((*layers)[r], label(r));
    const Shape strings = string_shape(config_of(entry), label(i));
    const std::string vectorizer = entry_name((*layers)[r]);
    entry["config"] = input_layer_config(shape, input);
    layers->erase(layers->begin() + static_cast<std::ptrdiff_t>(r));
    for (auto& other : *layers) {
      if (other.contains("inbound_nodes")) rename(other["inbound_nodes"], vectorizer, input);
    }
    if (outputs != nullptr) rename(*outputs, vectorizer, input);
    fronts.push_back({input, std::move(layer), strings});
    if (r < i) --i;
  }
  for (std::size_t i = 0; i < layers->size(); ++i) {
    if (is_class((*layers)[i], "TextVectorization")) {
      throw ConfigError(label(i) + ": a TextVectorization must read a string InputLayer (dtype " +
                        "string) directly");
    }
  }
  return fronts;
}

void join_text_inputs(nlohmann::json& model_config, const Model& model, bool inline_vocabulary) {
  using namespace text_inputs;
  if (model.text_inputs().empty()) return;
  nlohmann::json& inner = model_config["config"];
  nlohmann::json& layers = inner["layers"];
  for (const auto& text : model.text_inputs()) {
    const std::string& input = model.input_names()[text.input];
    const std::string& vectorizer = text.layer.options().name;
    nlohmann::json config = text.layer.get_config();
    if (inline_vocabulary && !text.layer.has_input_vocabulary() && text.layer.has_tokens()) {
      const auto tokens = text.layer.get_vocabulary(false);
      if (text.layer.options().output_mode == "tf_idf") {
        // The tokens' weights: after the special tokens', before the padding to max_tokens.
        const auto& idf = text.layer.idf_weights();
        const auto end = idf.begin() + static_cast<std::ptrdiff_t>(text.layer.vocabulary_size());
        config["idf_weights"] =
            std::vector<float>(end - static_cast<std::ptrdiff_t>(tokens.size()), end);
      }
      config["vocabulary"] = tokens;
    }
    std::size_t at = 0;
    while (at < layers.size() && !(is_class(layers[at], "InputLayer") &&
                                   (model_config.value("class_name", "") == "Sequential" ||
                                    entry_name(layers[at]) == input)))
      ++at;
    if (at == layers.size()) continue;  // not reached: model_get_config lists every input
    nlohmann::json& input_config = layers[at]["config"];
    input_config["dtype"] = "string";
    input_config["batch_input_shape"] = batch_shape_json(text.string_shape);
    nlohmann::json entry = {{"class_name", "TextVectorization"}, {"config", std::move(config)}};
    if (model_config.value("class_name", "") != "Sequential") {
      for (std::size_t j = 0; j < layers.size(); ++j) {
        if (j != at && layers[j].contains("inbound_nodes"))
          rename(layers[j]["inbound_nodes"], input, vectorizer);
      }
      if (inner.contains("output_layers")) rename(inner["output_layers"], input, vectorizer);
      entry["name"] = vectorizer;
      entry["inbound_nodes"] =
          nlohmann::json::array({nlohmann::json::array({{input, 0, 0, nlohmann::json::object()}})});
    }
    layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(at + 1), std::move(entry));
  }
}

std::vector<std::string> text_layer_keys(const Model& model) {
  std::vector<std::string> keys;
  for (std::size_t k = 0; k < model.text_inputs().size(); ++k)
    keys.push_back(k == 0 ? std::string("text_vectorization")
                          : "text_vectorization_" + std::to_string(k));
  return keys;
}

std::vector<std::string> vocabulary_lines(const std::string& text) {
  // Universal newlines (\r\n and \r read as \n), then str.splitlines's separators: \n, \v, \f,
  // \x1c, \x1d, \x1e, and U+0085, U+2028, U+2029 in UTF-8.
  std::vector<std::string> lines;
  std::string line;
  bool open = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t skip = 0;
    if (c == '\r') {
      skip = i + 1 < text.size() && text[i + 1] == '\n' ? 2 : 1;
    } else if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
      skip = 1;
    } else if (c == 0xc2 && i + 1 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) == 0x85) {
      skip = 2;
    } else if (c == 0xe2 && i + 2 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(text[i + 2]) == 0xa8 ||
                static_cast<unsigned char>(text[i + 2]) == 0xa9)) {
      skip = 3;
    }
    if (skip == 0) {
      line += text[i];
      open = true;
      continue;
    }
    lines.push_back(std::move(line));
    line.clear();
    open = false;
    i += skip - 1;
  }
  if (open) lines.push_back(std::move(line));
  while (!lines.empty() && lines.back().empty())
    lines.pop_back();
  return lines;
}

}  // namespace loadstar::keras::detail
#endif
