/// \file
/// `MaxPooling3D`: the maximum of each window of a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling3d.hpp"

namespace loadstar::keras::layers {

/// Keras's `MaxPooling3D` over `(d, h, w, c)` (or `(c, d, h, w)` with channels_first); the
/// gradient goes to the first maximum of a window (over height and width, then depth).
/// \code
/// MaxPooling3D pool;  // 2x2x2, strides 2, valid
/// \endcode
class MaxPooling3D : public detail::Pooling3D<true> {
 public:
  explicit MaxPooling3D(Pooling3DOptions options = {}) : Pooling3D(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> MaxPooling3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "MaxPooling3D");
  return detail::finish_layer(read, std::make_shared<MaxPooling3D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
