/// \file
/// Saving and restoring a `SplitMix64` generator's position without access to its member: its
/// next output is `mix64(state + golden_gamma)` and `mix64` is a bijection, so the state is
/// recovered by inverting `mix64` on the output of a copy.
#pragma once

#include <cstdint>

#include "loadstar/random.hpp"

namespace loadstar::trial::detail {

/// The inverse of `y = x ^ (x >> shift)`.
constexpr std::uint64_t unxorshift(std::uint64_t y, unsigned shift) noexcept {
  std::uint64_t x = y;
  for (unsigned known = shift; known < 64; known += shift)
    x = y ^ (x >> shift);
  return x;
}

/// The inverse of the odd `a` modulo 2^64 (Newton's iteration doubles the correct bits).
constexpr std::uint64_t inverse_mod_2_64(std::uint64_t a) noexcept {
  std::uint64_t x = a;  // correct to 3 bits for odd a
  for (int i = 0; i < 5; ++i)
    x *= 2 - a * x;
  return x;
}

/// The inverse of `loadstar::mix64`.
constexpr std::uint64_t unmix64(std::uint64_t z) noexcept {
  z = unxorshift(z, 31);
  z *= inverse_mod_2_64(0x94d049bb133111ebULL);
  z = unxorshift(z, 27);
  z *= inverse_mod_2_64(0xbf58476d1ce4e5b9ULL);
  return unxorshift(z, 30);
}

/// The seed that makes a generator equal to `rng` (`SplitMix64(rng_state(rng))` continues where
/// `rng` is).
constexpr std::uint64_t rng_state(SplitMix64 rng) noexcept {
  return unmix64(rng.next()) - golden_gamma;
}

}  // namespace loadstar::trial::detail
