// A separable toy problem shared by the executor's tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <loadstar/tensor.hpp>

/// Two features in [-1, 1], the class is whether their sum is positive.
struct Blobs {
  loadstar::Tensor<float> x;
  loadstar::Tensor<std::int64_t> y;
};

/// `n` rows drawn by a fixed linear congruential generator from `seed`.
inline Blobs blobs(std::size_t n, std::uint64_t seed = 99) {
  Blobs b{loadstar::Tensor<float>({n, 2}), loadstar::Tensor<std::int64_t>({n})};
  std::uint64_t state = seed;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 2; ++j) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      b.x(i, j) = static_cast<float>((state >> 40) % 2001) / 1000.0F - 1.0F;
    }
    b.y(i) = b.x(i, 0) + b.x(i, 1) > 0 ? 1 : 0;
  }
  return b;
}
