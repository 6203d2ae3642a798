// libFuzzer harness: Hdf5Sequence over datasets x and y of any bytes, every batch read. As in
// fuzz_hdf5.cpp, the untrusted construction checks the file in a sandbox child, and only a file
// that child survived is read in this process.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/hdf5_sequence.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".h5");
  constexpr std::size_t limit = std::size_t{64} << 20;
  try {
    const loadstar::Hdf5Sequence<float, std::int64_t> sequence(
        path, "x", "y", 2, {}, {.max_bytes = limit, .max_fill_bytes = limit});
    // Few batches: a header may declare millions of rows of fill value within the limits.
    for (std::size_t i = 0; i < sequence.size() && i < 64; ++i)
      (void)sequence[i];
  } catch (const loadstar::Error&) {
  }
  return 0;
}
