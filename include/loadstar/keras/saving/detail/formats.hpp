/// \file
/// Writing and reading the contents of Keras's model files: the layer lists and names Keras uses,
/// `training_config` and Keras 3's `compile_config`, Keras 3's `config.json` serialization, the
/// legacy and Keras 3 weight layouts, the optimizer's state, and writing through a temporary file.
///
/// Over 800 lines as one feature (both Keras formats' tables, read and written side by side, so
/// that a change to one name changes both directions): the bodies, most of the file, are
/// compiled into loadstar_keras under LOADSTAR_SEPARATE_COMPILATION.
#pragma once

#include "loadstar/config.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/detail/keras_layer_order.hpp"
#include "loadstar/keras/detail/nested_model.hpp"
#include "loadstar/keras/detail/shape_text.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/layers/bidirectional.hpp"
#include "loadstar/keras/layers/detail/recurrent.hpp"
#include "loadstar/keras/layers/multi_head_attention.hpp"
#include "loadstar/keras/layers/registry.hpp"
#include "loadstar/keras/losses.hpp"
#include "loadstar/keras/metrics.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/optimizers.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/saving/detail/h5_io.hpp"
#include "loadstar/keras/saving/detail/model_file.hpp"
#include "loadstar/keras/saving/detail/text_inputs.hpp"
#include "loadstar/keras/saving/options.hpp"
#include "loadstar/keras/sequential.hpp"

namespace loadstar::keras::detail {

/// The tf.keras release whose legacy layout and weight names our `.h5` files follow.
inline constexpr const char* legacy_keras_version = "2.13.1";
/// The Keras 3 release whose `.keras` layout our archives follow.
inline constexpr const char* keras3_version = "3.5.0";

/// Whether Keras's class `name` is a recurrent layer, whose call takes `initial_state`.
inline bool is_recurrent_class(const std::string& name) {
  return name == "SimpleRNN" || name == "LSTM" || name == "GRU" || name == "RNN" ||
         name == "Bidirectional";
}

// --- the model's layers as Keras lists them
// -------------------------------------------------------

/// One entry of Keras's `model.layers`: an input (functional models list their `InputLayer`s,
/// without weights) or a layer.
struct KerasLayerEntry {
  std::string name;
  std::string class_name;
  const Layer* layer = nullptr;
};

/// Keras's `model.layers`: a `Sequential` lists its layers alone (Keras leaves out the
/// auto-generated `InputLayer`), a functional model its inputs first, then its layers.
LOADSTAR_DECL std::vector<KerasLayerEntry> keras_layers(const Model& model);

/// Keras 3's `naming.to_snake_case`: `"Conv2D"` -> `"conv2d"`, `"BatchNormalization"` ->
/// `"batch_normalization"`, `"MaxPooling2D"` -> `"max_pooling2d"`.
LOADSTAR_DECL std::string snake_case(const std::string& name);

/// One `vars` group Keras 3 writes for a layer below its `layers/<key>` group: the path between
/// (empty for the layer's own variables), the group's `name` attribute, and the layer's weights
/// it holds (`count` of them from `first`).
struct Keras3Vars {
  std::string path;
  std::string name;
  std::size_t first = 0;
  std::size_t count = 0;
};

/// The `vars` groups of a layer as Keras 3's `saving_lib._save_state` walks it: the layer's own
/// variables, then its tracked sublayers in `dir()` order. A recurrent layer owns no variables
/// and its `cell` holds them all (`layers/lstm/cell/vars`); `Bidirectional` walks its
/// `backward_layer` and `forward_layer`, each with its `cell` (`layers/bidirectional/
/// forward_layer/cell/vars`); `TimeDistributed` walks the wrapped layer as `layer`; every other
/// layer keeps its weights in its own `vars`.
LOADSTAR_DECL std::vector<Keras3Vars> keras3_vars(const Layer& layer);

/// The order tf.keras 2's HDF5 files keep a layer's weights in (`_legacy_weights`: the trainable
/// weights, then the others): for a model used as a layer, whose weights are in layer order, the
/// indices of its trainable weights, then of the others; `0, 1, ...` for every other layer.
LOADSTAR_DECL std::vector<std::size_t> legacy_weight_order(const Layer& layer);

/// The groups Keras 3 stores each entry of `model.layers` under (`layers/<key>`): the class name
/// in snake case, made unique with `_1`, `_2`, ... in list order (saving_lib's
/// `_save_container_state`; names are not used, since they are not reproducible).
LOADSTAR_DECL std::vector<std::string> keras3_keys(const std::vector<KerasLayerEntry>& entries);

/// The weights of every layer on the host, by layer, from `get_weights`.
LOADSTAR_DECL std::map<const Layer*, std::vector<Tensor<float>>> host_weights(const Model& model);

/// A tensor on the host (optimizer slots live in the backend's memory).
LOADSTAR_DECL Tensor<float> to_host(const Model& model, const Tensor<float>& tensor);

/// For each trainable variable of the model, in `trainable_variables` order: its layer's name
/// and its own (`"dense"`, `"kernel"`).
LOADSTAR_DECL std::vector<std::pair<std::string, std::string>> trainable_names(const Model& model);

// --- writing through a temporary file ------------------------------------------------------------

/// Runs `write(temporary)` for a temporary name in the directory of `path`, then renames it to
/// `path` (atomic on POSIX file systems): a failure leaves neither a half-written file under the
/// final name nor the temporary file. With `overwrite` false, an existing `path` is an `IoError`.
template <class Write>
void write_atomically(const std::filesystem::path& path, bool overwrite, const std::string& where,
                      Write&& write) {
  std::error_code error;
  if (!overwrite && std::filesystem::exists(path, error)) {
    throw IoError(where + ": exists and overwrite is false");
  }
  if (std::filesystem::is_directory(path, error)) {
    throw IoError(where + ": cannot write (is a directory)");
  }
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path directory =
      path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const std::filesystem::path temporary =
      directory / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                   std::to_string(counter++));
  try {
    write(temporary);
    std::filesystem::rename(temporary, path, error);
    if (error)
      throw IoError(where + ": cannot rename the temporary file into place (" + error.message() +
                    ")");
  } catch (...) {
    std::filesystem::remove(temporary, error);
    throw;
  }
}

// --- training_config / compile_config
// --------------------------------------------------------------

template <class Arg>
nlohmann::json object_arg_json(const Arg& arg, const char* module) {
  if (!arg.object()) return arg.name();
  nlohmann::json out = {{"class_name", arg.object()->class_name()},
                        {"config", arg.object()->get_config()}};
  if (module != nullptr) {
    out["module"] = module;
    out["registered_name"] = nullptr;
  }
  return out;
}

LOADSTAR_DECL nlohmann::json losses_json(const Losses& losses, const char* module);

LOADSTAR_DECL nlohmann::json metrics_json(const std::vector<MetricArg>& metrics,
                                          const char* module);

LOADSTAR_DECL nlohmann::json loss_weights_json(const CompileOptions& options);

/// tf.keras 2.x's `training_config` (`saving_utils.model_metadata`): the compile arguments and
/// `optimizer_config`.
LOADSTAR_DECL nlohmann::json training_config(const Model& model);

/// Keras 3's `compile_config` (`Trainer.get_compile_config`).
LOADSTAR_DECL nlohmann::json compile_config(const Model& model);

