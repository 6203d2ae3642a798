/// \file
/// `element_seed`: per-element randomness that depends on (seed, epoch, index) only.
#pragma once

#include <cstdint>

namespace loadstar {

/// One step of SplitMix64 (Steele, Lea and Flood, 2014): a bijective mix of 64 bits.
constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// The seed of element `index` of epoch `epoch` of a stream seeded with `seed`. An augmentation
/// that draws its randomness from it gives the same result whatever the thread count, the
/// prefetch depth or a restore in between.
/// \code
/// std::mt19937 rng(element_seed(42, epoch, index));
/// \endcode
constexpr std::uint64_t element_seed(std::uint64_t seed, std::uint64_t epoch,
                                     std::uint64_t index) noexcept {
  return splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ index);
}

namespace detail {
/// A small counter-based generator for shuffles: deterministic across platforms (the standard
/// distributions are not).
class SplitMixRng {
 public:
  explicit constexpr SplitMixRng(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t operator()() noexcept { return splitmix64(state_++); }
  /// A uniform integer in `[0, bound)` (the modulo bias is below 2^-40 for the buffer sizes a
  /// shuffle uses).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept { return (*this)() % bound; }

 private:
  std::uint64_t state_;
};
}  // namespace detail

}  // namespace loadstar
