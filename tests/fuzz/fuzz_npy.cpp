// libFuzzer harness: read_npy on any bytes, read as float, double and int64 (every conversion
// path). Every outcome but a value or a loadstar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/npy.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".npy");
  try {
    (void)loadstar::read_npy<float>(path);
  } catch (const loadstar::Error&) {
  }
  try {
    (void)loadstar::read_npy<double>(path);
  } catch (const loadstar::Error&) {
  }
  try {
    (void)loadstar::read_npy<std::int64_t>(path);
  } catch (const loadstar::Error&) {
  }
  return 0;
}
