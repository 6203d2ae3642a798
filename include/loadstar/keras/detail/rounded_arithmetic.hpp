/// \file
/// Float and double arithmetic rounded after every operation, on the device too: nvcc would
/// otherwise contract `a * b + c` into one fused multiply-add wherever it sees fit, so a kernel
/// that must follow a formula rounding for rounding (an optimizer's update, a layer kernel the
/// CPU computes alike) spells its operations with these. On the host the compiler's contraction
/// rules apply as they do to the CPU backend's code.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

namespace loadstar::keras::detail {

LOADSTAR_HOST_DEVICE inline float mul_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
LOADSTAR_HOST_DEVICE inline float add_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
LOADSTAR_HOST_DEVICE inline float sub_rn(float a, float b) noexcept {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

LOADSTAR_HOST_DEVICE inline double dmul_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LOADSTAR_HOST_DEVICE inline double dadd_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
LOADSTAR_HOST_DEVICE inline double dsub_rn(double a, double b) noexcept {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

}  // namespace loadstar::keras::detail
