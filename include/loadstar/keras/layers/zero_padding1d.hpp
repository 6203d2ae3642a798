/// \file
/// `ZeroPadding1D`: zero steps at the start and end of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `ZeroPadding1D` (channels_last or channels_first): `padding` gives the elements added as
/// zeros before and after each spatial axis, as Keras's `(padding_before, padding_after)` per axis.
/// \code
/// ZeroPadding1D pad({2, 1});
/// \endcode
class ZeroPadding1D : public detail::SpatialBoxLayer {
 public:
  explicit ZeroPadding1D(Edges padding = {1, 1}, SpatialOptions options = {})
      : SpatialBoxLayer("ZeroPadding1D", 1, false,
                        std::array<Edges, 3>{padding, Edges{0, 0}, Edges{0, 0}}, options) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json ZeroPadding1D::get_config() const {
  auto config = base_config();
  config["padding"] = edges_json();
  // Keras 3 added data_format; tf.keras has none, so the default is left out.
  if (channels_first_) config["data_format"] = data_format();
  return config;
}

std::shared_ptr<Layer> ZeroPadding1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ZeroPadding1D");
  const auto edges = detail::config_edges(read, "padding", 1, std::array<Edges, 3>{{{1, 1}}});
  return detail::finish_layer(
      read, std::make_shared<ZeroPadding1D>(
                edges[0],
                SpatialOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                  : "channels_last",
                               .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
