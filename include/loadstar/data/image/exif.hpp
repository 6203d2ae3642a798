/// \file
/// `exif_orientation` and `apply_exif_orientation`: the opt-in for JPEGs whose EXIF orientation
/// tag says how to turn the stored pixels. `decode_image` and the Keras utilities leave the pixels
/// as stored, as tf.io and Keras do; PIL's `ImageOps.exif_transpose` is what these reproduce.
/// \code
/// auto upright = image::apply_exif_orientation(image::decode_image(bytes, 3),
///                                              image::exif_orientation(bytes));
/// \endcode
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "loadstar/data/image/ops.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::image {

/// The EXIF orientation (1 to 8) of JPEG bytes: tag 0x0112 of the first IFD of the APP1 "Exif"
/// segment; 1 (as stored) when there is none or it cannot be read, as PIL's `exif_transpose`
/// treats an unreadable EXIF block.
inline int exif_orientation(std::span<const std::uint8_t> bytes) noexcept {
  const std::size_t n = bytes.size();
  if (n < 4 || bytes[0] != 0xff || bytes[1] != 0xd8) return 1;
  std::size_t at = 2;
  while (at + 4 <= n && bytes[at] == 0xff) {
    const std::uint8_t marker = bytes[at + 1];
    if (marker == 0xda || marker == 0xd9) break;  // the image data: no EXIF after it
    const std::size_t length = (std::size_t{bytes[at + 2]} << 8) | bytes[at + 3];
    if (length < 2 || at + 2 + length > n) return 1;
    const std::size_t body = at + 4, body_end = at + 2 + length;
    if (marker == 0xe1 && body_end - body >= 14 && std::memcmp(&bytes[body], "Exif\0\0", 6) == 0) {
      const std::size_t tiff = body + 6;
      const bool little = bytes[tiff] == 'I' && bytes[tiff + 1] == 'I';
      const bool big = bytes[tiff] == 'M' && bytes[tiff + 1] == 'M';
      if (!little && !big) return 1;
      auto u16 = [&](std::size_t p) -> std::uint32_t {
        return little ? bytes[p] | (bytes[p + 1] << 8) : (bytes[p] << 8) | bytes[p + 1];
      };
      auto u32 = [&](std::size_t p) -> std::uint32_t {
        return little ? u16(p) | (u16(p + 2) << 16) : (u16(p) << 16) | u16(p + 2);
      };
      const std::uint32_t ifd = u32(tiff + 4);
      if (ifd > body_end - tiff || body_end - tiff - ifd < 2) return 1;
      const std::size_t entries = tiff + ifd;
      const std::uint32_t count = u16(entries);
      for (std::uint32_t e = 0; e < count; ++e) {
        const std::size_t entry = entries + 2 + 12 * std::size_t{e};
        if (entry + 12 > body_end) return 1;
        if (u16(entry) == 0x0112 && u16(entry + 2) == 3) {
          const std::uint32_t value = u16(entry + 8);
          return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
        }
      }
      return 1;
    }
    at = body_end;
  }
  return 1;
}

/// The image with its rows and columns exchanged.
template <TensorElement T>
Tensor<T> transpose_image(const Tensor<T>& image) {
  detail::check_image(image, "transpose_image");
  const std::size_t h = image.dim(0), w = image.dim(1), c = image.dim(2);
  auto out = Tensor<T>::uninitialized(Shape{w, h, c});
  for (std::size_t y = 0; y < h; ++y)
    for (std::size_t x = 0; x < w; ++x)
      std::copy_n(image.begin() + (y * w + x) * c, c, out.begin() + (x * h + y) * c);
  return out;
}

/// The image turned upright for EXIF orientation `orientation` (1 to 8), as PIL's
/// `ImageOps.exif_transpose`: 2 mirrors, 3 turns by 180 degrees, 4 flips, 5 transposes, 6 turns
/// clockwise, 7 transposes across the other diagonal, 8 turns anticlockwise. Throws `ConfigError`
/// for another value.
template <TensorElement T>
Tensor<T> apply_exif_orientation(const Tensor<T>& image, int orientation) {
  switch (orientation) {
    case 1:
      return image;
    case 2:
      return flip_left_right(image);
    case 3:
      return flip_up_down(flip_left_right(image));
    case 4:
      return flip_up_down(image);
    case 5:
      return transpose_image(image);
    case 6:
      return flip_left_right(transpose_image(image));
    case 7:
      return flip_up_down(flip_left_right(transpose_image(image)));
    case 8:
      return flip_up_down(transpose_image(image));
    default:
      throw ConfigError("apply_exif_orientation: orientation must be 1 to 8 but is " +
                        std::to_string(orientation));
  }
}

}  // namespace loadstar::image