/// Appends the metrics a config lists: names, objects, and tf.keras 2.4+'s per-output lists of
/// `MeanMetricWrapper` configs (a wrapped Keras function, named by its `name`).
LOADSTAR_DECL void read_metrics(const nlohmann::json& value, std::vector<MetricArg>& out,
                                const CustomObjects* custom);

LOADSTAR_DECL LossArg read_loss(const nlohmann::json& value, const CustomObjects* custom);

/// Compiles `model` as a `training_config` (legacy) or `compile_config` (Keras 3) describes;
/// returns false, leaving the model uncompiled, when it names no loss (Keras compiles such a model
/// with `loss=None`, which loadstar cannot train).
LOADSTAR_DECL bool compile_from_config(Model& model, const nlohmann::json& config,
                                       const CustomObjects* custom);

// --- Keras 3's config.json
// ---------------------------------------------------------------------------

inline nlohmann::json dtype_policy(const std::string& name) {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", name}}},
          {"registered_name", nullptr}};
}

/// A layer's Keras 2 config as Keras 3 writes it: `batch_shape` for `InputLayer`, no
/// `batch_input_shape` elsewhere, a `DTypePolicy`, and `module`s on nested objects.
LOADSTAR_DECL nlohmann::json keras3_layer_config(const std::string& class_name,
                                                 nlohmann::json config);

/// Keras 3's `config.json` for a model (`serialize_keras_object(model)`): `module`,
/// `class_name`, `config` with Keras 3 layer entries (functional `inbound_nodes` as
/// `{"args": [__keras_tensor__...], "kwargs": {}}`), `build_config`, and `compile_config` for a
/// compiled model when `include_compile`.
LOADSTAR_DECL nlohmann::json keras3_model_config(const Model& model, bool include_compile);

/// The `[[layer, node, tensor, {}], ...]` of one Keras 3 call: every `__keras_tensor__` of its
/// `args`, in order.
LOADSTAR_DECL void collect_keras_tensors(const nlohmann::json& value, nlohmann::json& out);

/// A Keras 3 `config.json` as the Keras 2 `model_config` that `model_from_config` reads: layer
/// entries keep their configs (the layer factories read Keras 3's keys), and `inbound_nodes`
/// become Keras 2's lists.
LOADSTAR_DECL nlohmann::json legacy_model_config(nlohmann::json config);

// --- writing weights
// --------------------------------------------------------------------------------

/// The legacy weights of every layer into `group` (`/model_weights` or the root of a weights
/// file), as `save_weights_to_hdf5_group`: `layer_names` in model order, `backend` and
/// `keras_version`, one group per layer created in name order, each with `weight_names`
/// (`dense/kernel:0`) and the datasets at those paths, and `top_level_model_weights`.
LOADSTAR_DECL void write_legacy_layers(H5Writer& writer, hid_t group, const Model& model);

/// The slot kind of a slot variable (`"m"` of `"m/kernel"`).
inline std::string slot_kind(const std::string& slot_name) {
  return slot_name.substr(0, slot_name.find('/'));
}

/// `/optimizer_weights` as tf.keras 2.x's OptimizerV2 lists its weights: `Adam/iter:0`, then
/// every variable's first slot (`Adam/dense/kernel/m:0`, ...), then every variable's second,
/// which is the order `optimizer.set_weights` expects.
LOADSTAR_DECL void write_legacy_optimizer(H5Writer& writer, const Model& model);

/// Keras 3's weights layout (`saving_lib._save_state`): the model's own `vars` (none), each
/// entry of `model.layers` under `layers/<key>/vars` with datasets `0`, `1`, ..., and, with
/// `optimizer`, `optimizer/vars`: the iteration count, the learning rate (when constant), then
/// every variable's slots in turn.
LOADSTAR_DECL void write_keras3_weights(H5Writer& writer, const Model& model, bool optimizer);

// --- reading weights -----------------------------------------------------------------------------

LOADSTAR_DECL std::string names_text(const std::vector<std::string>& names);

/// Sets the weights of `model` from a file's layers. Legacy files pair layers with weights by
/// position (Keras's `load_weights_from_hdf5_group`) or, with `by_name`, by name; Keras 3 files
/// by their `layers/<key>` group. Throws `FormatError` for a different number of layers with
/// weights or a missing layer, `ShapeError` for a different number or shape of weights, each
/// naming the layer (and weight); with `skip_mismatch`, such layers keep their weights instead.
LOADSTAR_DECL void assign_weights(Model& model, const ModelFile& file,
                                  const LoadWeightsOptions& options, const std::string& where);

/// The last component of a weight name without `:0` (`"m"` of `"Adam/dense/kernel/m:0"`).
LOADSTAR_DECL std::string last_component(const std::string& name);

/// The `LossScaleOptimizer` `optimizer` is or wraps (under a `dist::DistributedOptimizer`), or
/// null.
inline optimizers::LossScaleOptimizer* loss_scaling(Optimizer& optimizer) {
  for (Optimizer* o = &optimizer; o != nullptr; o = o->wrapped_optimizer()) {
    if (auto* scaling = dynamic_cast<optimizers::LossScaleOptimizer*>(o)) return scaling;
  }
  return nullptr;
}

/// Restores the compiled optimizer's slots and iteration count from a file's optimizer state:
/// tf.keras 2.x's `/optimizer_weights` (the iteration count found by name, the slots grouped by
/// kind as OptimizerV2 lists them or interleaved per variable as Keras 3 does), or Keras 3's
/// `optimizer/vars` (iterations, learning rate, slots). Throws `FormatError` when the slots do not
/// match the optimizer's for the model's trainable weights.
LOADSTAR_DECL void restore_optimizer(Model& model, const ModelFile& file, const std::string& where);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

std::vector<KerasLayerEntry> keras_layers(const Model& model) {
  std::vector<KerasLayerEntry> out;
  if (dynamic_cast<const Sequential*>(&model) != nullptr) {
    for (const auto& layer : model.layers())
      out.push_back({layer->name(), layer->class_name(), layer.get()});
    return out;
  }
  // A functional model lists its inputs among its layers, in Keras's order.
  std::map<const GraphNode*, std::string> input_names;
  for (std::size_t i = 0; i < model.inputs().size(); ++i)
    input_names[model.inputs()[i].node().get()] = model.input_names()[i];
  for (const GraphNode* first : keras_layer_order(model.inputs(), model.outputs())) {
    if (first->layer == nullptr) {
      out.push_back({input_names.at(first), "InputLayer", nullptr});
    } else {
      out.push_back({first->layer->name(), first->layer->class_name(), first->layer.get()});
    }
  }
  return out;
}

