/// \file
/// `GlobalAveragePooling2D` and `GlobalMaxPooling2D`: one value per channel of an image.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/global_pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `GlobalAveragePooling2D`: `(h, w, c)` (or `(c, h, w)` with channels_first) to `(c,)`,
/// the mean over `h * w` (`(1, 1, c)` or `(c, 1, 1)` with `keepdims`).
/// \code
/// GlobalAveragePooling2D gap;
/// \endcode
class GlobalAveragePooling2D : public detail::GlobalPooling<false, 2> {
 public:
  explicit GlobalAveragePooling2D(GlobalPooling2DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

/// Keras's `GlobalMaxPooling2D`: `(h, w, c)` (or `(c, h, w)` with channels_first) to `(c,)`, the
/// maximum over `h * w` (`(1, 1, c)` or `(c, 1, 1)` with `keepdims`).
/// \code
/// GlobalMaxPooling2D gmp;
/// \endcode
class GlobalMaxPooling2D : public detail::GlobalPooling<true, 2> {
 public:
  explicit GlobalMaxPooling2D(GlobalPooling2DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> GlobalAveragePooling2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalAveragePooling2D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalAveragePooling2D>(options_from_config(read)));
}

std::shared_ptr<Layer> GlobalMaxPooling2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalMaxPooling2D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalMaxPooling2D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
