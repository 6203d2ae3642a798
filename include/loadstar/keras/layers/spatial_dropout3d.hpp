/// \file
/// `SpatialDropout3D`: drops whole channels of 3-D feature maps while training.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_dropout.hpp"

namespace loadstar::keras::layers {

/// Keras's `SpatialDropout3D`: each channel of each sample dropped whole with probability
/// `rate` in training (kept ones scaled by `1 / (1 - rate)`), the identity otherwise.
/// \code
/// SpatialDropout3D dropout(0.2);
/// \endcode
class SpatialDropout3D : public detail::SpatialDropout {
 public:
  explicit SpatialDropout3D(double rate, SpatialDropoutOptions options = {})
      : SpatialDropout("SpatialDropout3D", 3, rate, options) {}

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return from_keras_config(config, "SpatialDropout3D", 3);
  }
};

}  // namespace loadstar::keras::layers