std::string snake_case(const std::string& name) {
  std::string word;
  for (char c : name)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') word += c;
  const auto upper = [](char c) { return c >= 'A' && c <= 'Z'; };
  const auto lower = [](char c) { return c >= 'a' && c <= 'z'; };
  // re.sub("(.)([A-Z][a-z]+)", r"\1_\2"), then re.sub("([a-z])([A-Z])", r"\1_\2"), then lower.
  std::string first;
  for (std::size_t i = 0; i < word.size(); ++i) {
    if (i > 0 && upper(word[i]) && i + 1 < word.size() && lower(word[i + 1])) first += '_';
    first += word[i];
  }
  std::string second;
  for (std::size_t i = 0; i < first.size(); ++i) {
    if (i > 0 && upper(first[i]) && lower(first[i - 1])) second += '_';
    second += first[i];
  }
  std::string out;
  for (char c : second)
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::vector<std::string> keras3_keys(const std::vector<KerasLayerEntry>& entries) {
  std::map<std::string, std::size_t> used;
  std::vector<std::string> keys;
  for (const auto& entry : entries) {
    const std::string base = snake_case(entry.class_name);
    auto [it, fresh] = used.emplace(base, 0);
    if (fresh) {
      keys.push_back(base);
    } else {
      keys.push_back(base + "_" + std::to_string(++it->second));
    }
  }
  return keys;
}

std::vector<Keras3Vars> keras3_vars(const Layer& layer) {
  const std::size_t n = layer.weights().size();
  if (const Model* model = nested_model(layer)) {
    // A nested model keeps its layers as a model does (`layers/<key>/layers/<inner key>/vars`);
    // its weights are its layers' in `model.layers()` order.
    std::map<const Layer*, std::size_t> offsets;
    std::size_t offset = 0;
    for (const auto& inner : model->layers()) {
      offsets[inner.get()] = offset;
      offset += inner->weights().size();
    }
    std::vector<Keras3Vars> out{{"", layer.name(), 0, 0}};
    const auto entries = keras_layers(*model);
    const auto keys = keras3_keys(entries);
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const std::string path = "layers/" + keys[i];
      if (entries[i].layer == nullptr) {
        out.push_back({path, entries[i].name, 0, 0});
        continue;
      }
      for (const Keras3Vars& group : keras3_vars(*entries[i].layer)) {
        out.push_back({path + (group.path.empty() ? "" : "/" + group.path),
                       group.path.empty() ? entries[i].name : group.name,
                       offsets.at(entries[i].layer) + group.first, group.count});
      }
    }
    return out;
  }
  if (const auto* stacked = dynamic_cast<const layers::StackedRNN*>(&layer)) {
    // The RNN's `cell` is the StackedRNNCells, whose list `cells` holds each cell under its
    // class name in snake case, made unique in list order (`cell/cells/lstm_cell`,
    // `cell/cells/lstm_cell_1`).
    std::vector<Keras3Vars> out{{"", layer.name(), 0, 0},
                                {"cell", stacked->options().cells_name, 0, 0}};
    std::map<std::string, std::size_t> seen;
    std::size_t first = 0;
    for (std::size_t i = 0; i < stacked->cell_count(); ++i) {
      const auto& cell = stacked->cell(i);
      const std::string base = snake_case(layers::detail::cell_class_name(cell.kind)) + "_cell";
      const std::size_t n = seen[base]++;
      const std::size_t count = cell.options.use_bias ? 3 : 2;
      out.push_back({"cell/cells/" + (n == 0 ? base : base + "_" + std::to_string(n)),
                     cell.options.name, first, count});
      first += count;
    }
    return out;
  }
  if (const auto* recurrent = dynamic_cast<const layers::detail::RecurrentLayer*>(&layer)) {
    return {
        {"", layer.name(), 0, 0},
        {"cell", snake_case(layers::detail::cell_class_name(recurrent->kind())) + "_cell", 0, n}};
  }
  if (const auto* mha = dynamic_cast<const layers::MultiHeadAttention*>(&layer)) {
    // The projections are EinsumDense sublayers reached through the public properties
    // (`query_dense`, ...) in `dir()` order; the softmax and dropout sublayers (private
    // attributes, visited last) hold no variables.
    const std::size_t w = mha->options().use_bias ? 2 : 1;
    return {{"", layer.name(), 0, 0},
            {"key_dense", "key", w, w},
            {"output_dense", "attention_output", 3 * w, w},
            {"query_dense", "query", 0, w},
            {"value_dense", "value", 2 * w, w},
            {"_dropout_layer", "dropout", 0, 0},
            {"_softmax", "softmax", 0, 0}};
  }
  if (dynamic_cast<const layers::Bidirectional*>(&layer) != nullptr) {
    // Keras names the directions after the wrapped layer (`forward_lstm`, `backward_lstm`), and
    // the forward direction's weights come first in `layer.weights`.
    const nlohmann::json config = layer.get_config();
    const std::string forward = config["layer"]["class_name"].get<std::string>();
    const std::string backward = config.contains("backward_layer")
                                     ? config["backward_layer"]["class_name"].get<std::string>()
                                     : forward;
    return {{"", layer.name(), 0, 0},
            {"backward_layer", "backward_" + snake_case(backward), 0, 0},
            {"backward_layer/cell", snake_case(backward) + "_cell", n / 2, n - n / 2},
            {"forward_layer", "forward_" + snake_case(forward), 0, 0},
            {"forward_layer/cell", snake_case(forward) + "_cell", 0, n / 2}};
  }
  if (const auto* wrapper = dynamic_cast<const layers::TimeDistributed*>(&layer)) {
    // The wrapped layer is tracked as `layer` (keras/src/layers/core/wrapper.py), with its own
    // walk below it (`layers/time_distributed/layer/vars`).
    std::vector<Keras3Vars> out{{"", layer.name(), 0, 0}};
    for (auto group : keras3_vars(*wrapper->layer())) {
      group.path = group.path.empty() ? "layer" : "layer/" + group.path;
      out.push_back(std::move(group));
    }
    return out;
  }
  return {{"", layer.name(), 0, n}};
}

std::vector<std::size_t> legacy_weight_order(const Layer& layer) {
  const auto weights = layer.weights();
  std::vector<std::size_t> order(weights.size());
  for (std::size_t k = 0; k < order.size(); ++k)
    order[k] = k;
  if (nested_model(layer) != nullptr) {
    std::stable_partition(order.begin(), order.end(),
                          [&](std::size_t k) { return weights[k].trainable; });
  }
  return order;
}

std::map<const Layer*, std::vector<Tensor<float>>> host_weights(const Model& model) {
  std::map<const Layer*, std::vector<Tensor<float>>> out;
  auto all = model.get_weights();
  std::size_t i = 0;
  for (const auto& layer : model.layers()) {
    auto& list = out[layer.get()];
    for (std::size_t k = 0; k < layer->weights().size(); ++k)
      list.push_back(std::move(all[i++]));
  }
  return out;
}

Tensor<float> to_host(const Model& model, const Tensor<float>& tensor) {
  if (tensor.is_host()) return tensor.clone();
  // The backend exists: a tensor off the host was made by it.
  return const_cast<Model&>(model).backend().to_host(tensor);
}

std::vector<std::pair<std::string, std::string>> trainable_names(const Model& model) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& layer : model.layers()) {
    for (const auto& w : layer->weights()) {
      if (!w.trainable) continue;
      // A nested model's weights are named after its layers ("dense/kernel"), as tf.keras names
      // their variables.
      const auto slash = w.name.rfind('/');
      if (nested_model(*layer) != nullptr && slash != std::string::npos) {
        out.emplace_back(w.name.substr(0, slash), w.name.substr(slash + 1));
      } else {
        out.emplace_back(layer->name(), w.name);
      }
    }
  }
  return out;
}

