/// \file
/// `Cropping3D`: removes planes at the edges of a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `Cropping3D` (channels_last or channels_first): `cropping` gives the elements removed
/// before and after each spatial axis, as Keras's `(cropping_before, cropping_after)` per axis.
/// \code
/// Cropping3D crop({{{1, 1}, {0, 2}, {1, 0}}});
/// \endcode
class Cropping3D : public detail::SpatialBoxLayer {
 public:
  explicit Cropping3D(std::array<Edges, 3> cropping = {{{1, 1}, {1, 1}, {1, 1}}},
                      SpatialOptions options = {})
      : SpatialBoxLayer("Cropping3D", 3, true, cropping, options) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json Cropping3D::get_config() const {
  auto config = base_config();
  config["cropping"] = edges_json();
  config["data_format"] = data_format();
  return config;
}

std::shared_ptr<Layer> Cropping3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Cropping3D");
  const auto edges =
      detail::config_edges(read, "cropping", 3, std::array<Edges, 3>{{{1, 1}, {1, 1}, {1, 1}}});
  return detail::finish_layer(
      read, std::make_shared<Cropping3D>(
                edges,
                SpatialOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                  : "channels_last",
                               .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
