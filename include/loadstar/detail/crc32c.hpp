/// \file
/// CRC-32C (Castagnoli) and TFRecord's masked form: the framing of TFRecord files (TensorBoard
/// event files are TFRecord files).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// SSE 4.2's crc32 instruction and AVX-512's carry-less multiplication, chosen at run time
// (`crc32c_level`): GCC and Clang compile a function for a target its translation unit was not
// compiled for (no -msse4.2 or -march=native needed) with `__attribute__((target))`.
#define LOADSTAR_CRC32C_X86 1
#include <immintrin.h>
#else
#define LOADSTAR_CRC32C_X86 0
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

/// `x^n mod P` for CRC-32C's polynomial `P` (0x1EDC6F41 plus `x^32`), bit `i` the coefficient of
/// `x^i` (the unreflected form).
constexpr std::uint32_t crc32c_power(std::size_t n) noexcept {
  // Square and multiply, products reduced a bit at a time (Horner's rule).
  const auto multiply = [](std::uint32_t a, std::uint32_t b) {
    std::uint64_t r = 0;
    for (int i = 31; i >= 0; --i) {
      r <<= 1;
      if ((r >> 32) != 0) r ^= 0x11EDC6F41ULL;
      if ((b >> i) & 1U) r ^= a;
    }
    return static_cast<std::uint32_t>(r);
  };
  std::uint32_t result = 1, square = 2;  // x^0, x^1
  for (; n > 0; n >>= 1) {
    if ((n & 1U) != 0) result = multiply(result, square);
    square = multiply(square, square);
  }
  return result;
}

/// The CRC register after `Block` zero bytes from register `r`, a linear map of `r` (the register
/// update is linear over GF(2)), tabulated a byte of `r` at a time:
/// `shift(r) = t[0][r & 0xFF] ^ t[1][(r >> 8) & 0xFF] ^ t[2][...] ^ t[3][r >> 24]`. It joins
/// chains: the register over `A` then `B` is `shift(f(r, A)) ^ f(0, B)` when `B` is `Block` bytes
/// long, since `f(r, B) = shift(r) ^ f(0, B)`. As a polynomial, register bit `b` the coefficient
/// of `x^(31-b)`, `shift(r)` is `r x^(8 Block) mod P`: the columns are `x^(31-b+8 Block) mod P`.
/// (So, not by running the table over `Block` zero bytes 32 times: a compiler evaluates that
/// far more slowly in every translation unit.)
template <std::size_t Block>
inline constexpr std::array<std::array<std::uint32_t, 256>, 4> crc32c_shift_table = [] {
  std::array<std::uint32_t, 32> basis{};           // shift() of each single bit
  std::uint64_t column = crc32c_power(8 * Block);  // bit 31's
  for (std::size_t b = 32; b-- > 0;) {
    std::uint32_t reflected = 0;
    for (std::size_t i = 0; i < 32; ++i)
      if ((column >> i) & 1U) reflected |= 1U << (31 - i);
    basis[b] = reflected;
    column <<= 1;
    if ((column >> 32) != 0) column ^= 0x11EDC6F41ULL;
  }
  std::array<std::array<std::uint32_t, 256>, 4> t{};
  for (std::size_t k = 0; k < 4; ++k) {
    for (std::uint32_t byte = 1; byte < 256; ++byte) {
      const auto low = static_cast<std::size_t>(std::countr_zero(byte));
      t[k][byte] = t[k][byte & (byte - 1)] ^ basis[8 * k + low];
    }
  }
  return t;
}();

template <std::size_t Block>
constexpr std::uint32_t crc32c_shift(std::uint32_t r) noexcept {
  const auto& t = crc32c_shift_table<Block>;
  return t[0][r & 0xFFU] ^ t[1][(r >> 8) & 0xFFU] ^ t[2][(r >> 16) & 0xFFU] ^ t[3][r >> 24];
}

/// Moves the CRC register `crc` (the running value, not inverted) over `bytes` a byte at a time.
constexpr std::uint32_t crc32c_update_portable(std::uint32_t crc, std::string_view bytes) noexcept {
  for (const char c : bytes)
    crc = crc32c_table[(crc ^ static_cast<unsigned char>(c)) & 0xFFU] ^ (crc >> 8);
  return crc;
}

