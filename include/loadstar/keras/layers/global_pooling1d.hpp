/// \file
/// `GlobalAveragePooling1D` and `GlobalMaxPooling1D`: one value per channel of a sequence.
#pragma once

#include "loadstar/keras/layers/detail/global_pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `GlobalAveragePooling1D`: `(steps, c)` (or `(c, steps)` with channels_first) to
/// `(c,)`, the mean over the steps (`(1, c)` or `(c, 1)` with `keepdims`).
/// \code
/// GlobalAveragePooling1D gap;
/// \endcode
class GlobalAveragePooling1D : public detail::GlobalPooling<false, 1> {
 public:
  explicit GlobalAveragePooling1D(GlobalPooling1DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalAveragePooling1D");
    return detail::finish_layer(
        read, std::make_shared<GlobalAveragePooling1D>(options_from_config(read)));
  }
};

/// Keras's `GlobalMaxPooling1D`: `(steps, c)` (or `(c, steps)` with channels_first) to `(c,)`,
/// the maximum over the steps (`(1, c)` or `(c, 1)` with `keepdims`).
/// \code
/// GlobalMaxPooling1D gmp({.keepdims = true});
/// \endcode
class GlobalMaxPooling1D : public detail::GlobalPooling<true, 1> {
 public:
  explicit GlobalMaxPooling1D(GlobalPooling1DOptions options = {})
      : GlobalPooling(std::move(options)) {}
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalMaxPooling1D");
    return detail::finish_layer(read,
                                std::make_shared<GlobalMaxPooling1D>(options_from_config(read)));
  }
};

}  // namespace loadstar::keras::layers
