/// \file
/// `Model`'s weights and summary: `get_weights`, `set_weights`, `count_params` and Keras's summary
/// table, defined out of the class (Taskflow style) so that model.hpp keeps the declaration and
/// each concern has its own file. Included by model.hpp; do not include alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL std::vector<Tensor<float>> Model::get_weights() const {
  std::vector<Tensor<float>> out;
  for (const auto& layer : layers_) {
    for (const auto& w : layer->weights())
      out.push_back(w.value.is_host() ? w.value.clone() : backend_->to_host(w.value));
  }
  return out;
}

LOADSTAR_DECL nlohmann::json Model::carried_states() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& layer : layers_) {
    const auto states = layer->carried_states();
    if (states.empty()) continue;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& state : states) {
      const Tensor<float> host = state.is_host() ? state : backend_->to_host(state);
      list.push_back({{"shape", std::vector<std::size_t>(host.shape().begin(), host.shape().end())},
                      {"values", std::vector<float>(host.data(), host.data() + host.size())}});
    }
    out[layer->name()] = std::move(list);
  }
  return out;
}

LOADSTAR_DECL void Model::restore_carried_states(const nlohmann::json& states) {
  if (!states.is_object()) {
    throw ConfigError("model '" + name_ + "': expected the carried states as an object but found " +
                      states.dump());
  }
  for (const auto& item : states.items()) {
    const std::string& name = item.key();
    if (std::none_of(layers_.begin(), layers_.end(),
                     [&](const auto& layer) { return layer->name() == name; })) {
      throw ConfigError("model '" + name_ + "': carried states of layer '" + name +
                        "', which the model does not have");
    }
  }
  Backend& backend = this->backend();
  for (const auto& layer : layers_) {
    const auto found = states.find(layer->name());
    if (found == states.end()) {
      layer->reset_states();
      continue;
    }
    std::vector<Tensor<float>> tensors;
    for (const auto& state : *found) {
      if (!state.is_object() || !state.contains("shape") || !state.contains("values")) {
        throw ConfigError("model '" + name_ + "': layer '" + layer->name() +
                          "': expected carried states {\"shape\", \"values\"} but found " +
                          state.dump());
      }
      Tensor<float> host(Shape(state["shape"].get<std::vector<std::size_t>>()));
      const auto values = state["values"].get<std::vector<float>>();
      if (values.size() != host.size()) {
        throw ShapeError("model '" + name_ + "': layer '" + layer->name() +
                         "': a carried state of shape " + host.shape().str() + " has " +
                         std::to_string(values.size()) + " values");
      }
      std::copy(values.begin(), values.end(), host.data());
      tensors.push_back(backend.is_host() ? std::move(host) : backend.from_host(host));
    }
    layer->restore_carried_states(backend, tensors);
  }
}

LOADSTAR_DECL void Model::set_weights(const std::vector<Tensor<float>>& weights) {
  std::size_t expected = 0;
  for (const auto& layer : layers_)
    expected += layer->weights().size();
  if (weights.size() != expected) {
    throw ShapeError("model '" + name_ + "': set_weights expects " + std::to_string(expected) +
                     " weights but got " + std::to_string(weights.size()));
  }
  std::size_t i = 0;
  for (const auto& layer : layers_) {
    for (const auto& w : layer->weights()) {
      if (weights[i].shape() != w.value.shape()) {
        throw ShapeError("model '" + name_ + "': layer '" + layer->name() + "' weight '" + w.name +
                         "' has shape " + w.value.shape().str() +
                         " but the given weight has shape " + weights[i].shape().str());
      }
      ++i;
    }
  }
  i = 0;
  for (const auto& layer : layers_) {
    for (auto& w : layer->weights()) {
      if (w.value.is_host()) {
        std::copy(weights[i].begin(), weights[i].end(), w.value.begin());
      } else {
        backend_->copy_from_host(weights[i], w.value);
      }
      ++i;
    }
  }
}

LOADSTAR_DECL std::size_t Model::count_params() const {
  std::size_t n = 0;
  for (const auto& layer : layers_)
    n += layer->count_params();
  return n;
}

