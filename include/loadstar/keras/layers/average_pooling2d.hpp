/// \file
/// `AveragePooling2D`: the mean of each window of a channels-last image.
#pragma once

#include "loadstar/keras/layers/detail/pooling2d.hpp"

namespace loadstar::keras::layers {

/// Keras's `AveragePooling2D` (channels_last); with `same` padding a window averages over its
/// elements inside the input only, as TensorFlow does.
/// \code
/// AveragePooling2D pool({.pool_size = 2, .padding = "same"});
/// \endcode
class AveragePooling2D : public detail::Pooling2D<false> {
 public:
  explicit AveragePooling2D(Pooling2DOptions options = {}) : Pooling2D(std::move(options)) {}

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "AveragePooling2D");
    return detail::finish_layer(read,
                                std::make_shared<AveragePooling2D>(options_from_config(read)));
  }
};

}  // namespace loadstar::keras::layers
