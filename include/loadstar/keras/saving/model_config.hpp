/// \file
/// A model's architecture as Keras 2's JSON (`model.get_config()`, `model.to_json()`,
/// `keras.models.model_from_json`): `Sequential` and functional models, the `model_config` of
/// Keras's HDF5 files.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/config.hpp"
#include "loadstar/keras/detail/nested_model.hpp"
// model.hpp ends with this header and saving.hpp, which uses this one's declarations: when this
// header comes before model.hpp, saving.hpp waits until its end.
#ifndef LOADSTAR_DETAIL_MODEL_HPP
#define LOADSTAR_DETAIL_DEFER_SAVING
#define LOADSTAR_DETAIL_MODEL_CONFIG_DEFERS_SAVING
#endif
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/saving/detail/text_inputs.hpp"
#include "loadstar/keras/saving/unsupported_layers_error.hpp"

namespace loadstar::keras {

/// Keras's `model.get_config()` wrapped as `model_config` is: `{"class_name": "Sequential",
/// "config": {"name", "layers": [InputLayer, ...]}}` or `{"class_name": "Functional", "config":
/// {"name", "layers": [{"class_name", "config", "name", "inbound_nodes"}], "input_layers",
/// "output_layers"}}` (Keras 2's format, which Keras 3 also reads).
/// \code
/// nlohmann::json config = model_get_config(model);
/// \endcode
LOADSTAR_DECL nlohmann::json model_get_config(const Model& model);

/// Keras's `model.to_json()`: `model_get_config` as compact JSON text.
LOADSTAR_DECL std::string to_json(const Model& model);

/// Keras's `keras.models.model_from_config`: the model a `model_config` describes (Keras 2.0-2.13
/// `Sequential`, with a list or an object as `config` and the input shape on an `InputLayer` or
/// the first layer; `Functional` and Keras 2.2's `Model`), its layers built through the layer
/// registry with `custom` objects first. The weights are new (set them with `set_weights`).
/// Throws `ConfigError` naming the key path for a bad config and an unknown layer class.
/// \code
/// auto copy = model_from_config(model_get_config(model));
/// copy->set_weights(model.get_weights());  // predicts bitwise as `model`
/// \endcode
LOADSTAR_DECL std::unique_ptr<Model> model_from_config(const nlohmann::json& model_config,
                                                       const CustomObjects* custom = nullptr);

/// Keras's `keras.models.model_from_json`: `model_from_config` of JSON text; throws
/// `FormatError` when the text is not JSON.
LOADSTAR_DECL std::unique_ptr<Model> model_from_json(std::string_view json,
                                                     const CustomObjects* custom = nullptr);

}  // namespace loadstar::keras

// The definitions: in every translation unit when header-only, in the library alone when
// separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_KERAS_BODIES
#include <algorithm>
#include <cstddef>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/keras_layer_order.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/layers/input_layer.hpp"
#include "loadstar/keras/layers/registry.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/sequential.hpp"

