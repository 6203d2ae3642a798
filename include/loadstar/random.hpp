/// \file
/// The one source of randomness of loadstar: the SplitMix64 generator and the seed functions that
/// every random choice derives from (the sampler's epoch order, dataset shuffles and augmentations,
/// weight initializers, dropout masks and `fit`'s row order).
///
/// Randomness is a pure function of `(seed, epoch, index)`, never of a thread, a worker, a process
/// or the time, which is what makes batches identical for any worker count and lets a run resume
/// exactly from an O(1) state. SplitMix64 is used rather than a standard engine and distribution
/// because its sequence (and ours, drawn on top of it) is the same on every platform and standard
/// library.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

namespace loadstar {

/// SplitMix64's finaliser (Steele, Lea and Flood, "Fast splittable pseudorandom number
/// generators", 2014): a bijective mix of 64 bits, also a counter-based hash. Host and device
/// code: the CUDA kernels hash with it too (dropout's mask), so that both backends draw the same
/// bits.
LOADSTAR_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30U)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27U)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31U);
}

/// SplitMix64's golden-ratio increment.
inline constexpr std::uint64_t golden_gamma = 0x9e3779b97f4a7c15ULL;

/// One step of SplitMix64 as a pure function: `mix64(x + golden_gamma)`.
LOADSTAR_HOST_DEVICE constexpr std::uint64_t splitmix64(std::uint64_t x) noexcept {
  return mix64(x + golden_gamma);
}

/// The SplitMix64 generator: small, fast, and seeded directly from any 64-bit key, so that the
/// permutation of an epoch is computed without generating the epochs before it.
/// \code
/// SplitMix64 rng(batch_seed(seed, epoch, index));
/// const auto j = rng.below(10);   // uniform in [0, 10), without modulo bias
/// const double u = rng.uniform(); // uniform in [0, 1)
/// \endcode
class SplitMix64 {
 public:
  constexpr explicit SplitMix64(std::uint64_t seed) noexcept : state_(seed) {}

  /// The next 64 random bits.
  constexpr std::uint64_t next() noexcept { return mix64(state_ += golden_gamma); }
  constexpr std::uint64_t operator()() noexcept { return next(); }

  /// A uniform integer in `[0, bound)` for `bound > 0`, without modulo bias (rejection).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = next();
      if (r >= threshold) return r % bound;
    }
  }

  /// A uniform double in `[0, 1)` from the top 53 bits.
  constexpr double uniform() noexcept { return static_cast<double>(next() >> 11U) * 0x1.0p-53; }

  /// A standard normal double (Box-Muller, one value per call).
  double normal() noexcept {
    const double u1 = 1.0 - uniform();  // (0, 1]: the logarithm is finite
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  /// The finaliser, for code that hashes counters (`SplitMix64::mix(key + i)`).
  static constexpr std::uint64_t mix(std::uint64_t z) noexcept { return mix64(z); }

 private:
  std::uint64_t state_;
};

/// FNV-1a (64 bits) of `text`: a hash of a name that is the same on every platform and standard
/// library (unlike `std::hash`), so that keys derived from a layer's name draw the same bits
/// everywhere.
constexpr std::uint64_t stable_hash(std::string_view text) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

/// The seed of item `index` (a batch of a `Sequence`, an element of a `Dataset`) of epoch `epoch`
/// of a stream seeded with `seed`. Randomness drawn from it (augmentation) is the same whatever
/// the worker count, the prefetch depth or a restore in between.
/// \code
/// SplitMix64 rng(loadstar::batch_seed(seed, epoch, index));
/// \endcode
constexpr std::uint64_t batch_seed(std::uint64_t seed, std::uint64_t epoch,
                                   std::uint64_t index) noexcept {
  return mix64(mix64(mix64(seed ^ 0x6a09e667f3bcc909ULL) + epoch) ^ (index * golden_gamma));
}

/// The seed of element `index` of epoch `epoch` of a dataset stream: the same function as
/// `batch_seed`, under the name the dataset operators use (`map_with_seed`).
constexpr std::uint64_t element_seed(std::uint64_t seed, std::uint64_t epoch,
                                     std::uint64_t index) noexcept {
  return batch_seed(seed, epoch, index);
}

/// The seed of the shuffle of epoch `epoch` (the sampler's batch order, `fit`'s row order, a
/// dataset's shuffle buffer).
constexpr std::uint64_t epoch_seed(std::uint64_t seed, std::uint64_t epoch) noexcept {
  return mix64(seed) ^ mix64(epoch + 0x243f6a8885a308d3ULL);
}

/// The one epoch permutation (the sampler's batch order, `fit`'s row order, the cached dataset's
/// element order) of `length` items in epoch `epoch`: the identity without `shuffle`, otherwise a
/// Fisher-Yates shuffle driven by a generator seeded from `(seed, epoch)` alone. Computing it costs
/// O(length) whatever the epoch: nothing is replayed.
inline std::vector<std::size_t> epoch_permutation(std::size_t length, std::uint64_t seed,
                                                  std::uint64_t epoch, bool shuffle) {
  std::vector<std::size_t> order(length);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (!shuffle || length < 2) return order;
  SplitMix64 rng(epoch_seed(seed, epoch));
  for (std::size_t i = length - 1; i > 0; --i) {
    std::swap(order[i], order[static_cast<std::size_t>(rng.below(i + 1))]);
  }
  return order;
}

}  // namespace loadstar
