/// \file
/// Test data: tensors of values in [-1, 1) from a fixed linear congruential sequence, the same
/// for a given shape and seed on every machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <loadstar/tensor.hpp>
#include <span>
#include <vector>

namespace test_support {

/// `n` values in [-1, 1) from a fixed linear congruential sequence.
inline std::vector<float> values(std::size_t n, std::uint64_t seed) {
  std::vector<float> out(n);
  std::uint64_t state = seed;
  for (auto& v : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>((state >> 40) % 2000) / 1000.0F - 1.0F;
  }
  return out;
}

/// A tensor of `shape` holding `values(...)` times `scale`.
inline loadstar::Tensor<float> random_tensor(const loadstar::Shape& shape, std::uint64_t seed,
                                             float scale = 1.0F) {
  auto v = values(shape.elements(), seed);
  for (auto& x : v)
    x *= scale;
  return loadstar::Tensor<float>(shape, std::span<const float>(v));
}

/// The starting contents of a gradient that a kernel adds to (`random_tensor`) or writes over
/// (NaNs, which reach the result if the kernel reads them).
inline loadstar::Tensor<float> gradient_start(const loadstar::Shape& shape, std::uint64_t seed,
                                              bool accumulate) {
  return accumulate ? random_tensor(shape, seed)
                    : loadstar::Tensor<float>(shape, std::numeric_limits<float>::quiet_NaN());
}

}  // namespace test_support