nlohmann::json losses_json(const Losses& losses, const char* module) {
  if (!losses.map().empty()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [name, arg] : losses.map())
      out[name] = object_arg_json(arg, module);
    return out;
  }
  if (losses.single()) return object_arg_json(losses.list().front(), module);
  nlohmann::json out = nlohmann::json::array();
  for (const auto& arg : losses.list())
    out.push_back(object_arg_json(arg, module));
  return out;
}

nlohmann::json metrics_json(const std::vector<MetricArg>& metrics, const char* module) {
  if (metrics.empty()) return nullptr;
  nlohmann::json out = nlohmann::json::array();
  for (const auto& arg : metrics)
    out.push_back(object_arg_json(arg, module));
  return out;
}

nlohmann::json loss_weights_json(const CompileOptions& options) {
  if (options.loss_weights.empty()) return nullptr;
  return options.loss_weights;
}

nlohmann::json training_config(const Model& model) {
  const CompileOptions& options = model.compile_options();
  const Optimizer& optimizer = model.optimizer();
  return {{"loss", losses_json(options.loss, nullptr)},
          {"metrics", metrics_json(options.metrics, nullptr)},
          {"weighted_metrics", metrics_json(options.weighted_metrics, nullptr)},
          {"loss_weights", loss_weights_json(options)},
          {"optimizer_config",
           {{"class_name", optimizer.class_name()}, {"config", optimizer.get_config()}}}};
}

nlohmann::json compile_config(const Model& model) {
  const CompileOptions& options = model.compile_options();
  const Optimizer& optimizer = model.optimizer();
  nlohmann::json optimizer_config = optimizer.get_config();
  // Keras 3 serializes a learning-rate schedule with its module too (serialization_lib).
  if (const auto rate = optimizer_config.find("learning_rate");
      rate != optimizer_config.end() && rate->is_object() && rate->contains("class_name") &&
      !rate->contains("module")) {
    (*rate)["module"] = "keras.optimizers.schedules";
    (*rate)["registered_name"] = nullptr;
  }
  return {{"optimizer",
           {{"module", "keras.optimizers"},
            {"class_name", optimizer.class_name()},
            {"config", std::move(optimizer_config)},
            {"registered_name", nullptr}}},
          {"loss", losses_json(options.loss, "keras.losses")},
          {"loss_weights", loss_weights_json(options)},
          {"metrics", metrics_json(options.metrics, "keras.metrics")},
          {"weighted_metrics", metrics_json(options.weighted_metrics, "keras.metrics")},
          {"run_eagerly", false},
          {"steps_per_execution", 1},
          {"jit_compile", false}};
}

void read_metrics(const nlohmann::json& value, std::vector<MetricArg>& out,
                  const CustomObjects* custom) {
  if (value.is_null()) return;
  if (value.is_string()) {
    out.emplace_back(value.get<std::string>());
  } else if (value.is_array()) {
    for (const auto& item : value)
      read_metrics(item, out, custom);
  } else if (value.is_object() && value.contains("class_name")) {
    const auto config = value.find("config");
    if (value["class_name"] == "MeanMetricWrapper" && config != value.end() &&
        config->is_object() && config->contains("name") && (*config)["name"].is_string()) {
      out.emplace_back((*config)["name"].get<std::string>());
    } else {
      out.emplace_back(std::shared_ptr<Metric>(Registry<Metric>::instance().create(value, custom)));
    }
  } else if (value.is_object()) {
    for (const auto& [name, item] : value.items())
      read_metrics(item, out, custom);
  } else {
    throw ConfigError("metrics: expected names or configs but found " + describe_json(value));
  }
}

LossArg read_loss(const nlohmann::json& value, const CustomObjects* custom) {
  if (value.is_string()) return LossArg(value.get<std::string>());
  return LossArg(std::shared_ptr<Loss>(Registry<Loss>::instance().create(value, custom)));
}

bool compile_from_config(Model& model, const nlohmann::json& config, const CustomObjects* custom) {
  if (!config.is_object()) {
    throw ConfigError("expected an object but found " + describe_json(config));
  }
  const auto loss = config.find("loss");
  if (loss == config.end() || loss->is_null()) return false;
  const auto optimizer = config.contains("optimizer_config") ? config.find("optimizer_config")
                                                             : config.find("optimizer");
  if (optimizer == config.end() || optimizer->is_null()) {
    throw ConfigError("no optimizer_config");
  }
  CompileOptions options;
  options.threads = model.compile_options().threads;
  options.backend = model.compile_options().backend;
  options.optimizer =
      std::shared_ptr<Optimizer>(Registry<Optimizer>::instance().create(*optimizer, custom));
  if (loss->is_array()) {
    std::vector<LossArg> list;
    for (const auto& item : *loss)
      list.push_back(read_loss(item, custom));
    options.loss = Losses(std::move(list));
  } else if (loss->is_object() && !loss->contains("class_name")) {
    std::map<std::string, LossArg> by_name;
    for (const auto& [name, item] : loss->items())
      by_name.emplace(name, read_loss(item, custom));
    options.loss = Losses::by_name(std::move(by_name));
  } else {
    options.loss = read_loss(*loss, custom);
  }
  if (const auto metrics = config.find("metrics"); metrics != config.end()) {
    read_metrics(*metrics, options.metrics, custom);
  }
  if (const auto weighted = config.find("weighted_metrics"); weighted != config.end()) {
    read_metrics(*weighted, options.weighted_metrics, custom);
  }
  if (const auto weights = config.find("loss_weights");
      weights != config.end() && !weights->is_null()) {
    if (weights->is_array()) {
      for (const auto& w : *weights) {
        if (!w.is_number()) throw ConfigError("loss_weights: expected numbers");
        options.loss_weights.push_back(w.get<double>());
      }
    } else if (weights->is_object()) {
      for (const auto& output : model.output_names()) {
        const auto w = weights->find(output);
        options.loss_weights.push_back(w != weights->end() && w->is_number() ? w->get<double>()
                                                                             : 1.0);
      }
    } else {
      throw ConfigError("loss_weights: expected a list or a map by output name");
    }
  }
  model.compile(options);
  return true;
}