namespace loadstar::keras {

namespace detail {

// input_layer_config: declared in saving/detail/text_inputs.hpp, which reads configs with it.

/// `model_get_config` without the string inputs (the inputs as their layers' outputs).
LOADSTAR_DECL nlohmann::json numeric_model_config(const Model& model);

/// The `config` of a functional model: every layer with its `inbound_nodes`, Keras 2's
/// `[[["dense", 0, 0, {}], ...], ...]` (one list per call of the layer, `node_index` counting the
/// calls of that layer inside the model, in call order).
LOADSTAR_DECL nlohmann::json functional_config(const Model& model);

/// Every layer of `model_config` (nested models' layers included) whose class neither the custom
/// objects in scope nor the layer registry knows, with its key path under `path`.
LOADSTAR_DECL std::vector<UnsupportedLayersError::Entry> unsupported_layers(
    const nlohmann::json& model_config, const std::string& path = "config");

/// Throws `UnsupportedLayersError` naming every layer `unsupported_layers` finds, with `where`.
LOADSTAR_DECL void require_supported_layers(const nlohmann::json& model_config,
                                            const std::string& where);

/// `"config.layers[3]"`.
inline std::string item_path(const std::string& path, std::size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

/// One `{"class_name": ..., "config": {...}}` entry of `layers`, built through the layer registry
/// (custom objects first); errors name the entry's path.
LOADSTAR_DECL std::shared_ptr<Layer> layer_from_entry(const ConfigReader& model,
                                                      const nlohmann::json& entry,
                                                      const std::string& path);

LOADSTAR_DECL std::unique_ptr<Model> sequential_from_config(const nlohmann::json& config);

/// A functional model from Keras 2's config: layers are called in the order of the list, each
/// node as soon as its inbound layers' outputs exist (Keras's `reconstruct_from_config`).
LOADSTAR_DECL std::unique_ptr<Model> functional_from_config(const nlohmann::json& config,
                                                            std::string_view class_name);

}  // namespace detail

nlohmann::json model_get_config(const Model& model) {
  nlohmann::json config = detail::numeric_model_config(model);
  detail::join_text_inputs(config, model, false);
  return config;
}

nlohmann::json detail::numeric_model_config(const Model& model) {
  if (const auto* sequential = dynamic_cast<const Sequential*>(&model)) {
    nlohmann::json layers = nlohmann::json::array();
    if (!model.inputs().empty()) {
      layers.push_back({{"class_name", "InputLayer"},
                        {"config", detail::input_layer_config(model.inputs()[0].shape(),
                                                              model.input_names()[0])}});
    }
    for (const auto& layer : sequential->stacked_layers())
      layers.push_back({{"class_name", layer->class_name()}, {"config", layer->get_config()}});
    return {{"class_name", "Sequential"},
            {"config", {{"name", model.name()}, {"layers", std::move(layers)}}}};
  }
  return {{"class_name", "Functional"}, {"config", detail::functional_config(model)}};
}

std::string to_json(const Model& model) {
  return model_get_config(model).dump();
}

nlohmann::json Model::get_config() const {
  return model_get_config(*this);
}
std::string Model::to_json() const {
  return keras::to_json(*this);
}

std::unique_ptr<Model> model_from_config(const nlohmann::json& model_config,
                                         const CustomObjects* custom) {
  const detail::CustomObjectScope scope(custom);
  const detail::ConfigReader read(model_config, "model config", "model_config");
  const auto class_name = read.get<std::string>("class_name");
  const nlohmann::json* config = read.find("config");
  if (config == nullptr) read.fail("config", "the model's config");
  // Every missing layer class at once, before building any layer.
  const nlohmann::json* named = config->is_object() ? &*config : nullptr;
  const std::string model_name =
      named != nullptr && named->contains("name") && (*named)["name"].is_string()
          ? (*named)["name"].get<std::string>()
          : std::string(class_name == "Sequential" ? "sequential" : "model");
  const std::string where = "model '" + model_name + "' (" + class_name + ")";
  // String inputs and their TextVectorization layers: taken out, the model built on the rest.
  nlohmann::json numeric = model_config;
  auto fronts = detail::split_text_inputs(numeric, where);
  if (!fronts.empty()) config = &numeric["config"];
  detail::require_supported_layers(numeric, where);
  std::unique_ptr<Model> model;
  if (class_name == "Sequential") {
    model = detail::sequential_from_config(*config);
  } else if (class_name == "Functional" || class_name == "Model") {
    model = detail::functional_from_config(*config, class_name);
  } else {
    read.fail("class_name", "\"Sequential\", \"Functional\" or \"Model\"");
  }
  for (auto& front : fronts) {
    const auto& names = model->input_names();
    const auto at = std::find(names.begin(), names.end(), front.input);
    if (at == names.end()) {
      throw ConfigError(where + ": the string input '" + front.input + "' is not an input of the " +
                        "model (input_layers)");
    }
    model->set_text_input(std::move(front.layer), static_cast<std::size_t>(at - names.begin()),
                          front.string_shape);
  }
  return model;
}

std::unique_ptr<Model> model_from_json(std::string_view json, const CustomObjects* custom) {
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    // parse_error, and out_of_range for a number JSON allows but a double cannot hold.
    throw FormatError(std::string("model_from_json: the text is not JSON loadstar can read: ") +
                      e.what());
  }
  return model_from_config(parsed, custom);
}

}  // namespace loadstar::keras

