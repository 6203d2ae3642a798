/// \file
/// `SpatialDropout2D`: drops whole channels of 2-D feature maps while training.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_dropout.hpp"

namespace loadstar::keras::layers {

/// Keras's `SpatialDropout2D`: each channel of each sample dropped whole with probability
/// `rate` in training (kept ones scaled by `1 / (1 - rate)`), the identity otherwise.
/// \code
/// SpatialDropout2D dropout(0.2);
/// \endcode
class SpatialDropout2D : public detail::SpatialDropout {
 public:
  explicit SpatialDropout2D(double rate, SpatialDropoutOptions options = {})
      : SpatialDropout("SpatialDropout2D", 2, rate, options) {}

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return from_keras_config(config, "SpatialDropout2D", 2);
  }
};

}  // namespace loadstar::keras::layers
