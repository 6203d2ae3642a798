/// \file
/// `GlobalAveragePooling2D` and `GlobalMaxPooling2D`: one value per channel of an image.
#pragma once

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
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalAveragePooling2D");
    return detail::finish_layer(
        read, std::make_shared<GlobalAveragePooling2D>(options_from_config(read)));
  }
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
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalMaxPooling2D");
    return detail::finish_layer(read,
                                std::make_shared<GlobalMaxPooling2D>(options_from_config(read)));
  }
};

}  // namespace loadstar::keras::layers