namespace loadstar::keras::detail {

std::vector<UnsupportedLayersError::Entry> unsupported_layers(const nlohmann::json& model_config,
                                                              const std::string& path) {
  std::vector<UnsupportedLayersError::Entry> out;
  if (!model_config.is_object()) return out;
  const auto inner = model_config.find("config");
  if (inner == model_config.end()) return out;
  // Keras 2.0-2.1 write a Sequential's list of layers alone.
  const nlohmann::json* layers = inner->is_array() ? &*inner : nullptr;
  std::string layers_path = path;
  if (inner->is_object() && inner->contains("layers")) {
    layers = &(*inner)["layers"];
    layers_path += ".layers";
  }
  if (layers == nullptr || !layers->is_array()) return out;
  const CustomObjects* custom = current_custom_objects();
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const nlohmann::json& entry = (*layers)[i];
    if (!entry.is_object() || !entry.contains("class_name") || !entry["class_name"].is_string())
      continue;
    const std::string class_name = entry["class_name"].get<std::string>();
    const std::string entry_path = item_path(layers_path, i);
    if ((custom != nullptr && custom->find<Layer>(class_name) != nullptr) ||
        Registry<Layer>::instance().contains(class_name))
      continue;
    // Read with the string input it belongs to (split_text_inputs), which names misplaced ones.
    if (class_name == "TextVectorization") continue;
    if (class_name == "Sequential" || class_name == "Functional" || class_name == "Model") {
      // A nested model: its own layers.
      auto nested = unsupported_layers(entry, entry_path + ".config");
      out.insert(out.end(), nested.begin(), nested.end());
      continue;
    }
    std::string name = "?";
    if (entry.contains("name") && entry["name"].is_string()) {
      name = entry["name"].get<std::string>();
    } else if (entry.contains("config") && entry["config"].is_object() &&
               entry["config"].contains("name") && entry["config"]["name"].is_string()) {
      name = entry["config"]["name"].get<std::string>();
    }
    out.push_back({entry_path, name, class_name});
  }
  return out;
}

void require_supported_layers(const nlohmann::json& model_config, const std::string& where) {
  auto missing = unsupported_layers(model_config);
  if (!missing.empty()) throw UnsupportedLayersError(where, std::move(missing));
}

nlohmann::json input_layer_config(const Shape& shape, const std::string& name) {
  return {{"batch_input_shape", batch_shape_json(shape)},
          {"dtype", "float32"},
          {"sparse", false},
          {"ragged", false},
          {"name", name}};
}

nlohmann::json functional_config(const Model& model) {
  // The calls the outputs depend on, in creation (call) order.
  std::map<std::uint64_t, const GraphNode*> reached;
  std::vector<const GraphNode*> stack;
  for (const auto& o : model.outputs())
    stack.push_back(call_node(o.node().get()));
  while (!stack.empty()) {
    const GraphNode* node = stack.back();
    stack.pop_back();
    if (!reached.emplace(node->id, node).second) continue;
    for (const auto& in : node->inputs)
      stack.push_back(call_node(in.get()));
  }
  std::map<const GraphNode*, std::string> input_names;
  for (std::size_t i = 0; i < model.inputs().size(); ++i)
    input_names[model.inputs()[i].node().get()] = model.input_names()[i];
  std::map<const GraphNode*, std::size_t> node_index;
  std::map<const Layer*, std::vector<const GraphNode*>> calls;
  for (const auto& [id, node] : reached) {
    if (node->layer == nullptr) continue;
    auto& list = calls[node->layer.get()];
    node_index[node] = list.size();
    list.push_back(node);
  }
  const auto reference = [&](const GraphNode* node) {
    if (node->layer == nullptr) return nlohmann::json::array({input_names.at(node), 0, 0});
    return nlohmann::json::array(
        {node->layer->name(), node_index.at(call_node(node)), node->output_index});
  };
  nlohmann::json layers = nlohmann::json::array();
  nlohmann::json input_layers = nlohmann::json::array();
  for (std::size_t i = 0; i < model.inputs().size(); ++i)
    input_layers.push_back({model.input_names()[i], 0, 0});
  // Inputs and layers in Keras's order (keras_layer_order), so that Keras lists them alike.
  for (const GraphNode* first : keras_layer_order(model.inputs(), model.outputs())) {
    if (first->layer == nullptr) {
      const std::string& name = input_names.at(first);
      layers.push_back({{"class_name", "InputLayer"},
                        {"config", input_layer_config(first->shape, name)},
                        {"name", name},
                        {"inbound_nodes", nlohmann::json::array()}});
      continue;
    }
    const std::shared_ptr<Layer>& layer = first->layer;
    nlohmann::json inbound = nlohmann::json::array();
    const auto* arguments = dynamic_cast<const CallArguments*>(layer.get());
    for (const GraphNode* node : calls[layer.get()]) {
      nlohmann::json call = nlohmann::json::array();
      if (arguments != nullptr) {
        std::vector<nlohmann::json> refs;
        for (const auto& in : node->inputs)
          refs.push_back(reference(in.get()));
        call = legacy_call(*arguments, std::move(refs));
      }
      for (const auto& in : node->inputs) {
        if (arguments != nullptr) break;
        auto ref = reference(in.get());
        ref.push_back(nlohmann::json::object());
        call.push_back(std::move(ref));
      }
      inbound.push_back(std::move(call));
    }
    layers.push_back({{"class_name", layer->class_name()},
                      {"config", layer->get_config()},
                      {"name", layer->name()},
                      {"inbound_nodes", std::move(inbound)}});
  }
  nlohmann::json output_layers = nlohmann::json::array();
  for (const auto& o : model.outputs())
    output_layers.push_back(reference(o.node().get()));
  return {{"name", model.name()},
          {"layers", std::move(layers)},
          {"input_layers", std::move(input_layers)},
          {"output_layers", std::move(output_layers)}};
}

