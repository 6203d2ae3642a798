/// \file
/// `GlobalAveragePooling1D` and `GlobalMaxPooling1D`: one value per channel of a sequence.
#pragma once

#include "loadstar/config.hpp"

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
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
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
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> GlobalAveragePooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalAveragePooling1D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalAveragePooling1D>(options_from_config(read)));
}

std::shared_ptr<Layer> GlobalMaxPooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GlobalMaxPooling1D");
  return detail::finish_layer(read,
                              std::make_shared<GlobalMaxPooling1D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
