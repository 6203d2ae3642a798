/// \file
/// `AveragePooling2D`: the mean of each window of an image.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `AveragePooling2D` (channels_last or channels_first); with `same` padding a window
/// averages over its elements inside the input only, as TensorFlow does.
/// \code
/// AveragePooling2D pool({.pool_size = 2, .padding = "same"});
/// \endcode
class AveragePooling2D : public detail::Pooling<false, 2> {
 public:
  explicit AveragePooling2D(Pooling2DOptions options = {}) : Pooling(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> AveragePooling2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "AveragePooling2D");
  return detail::finish_layer(read, std::make_shared<AveragePooling2D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
