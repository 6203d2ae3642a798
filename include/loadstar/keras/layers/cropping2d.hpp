/// \file
/// `Cropping2D`: removes rows and columns at the edges of an image.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `Cropping2D` (channels_last or channels_first): `cropping` gives the elements removed
/// before and after each spatial axis, as Keras's `(cropping_before, cropping_after)` per axis.
/// \code
/// Cropping2D crop({{{1, 1}, {2, 0}}});  // ((top, bottom), (left, right))
/// \endcode
class Cropping2D : public detail::SpatialBoxLayer {
 public:
  explicit Cropping2D(std::array<Edges, 2> cropping = {}, SpatialOptions options = {})
      : SpatialBoxLayer("Cropping2D", 2, true,
                        std::array<Edges, 3>{cropping[0], cropping[1], Edges{0, 0}}, options) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json Cropping2D::get_config() const {
  auto config = base_config();
  config["cropping"] = edges_json();
  config["data_format"] = data_format();
  return config;
}

std::shared_ptr<Layer> Cropping2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Cropping2D");
  const auto edges = detail::config_edges(read, "cropping", 2, std::array<Edges, 3>{});
  return detail::finish_layer(
      read, std::make_shared<Cropping2D>(
                std::array<Edges, 2>{edges[0], edges[1]},
                SpatialOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                  : "channels_last",
                               .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
