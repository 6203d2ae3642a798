// libFuzzer harness: read_idx on any bytes, plain or gzip-compressed (gzread tells them apart).
// Every outcome but a value or a loadstar::Error is a finding.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/idx.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".idx");
  try {
    (void)loadstar::read_idx<std::uint8_t>(path);
  } catch (const loadstar::Error&) {
  }
  try {
    (void)loadstar::read_idx<std::int32_t>(path);
  } catch (const loadstar::Error&) {
  }
  try {
    (void)loadstar::read_idx<double>(path);
  } catch (const loadstar::Error&) {
  }
  return 0;
}
