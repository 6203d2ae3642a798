/// \file
/// `GlobalAveragePooling3D` and `GlobalMaxPooling3D`: one value per channel of a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/global_pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `GlobalAveragePooling3D`: `(d, h, w, c)` (or `(c, d, h, w)` with channels_first) to
/// `(c,)`, the mean over `d * h * w` (`(1, 1, 1, c)` or `(c, 1, 1, 1)` with `keepdims`).
/// \code
/// GlobalAveragePooling3D gap;
/// \endcode
class GlobalAveragePooling3D : public detail::GlobalPooling<false, 3> {
 public:
  explicit GlobalAveragePooling3D(GlobalPooling3DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

/// Keras's `GlobalMaxPooling3D`: `(d, h, w, c)` (or `(c, d, h, w)` with channels_first) to `(c,)`,
/// the maximum over `d * h * w` (`(1, 1, 1, c)` or `(c, 1, 1, 1)` with `keepdims`).
/// \code
/// GlobalMaxPooling3D gmp;
/// \endcode
class GlobalMaxPooling3D : public detail::GlobalPooling<true, 3> {
 public:
  explicit GlobalMaxPooling3D(GlobalPooling3DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> GlobalAveragePooling3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalAveragePooling3D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalAveragePooling3D>(options_from_config(read)));
}

std::shared_ptr<Layer> GlobalMaxPooling3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalMaxPooling3D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalMaxPooling3D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
