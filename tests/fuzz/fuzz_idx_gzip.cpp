// libFuzzer harness: read_idx on a gzip file whose uncompressed content is the input, so that
// mutations reach the IDX header and data behind a valid gzip stream.
#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <loadstar/data/idx.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(nullptr, 0, ".idx.gz");
  gzFile out = gzopen(path.c_str(), "wb");
  if (out == nullptr) std::abort();
  if (size != 0 && gzwrite(out, data, static_cast<unsigned>(size)) != static_cast<int>(size)) {
    std::abort();
  }
  gzclose(out);
  try {
    (void)loadstar::read_idx<std::uint8_t>(path);
  } catch (const loadstar::Error&) {
  }
  try {
    (void)loadstar::read_idx<float>(path);
  } catch (const loadstar::Error&) {
  }
  return 0;
}
