/// \file
/// `MaxPooling1D`: the maximum of each window of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `MaxPooling1D`: `(steps, channels)` (or `(channels, steps)` with channels_first) to
/// the maxima of windows of `pool_size` steps; the gradient goes to the first maximum.
/// \code
/// MaxPooling1D pool({.pool_size = 5});  // strides 5, valid
/// \endcode
class MaxPooling1D : public detail::Pooling<true, 1> {
 public:
  explicit MaxPooling1D(Pooling1DOptions options = {}) : Pooling(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> MaxPooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "MaxPooling1D");
  return detail::finish_layer(read, std::make_shared<MaxPooling1D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
