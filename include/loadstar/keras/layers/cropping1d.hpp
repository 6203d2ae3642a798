/// \file
/// `Cropping1D`: removes steps at the start and end of a sequence.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `Cropping1D` (channels_last): `cropping` gives the elements removed before and after
/// each spatial axis, as Keras's `(cropping_before, cropping_after)` per axis. \code Cropping1D
/// crop({1, 2});  // one step from the start, two from the end \endcode
class Cropping1D : public detail::SpatialBoxLayer {
 public:
  explicit Cropping1D(Edges cropping = {1, 1}, std::string name = {})
      : SpatialBoxLayer("Cropping1D", 1, true,
                        std::array<Edges, 3>{cropping, Edges{0, 0}, Edges{0, 0}},
                        SpatialOptions{.name = std::move(name)}) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json Cropping1D::get_config() const {
  auto config = base_config();
  config["cropping"] = edges_json();
  return config;
}

std::shared_ptr<Layer> Cropping1D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Cropping1D");
  const auto edges = detail::config_edges(read, "cropping", 1, std::array<Edges, 3>{{{1, 1}}});
  read.expect("data_format", nullptr, "Keras's Cropping1D has channels last");
  return detail::finish_layer(read,
                              std::make_shared<Cropping1D>(edges[0], detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