nlohmann::json keras3_layer_config(const std::string& class_name, nlohmann::json config) {
  if (!config.is_object()) return config;
  if (class_name == "InputLayer") {
    if (config.contains("batch_input_shape")) {
      config["batch_shape"] = config["batch_input_shape"];
      config.erase("batch_input_shape");
    }
    return config;
  }
  config.erase("batch_input_shape");
  if (config.contains("dtype") && config["dtype"].is_string()) {
    config["dtype"] = dtype_policy(config["dtype"].get<std::string>());
  } else if (config.contains("dtype") && config["dtype"].is_object() &&
             config["dtype"].value("class_name", "") == "Policy") {
    // A mixed policy (tf.keras 2.x's Policy object).
    config["dtype"] = dtype_policy(config["dtype"]["config"].value("name", "float32"));
  }
  for (auto item : config.items()) {
    const std::string key = item.key();
    nlohmann::json& value = item.value();
    if (key == "cells" && value.is_array()) {
      // StackedRNNCells' cells, each serialized as a layer.
      for (auto& cell : value) {
        if (!cell.is_object() || !cell.contains("class_name") || cell.contains("module") ||
            !cell["class_name"].is_string())
          continue;
        if (cell.contains("config"))
          cell["config"] =
              keras3_layer_config(cell["class_name"].get<std::string>(), cell["config"]);
        cell["module"] = "keras.layers";
        cell["registered_name"] = nullptr;
      }
      continue;
    }
    if (!value.is_object() || !value.contains("class_name") || value.contains("module")) continue;
    if ((key == "layer" || key == "backward_layer" || key == "cell") &&
        value["class_name"].is_string()) {
      // A wrapper's layer (`TimeDistributed`, `Bidirectional`) or an `RNN`'s cell, serialized as
      // a layer.
      if (value.contains("config")) {
        value["config"] =
            keras3_layer_config(value["class_name"].get<std::string>(), value["config"]);
      }
      value["module"] = "keras.layers";
      value["registered_name"] = nullptr;
      continue;
    }
    const auto ends = [&key](std::string_view suffix) {
      return key.size() >= suffix.size() &&
             key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const char* module = ends("_initializer")   ? "keras.initializers"
                         : ends("_regularizer") ? "keras.regularizers"
                         : ends("_constraint")  ? "keras.constraints"
                                                : nullptr;
    if (module == nullptr) continue;
    value["module"] = module;
    value["registered_name"] = nullptr;
  }
  return config;
}

nlohmann::json keras3_model_config(const Model& model, bool include_compile) {
  nlohmann::json legacy = model_get_config(model);
  const std::string class_name = legacy["class_name"].get<std::string>();
  nlohmann::json config = legacy["config"];
  std::map<std::string, const Layer*> by_name;
  for (const auto& layer : model.layers())
    by_name[layer->name()] = layer.get();
  std::map<std::string, Shape> output_shapes;
  for (std::size_t i = 0; i < model.inputs().size(); ++i)
    output_shapes[model.input_names()[i]] = model.inputs()[i].shape();
  for (const auto& layer : model.layers())
    output_shapes[layer->name()] = layer->built_output_shape();
  // A string input gives strings, its TextVectorization what the input took.
  std::map<std::string, std::string> dtypes;
  for (const auto& text : model.text_inputs()) {
    const std::string& input = model.input_names()[text.input];
    const std::string& vectorizer = text.layer.options().name;
    output_shapes[vectorizer] = output_shapes[input];
    output_shapes[input] = text.string_shape;
    dtypes[input] = "string";
    dtypes[vectorizer] = text.layer.options().output_mode == "int" ? "int64" : "float32";
  }
  const auto keras_tensor = [&](const nlohmann::json& ref) {
    const std::string name = ref[0].get<std::string>();
    auto shape = output_shapes.find(name);
    Shape extra;  // a later output of a layer with several
    if (const auto layer = by_name.find(name);
        layer != by_name.end() && ref[2].get<std::size_t>() > 0 && layer->second->built()) {
      const auto shapes = layer->second->extra_output_shapes(layer->second->built_input_shapes());
      if (ref[2].get<std::size_t>() <= shapes.size()) {
        extra = shapes[ref[2].get<std::size_t>() - 1];
        shape = output_shapes.end();
      }
    }
    const nlohmann::json shape_json = extra.rank() > 0 ? batch_shape_json(extra)
                                      : shape != output_shapes.end()
                                          ? batch_shape_json(shape->second)
                                          : nlohmann::json(nullptr);
    const auto dtype = dtypes.find(name);
    return nlohmann::json{{"class_name", "__keras_tensor__"},
                          {"config",
                           {{"shape", shape_json},
                            {"dtype", dtype != dtypes.end() ? dtype->second : "float32"},
                            {"keras_history", {name, ref[1], ref[2]}}}}};
  };
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& entry : config["layers"]) {
    const std::string layer_class = entry["class_name"].get<std::string>();
    const std::string name = entry.contains("name") ? entry["name"].get<std::string>()
                             : entry["config"].contains("name")
                                 ? entry["config"]["name"].get<std::string>()
                                 : std::string();
    nlohmann::json out = {{"module", "keras.layers"},
                          {"class_name", layer_class},
                          {"config", keras3_layer_config(layer_class, entry["config"])},
                          {"registered_name", nullptr}};
    if (const auto it = by_name.find(name); it != by_name.end()) {
      if (const Model* nested = nested_model(*it->second)) {
        // A nested model is written as Keras 3 serializes a model, with its layer's name and
        // trainable.
        out = keras3_model_config(*nested, false);
        out["config"]["name"] = name;
        out["config"]["trainable"] = it->second->trainable();
      }
    }
    if (const auto it = by_name.find(name); it != by_name.end() && it->second->built()) {
      const auto& shapes = it->second->built_input_shapes();
      nlohmann::json input_shape;
      if (shapes.size() == 1) {
        input_shape = batch_shape_json(shapes.front());
      } else {
        for (const auto& s : shapes)
          input_shape.push_back(batch_shape_json(s));
      }
      out["build_config"] = {{"input_shape", input_shape}};
    }
    if (entry.contains("inbound_nodes")) {
      nlohmann::json nodes = nlohmann::json::array();
      for (const auto& call : entry["inbound_nodes"]) {
        nlohmann::json args = nlohmann::json::array();
        for (const auto& ref : call)
          args.push_back(keras_tensor(ref));
        // A call's keyword arguments (`use_causal_mask`, `MultiHeadAttention`'s `value` and
        // `key`: call_arguments.hpp) ride on its first input in the legacy form.
        nlohmann::json kwargs = nlohmann::json::object();
        if (!call.empty() && call[0].size() > 3 && call[0][3].is_object()) {
          for (const auto& [key, value] : call[0][3].items())
            kwargs[key] = is_tensor_reference(value) ? keras_tensor(value) : value;
        }
        if (is_recurrent_class(layer_class) && args.size() > 1) {
          // A recurrent layer's later inputs are its `initial_state` (Keras 3's keyword); an
          // RNN of StackedRNNCells takes them nested, a list per cell of several states.
          nlohmann::json states = nlohmann::json::array();
          for (std::size_t i = 1; i < args.size(); ++i)
            states.push_back(args[i]);
          const nlohmann::json& config = entry["config"];
          if (layer_class == "RNN" && config.contains("cell") && config["cell"].is_object() &&
              config["cell"].value("class_name", nlohmann::json()) == "StackedRNNCells") {
            nlohmann::json nested = nlohmann::json::array();
            std::size_t next = 0;
            for (const auto& cell : config["cell"]["config"]["cells"]) {
              const std::size_t count =
                  cell.value("class_name", nlohmann::json()) == "LSTMCell" ? 2 : 1;
              nlohmann::json group = nlohmann::json::array();
              for (std::size_t k = 0; k < count && next < states.size(); ++k)
                group.push_back(states[next++]);
              nested.push_back(count == 1 && !group.empty() ? group[0] : group);
            }
            states = std::move(nested);
          }
          kwargs["initial_state"] = std::move(states);
          args = nlohmann::json::array({args[0]});
        }
        nodes.push_back({{"args", args.size() == 1 ? args : nlohmann::json::array({args})},
                         {"kwargs", std::move(kwargs)}});
      }
      out["name"] = name;
      out["inbound_nodes"] = std::move(nodes);
    }
    layers.push_back(std::move(out));
  }
  config["layers"] = std::move(layers);
  config["trainable"] = true;
  nlohmann::json out = {
      {"module", class_name == "Sequential" ? "keras" : "keras.src.models.functional"},
      {"class_name", class_name},
      {"config", nullptr},
      {"registered_name",
       class_name == "Sequential" ? nlohmann::json(nullptr) : nlohmann::json(class_name)}};
  if (class_name == "Sequential") {
    config["dtype"] = dtype_policy("float32");
    if (!model.inputs().empty()) {
      config["build_input_shape"] = batch_shape_json(model.inputs()[0].shape());
      out["build_config"] = {{"input_shape", config["build_input_shape"]}};
    }
  } else {
    out["build_config"] = {{"input_shape", nullptr}};
  }
  out["config"] = std::move(config);
  if (include_compile && model.compiled()) out["compile_config"] = compile_config(model);
  return out;
}

