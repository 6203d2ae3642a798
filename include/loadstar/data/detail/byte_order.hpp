/// \file
/// Big-endian to native conversion in place, for the IDX and other big-endian file formats.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace loadstar::detail {

/// Reverses the bytes of each of `count` elements of `Size` bytes at `bytes` (memcpy keeps the
/// access free of aliasing problems; compilers turn the loop into bswap instructions).
template <std::size_t Size>
void swap_bytes_in_place(unsigned char* bytes, std::size_t count) noexcept {
  static_assert(Size == 1 || Size == 2 || Size == 4 || Size == 8,
                "element size must be 1, 2, 4 or 8");
  if constexpr (Size == 2) {
    for (std::size_t i = 0; i < count; ++i) {
      std::uint16_t v;
      std::memcpy(&v, bytes + i * 2, 2);
      v = __builtin_bswap16(v);
      std::memcpy(bytes + i * 2, &v, 2);
    }
  } else if constexpr (Size == 4) {
    for (std::size_t i = 0; i < count; ++i) {
      std::uint32_t v;
      std::memcpy(&v, bytes + i * 4, 4);
      v = __builtin_bswap32(v);
      std::memcpy(bytes + i * 4, &v, 4);
    }
  } else if constexpr (Size == 8) {
    for (std::size_t i = 0; i < count; ++i) {
      std::uint64_t v;
      std::memcpy(&v, bytes + i * 8, 8);
      v = __builtin_bswap64(v);
      std::memcpy(bytes + i * 8, &v, 8);
    }
  }
}

/// Converts `count` big-endian elements of `Size` bytes to native byte order, in place.
template <std::size_t Size>
void big_endian_to_native(unsigned char* bytes, std::size_t count) noexcept {
  if constexpr (std::endian::native == std::endian::little) swap_bytes_in_place<Size>(bytes, count);
}

/// A big-endian unsigned 32-bit integer at `bytes`.
inline std::uint32_t load_big_endian_u32(const unsigned char* bytes) noexcept {
  return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
         (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
}

}  // namespace loadstar::detail
