/// \file
/// `SpatialDropout1D`: drops whole channels of 1-D feature maps while training.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_dropout.hpp"

namespace loadstar::keras::layers {

/// Keras's `SpatialDropout1D`: each channel of each sample dropped whole with probability
/// `rate` in training (kept ones scaled by `1 / (1 - rate)`), the identity otherwise.
/// \code
/// SpatialDropout1D dropout(0.2);
/// \endcode
class SpatialDropout1D : public detail::SpatialDropout {
 public:
  explicit SpatialDropout1D(double rate, SpatialDropoutOptions options = {})
      : SpatialDropout("SpatialDropout1D", 1, rate, options) {}

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return from_keras_config(config, "SpatialDropout1D", 1);
  }
};

}  // namespace loadstar::keras::layers
