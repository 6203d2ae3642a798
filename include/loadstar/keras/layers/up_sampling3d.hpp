/// \file
/// `UpSampling3D`: repeats each voxel of a volume.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/spatial_box.hpp"

namespace loadstar::keras::layers {

/// Keras's `UpSampling3D`: each spatial axis enlarged by its whole factor in `size`, every element
/// repeated (nearest neighbour), channels_last or channels_first.
/// \code
/// UpSampling3D up({2, 1, 3});
/// \endcode
class UpSampling3D : public detail::SpatialRepeatLayer {
 public:
  explicit UpSampling3D(std::array<std::size_t, 3> size = {2, 2, 2}, SpatialOptions options = {})
      : SpatialRepeatLayer("UpSampling3D", 3, size, options) {}

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

nlohmann::json UpSampling3D::get_config() const {
  auto config = base_config();
  config["size"] = {factors_[0], factors_[1], factors_[2]};
  config["data_format"] = data_format();
  return config;
}

std::shared_ptr<Layer> UpSampling3D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "UpSampling3D");
  std::array<std::size_t, 3> size{2, 2, 2};
  if (read.has("size")) {
    const nlohmann::json& v = *read.find("size");
    const auto positive = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() > 0;
    };
    if (positive(v)) {
      size = {v.get<std::size_t>(), v.get<std::size_t>(), v.get<std::size_t>()};
    } else if (v.is_array() && v.size() == 3 && std::all_of(v.begin(), v.end(), positive)) {
      size = {v[0].get<std::size_t>(), v[1].get<std::size_t>(), v[2].get<std::size_t>()};
    } else {
      read.fail("size", "a positive integer or a list of three");
    }
  }
  return detail::finish_layer(
      read,
      std::make_shared<UpSampling3D>(
          size, SpatialOptions{.data_format = detail::config_channels_first(read) ? "channels_first"
                                                                                  : "channels_last",
                               .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