#if LOADSTAR_CRC32C_X86
/// The bytes each of the three interleaved chains of `crc32c_update_instruction` covers per
/// round: long rounds for the bulk, short ones for most of what is left of it.
inline constexpr std::size_t crc32c_long_block = 1024;
inline constexpr std::size_t crc32c_short_block = 128;

/// One round of three chains over the `3 * Block` bytes at `p` from register `crc`: `crc` goes on
/// over the first block while the chains over the second and third start from 0, and
/// `crc32c_shift` joins them.
template <std::size_t Block>
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_round(std::uint32_t crc,
                                                                    const char* p) noexcept {
  std::uint64_t a = crc, b = 0, c = 0;
  for (std::size_t i = 0; i < Block; i += 8) {
    std::uint64_t x, y, z;
    std::memcpy(&x, p + i, 8);
    std::memcpy(&y, p + Block + i, 8);
    std::memcpy(&z, p + 2 * Block + i, 8);
    a = _mm_crc32_u64(a, x);
    b = _mm_crc32_u64(b, y);
    c = _mm_crc32_u64(c, z);
  }
  const std::uint32_t ab =
      crc32c_shift<Block>(static_cast<std::uint32_t>(a)) ^ static_cast<std::uint32_t>(b);
  return crc32c_shift<Block>(ab) ^ static_cast<std::uint32_t>(c);
}

/// `crc32c_update_portable` through SSE 4.2's crc32 instruction, 8 bytes at a time. One chain
/// waits on the instruction's latency (3 cycles) and does a third of what the core can; three
/// chains over consecutive blocks keep it busy every cycle.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_update_instruction(
    std::uint32_t crc, std::string_view bytes) noexcept {
  const char* p = bytes.data();
  std::size_t n = bytes.size();
  for (; n >= 3 * crc32c_long_block; n -= 3 * crc32c_long_block, p += 3 * crc32c_long_block)
    crc = crc32c_round<crc32c_long_block>(crc, p);
  for (; n >= 3 * crc32c_short_block; n -= 3 * crc32c_short_block, p += 3 * crc32c_short_block)
    crc = crc32c_round<crc32c_short_block>(crc, p);
  std::uint64_t wide = crc;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    wide = _mm_crc32_u64(wide, word);
  }
  crc = static_cast<std::uint32_t>(wide);
  for (; n > 0; --n, ++p)
    crc = _mm_crc32_u8(crc, static_cast<unsigned char>(*p));
  return crc;
}

/// `crc32c_power(n)` placed for PCLMULQDQ on reflected data: the coefficient of `x^i` at bit
/// `63 - i`.
constexpr std::uint64_t crc32c_fold_constant(std::size_t n) noexcept {
  const std::uint32_t power = crc32c_power(n);
  std::uint64_t reflected = 0;
  for (std::size_t i = 0; i < 32; ++i)
    if ((power >> i) & 1U) reflected |= std::uint64_t{1} << (63 - i);
  return reflected;
}

/// The bytes `crc32c_update_folded` takes per round: four 64-byte registers.
inline constexpr std::size_t crc32c_fold_round = 256;

#define LOADSTAR_CRC32C_FOLD_TARGET \
  __attribute__((target("sse4.2,pclmul,avx512f,avx512vl,vpclmulqdq")))

/// `a` moved by the distance `k` holds the constants of, xored into `b`, in each 128-bit lane.
LOADSTAR_CRC32C_FOLD_TARGET inline __m512i crc32c_fold(__m512i a, __m512i k, __m512i b) noexcept {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(a, k, 0x00),
                                   _mm512_clmulepi64_epi128(a, k, 0x11), b, 0x96);
}
LOADSTAR_CRC32C_FOLD_TARGET inline __m128i crc32c_fold(__m128i a, __m128i k, __m128i b) noexcept {
  return _mm_ternarylogic_epi64(_mm_clmulepi64_si128(a, k, 0x00), _mm_clmulepi64_si128(a, k, 0x11),
                                b, 0x96);
}
/// The constants that move a 128-bit piece `Distance` bits on: `high` for its high half (the
/// first 8 bytes), `low` for its low half.
template <std::size_t Distance>
struct Crc32cFold {
  static constexpr auto high = static_cast<long long>(crc32c_fold_constant(Distance + 63));
  static constexpr auto low = static_cast<long long>(crc32c_fold_constant(Distance - 1));
};
template <std::size_t Distance>
LOADSTAR_CRC32C_FOLD_TARGET inline __m128i crc32c_fold_constants() noexcept {
  return _mm_set_epi64x(Crc32cFold<Distance>::low, Crc32cFold<Distance>::high);
}
template <std::size_t Distance>
LOADSTAR_CRC32C_FOLD_TARGET inline __m512i crc32c_fold_constants_512() noexcept {
  constexpr long long high = Crc32cFold<Distance>::high, low = Crc32cFold<Distance>::low;
  return _mm512_set_epi64(low, high, low, high, low, high, low, high);
}

