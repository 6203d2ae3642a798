/// \file
/// `MaxPooling1D`: the maximum of each window of a sequence.
#pragma once

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

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "MaxPooling1D");
    return detail::finish_layer(read, std::make_shared<MaxPooling1D>(options_from_config(read)));
  }
};

}  // namespace loadstar::keras::layers