std::shared_ptr<Layer> layer_from_entry(const ConfigReader& model, const nlohmann::json& entry,
                                        const std::string& path) {
  const ConfigReader read(entry, model.owner(), path);
  const auto class_name = read.get<std::string>("class_name");
  const nlohmann::json empty = nlohmann::json::object();
  const nlohmann::json* config = read.has("config") ? read.find("config") : &empty;
  const CustomObjects* custom = current_custom_objects();
  if ((class_name == "Sequential" || class_name == "Functional" || class_name == "Model") &&
      (custom == nullptr || custom->find<Layer>(class_name) == nullptr) &&
      !Registry<Layer>::instance().contains(class_name)) {
    // A nested model (Keras writes its config as the model's own): a `ModelLayer`.
    try {
      return model_layer_from_config(class_name, *config);
    } catch (const ConfigError& e) {
      throw ConfigError(model.owner() + ": " + path + ": " + e.what());
    }
  }
  try {
    return Registry<Layer>::instance().create(class_name, *config);
  } catch (const ConfigError& e) {
    // Name the layer when the message does not (an unknown class): "layer 'gru_1' (GRU): ...".
    std::string layer;
    for (const nlohmann::json* object : {config, &entry}) {
      if (layer.empty() && object->is_object() && object->contains("name") &&
          (*object)["name"].is_string())
        layer = (*object)["name"].get<std::string>();
    }
    const std::string what = e.what();
    const std::string label = "layer '" + layer + "'";
    const std::string prefix = layer.empty() || what.find(label) != std::string::npos
                                   ? ""
                                   : label + " (" + class_name + "): ";
    throw ConfigError(model.owner() + ": " + path + ": " + prefix + what);
  }
}

