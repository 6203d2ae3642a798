/// \file
/// CRC-32C (Castagnoli) and TFRecord's masked form: the framing of TFRecord files (TensorBoard
/// event files are TFRecord files).
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace loadstar::detail {

/// The byte-at-a-time table of CRC-32C's reflected polynomial 0x82F63B78 (RFC 3720, the CRC that
/// TFRecord uses; Debian packages no C++ library of it).
inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit)
      crc = (crc & 1U) != 0 ? (crc >> 1) ^ 0x82F63B78U : crc >> 1;
    table[i] = crc;
  }
  return table;
}();

/// CRC-32C of `bytes`: `crc32c("123456789") == 0xE3069283`.
constexpr std::uint32_t crc32c(std::string_view bytes) noexcept {
  std::uint32_t crc = 0xFFFFFFFFU;
#if defined(__SSE4_2__)
  // SSE 4.2's crc32 instruction computes the same polynomial 8 bytes at a time.
  if (!std::is_constant_evaluated()) {
    const char* p = bytes.data();
    std::size_t n = bytes.size();
    std::uint64_t wide = crc;
    for (; n >= 8; n -= 8, p += 8) {
      std::uint64_t word;
      std::memcpy(&word, p, 8);
      wide = _mm_crc32_u64(wide, word);
    }
    crc = static_cast<std::uint32_t>(wide);
    for (; n > 0; --n, ++p)
      crc = _mm_crc32_u8(crc, static_cast<unsigned char>(*p));
    return crc ^ 0xFFFFFFFFU;
  }
#endif
  for (const char c : bytes)
    crc = crc32c_table[(crc ^ static_cast<unsigned char>(c)) & 0xFFU] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFU;
}

/// TFRecord's masked CRC (tensorflow/core/lib/hash/crc32c.h `Mask`): rotated right by 15 bits
/// plus a constant, so that a CRC of data that itself holds CRCs stays well distributed.
constexpr std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8U;
}

static_assert(crc32c("123456789") == 0xE3069283U, "CRC-32C's check value (RFC 3720)");

}  // namespace loadstar::detail
