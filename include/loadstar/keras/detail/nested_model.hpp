/// \file
/// What the saving code asks of a model used as a layer (`ModelLayer`, keras/model_layer.hpp)
/// without the class itself, whose header comes after `Model`'s: the functions are defined there.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace loadstar::keras {
class Layer;
class Model;
}  // namespace loadstar::keras

namespace loadstar::keras::detail {

/// The model `layer` runs when it is a `ModelLayer`, else null.
LOADSTAR_DECL const Model* nested_model(const Layer& layer) noexcept;

/// `model` as a layer: the `ModelLayer` made for it before, while that one lives (Keras's model
/// called again is the same layer), or a new one. Throws what the `ModelLayer` constructor
/// throws.
LOADSTAR_DECL std::shared_ptr<Layer> model_as_layer(const std::shared_ptr<Model>& model);

/// The layer a `layers` entry of class `Sequential`, `Functional` or `Model` describes: the model
/// of `{"class_name": class_name, "config": config}` (`model_from_config`) as a `ModelLayer`,
/// frozen when `config.trainable` is false.
LOADSTAR_DECL std::shared_ptr<Layer> model_layer_from_config(const std::string& class_name,
                                                             const nlohmann::json& config);

}  // namespace loadstar::keras::detail