std::unique_ptr<Model> sequential_from_config(const nlohmann::json& config) {
  // Keras 2.0-2.1 write the list of layers alone; 2.2+ {"name": ..., "layers": [...]}.
  const nlohmann::json wrapped = {{"layers", config}};
  const nlohmann::json& object = config.is_array() ? wrapped : config;
  const std::string name =
      object.is_object() && object.contains("name") && object["name"].is_string()
          ? object["name"].get<std::string>()
          : std::string("sequential");
  const ConfigReader read(object, "model '" + name + "' (Sequential)");
  const nlohmann::json* layers = read.find("layers");
  if (layers == nullptr || !layers->is_array()) read.fail("layers", "a list of layer configs");
  auto model = std::make_unique<Sequential>(name);
  bool has_input = false;
  for (std::size_t i = 0; i < layers->size(); ++i) {
    const std::string path = item_path(read.path("layers"), i);
    const nlohmann::json& entry = (*layers)[i];
    auto layer = layer_from_entry(read, entry, path);
    try {
      if (auto input = std::dynamic_pointer_cast<layers::InputLayer>(layer)) {
        model->add(Input(input->shape(), input->name()));
        has_input = true;
        continue;
      }
      // Keras 2 puts the input shape on the first layer when there is no InputLayer (and repeats
      // it there when there is one), and names the input `<layer>_input`.
      const auto layer_config = entry.find("config");
      if (!has_input && i == 0 && layer_config != entry.end() && layer_config->is_object() &&
          layer_config->contains("batch_input_shape") &&
          !(*layer_config)["batch_input_shape"].is_null()) {
        const ConfigReader shape_reader(*layer_config, read.owner(), path + ".config");
        model->add(Input(layers::detail::config_batch_shape(shape_reader, "batch_input_shape"),
                         layer->name() + "_input"));
        has_input = true;
      }
      // A model first (tf.keras 2's `Sequential([base, ...])`) gives its input: Keras's outer
      // model takes the nested model's inputs.
      const Model* nested = nested_model(*layer);
      if (!has_input && i == 0 && nested != nullptr) {
        model->add(Input(nested->inputs()[0].shape(), nested->input_names()[0]));
        has_input = true;
      }
      model->add(layer);
    } catch (const ShapeError& e) {
      throw ShapeError(read.owner() + ": " + path + ": " + e.what());
    } catch (const MemoryError& e) {
      throw MemoryError(read.owner() + ": " + path + ": " + e.what());
    }
  }
  return model;
}