LOADSTAR_DECL void Model::summary(std::ostream& out) const {
  require_built("summary");
  const bool chain = is_chain();
  const std::size_t line = chain ? 65 : 98;
  const std::vector<std::size_t> positions =
      chain ? std::vector<std::size_t>{29, 55, 65} : std::vector<std::size_t>{32, 53, 65, 98};
  auto row = [&](std::vector<std::string> fields) {
    std::string text;
    for (std::size_t c = 0; c < fields.size(); ++c) {
      const std::size_t start = c == 0 ? 0 : positions[c - 1];
      const std::size_t space = c + 1 == positions.size() ? 0 : 2;
      std::string field = fields[c].substr(0, positions[c] - start - space);
      text += field + std::string(space, ' ');
      if (text.size() < positions[c]) text += std::string(positions[c] - text.size(), ' ');
    }
    out << text << "\n";
  };
  out << "Model: \"" << name_ << "\"\n" << std::string(line, '_') << "\n";
  std::vector<std::string> header{" Layer (type)", "Output Shape", "Param #"};
  if (!chain) header.emplace_back("Connected to");
  row(header);
  out << std::string(line, '=') << "\n";
  const auto shape_of = detail::batch_shape_str;
  // A string input shows as Keras shows it: the input of strings, then its TextVectorization
  // (which the input's readers are connected to).
  const auto text_input = [&](std::size_t k) -> const TextInput* {
    for (const auto& t : text_inputs_)
      if (t.input == k) return &t;
    return nullptr;
  };
  const auto source_name = [&](std::size_t p) {
    const TextInput* text = nodes_[p].layer ? nullptr : text_input(p);
    return text != nullptr ? text->layer.options().name : node_names_[p];
  };
  for (std::size_t k = 0; k < nodes_.size(); ++k) {
    const auto& node = nodes_[k];
    std::vector<std::string> fields;
    if (const TextInput* text = node.layer ? nullptr : text_input(k)) {
      if (show_inputs_in_summary_) {
        std::vector<std::string> input{" " + node_names_[k] + " (InputLayer)",
                                       "[" + shape_of(text->string_shape) + "]", "0"};
        if (!chain) input.emplace_back("[]");
        row(input);
        out << std::string(line, ' ') << "\n";
      }
      fields = {" " + text->layer.options().name + " (TextVectorization)", shape_of(node.declared),
                "0"};
      if (!chain) fields.push_back("['" + node_names_[k] + "[0][0]']");
      row(fields);
      out << std::string(line, ' ') << "\n";
      continue;
    }
    if (!node.layer && !show_inputs_in_summary_) continue;
    if (node.layer && !node.runs()) continue;  // shown with the call's first output
    if (!node.layer) {
      fields = {" " + node_names_[k] + " (InputLayer)", "[" + shape_of(node.declared) + "]", "0"};
    } else {
      std::string shapes = shape_of(node.declared);
      if (!node.extras.empty()) {
        // Keras lists the shapes of a call's several outputs.
        shapes = "[" + shapes;
        for (const std::size_t e : node.extras)
          shapes += ", " + shape_of(nodes_[e].declared);
        shapes += "]";
      }
      fields = {" " + node.layer->name() + " (" + node.layer->class_name() + ")", shapes,
                std::to_string(node.layer->count_params())};
    }
    if (!chain) {
      std::string connected = "[";
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const std::size_t p = node.inputs[j];
        connected += (j ? ", '" : "'") + source_name(p) + "[0][" +
                     std::to_string(nodes_[p].output_index) + "]'";
      }
      fields.push_back(connected + "]");
    }
    row(fields);
    out << std::string(line, ' ') << "\n";  // tf.keras 2.9+ separates rows by a blank line
  }
  out << std::string(line, '=') << "\n";
  std::size_t trainable = 0, total = 0;
  for (const auto& layer : layers_) {
    for (const auto& w : layer->weights()) {
      total += w.value.size();
      if (w.trainable) trainable += w.value.size();
    }
  }
  out << "Total params: " << grouped(total) << "\nTrainable params: " << grouped(trainable)
      << "\nNon-trainable params: " << grouped(total - trainable) << "\n"
      << std::string(line, '_') << "\n";
}

}  // namespace loadstar::keras
