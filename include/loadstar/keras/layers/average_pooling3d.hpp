/// \file
/// `AveragePooling3D`: the mean of each window of a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling3d.hpp"

namespace loadstar::keras::layers {

/// Keras's `AveragePooling3D` over `(d, h, w, c)` (or `(c, d, h, w)` with channels_first); with
/// `same` padding a window's mean counts only its elements inside the input.
/// \code
/// AveragePooling3D pool({.pool_size = {1, 2, 2}, .padding = "same"});
/// \endcode
class AveragePooling3D : public detail::Pooling3D<false> {
 public:
  explicit AveragePooling3D(Pooling3DOptions options = {}) : Pooling3D(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> AveragePooling3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "AveragePooling3D");
  return detail::finish_layer(read, std::make_shared<AveragePooling3D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
