// libFuzzer harness: decode_image on any bytes (JPEG, BMP and GIF seeds) with every channel
// count, every frame of a GIF (decode_gif), the cropped and scaled JPEG decoding of
// decode_random_resized_crop, and the EXIF orientation reader.
// Every outcome but an image or a loadstar::Error is a finding (a libjpeg error that escaped as a
// longjmp would be one).
#include <cstddef>
#include <cstdint>
#include <loadstar/data/image.hpp>
#include <loadstar/error.hpp>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> bytes(data, size);
  for (int channels : {0, 1, 3, 4}) {
    try {
      (void)loadstar::image::decode_image(bytes, channels, "fuzz");
    } catch (const loadstar::Error&) {
    }
  }
  if (loadstar::image::sniff_format(bytes) == loadstar::image::ImageFormat::gif) {
    try {
      (void)loadstar::image::decode_gif(bytes, "fuzz");
    } catch (const loadstar::Error&) {
    }
  }
  const int orientation = loadstar::image::exif_orientation(bytes);
  if (orientation < 1 || orientation > 8) __builtin_trap();
  try {
    (void)loadstar::image::decode_random_resized_crop(bytes, 16, 16, size, 3, "fuzz");
  } catch (const loadstar::Error&) {
  }
  return 0;
}
