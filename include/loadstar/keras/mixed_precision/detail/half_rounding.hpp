/// \file
/// A float rounded to the nearest float16 or bfloat16 value (to nearest even, as PyTorch's and
/// NumPy's casts round), kept as a float: the one formula of mixed precision's rounding, host and
/// device code (`LOADSTAR_HOST_DEVICE`), so that the CPU backend and the CUDA kernels round alike.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <cstring>

namespace loadstar::keras::detail {

/// Which half-precision format `round_half` rounds to (the kernels' argument: a `DType` needs
/// the tensor headers, which device code does not include).
enum class HalfKind : std::uint8_t { float16 = 0, bfloat16 = 1 };

LOADSTAR_HOST_DEVICE inline std::uint32_t float_bits(float x) noexcept {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

LOADSTAR_HOST_DEVICE inline float bits_float(std::uint32_t bits) noexcept {
  float x = 0.0F;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

/// `x` rounded to bfloat16 (float's upper 16 bits), to nearest even; NaN stays NaN.
LOADSTAR_HOST_DEVICE inline float round_to_bfloat16(float x) noexcept {
  const std::uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFU) > 0x7F800000U) return bits_float(bits | 0x00400000U);  // quiet NaN
  const std::uint32_t rounded = bits + 0x7FFFU + ((bits >> 16U) & 1U);
  return bits_float(rounded & 0xFFFF0000U);
}

/// `x` rounded to IEEE half precision, to nearest even: magnitudes from 65520 up become infinite,
/// those under 2^-14 are rounded to multiples of 2^-24 (half's subnormals); NaN stays NaN.
LOADSTAR_HOST_DEVICE inline float round_to_float16(float x) noexcept {
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t sign = bits & 0x80000000U;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (magnitude > 0x7F800000U) return bits_float(bits | 0x00400000U);   // quiet NaN
  if (magnitude >= 0x477FF000U) return bits_float(sign | 0x7F800000U);  // >= 65520: infinity
  if (magnitude >= 0x38800000U) {
    // A normal half: keep 10 of float's 23 mantissa bits.
    const std::uint32_t rounded = magnitude + 0xFFFU + ((magnitude >> 13U) & 1U);
    return bits_float(sign | (rounded & 0xFFFFE000U));
  }
  // A subnormal half: |x| * 2^24 (exact) rounded to an integer, to nearest even, by adding and
  // subtracting 2^23 (the sum's unit in the last place is 1; the value is under 2^10).
  constexpr float two_24 = 16777216.0F;
  constexpr float two_23 = 8388608.0F;
  const float shifted = bits_float(magnitude) * two_24 + two_23;
  const float integer = shifted - two_23;
  return bits_float(sign | float_bits(integer / two_24));
}

/// `x` rounded to `kind`.
LOADSTAR_HOST_DEVICE inline float round_half(float x, HalfKind kind) noexcept {
  return kind == HalfKind::bfloat16 ? round_to_bfloat16(x) : round_to_float16(x);
}

/// The 16 bits of `x` rounded to `kind` (`round_half`): what a half-precision matrix product reads.
LOADSTAR_HOST_DEVICE inline std::uint16_t half_bits(float x, HalfKind kind) noexcept {
  const std::uint32_t bits = float_bits(round_half(x, kind));
  const std::uint32_t sign = (bits >> 16U) & 0x8000U;
  const std::uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (kind == HalfKind::bfloat16) {
    // The rounding left the lower half zero; a NaN keeps a mantissa bit in the upper one.
    return static_cast<std::uint16_t>(magnitude > 0x7F800000U ? sign | 0x7FC0U : bits >> 16U);
  }
  if (magnitude > 0x7F800000U) return static_cast<std::uint16_t>(sign | 0x7E00U);  // quiet NaN
  if (magnitude == 0x7F800000U) return static_cast<std::uint16_t>(sign | 0x7C00U);
  if (magnitude < 0x33800000U) return static_cast<std::uint16_t>(sign);  // under 2^-24: zero
  const int exponent = static_cast<int>(magnitude >> 23U) - 127;
  const std::uint32_t mantissa = magnitude & 0x7FFFFFU;
  if (exponent >= -14) {  // a normal half: its 10 mantissa bits are float's upper ones
    return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(exponent + 15) << 10U |
                                      mantissa >> 13U);
  }
  // A subnormal half: the value in units of 2^-24, exact after the rounding.
  return static_cast<std::uint16_t>(sign |
                                    (0x800000U | mantissa) >> static_cast<unsigned>(-exponent - 1));
}

/// The float value of the 16 bits `h` of `kind` (exact: every half value is a float).
LOADSTAR_HOST_DEVICE inline float half_float(std::uint16_t h, HalfKind kind) noexcept {
  const std::uint32_t bits = h;
  if (kind == HalfKind::bfloat16) return bits_float(bits << 16U);
  const std::uint32_t sign = (bits & 0x8000U) << 16U;
  const std::uint32_t exponent = (bits >> 10U) & 0x1FU;
  const std::uint32_t mantissa = bits & 0x3FFU;
  if (exponent == 0x1FU) return bits_float(sign | 0x7F800000U | mantissa << 13U);
  if (exponent != 0) return bits_float(sign | (exponent + 112U) << 23U | mantissa << 13U);
  // Zero or a subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * bits_float(0x33800000U);
  return bits_float(sign | float_bits(magnitude));
}

}  // namespace loadstar::keras::detail
