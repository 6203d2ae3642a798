/// \file
/// `CenterCrop`: crops the centre of images to a fixed height and width.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/image_resize.hpp"

namespace loadstar::keras::layers {

/// Keras's `CenterCrop` of channels_last images `(batch, h, w, c)` to `(batch, height, width, c)`:
/// the centred window (starting at `(h - height) / 2`, `(w - width) / 2`, rounded down); an image
/// smaller than the target on either axis is resized as Keras 3 does (`smart_resize`: the largest
/// centred box with the target's aspect ratio, resized bilinearly).
/// \code
/// CenterCrop centre(224, 224);
/// \endcode
class CenterCrop : public detail::ImageResizeLayer {
 public:
  LOADSTAR_DECL CenterCrop(std::size_t height, std::size_t width, std::string name = {});

  std::string class_name() const override { return "CenterCrop"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  LOADSTAR_DECL Box box(std::size_t h, std::size_t w) const override;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

CenterCrop::CenterCrop(std::size_t height, std::size_t width, std::string name)
    : ImageResizeLayer(std::move(name), height, width, detail::ResizeKind::bilinear) {
  if (height == 0 || width == 0) {
    throw ConfigError(label() + ": height and width must be positive but are " +
                      std::to_string(height) + " and " + std::to_string(width));
  }
}

detail::ImageResizeLayer::Box CenterCrop::box(std::size_t h, std::size_t w) const {
  if (h >= height_ && w >= width_) return {(h - height_) / 2, (w - width_) / 2, height_, width_};
  return aspect_box(h, w, height_, width_);
}

nlohmann::json CenterCrop::get_config() const {
  auto config = base_config();
  config["height"] = height_;
  config["width"] = width_;
  config["data_format"] = "channels_last";
  return config;
}

std::shared_ptr<Layer> CenterCrop::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "CenterCrop");
  if (read.has("data_format") && !read.find("data_format")->is_null() &&
      read.get<std::string>("data_format") != "channels_last") {
    read.fail("data_format", "null or \"channels_last\"");
  }
  return detail::finish_layer(read, std::make_shared<CenterCrop>(read.get<std::size_t>("height"),
                                                                 read.get<std::size_t>("width"),
                                                                 detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
