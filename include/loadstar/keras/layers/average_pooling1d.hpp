/// \file
/// `AveragePooling1D`: the mean of each window of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/pooling.hpp"

namespace loadstar::keras::layers {

/// Keras's `AveragePooling1D`: `(steps, channels)` (or `(channels, steps)` with channels_first)
/// to the means of windows of `pool_size` steps; with `same` padding a window averages over its
/// steps inside the input only, as TensorFlow does.
/// \code
/// AveragePooling1D pool({.pool_size = 3, .strides = 1, .padding = "same"});
/// \endcode
class AveragePooling1D : public detail::Pooling<false, 1> {
 public:
  explicit AveragePooling1D(Pooling1DOptions options = {}) : Pooling(std::move(options)) {}

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

std::shared_ptr<Layer> AveragePooling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "AveragePooling1D");
  return detail::finish_layer(read, std::make_shared<AveragePooling1D>(options_from_config(read)));
}

}  // namespace loadstar::keras::layers
#endif