std::unique_ptr<Model> functional_from_config(const nlohmann::json& config,
                                              std::string_view class_name) {
  const std::string name =
      config.is_object() && config.contains("name") && config["name"].is_string()
          ? config["name"].get<std::string>()
          : std::string("model");
  const ConfigReader read(config, "model '" + name + "' (" + std::string(class_name) + ")");
  const nlohmann::json* entries = read.find("layers");
  if (entries == nullptr || !entries->is_array()) read.fail("layers", "a list of layer configs");
  struct Pending {
    std::shared_ptr<Layer> layer;
    std::string name;
    std::string path;
    const nlohmann::json* nodes;
    std::size_t done = 0;
  };
  std::vector<Pending> pending;
  // The outputs of each call (layer name, node index), by tensor index.
  std::map<std::pair<std::string, std::size_t>, std::vector<KerasTensor>> tensors;
  // The tensor [layer, node index, tensor index, ...] names; null when that call was not made
  // yet. Throws `ConfigError` (at `path`) for a tensor index the call does not return.
  const auto tensor_at = [&](const nlohmann::json& ref,
                             const std::string& path) -> const KerasTensor* {
    const auto it = tensors.find({ref[0].get<std::string>(), ref[1].get<std::size_t>()});
    if (it == tensors.end()) return nullptr;
    const std::size_t t =
        ref.size() > 2 && ConfigValue<std::size_t>::fits(ref[2]) ? ref[2].get<std::size_t>() : 0;
    if (t >= it->second.size()) {
      throw ConfigError(read.owner() + ": " + path + ": expected a tensor index below " +
                        std::to_string(it->second.size()) + " (the outputs of layer '" +
                        ref[0].get<std::string>() + "') but found " + describe_json(ref[2]));
    }
    return &it->second[t];
  };
  for (std::size_t i = 0; i < entries->size(); ++i) {
    const std::string path = item_path(read.path("layers"), i);
    auto layer = layer_from_entry(read, (*entries)[i], path);
    const ConfigReader entry((*entries)[i], read.owner(), path);
    const std::string layer_name = entry.get("name", layer->name().c_str());
    if (auto input = std::dynamic_pointer_cast<layers::InputLayer>(layer)) {
      tensors.emplace(std::pair{layer_name, std::size_t{0}},
                      std::vector{Input(input->shape(), layer_name)});
      continue;
    }
    const nlohmann::json* nodes = entry.find("inbound_nodes");
    if (nodes == nullptr || !nodes->is_array())
      entry.fail("inbound_nodes", "a list of calls [[[layer, node, tensor, {}], ...], ...]");
    pending.push_back({std::move(layer), layer_name, path, nodes});
  }
  // Reads [layer, node_index, tensor_index, kwargs] of a call's input; nullptr when that tensor
  // does not exist yet.
  const auto input_of = [&](const Pending& p, std::size_t k, std::size_t j) -> const KerasTensor* {
    const nlohmann::json& ref = (*p.nodes)[k][j];
    const std::string path =
        p.path + ".inbound_nodes[" + std::to_string(k) + "][" + std::to_string(j) + "]";
    if (!ref.is_array() || ref.size() < 3 || !ref[0].is_string() ||
        !ConfigValue<std::size_t>::fits(ref[1]) || !ConfigValue<std::size_t>::fits(ref[2])) {
      throw ConfigError(read.owner() + ": " + path +
                        ": expected [layer name, node index, tensor index, kwargs] but found " +
                        describe_json(ref));
    }
    return tensor_at(ref, path);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (auto& p : pending) {
      while (p.done < p.nodes->size()) {
        const nlohmann::json& node = (*p.nodes)[p.done];
        if (!node.is_array()) {
          throw ConfigError(read.owner() + ": " + p.path + ".inbound_nodes[" +
                            std::to_string(p.done) +
                            "]: expected a list of [layer, node, tensor, kwargs] but found " +
                            describe_json(node));
        }
        std::vector<KerasTensor> inputs;
        for (std::size_t j = 0; j < node.size(); ++j) {
          const KerasTensor* input = input_of(p, p.done, j);
          if (input == nullptr) break;
          inputs.push_back(*input);
        }
        if (inputs.size() != node.size()) break;
        if (auto* arguments = dynamic_cast<CallArguments*>(p.layer.get())) {
          const std::string where =
              read.owner() + ": " + p.path + ".inbound_nodes[" + std::to_string(p.done) + "]";
          const auto find = [&](const nlohmann::json& ref) { return tensor_at(ref, where); };
          if (!read_legacy_call(
                  *arguments, node,
                  read.owner() + ": " + p.path + ".inbound_nodes[" + std::to_string(p.done) + "]",
                  find, inputs))
            break;
        }
        try {
          tensors.emplace(std::pair{p.name, p.done}, call_outputs(p.layer, inputs));
        } catch (const ShapeError& e) {
          throw ShapeError(read.owner() + ": " + p.path + ": " + e.what());
        } catch (const MemoryError& e) {
          throw MemoryError(read.owner() + ": " + p.path + ": " + e.what());
        }
        ++p.done;
        progress = true;
      }
    }
  }
  for (const auto& p : pending) {
    if (p.done == p.nodes->size()) continue;
    const nlohmann::json& node = (*p.nodes)[p.done];
    for (std::size_t j = 0; j < node.size(); ++j) {
      if (input_of(p, p.done, j) == nullptr) {
        throw ConfigError(read.owner() + ": " + p.path + ".inbound_nodes[" +
                          std::to_string(p.done) + "][" + std::to_string(j) +
                          "]: expected the output of a layer of the model but found " +
                          describe_json(node[j]) + ", which no layer produces");
      }
    }
  }
  const auto endpoints = [&](const char* key) {
    const nlohmann::json* list = read.find(key);
    if (list == nullptr || !list->is_array() || list->empty())
      read.fail(key, "a list of [layer name, node index, tensor index]");
    std::vector<KerasTensor> out;
    for (std::size_t i = 0; i < list->size(); ++i) {
      const nlohmann::json& ref = (*list)[i];
      const KerasTensor* tensor = ref.is_array() && ref.size() >= 2 && ref[0].is_string() &&
                                          ConfigValue<std::size_t>::fits(ref[1])
                                      ? tensor_at(ref, item_path(read.path(key), i))
                                      : nullptr;
      if (tensor == nullptr) {
        throw ConfigError(read.owner() + ": " + item_path(read.path(key), i) +
                          ": expected a tensor of the model [layer name, node index, tensor "
                          "index] but found " +
                          describe_json(ref));
      }
      out.push_back(*tensor);
    }
    return out;
  };
  return std::make_unique<Model>(endpoints("input_layers"), endpoints("output_layers"), name);
}

}  // namespace loadstar::keras::detail
#endif

// A model used as a layer, which `layer_from_entry` makes for a nested model's entry: after
// `Model` and `model_from_config`, whichever header a program includes first.
#include "loadstar/keras/model_layer.hpp"

#ifdef LOADSTAR_DETAIL_MODEL_CONFIG_DEFERS_SAVING
#undef LOADSTAR_DETAIL_MODEL_CONFIG_DEFERS_SAVING
#undef LOADSTAR_DETAIL_DEFER_SAVING
#include "loadstar/keras/saving/saving.hpp"
#endif
