// libFuzzer harness: decode_image and decode_png16 on any bytes (PNG seeds) with every channel
// count. Every outcome but an image or a loadstar::Error is a finding (a libpng error that escaped
// as a longjmp would be one).
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
    try {
      (void)loadstar::image::decode_png16(bytes, channels, "fuzz");
    } catch (const loadstar::Error&) {
    }
  }
  return 0;
}