/// The 64 bytes at `p + at`, stored to `out + at` too with `Copy`.
template <bool Copy>
LOADSTAR_CRC32C_FOLD_TARGET inline __m512i crc32c_fold_load(const char* p, char* out,
                                                            std::size_t at) noexcept {
  const __m512i v = _mm512_loadu_si512(p + at);
  if constexpr (Copy) {
    _mm512_storeu_si512(out + at, v);
  } else {
    (void)out;
  }
  return v;
}

/// Moves the CRC register `crc` over the first `n` bytes at `p` (`n` a positive multiple of
/// `crc32c_fold_round`) by folding with carry-less multiplication (AVX-512's VPCLMULQDQ), 64
/// bytes per instruction pair where the crc32 instruction takes 8.
///
/// The math: read the message as a polynomial over GF(2), first bit highest (reflected in
/// memory: bit 0 of byte 0 first). The register after it, from register 0, is determined by the
/// message mod `P`, so any shorter polynomial congruent to it, placed at its end, gives the same
/// register. A 128-bit piece `A = H x^64 + L` that lies `D` bits before a piece `B` contributes
/// `A x^D`, congruent to `H (x^(D+64) mod P) + L (x^D mod P)`: two 64x32-bit carry-less products
/// of under 96 bits, which xor into `B`. On reflected data PCLMULQDQ's 127-bit product lands one
/// bit short of the 128-bit piece's top, a factor of `x`, so the constants are `x^(D+63)` and
/// `x^(D-1)`. Folding every piece onto the last 16 bytes leaves a polynomial congruent to the
/// message, whose register the crc32 instruction computes from 0. A starting register `crc` is
/// the same as 0 with `crc` xored into the first 4 bytes. With `Copy`, each 64 bytes loaded are
/// also stored to `out`.
template <bool Copy = false>
LOADSTAR_CRC32C_FOLD_TARGET inline std::uint32_t crc32c_update_folded(
    std::uint32_t crc, const char* p, std::size_t n, char* out = nullptr) noexcept {
  // Each 128-bit lane of the four registers moves 2048 bits (one round) per fold.
  const __m512i k_round = crc32c_fold_constants_512<2048>();
  const __m512i k_register = crc32c_fold_constants_512<512>();
  __m512i a0 = crc32c_fold_load<Copy>(p, out, 0);
  __m512i a1 = crc32c_fold_load<Copy>(p, out, 64);
  __m512i a2 = crc32c_fold_load<Copy>(p, out, 128);
  __m512i a3 = crc32c_fold_load<Copy>(p, out, 192);
  a0 = _mm512_xor_si512(a0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(crc))));
  for (std::size_t i = crc32c_fold_round; i < n; i += crc32c_fold_round) {
    a0 = crc32c_fold(a0, k_round, crc32c_fold_load<Copy>(p, out, i));
    a1 = crc32c_fold(a1, k_round, crc32c_fold_load<Copy>(p, out, i + 64));
    a2 = crc32c_fold(a2, k_round, crc32c_fold_load<Copy>(p, out, i + 128));
    a3 = crc32c_fold(a3, k_round, crc32c_fold_load<Copy>(p, out, i + 192));
  }
  // The four registers onto the last, 512 bits apart; then its four lanes onto its last.
  a1 = crc32c_fold(a0, k_register, a1);
  a2 = crc32c_fold(a1, k_register, a2);
  a3 = crc32c_fold(a2, k_register, a3);
  // Through memory: GCC 12 warns (-Wuninitialized) inside `_mm512_extracti32x4_epi32`.
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, a3);
  __m128i last = lanes[3];
  last = crc32c_fold(lanes[0], crc32c_fold_constants<384>(), last);
  last = crc32c_fold(lanes[1], crc32c_fold_constants<256>(), last);
  last = crc32c_fold(lanes[2], crc32c_fold_constants<128>(), last);
  const auto low = static_cast<std::uint64_t>(_mm_cvtsi128_si64(last));
  const auto high = static_cast<std::uint64_t>(_mm_extract_epi64(last, 1));
  return static_cast<std::uint32_t>(_mm_crc32_u64(_mm_crc32_u64(0, low), high));
}