void collect_keras_tensors(const nlohmann::json& value, nlohmann::json& out) {
  if (value.is_array()) {
    for (const auto& item : value)
      collect_keras_tensors(item, out);
  } else if (value.is_object()) {
    const auto class_name = value.find("class_name");
    const auto config = value.find("config");
    if (class_name != value.end() && *class_name == "__keras_tensor__" && config != value.end() &&
        config->is_object() && config->contains("keras_history") &&
        (*config)["keras_history"].is_array() && (*config)["keras_history"].size() == 3) {
      const auto& history = (*config)["keras_history"];
      out.push_back({history[0], history[1], history[2], nlohmann::json::object()});
      return;
    }
    for (const auto& [key, item] : value.items())
      collect_keras_tensors(item, out);
  }
}

nlohmann::json legacy_model_config(nlohmann::json config) {
  if (!config.is_object()) return config;
  const auto inner = config.find("config");
  if (inner == config.end() || !inner->is_object()) return config;
  const auto layers = inner->find("layers");
  if (layers != inner->end() && layers->is_array()) {
    for (auto& entry : *layers) {
      if (!entry.is_object()) continue;
      // A nested model's config: its own layers' calls too.
      const auto entry_class = entry.find("class_name");
      if (entry_class != entry.end() && entry_class->is_string() && entry.contains("config") &&
          (*entry_class == "Functional" || *entry_class == "Sequential" ||
           *entry_class == "Model")) {
        entry["config"] = legacy_model_config(entry)["config"];
      }
      const auto nodes = entry.find("inbound_nodes");
      if (nodes == entry.end() || !nodes->is_array()) continue;
      nlohmann::json legacy = nlohmann::json::array();
      for (nlohmann::json node : *nodes) {
        if (!node.is_object()) {
          legacy.push_back(node);
          continue;
        }
        nlohmann::json refs = nlohmann::json::array();
        if (node.contains("args")) collect_keras_tensors(node["args"], refs);
        // Keras 3 gives a recurrent layer's initial states as the keyword `initial_state`;
        // tf.keras 2 (and loadstar) as the inputs after the sequence.
        if (const auto kwargs = node.find("kwargs");
            kwargs != node.end() && kwargs->is_object() && kwargs->contains("initial_state") &&
            entry_class != entry.end() && entry_class->is_string() &&
            is_recurrent_class(entry_class->get<std::string>())) {
          nlohmann::json states = nlohmann::json::array();
          collect_keras_tensors((*kwargs)["initial_state"], states);
          for (auto& state : states)
            refs.push_back(std::move(state));
          kwargs->erase("initial_state");
        }
        // The keyword arguments go on the first input as tf.keras 2 writes them, their tensors
        // as [layer, node, tensor] (call_arguments.hpp reads them).
        const auto kwargs = node.find("kwargs");
        if (kwargs != node.end() && kwargs->is_object() && !kwargs->empty() && !refs.empty()) {
          nlohmann::json legacy_kwargs = nlohmann::json::object();
          for (const auto& [key, value] : kwargs->items()) {
            nlohmann::json tensors = nlohmann::json::array();
            collect_keras_tensors(value, tensors);
            legacy_kwargs[key] =
                value.is_object() && tensors.size() == 1
                    ? nlohmann::json::array({tensors[0][0], tensors[0][1], tensors[0][2]})
                    : value;
          }
          refs[0][3] = std::move(legacy_kwargs);
        }
        legacy.push_back(std::move(refs));
      }
      *nodes = std::move(legacy);
    }
  }
  for (const char* key : {"input_layers", "output_layers"}) {
    const auto list = inner->find(key);
    // Keras 3 writes one endpoint [name, 0, 0] without the enclosing list for a single tensor.
    if (list != inner->end() && list->is_array() && !list->empty() && (*list)[0].is_string()) {
      *list = nlohmann::json::array({*list});
    }
  }
  return {{"class_name", config.value("class_name", nlohmann::json())}, {"config", *inner}};
}

void write_legacy_layers(H5Writer& writer, hid_t group, const Model& model) {
  const auto entries = keras_layers(model);
  std::vector<std::string> names;
  for (const auto& entry : entries)
    names.push_back(entry.name);
  writer.string_list_attribute(group, "layer_names", names);
  writer.string_attribute(group, "backend", "tensorflow", false);
  writer.string_attribute(group, "keras_version", legacy_keras_version, false);
  auto weights = host_weights(model);
  std::vector<const KerasLayerEntry*> sorted;
  for (const auto& entry : entries)
    sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  for (const KerasLayerEntry* entry : sorted) {
    H5Id layer_group = writer.create_group(group, entry->name);
    std::vector<std::string> weight_names;
    if (entry->layer != nullptr) {
      const auto& values = weights[entry->layer];
      // A nested model's weights are named after its own layers ("dense/kernel:0").
      const std::string prefix = nested_model(*entry->layer) != nullptr ? "" : entry->name + "/";
      const auto order = legacy_weight_order(*entry->layer);
      for (const std::size_t k : order)
        weight_names.push_back(prefix + entry->layer->weights()[k].name + ":0");
      writer.string_list_attribute(layer_group.get(), "weight_names", weight_names);
      for (std::size_t i = 0; i < order.size(); ++i) {
        writer.float_dataset(layer_group.get(), weight_names[i], values[order[i]].shape(),
                             values[order[i]].data());
      }
    } else {
      writer.string_list_attribute(layer_group.get(), "weight_names", weight_names);
    }
  }
  H5Id top = writer.create_group(group, "top_level_model_weights");
  writer.string_list_attribute(top.get(), "weight_names", {});
}

void write_legacy_optimizer(H5Writer& writer, const Model& model) {
  // A LossScaleOptimizer lists its inner optimizer's weights, as tf.keras's does, then its
  // scale and its count of finite steps (tf.keras's `current_loss_scale` and `good_steps`).
  const auto* scaling = loss_scaling(model.optimizer());
  Optimizer& optimizer = scaling != nullptr ? scaling->inner_optimizer() : model.optimizer();
  H5Id group = writer.create_group(writer.root(), "optimizer_weights");
  const std::string prefix = optimizer.name();
  const auto slots = optimizer.variables();
  const auto variables = trainable_names(model);
  std::vector<std::string> names{prefix + "/iter:0"};
  std::vector<const Variable*> order;
  const std::size_t per_variable = variables.empty() ? 0 : slots.size() / variables.size();
  if (per_variable * variables.size() == slots.size()) {
    for (std::size_t k = 0; k < per_variable; ++k) {
      for (std::size_t j = 0; j < variables.size(); ++j) {
        const Variable& slot = slots[j * per_variable + k];
        names.push_back(prefix + "/" + variables[j].first + "/" + variables[j].second + "/" +
                        slot_kind(slot.name) + ":0");
        order.push_back(&slot);
      }
    }
  }
  if (scaling != nullptr) {
    names.push_back(scaling->name() + "/current_loss_scale:0");
    names.push_back(scaling->name() + "/good_steps:0");
  }
  writer.string_list_attribute(group.get(), "weight_names", names);
  writer.int64_dataset(group.get(), names[0], optimizer.iterations());
  for (std::size_t i = 0; i < order.size(); ++i) {
    const Tensor<float> value = to_host(model, order[i]->value);
    writer.float_dataset(group.get(), names[i + 1], value.shape(), value.data());
  }
  if (scaling != nullptr) {
    const float scale = scaling->loss_scale();
    writer.float_dataset(group.get(), names[names.size() - 2], Shape{}, &scale);
    writer.int64_dataset(group.get(), names.back(), scaling->step_counter());
  }
}

