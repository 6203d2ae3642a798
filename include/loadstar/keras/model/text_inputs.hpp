/// \file
/// `Model`'s string inputs: an input read by a `TextVectorization` (Keras's end-to-end text
/// model), fed texts by `predict`, `evaluate` and `fit`. Included by model.hpp; do not include
/// alone.
#pragma once

#include "loadstar/keras/model.hpp"

namespace loadstar::keras {

LOADSTAR_DECL void Model::set_text_input(layers::TextVectorization layer, std::size_t input,
                                         Shape string_shape) {
  const std::string label = "model '" + name_ + "': set_text_input";
  if (!built()) {
    throw ConfigError(label + ": the model is not built (give it an Input first)");
  }
  if (input >= input_names_.size()) {
    throw ConfigError(label + ": expected an input index below " +
                      std::to_string(input_names_.size()) + " but found " + std::to_string(input));
  }
  for (const auto& t : text_inputs_) {
    if (t.input == input) {
      throw ConfigError(label + ": input '" + input_names_[input] +
                        "' takes strings already (TextVectorization '" + t.layer.options().name +
                        "')");
    }
  }
  if (string_shape.rank() > 1 || (string_shape.rank() == 1 && string_shape[0] != 1)) {
    throw ShapeError(label + ": a string input's samples have shape (1) or () but found " +
                     detail::sample_shape_str(string_shape));
  }
  const std::string& name = layer.options().name;
  const bool taken =
      std::find(input_names_.begin(), input_names_.end(), name) != input_names_.end() ||
      std::any_of(layers_.begin(), layers_.end(),
                  [&](const auto& l) { return l->name() == name; }) ||
      std::any_of(text_inputs_.begin(), text_inputs_.end(),
                  [&](const auto& t) { return t.layer.options().name == name; });
  if (taken) {
    throw ConfigError(label + ": the model has a layer or input named '" + name +
                      "' already (give the TextVectorization another name)");
  }
  // An adapted layer of rows as wide as its vocabulary is checked when the vocabulary comes.
  const bool known = layer.options().output_mode == "int" || layer.options().pad_to_max_tokens ||
                     layer.has_tokens();
  const Shape made = layer.output_sample_shape();
  const Shape& declared = nodes_[input].declared;
  const bool fits = declared.rank() == 1 && (!known || declared[0] == 0 || declared[0] == made[0]);
  if (!fits) {
    throw ShapeError(label + ": TextVectorization '" + layer.options().name + "' gives rows of " +
                     detail::sample_shape_str(made) + " but input '" + input_names_[input] +
                     "' takes samples of shape " + detail::sample_shape_str(declared));
  }
  text_inputs_.push_back({input, std::move(layer), std::move(string_shape)});
}

LOADSTAR_DECL layers::TextVectorization& Model::text_vectorization(std::size_t k) {
  if (k >= text_inputs_.size()) {
    throw ConfigError("model '" + name_ + "': text_vectorization: expected an index below " +
                      std::to_string(text_inputs_.size()) + " (the string inputs) but found " +
                      std::to_string(k));
  }
  return text_inputs_[k].layer;
}

LOADSTAR_DECL const Model::TextInput& Model::text_input_for(std::string_view what,
                                                            std::size_t count) const {
  const std::string label = "model '" + name_ + "': " + std::string(what) + " on texts";
  if (text_inputs_.empty()) {
    throw ConfigError(label + ": the model has no string input (set_text_input makes one)");
  }
  if (input_names_.size() != 1) {
    throw ConfigError(label + " takes a model of one string input but the model has " +
                      std::to_string(input_names_.size()) + " inputs");
  }
  const TextInput& text = text_inputs_.front();
  if (!text.layer.has_tokens()) {
    throw ConfigError(label + ": TextVectorization '" + text.layer.options().name +
                      "' has no vocabulary (adapt it or set_vocabulary; a model file keeps it)");
  }
  if (count == 0) throw ShapeError(label + ": no texts");
  return text;
}

LOADSTAR_DECL void Model::refuse_arrays_for_text() const {
  const TextInput& text = text_inputs_.front();
  throw ConfigError("model '" + name_ + "': input '" + input_names_[text.input] +
                    "' takes strings (TextVectorization '" + text.layer.options().name +
                    "' makes its values) but was given arrays; pass the texts to predict, "
                    "evaluate or fit as a std::vector<std::string>");
}

LOADSTAR_DECL std::vector<Tensor<float>> Model::predict_outputs(
    const std::vector<std::string>& texts, const PredictOptions& options) {
  const TextInput& text = text_input_for("predict", texts.size());
  const std::size_t batch = std::max<std::size_t>(1, std::min(options.batch_size, texts.size()));
  const FeedingText feeding(*this);
  using Batches = TextBatches<void, false>;
  detail::SequenceSource<Batches> source(Batches{&texts, nullptr, nullptr, &text.layer, batch},
                                         options.steps);
  return detail::run_predict(*this, source, options);
}

}  // namespace loadstar::keras
