/// \file
/// `NumpyRandomState`: NumPy's legacy `np.random.RandomState(seed)` generator, as far as Keras's
/// dataset utilities use it (`shuffle`), so that a file list lands in the same order as in Keras.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar {

/// NumPy's legacy MT19937 `RandomState` seeded with an integer. NumPy seeds an integer in
/// `[0, 2**32)` with `init_genrand(seed)` (its `init_by_array` is for array seeds), which is
/// `std::mt19937`'s seeding, so the 32-bit outputs are `std::mt19937`'s. `shuffle` is NumPy's
/// Fisher-Yates: for `i` from `n - 1` down to 1, swap with `j = random_interval(i)`, drawn by
/// masking 32-bit outputs to the smallest covering power of two and rejecting values above `i`.
/// \code
/// std::vector<std::string> paths = ...;
/// NumpyRandomState(1337).shuffle(paths);  // np.random.RandomState(1337).shuffle(paths)
/// \endcode
class NumpyRandomState {
 public:
  /// Throws `ConfigError` for a seed outside `[0, 2**32)`, as NumPy raises ValueError.
  explicit NumpyRandomState(std::uint64_t seed) : engine_(check(seed)) {}

  /// The next 32-bit output of the generator.
  std::uint32_t next_uint32() { return static_cast<std::uint32_t>(engine_()); }

  /// A uniform integer in `[0, max]`, as NumPy's `random_interval(max)` for `max < 2**32`.
  std::uint64_t random_interval(std::uint64_t max) {
    if (max == 0) return 0;
    std::uint64_t mask = max;
    for (unsigned shift = 1; shift <= 32; shift *= 2)
      mask |= mask >> shift;
    if (max <= 0xffffffffULL) {
      std::uint64_t value;
      do {
        value = next_uint32() & mask;
      } while (value > max);
      return value;
    }
    std::uint64_t value;
    do {
      const std::uint64_t high = next_uint32();
      value = ((high << 32) | next_uint32()) & mask;
    } while (value > max);
    return value;
  }

  /// Shuffles `items` in place as `RandomState.shuffle` shuffles a list or a 1-D array.
  template <class T>
  void shuffle(std::vector<T>& items) {
    for (std::size_t i = items.size(); i-- > 1;) {
      const auto j = static_cast<std::size_t>(random_interval(i));
      using std::swap;
      swap(items[i], items[j]);
    }
  }

 private:
  static std::uint32_t check(std::uint64_t seed) {
    if (seed > 0xffffffffULL) {
      throw ConfigError("NumpyRandomState: seed must be between 0 and 2**32 - 1 but is " +
                        std::to_string(seed));
    }
    return static_cast<std::uint32_t>(seed);
  }

  std::mt19937 engine_;
};

}  // namespace loadstar