void write_keras3_weights(H5Writer& writer, const Model& model, bool optimizer) {
  H5Id root_vars = writer.create_group(writer.root(), "vars");
  writer.string_attribute(root_vars.get(), "name", model.name(), true);
  const auto entries = keras_layers(model);
  const auto keys = keras3_keys(entries);
  auto weights = host_weights(model);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].layer == nullptr) {
      H5Id vars = writer.create_group(writer.root(), "layers/" + keys[i] + "/vars");
      writer.string_attribute(vars.get(), "name", entries[i].name, true);
      continue;
    }
    const auto& values = weights[entries[i].layer];
    for (const Keras3Vars& group : keras3_vars(*entries[i].layer)) {
      const std::string path =
          "layers/" + keys[i] + (group.path.empty() ? "" : "/" + group.path) + "/vars";
      H5Id vars = writer.create_group(writer.root(), path);
      writer.string_attribute(vars.get(), "name", group.path.empty() ? entries[i].name : group.name,
                              true);
      for (std::size_t k = 0; k < group.count; ++k) {
        const Tensor<float>& value = values[group.first + k];
        writer.float_dataset(vars.get(), std::to_string(k), value.shape(), value.data());
      }
    }
  }
  // A TextVectorization has no weights but TF-IDF's, which Keras keeps under its key and its
  // StringLookup's.
  const auto text_keys = text_layer_keys(model);
  for (std::size_t k = 0; k < text_keys.size(); ++k) {
    const auto& layer = model.text_inputs()[k].layer;
    for (const char* inner : {"", "/_lookup_layer"}) {
      H5Id text_vars =
          writer.create_group(writer.root(), "layers/" + text_keys[k] + inner + "/vars");
      writer.string_attribute(text_vars.get(), "name", layer.options().name, true);
      if (layer.options().output_mode == "tf_idf") {
        const auto& idf = layer.idf_weights();
        writer.float_dataset(text_vars.get(), "idf_weights", Shape{idf.size()}, idf.data());
      }
    }
  }
  if (!optimizer || !model.compiled()) return;
  H5Id vars = writer.create_group(writer.root(), "optimizer/vars");
  writer.string_attribute(vars.get(), "name", model.optimizer().name(), true);
  std::size_t index = 0;
  // Keras 3's LossScaleOptimizer.variables: its own iteration (never counted: 0) and learning
  // rate (0.0), step_counter, dynamic_scale, then the inner optimizer's variables.
  const auto* scaling = loss_scaling(model.optimizer());
  if (scaling != nullptr) {
    const float zero = 0.0F;
    const float scale = scaling->loss_scale();
    writer.int64_dataset(vars.get(), std::to_string(index++), 0);
    writer.float_dataset(vars.get(), std::to_string(index++), Shape{}, &zero);
    writer.int64_dataset(vars.get(), std::to_string(index++), scaling->step_counter());
    writer.float_dataset(vars.get(), std::to_string(index++), Shape{}, &scale);
  }
  Optimizer& opt = scaling != nullptr ? scaling->inner_optimizer() : model.optimizer();
  writer.int64_dataset(vars.get(), std::to_string(index++), opt.iterations());
  const nlohmann::json config = opt.get_config();
  if (config.contains("learning_rate") && config["learning_rate"].is_number()) {
    const float rate = static_cast<float>(opt.learning_rate());
    writer.float_dataset(vars.get(), std::to_string(index++), Shape{}, &rate);
  }
  for (const Variable& slot : opt.variables()) {
    const Tensor<float> value = to_host(model, slot.value);
    writer.float_dataset(vars.get(), std::to_string(index++), value.shape(), value.data());
  }
}

std::string names_text(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names)
    out += (out.empty() ? "'" : ", '") + name + "'";
  return out.empty() ? "none" : out;
}

void assign_weights(Model& model, const ModelFile& file, const LoadWeightsOptions& options,
                    const std::string& where) {
  auto values = model.get_weights();
  std::map<const Layer*, std::size_t> offsets;
  std::size_t offset = 0;
  for (const auto& layer : model.layers()) {
    offsets[layer.get()] = offset;
    offset += layer->weights().size();
  }
  const auto assign = [&](const Layer& layer, const StoredLayer& file_order) {
    const auto weights = layer.weights();
    // tf.keras 2's files keep a nested model's trainable weights first (`legacy_weight_order`).
    StoredLayer reordered;
    const bool legacy =
        file.layout != FileLayout::keras3_archive && file.layout != FileLayout::keras3_weights;
    if (legacy && nested_model(layer) != nullptr && file_order.weights.size() == weights.size()) {
      const auto order = legacy_weight_order(layer);
      reordered = file_order;
      for (std::size_t i = 0; i < order.size(); ++i)
        reordered.weights[order[i]] = file_order.weights[i];
    }
    const StoredLayer& stored = reordered.weights.empty() ? file_order : reordered;
    if (stored.weights.size() != weights.size()) {
      if (options.skip_mismatch) return;
      throw ShapeError(where + ": layer '" + layer.name() + "' (" + layer.class_name() + ") has " +
                       std::to_string(weights.size()) + " weights but the file holds " +
                       std::to_string(stored.weights.size()) + " for it (layer '" + stored.name +
                       "')");
    }
    for (std::size_t k = 0; k < weights.size(); ++k) {
      if (stored.weights[k].shape != weights[k].value.shape()) {
        if (options.skip_mismatch) return;
        throw ShapeError(where + ": layer '" + layer.name() + "' weight '" + weights[k].name +
                         "' has shape " + weights[k].value.shape().str() + " but the file's '" +
                         stored.weights[k].name + "' has shape " + stored.weights[k].shape.str());
      }
    }
    const std::size_t first = offsets.at(&layer);
    for (std::size_t k = 0; k < weights.size(); ++k) {
      std::copy(stored.weights[k].values.begin(), stored.weights[k].values.end(),
                values[first + k].begin());
    }
  };
  if (file.layout == FileLayout::keras3_archive || file.layout == FileLayout::keras3_weights) {
    const auto entries = keras_layers(model);
    const auto keys = keras3_keys(entries);
    std::map<std::string, const StoredLayer*> stored;
    for (const auto& layer : file.layers)
      stored[layer.name] = &layer;
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const Layer* layer = entries[i].layer;
      if (layer == nullptr || layer->weights().empty()) continue;
      // The layer's weights gathered from its groups in its weights' order: a group Keras 3 did
      // not write reads as empty (`H5IOStore.get`), one that must hold weights is missing.
      const auto groups = keras3_vars(*layer);
      std::vector<const StoredLayer*> found(groups.size(), nullptr);
      std::string missing;
      for (std::size_t g = 0; g < groups.size(); ++g) {
        const auto it = stored.find(keys[i] + (groups[g].path.empty() ? "" : "/" + groups[g].path));
        if (it != stored.end()) {
          found[g] = it->second;
        } else if (groups[g].count > 0 && missing.empty()) {
          missing =
              "layers/" + keys[i] + (groups[g].path.empty() ? "" : "/" + groups[g].path) + "/vars";
        }
      }
      if (!missing.empty()) {
        if (options.skip_mismatch) continue;
        throw FormatError(where + ": layer '" + layer->name() + "' (" + layer->class_name() +
                          ") has weights but the file has no group '" + missing + "' for it");
      }
      StoredLayer gathered{keys[i], {}};
      std::vector<std::size_t> order(groups.size());
      for (std::size_t g = 0; g < groups.size(); ++g)
        order[g] = g;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        return groups[a].first < groups[b].first;
      });
      for (const std::size_t g : order) {
        if (found[g] == nullptr) continue;
        gathered.weights.insert(gathered.weights.end(), found[g]->weights.begin(),
                                found[g]->weights.end());
      }
      assign(*layer, gathered);
    }
  } else if (options.by_name) {
    std::map<std::string, const StoredLayer*> stored;
    for (const auto& layer : file.layers)
      stored[layer.name] = &layer;
    for (const auto& layer : model.layers()) {
      if (layer->weights().empty()) continue;
      const auto it = stored.find(layer->name());
      if (it != stored.end()) assign(*layer, *it->second);
    }
  } else {
    std::vector<const StoredLayer*> stored;
    std::vector<std::string> stored_names, model_names;
    for (const auto& layer : file.layers) {
      if (layer.weights.empty()) continue;
      stored.push_back(&layer);
      stored_names.push_back(layer.name);
    }
    std::vector<const Layer*> targets;
    for (const auto& layer : model.layers()) {
      if (layer->weights().empty()) continue;
      targets.push_back(layer.get());
      model_names.push_back(layer->name());
    }
    if (stored.size() != targets.size()) {
      throw FormatError(where + ": holds weights for " + std::to_string(stored.size()) +
                        " layers (" + names_text(stored_names) + ") but model '" + model.name() +
                        "' has " + std::to_string(targets.size()) + " layers with weights (" +
                        names_text(model_names) + ")");
    }
    for (std::size_t i = 0; i < targets.size(); ++i)
      assign(*targets[i], *stored[i]);
  }
  model.set_weights(values);
}

