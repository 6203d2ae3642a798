/// \file
/// `UpSampling1D`: repeats each step of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `UpSampling1D`: each spatial axis enlarged by its whole factor in `size`, every element
/// repeated (nearest neighbour), channels_last.
/// \code
/// UpSampling1D up(3);
/// \endcode
class UpSampling1D : public detail::SpatialRepeatLayer {
 public:
  explicit UpSampling1D(std::size_t size = 2, std::string name = {})
      : SpatialRepeatLayer("UpSampling1D", 1, std::array<std::size_t, 3>{size, 1, 1},
                           SpatialOptions{.name = std::move(name)}) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json UpSampling1D::get_config() const {
  auto config = base_config();
  config["size"] = factors_[0];
  return config;
}

std::shared_ptr<Layer> UpSampling1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "UpSampling1D");
  read.expect("data_format", nullptr, "Keras's UpSampling1D has channels last");
  const std::size_t size = detail::config_size1(read, "size", 2);
  return detail::finish_layer(read,
                              std::make_shared<UpSampling1D>(size, detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
