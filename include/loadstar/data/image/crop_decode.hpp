/// \file
/// `decode_jpeg_window` and `decode_random_resized_crop`: decoding only the part of a JPEG that a
/// crop keeps, at the smallest scale that still covers the output (libjpeg-turbo's
/// `jpeg_crop_scanline`, `jpeg_skip_scanlines` and `scale_num / 8`), where DALI and FFCV find their
/// CPU speed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "loadstar/data/image/decode.hpp"
#include "loadstar/data/image/ops.hpp"

namespace loadstar::image {

/// The pixels of `window` (in full-size coordinates) of a JPEG, decoded at scale `scale_eighths`
/// / 8 (1 to 8): the window's edges are rounded outwards at that scale, only its rows are decoded
/// and only the iMCU columns that hold it. At scale 8 the pixels are those of `decode_jpeg`
/// cropped to the window. Throws `ShapeError` for a window outside the image, `ConfigError` for a
/// scale outside 1..8 or bad channels, and `FormatError` for corrupt data.
inline Tensor<std::uint8_t> decode_jpeg_window(std::span<const std::uint8_t> bytes,
                                               const CropWindow& window, int channels = 0,
                                               const std::string& name = "jpeg",
                                               unsigned scale_eighths = 8) {
  detail::check_channels(name, channels, "0, 1 or 3 for a JPEG image", false);
  if (scale_eighths < 1 || scale_eighths > 8) {
    throw ConfigError(name + ": scale must be 1/8 to 8/8 but is " + std::to_string(scale_eighths) +
                      "/8");
  }
  detail::JpegReader reader(bytes, name);
  auto& info = reader.info();
  if (window.height == 0 || window.width == 0 || window.top + window.height > info.image_height ||
      window.left + window.width > info.image_width) {
    throw ShapeError(name + ": crop window of " + std::to_string(window.height) + "x" +
                     std::to_string(window.width) + " at (" + std::to_string(window.top) + ", " +
                     std::to_string(window.left) + ") is empty or outside the " +
                     std::to_string(info.image_height) + "x" + std::to_string(info.image_width) +
                     " image");
  }
  const std::size_t c = static_cast<std::size_t>(reader.set_channels(channels));
  info.scale_num = scale_eighths;
  info.scale_denom = 8;
  reader.call("cannot start decompressing", [&] { jpeg_start_decompress(&info); });
  auto scaled_floor = [&](std::size_t v) { return v * scale_eighths / 8; };
  auto scaled_ceil = [&](std::size_t v) { return (v * scale_eighths + 7) / 8; };
  const std::size_t y0 = std::min<std::size_t>(scaled_floor(window.top), info.output_height - 1);
  const std::size_t y1 =
      std::clamp<std::size_t>(scaled_ceil(window.top + window.height), y0 + 1, info.output_height);
  const std::size_t x0 = std::min<std::size_t>(scaled_floor(window.left), info.output_width - 1);
  const std::size_t x1 =
      std::clamp<std::size_t>(scaled_ceil(window.left + window.width), x0 + 1, info.output_width);
  // One more column on each side than the window: at the edges of a cropped decode, libjpeg-turbo
  // upsamples the chroma without its neighbours, so those columns differ from a full decode.
  auto x_offset = static_cast<JDIMENSION>(x0 > 0 ? x0 - 1 : 0);
  auto crop_width =
      static_cast<JDIMENSION>(std::min<std::size_t>(x1 + 1, info.output_width) - x_offset);
  reader.call("cannot crop the rows", [&] {
    if (crop_width < info.output_width) jpeg_crop_scanline(&info, &x_offset, &crop_width);
    if (y0 > 0) jpeg_skip_scanlines(&info, static_cast<JDIMENSION>(y0));
  });
  // The decoded rows are iMCU-aligned and wider than the window: read them, then keep the window.
  const std::size_t stride = std::size_t{info.output_width} * c;
  auto rows = Tensor<std::uint8_t>::uninitialized(Shape{y1 - y0, info.output_width, c});
  reader.set_first_row(static_cast<JDIMENSION>(y0));
  reader.read_rows(rows.data(), stride, static_cast<JDIMENSION>(y1));
  jpeg_abort_decompress(&info);
  const std::size_t skip = x0 - x_offset;
  auto out = Tensor<std::uint8_t>::uninitialized(Shape{y1 - y0, x1 - x0, c});
  for (std::size_t y = 0; y < y1 - y0; ++y) {
    std::copy_n(rows.data() + y * stride + skip * c, (x1 - x0) * c, out.data() + y * (x1 - x0) * c);
  }
  return out;
}

/// The smallest scale `m / 8` at which a `window` still has at least `height` x `width` pixels (8
/// when even the full size has fewer).
inline unsigned jpeg_scale_for(const CropWindow& window, std::size_t height, std::size_t width) {
  for (unsigned m = 1; m < 8; ++m) {
    if (window.height * m / 8 >= height && window.width * m / 8 >= width) return m;
  }
  return 8;
}

/// torchvision's `RandomResizedCrop` on encoded bytes: the window `random_resized_crop_window`
/// draws for the image's size; a JPEG decodes only that window at the smallest scale that keeps
/// at least the output's pixels (so the result is close to, not equal to, `random_resized_crop`
/// of the full decode when that scale is below 1), a PNG is decoded in full. The result is
/// `(height, width, channels)` float32.
inline Tensor<float> decode_random_resized_crop(std::span<const std::uint8_t> bytes,
                                                std::size_t height, std::size_t width,
                                                std::uint64_t seed, int channels = 0,
                                                const std::string& name = "image",
                                                const RandomResizedCropOptions& options = {}) {
  if (sniff_format(bytes) != ImageFormat::jpeg) {
    return random_resized_crop(decode_image(bytes, channels, name), height, width, seed, options);
  }
  if (height == 0 || width == 0) {
    throw ShapeError("random_resized_crop: the target size must be positive but is " +
                     std::to_string(height) + "x" + std::to_string(width));
  }
  std::size_t image_height = 0, image_width = 0;
  {
    detail::JpegReader header(bytes, name);
    image_height = header.info().image_height;
    image_width = header.info().image_width;
  }
  const auto window = random_resized_crop_window(image_height, image_width, seed, options);
  const unsigned scale = jpeg_scale_for(window, height, width);
  const auto pixels = decode_jpeg_window(bytes, window, channels, name, scale);
  // The window in the decoded pixels' coordinates: scaled, less the outward rounding.
  const float factor = static_cast<float>(scale) / 8.0f;
  const auto first_row = static_cast<float>(window.top * scale / 8);
  const auto first_column = static_cast<float>(window.left * scale / 8);
  return resize_box(pixels, static_cast<float>(window.top) * factor - first_row,
                    static_cast<float>(window.left) * factor - first_column,
                    static_cast<float>(window.height) * factor,
                    static_cast<float>(window.width) * factor, height, width, options.method);
}

}  // namespace loadstar::image
