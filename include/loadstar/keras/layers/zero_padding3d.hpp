/// \file
/// `ZeroPadding3D`: zero planes around a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `ZeroPadding3D` (channels_last or channels_first): `padding` gives the elements added as
/// zeros before and after each spatial axis, as Keras's `(padding_before, padding_after)` per axis.
/// \code
/// ZeroPadding3D pad({{{1, 1}, {0, 2}, {1, 0}}});
/// \endcode
class ZeroPadding3D : public detail::SpatialBoxLayer {
 public:
  explicit ZeroPadding3D(std::array<Edges, 3> padding = {{{1, 1}, {1, 1}, {1, 1}}},
                         SpatialOptions options = {})
      : SpatialBoxLayer("ZeroPadding3D", 3, false, padding, options) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json ZeroPadding3D::get_config() const {
  auto config = base_config();
  config["padding"] = edges_json();
  config["data_format"] = data_format();
  return config;
}

std::shared_ptr<Layer> ZeroPadding3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ZeroPadding3D");
  const auto edges =
      detail::config_edges(read, "padding", 3, std::array<Edges, 3>{{{1, 1}, {1, 1}, {1, 1}}});
  return detail::finish_layer(
      read, std::make_shared<ZeroPadding3D>(
                edges,
                SpatialOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                  : "channels_last",
                               .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
