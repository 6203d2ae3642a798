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

/// CRC-32C of `bytes` a byte at a time through `crc32c_table`: the portable definition.
constexpr std::uint32_t crc32c_portable(std::string_view bytes) noexcept {
  std::uint32_t crc = 0xFFFFFFFFU;
  for (const char c : bytes)
    crc = crc32c_table[(crc ^ static_cast<unsigned char>(c)) & 0xFFU] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFU;
}

#if defined(__SSE4_2__)
/// The bytes each of the three interleaved chains of `crc32c` covers per round.
inline constexpr std::size_t crc32c_block = 1024;

/// The CRC register after `crc32c_block` zero bytes from register `r`, a linear map of `r`,
/// tabulated a byte of `r` at a time: `shift(r) = t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ ...`.
/// It joins chains: the register over `A` then `B` is `shift(f(r, A)) ^ f(0, B)` when `B` is
/// `crc32c_block` bytes long, since the register update is linear.
inline const std::array<std::array<std::uint32_t, 256>, 4>& crc32c_shift_table() {
  static const auto table = [] {
    std::array<std::uint32_t, 32> basis{};  // shift() of each single bit
    for (int bit = 0; bit < 32; ++bit) {
      std::uint32_t r = 1U << bit;
      for (std::size_t i = 0; i < crc32c_block; ++i)
        r = crc32c_table[r & 0xFFU] ^ (r >> 8);
      basis[static_cast<std::size_t>(bit)] = r;
    }
    std::array<std::array<std::uint32_t, 256>, 4> t{};
    for (std::size_t k = 0; k < 4; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t value = 0;
        for (std::uint32_t bit = 0; bit < 8; ++bit)
          if ((b >> bit) & 1U) value ^= basis[8 * k + bit];
        t[k][b] = value;
      }
    }
    return t;
  }();
  return table;
}
#endif

/// CRC-32C of `bytes`: `crc32c("123456789") == 0xE3069283`.
constexpr std::uint32_t crc32c(std::string_view bytes) noexcept {
#if defined(__SSE4_2__)
  // SSE 4.2's crc32 instruction computes the same polynomial 8 bytes at a time. One chain waits
  // on the instruction's latency (3 cycles); three chains over consecutive blocks, joined through
  // the shift table, keep it busy every cycle.
  if (!std::is_constant_evaluated()) {
    const char* p = bytes.data();
    std::size_t n = bytes.size();
    std::uint64_t crc = 0xFFFFFFFFU;
    const auto load = [](const char* at) {
      std::uint64_t word;
      std::memcpy(&word, at, 8);
      return word;
    };
    if (n >= 3 * crc32c_block) {
      const auto& shift = crc32c_shift_table();
      const auto shifted = [&shift](std::uint64_t r) {
        return static_cast<std::uint64_t>(shift[0][r & 0xFFU] ^ shift[1][(r >> 8) & 0xFFU] ^
                                          shift[2][(r >> 16) & 0xFFU] ^
                                          shift[3][(r >> 24) & 0xFFU]);
      };
      for (; n >= 3 * crc32c_block; n -= 3 * crc32c_block, p += 3 * crc32c_block) {
        std::uint64_t a = crc, b = 0, c = 0;
        for (std::size_t i = 0; i < crc32c_block; i += 8) {
          a = _mm_crc32_u64(a, load(p + i));
          b = _mm_crc32_u64(b, load(p + crc32c_block + i));
          c = _mm_crc32_u64(c, load(p + 2 * crc32c_block + i));
        }
        crc = shifted(shifted(a) ^ b) ^ c;
      }
    }
    for (; n >= 8; n -= 8, p += 8)
      crc = _mm_crc32_u64(crc, load(p));
    auto narrow = static_cast<std::uint32_t>(crc);
    for (; n > 0; --n, ++p)
      narrow = _mm_crc32_u8(narrow, static_cast<unsigned char>(*p));
    return narrow ^ 0xFFFFFFFFU;
  }
#endif
  return crc32c_portable(bytes);
}

/// TFRecord's masked CRC (tensorflow/core/lib/hash/crc32c.h `Mask`): rotated right by 15 bits
/// plus a constant, so that a CRC of data that itself holds CRCs stays well distributed.
constexpr std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8U;
}

static_assert(crc32c("123456789") == 0xE3069283U, "CRC-32C's check value (RFC 3720)");

}  // namespace loadstar::detail
