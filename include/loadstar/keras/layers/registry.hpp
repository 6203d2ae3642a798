/// \file
/// `LayerRegistry`: Keras `class_name` strings to layer factories, extensible by users.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/layers/activation.hpp"
#include "loadstar/keras/layers/add.hpp"
#include "loadstar/keras/layers/average_pooling2d.hpp"
#include "loadstar/keras/layers/batch_normalization.hpp"
#include "loadstar/keras/layers/concatenate.hpp"
#include "loadstar/keras/layers/conv2d.hpp"
#include "loadstar/keras/layers/dense.hpp"
#include "loadstar/keras/layers/dropout.hpp"
#include "loadstar/keras/layers/embedding.hpp"
#include "loadstar/keras/layers/flatten.hpp"
#include "loadstar/keras/layers/global_pooling2d.hpp"
#include "loadstar/keras/layers/input_layer.hpp"
#include "loadstar/keras/layers/max_pooling2d.hpp"
#include "loadstar/keras/layers/relu.hpp"
#include "loadstar/keras/layers/reshape.hpp"
#include "loadstar/keras/layers/softmax.hpp"

namespace loadstar::keras::layers {

/// Maps Keras's `class_name` (`"Dense"`) to a factory building the layer from its `get_config()`
/// JSON; every built-in layer is registered, and users add their own.
/// \code
/// auto dense = LayerRegistry::instance().create("Dense", {{"units", 10}, {"name", "fc"}});
/// LayerRegistry::instance().add("MyLayer", [](const nlohmann::json& config) {
///   return std::make_shared<MyLayer>(config);
/// });
/// \endcode
class LayerRegistry {
 public:
  using Factory = std::function<std::shared_ptr<Layer>(const nlohmann::json& config)>;

  /// The process-wide registry.
  static LayerRegistry& instance() {
    static LayerRegistry registry;
    return registry;
  }

  /// Registers (or replaces) the factory of `class_name`.
  void add(const std::string& class_name, Factory factory) {
    std::lock_guard lock(mutex_);
    factories_[class_name] = std::move(factory);
  }

  bool contains(const std::string& class_name) const {
    std::lock_guard lock(mutex_);
    return factories_.contains(class_name);
  }

  /// Builds a layer of `class_name` from its config; throws `ConfigError` for an unknown class
  /// (`"unknown layer class 'Dense2'"`) and for a config the factory rejects.
  std::shared_ptr<Layer> create(const std::string& class_name, const nlohmann::json& config) const {
    Factory factory;
    {
      std::lock_guard lock(mutex_);
      const auto it = factories_.find(class_name);
      if (it == factories_.end()) throw ConfigError("unknown layer class '" + class_name + "'");
      factory = it->second;
    }
    try {
      return factory(config);
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError("layer class '" + class_name + "': invalid config " + config.dump() + ": " +
                        e.what());
    }
  }

 private:
  LayerRegistry() {
    factories_ = {
        {"InputLayer", InputLayer::from_config},
        {"Dense", Dense::from_config},
        {"Activation", Activation::from_config},
        {"Dropout", Dropout::from_config},
        {"Flatten", Flatten::from_config},
        {"Reshape", Reshape::from_config},
        {"Conv2D", Conv2D::from_config},
        {"MaxPooling2D", MaxPooling2D::from_config},
        {"AveragePooling2D", AveragePooling2D::from_config},
        {"GlobalAveragePooling2D", GlobalAveragePooling2D::from_config},
        {"GlobalMaxPooling2D", GlobalMaxPooling2D::from_config},
        {"BatchNormalization", BatchNormalization::from_config},
        {"Concatenate", Concatenate::from_config},
        {"Add", Add::from_config},
        {"Embedding", Embedding::from_config},
        {"ReLU", ReLU::from_config},
        {"LeakyReLU", LeakyReLU::from_config},
        {"Softmax", Softmax::from_config},
    };
  }

  mutable std::mutex mutex_;
  std::map<std::string, Factory> factories_;
};

}  // namespace loadstar::keras::layers
