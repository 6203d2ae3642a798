/// \file
/// `MaxPooling2D`: the maximum of each window of an image.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `MaxPooling2D` (channels_last or channels_first); the gradient goes to the first
/// maximum of a window.
/// \code
/// MaxPooling2D pool;                                        // 2x2, strides 2, valid
/// MaxPooling2D same({.pool_size = 3, .strides = 1, .padding = "same"});
/// \endcode
class MaxPooling2D : public detail::Pooling<true, 2> {
 public:
  explicit MaxPooling2D(Pooling2DOptions options = {}) : Pooling(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> MaxPooling2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "MaxPooling2D");
  return detail::finish_layer(read, std::make_shared<MaxPooling2D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
