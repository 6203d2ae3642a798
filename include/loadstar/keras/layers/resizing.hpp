/// \file
/// `Resizing`: resizes images to a fixed height and width.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/image_resize.hpp"

namespace loadstar::keras::layers {

/// `Resizing`'s Keras arguments after `height` and `width`, with Keras's defaults.
struct ResizingOptions {
  /// `"bilinear"`, `"nearest"`, `"bicubic"`, `"lanczos3"`, `"lanczos5"` or `"area"`
  /// (`detail::axis_taps` says how each samples).
  std::string interpolation = "bilinear";
  /// Resize the largest centred box with the target's aspect ratio instead of the whole image.
  bool crop_to_aspect_ratio = false;
  /// Pad the image with `fill_value` on both sides of one axis to the target's aspect ratio
  /// first (at most one of the two aspect-ratio options).
  bool pad_to_aspect_ratio = false;
  /// The padding's fill: `"constant"`, the only mode Keras's resize has.
  std::string fill_mode = "constant";
  float fill_value = 0.0F;
  /// Widen the kernel to a low-pass filter when shrinking (bilinear, bicubic, lanczos3,
  /// lanczos5; nearest and area are unchanged), as `tf.image.resize`.
  bool antialias = false;
  std::string name = {};
};

/// Keras's `Resizing` of channels_last images `(batch, h, w, c)` to `(batch, height, width, c)`
/// as `tf.image.resize` (half-pixel centres), after Keras's crop or pad to the target's aspect
/// ratio when asked.
/// \code
/// Resizing to_224(224, 224);
/// Resizing blocky(32, 32, {.interpolation = "nearest", .crop_to_aspect_ratio = true});
/// Resizing smooth(64, 64, {.interpolation = "lanczos3", .antialias = true});
/// \endcode
class Resizing : public detail::ImageResizeLayer {
 public:
  LOADSTAR_DECL Resizing(std::size_t height, std::size_t width, ResizingOptions options = {});

  std::string class_name() const override { return "Resizing"; }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 protected:
  LOADSTAR_DECL Box box(std::size_t h, std::size_t w) const override;

 private:
  ResizingOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Resizing::Resizing(std::size_t height, std::size_t width, ResizingOptions options)
    : ImageResizeLayer(options.name, height, width, detail::ResizeKind::bilinear, options.antialias,
                       options.fill_value),
      options_(std::move(options)) {
  kind_ = detail::resize_kind(options_.interpolation, label());
  if (height == 0 || width == 0) {
    throw ConfigError(label() + ": height and width must be positive but are " +
                      std::to_string(height) + " and " + std::to_string(width));
  }
  if (options_.crop_to_aspect_ratio && options_.pad_to_aspect_ratio) {
    throw ConfigError(label() +
                      ": expected at most one of crop_to_aspect_ratio and pad_to_aspect_ratio "
                      "but both are true");
  }
  if (options_.fill_mode != "constant") {
    throw ConfigError(label() +
                      ": fill_mode must be \"constant\" (Keras's resize has no other) "
                      "but is \"" +
                      options_.fill_mode + "\"");
  }
}

detail::ImageResizeLayer::Box Resizing::box(std::size_t h, std::size_t w) const {
  if (options_.crop_to_aspect_ratio) return aspect_box(h, w, height_, width_);
  if (options_.pad_to_aspect_ratio) return padded_box(h, w, height_, width_);
  return Box{0, 0, h, w};
}

nlohmann::json Resizing::get_config() const {
  auto config = base_config();
  config["height"] = height_;
  config["width"] = width_;
  config["interpolation"] = options_.interpolation;
  config["crop_to_aspect_ratio"] = options_.crop_to_aspect_ratio;
  config["pad_to_aspect_ratio"] = options_.pad_to_aspect_ratio;
  config["fill_mode"] = options_.fill_mode;
  config["fill_value"] = options_.fill_value;
  config["antialias"] = options_.antialias;
  config["data_format"] = "channels_last";
  return config;
}

std::shared_ptr<Layer> Resizing::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Resizing");
  if (read.has("data_format") && !read.find("data_format")->is_null() &&
      read.get<std::string>("data_format") != "channels_last") {
    read.fail("data_format", "null or \"channels_last\"");
  }
  return detail::finish_layer(
      read, std::make_shared<Resizing>(
                read.get<std::size_t>("height"), read.get<std::size_t>("width"),
                ResizingOptions{.interpolation = read.get("interpolation", std::string("bilinear")),
                                .crop_to_aspect_ratio = read.get("crop_to_aspect_ratio", false),
                                .pad_to_aspect_ratio = read.get("pad_to_aspect_ratio", false),
                                .fill_mode = read.get("fill_mode", std::string("constant")),
                                .fill_value = read.get("fill_value", 0.0F),
                                .antialias = read.get("antialias", false),
                                .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