#undef LOADSTAR_CRC32C_FOLD_TARGET

/// What this CPU offers CRC-32C: 0 the table, 1 the crc32 instruction (SSE 4.2), 2 that and
/// VPCLMULQDQ on AVX-512 registers. Asked once.
inline int crc32c_level() noexcept {
  static const int level = [] {
    __builtin_cpu_init();  // Needed where this runs before the runtime's own constructor has.
    if (__builtin_cpu_supports("sse4.2") == 0) return 0;
    if (__builtin_cpu_supports("pclmul") != 0 && __builtin_cpu_supports("avx512f") != 0 &&
        __builtin_cpu_supports("avx512vl") != 0 && __builtin_cpu_supports("vpclmulqdq") != 0) {
      return 2;
    }
    return 1;
  }();
  return level;
}

/// Below this many bytes the crc32 instruction alone is as fast as folding.
inline constexpr std::size_t crc32c_fold_threshold = 1024;
#endif

/// Moves the CRC register `crc` (the running value, not inverted) over `bytes`: by folding, or
/// through the crc32 instruction, where the CPU has them, else through the table; all give the
/// same bits.
inline std::uint32_t crc32c_update(std::uint32_t crc, std::string_view bytes) noexcept {
#if LOADSTAR_CRC32C_X86
  const int level = crc32c_level();
  if (level == 2 && bytes.size() >= crc32c_fold_threshold) {
    const std::size_t folded = bytes.size() / crc32c_fold_round * crc32c_fold_round;
    crc = crc32c_update_folded(crc, bytes.data(), folded);
    bytes.remove_prefix(folded);
  }
  if (level >= 1) return crc32c_update_instruction(crc, bytes);
#endif
  return crc32c_update_portable(crc, bytes);
}

/// Copies `bytes` to `out` and returns the CRC register moved over them, as `crc32c_update`:
/// where the CPU folds, in one pass (each 64 bytes loaded once, stored and folded), else a
/// `memcpy` and `crc32c_update` a piece at a time, each piece still in the CPU's cache.
inline std::uint32_t crc32c_update_copy(std::uint32_t crc, std::string_view bytes,
                                        char* out) noexcept {
#if LOADSTAR_CRC32C_X86
  if (crc32c_level() == 2 && bytes.size() >= crc32c_fold_threshold) {
    const std::size_t folded = bytes.size() / crc32c_fold_round * crc32c_fold_round;
    crc = crc32c_update_folded<true>(crc, bytes.data(), folded, out);
    bytes.remove_prefix(folded);
    out += folded;
  }
#endif
  constexpr std::size_t piece = 64 * 1024;
  for (std::size_t done = 0; done < bytes.size();) {
    const std::size_t take = std::min(piece, bytes.size() - done);
    std::memcpy(out + done, bytes.data() + done, take);
    crc = crc32c_update(crc, std::string_view(out + done, take));
    done += take;
  }
  return crc;
}

/// CRC-32C of `bytes`: `crc32c("123456789") == 0xE3069283`. A long input goes on with
/// `crc32c_update`: `crc32c(a + b) == ~crc32c_update(~crc32c(a), b)`.
constexpr std::uint32_t crc32c(std::string_view bytes) noexcept {
  if (std::is_constant_evaluated()) return crc32c_portable(bytes);
  return crc32c_update(0xFFFFFFFFU, bytes) ^ 0xFFFFFFFFU;
}

/// TFRecord's masked CRC (tensorflow/core/lib/hash/crc32c.h `Mask`): rotated right by 15 bits
/// plus a constant, so that a CRC of data that itself holds CRCs stays well distributed.
constexpr std::uint32_t mask_crc32c(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8U;
}

/// `mask_crc32c` of the CRC-32C of `bytes`.
constexpr std::uint32_t masked_crc32c(std::string_view bytes) noexcept {
  return mask_crc32c(crc32c(bytes));
}

static_assert(crc32c("123456789") == 0xE3069283U, "CRC-32C's check value (RFC 3720)");

}  // namespace loadstar::detail
