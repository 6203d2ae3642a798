// libFuzzer harness: a dataset cache file of any bytes served by cache(path), with elements of
// int64 (range) and of float tensors (from_tensor_slices), read to the end.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/dataset.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".cache");
  try {
    auto ds = loadstar::range(4).cache(path);
    while (ds.next()) {
    }
  } catch (const loadstar::Error&) {
  }
  try {
    auto ds = loadstar::from_tensor_slices(loadstar::Tensor<float>({3, 2, 3})).cache(path);
    while (ds.next()) {
    }
  } catch (const loadstar::Error&) {
  }
  return 0;
}