std::string last_component(const std::string& name) {
  std::string last = name.substr(name.rfind('/') == std::string::npos ? 0 : name.rfind('/') + 1);
  if (const auto colon = last.rfind(':'); colon != std::string::npos) last.resize(colon);
  return last;
}

void restore_optimizer(Model& model, const ModelFile& file, const std::string& where) {
  Optimizer& optimizer = model.optimizer();
  optimizer.build(model.trainable_variables());
  const auto slots = optimizer.variables();
  std::optional<std::int64_t> iterations;
  std::vector<const StoredArray*> entries;
  const bool keras3 =
      file.layout == FileLayout::keras3_archive || file.layout == FileLayout::keras3_weights;
  const auto count_of = [&](const StoredArray& a) -> std::int64_t {
    if (a.integer) return *a.integer;
    if (a.values.size() != 1 || !(a.values[0] >= 0) || a.values[0] > 9e18F) {
      throw FormatError(where + ": optimizer iteration count '" + a.name +
                        "' is not a non-negative scalar");
    }
    return static_cast<std::int64_t>(a.values[0]);
  };
  // A LossScaleOptimizer's scale and count of finite steps (restored last).
  optimizers::LossScaleOptimizer* scaling = loss_scaling(optimizer);
  const StoredArray* saved_scale = nullptr;
  const StoredArray* saved_counter = nullptr;
  if (keras3) {
    if (file.optimizer.empty()) return;
    // Keras 3 lists a LossScaleOptimizer's iteration, learning rate, step_counter and
    // dynamic_scale before the inner optimizer's variables.
    std::size_t first = 0;
    if (scaling != nullptr && file.optimizer.size() >= slots.size() + 5) {
      saved_counter = &file.optimizer[2];
      saved_scale = &file.optimizer[3];
      first = 4;
    }
    iterations = count_of(file.optimizer[first]);
    const std::size_t skip = file.optimizer.size() - first == slots.size() + 2 ? 2 : 1;
    for (std::size_t i = first + skip; i < file.optimizer.size(); ++i)
      entries.push_back(&file.optimizer[i]);
  } else {
    for (const auto& a : file.optimizer) {
      const std::string last = last_component(a.name);
      if (last == "iter" || last == "iteration" || last == "iterations") {
        iterations = count_of(a);
      } else if (scaling != nullptr && (last == "current_loss_scale" || last == "dynamic_scale")) {
        saved_scale = &a;
      } else if (scaling != nullptr && (last == "good_steps" || last == "step_counter")) {
        saved_counter = &a;
      } else if (last != "learning_rate") {
        entries.push_back(&a);
      }
    }
  }
  if (!entries.empty() && entries.size() != slots.size()) {
    throw FormatError(where + ": the optimizer state holds " + std::to_string(entries.size()) +
                      " slot arrays but optimizer '" + optimizer.name() + "' (" +
                      optimizer.class_name() + ") has " + std::to_string(slots.size()) +
                      " for the model's " + std::to_string(model.trainable_variables().size()) +
                      " trainable weights");
  }
  const std::size_t variables = model.trainable_variables().size();
  const std::size_t per_variable = variables == 0 ? 0 : slots.size() / variables;
  // OptimizerV2 groups the slots by kind (every m, then every v): its first two names end alike.
  const bool grouped = !keras3 && per_variable > 1 && variables > 1 && entries.size() > 1 &&
                       last_component(entries[0]->name) == last_component(entries[1]->name);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::size_t target = grouped ? (i % variables) * per_variable + i / variables : i;
    const Variable& slot = slots[target];
    if (entries[i]->shape != slot.value.shape()) {
      throw FormatError(where + ": optimizer weight '" + entries[i]->name + "' has shape " +
                        entries[i]->shape.str() + " but slot '" + slot.name + "' of optimizer '" +
                        optimizer.name() + "' has shape " + slot.value.shape().str());
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const std::size_t target = grouped ? (i % variables) * per_variable + i / variables : i;
    const Variable& slot = slots[target];
    const Tensor<float> value(entries[i]->shape, std::span<const float>(entries[i]->values));
    if (slot.value.is_host()) {
      std::copy(value.begin(), value.end(), slot.value.begin());
    } else {
      model.backend().copy_from_host(value, slot.value);
    }
  }
  if (iterations) optimizer.set_iterations(*iterations);
  if (saved_scale != nullptr && saved_counter != nullptr) {
    if (saved_scale->values.size() != 1) {
      throw FormatError(where + ": loss scale '" + saved_scale->name + "' is not a scalar (shape " +
                        saved_scale->shape.str() + ")");
    }
    scaling->set_state(saved_scale->values[0], count_of(*saved_counter));
  }
}

}  // namespace loadstar::keras::detail
#endif
