/// \file
/// Element types a `Tensor` may hold, with their names as NumPy and Keras spell them.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "loadstar/detail/eigen.hpp"

namespace loadstar {

/// IEEE 754 half precision (1 sign, 5 exponent, 10 mantissa bits): Eigen's `half`, which converts
/// from `float` rounding to nearest even, as NumPy's and PyTorch's `float16` do.
using float16 = Eigen::half;

/// Brain floating point (1 sign, 8 exponent, 7 mantissa bits: `float`'s upper half): Eigen's
/// `bfloat16`, which converts from `float` rounding to nearest even, as PyTorch's `bfloat16` does.
using bfloat16 = Eigen::bfloat16;

/// The element type of a tensor, known at run time.
enum class DType : std::uint8_t { float32, float64, int32, int64, uint8, float16, bfloat16 };

/// The element types a `Tensor` may hold: `float`, `double`, `int32_t`, `int64_t`, `uint8_t`,
/// `float16` and `bfloat16`.
template <class T>
concept TensorElement = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
    std::same_as<T, std::uint8_t> || std::same_as<T, float16> || std::same_as<T, bfloat16>;

/// The floating-point element types, the half-precision ones included (for which
/// `std::is_floating_point_v` is false).
template <class T>
concept FloatingElement = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, float16> || std::same_as<T, bfloat16>;

/// The `DType` of a C++ element type.
template <TensorElement T>
inline constexpr DType dtype_of = std::same_as<T, float>          ? DType::float32
                                  : std::same_as<T, double>       ? DType::float64
                                  : std::same_as<T, std::int32_t> ? DType::int32
                                  : std::same_as<T, std::int64_t> ? DType::int64
                                  : std::same_as<T, float16>      ? DType::float16
                                  : std::same_as<T, bfloat16>     ? DType::bfloat16
                                                                  : DType::uint8;

/// The NumPy name of a dtype (`"float32"`), used in every error message.
constexpr std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
      return "float32";
    case DType::float64:
      return "float64";
    case DType::int32:
      return "int32";
    case DType::int64:
      return "int64";
    case DType::uint8:
      return "uint8";
    case DType::float16:
      return "float16";
    case DType::bfloat16:
      return "bfloat16";
  }
  return "unknown";
}

/// The NumPy name of a C++ element type.
template <TensorElement T>
constexpr std::string_view dtype_name() noexcept {
  return dtype_name(dtype_of<T>);
}

/// Size in bytes of one element of `dtype`.
constexpr std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32:
    case DType::int32:
      return 4;
    case DType::float64:
    case DType::int64:
      return 8;
    case DType::uint8:
      return 1;
    case DType::float16:
    case DType::bfloat16:
      return 2;
  }
  return 0;
}

}  // namespace loadstar
