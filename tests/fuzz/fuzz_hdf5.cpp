// libFuzzer harness: read_hdf5 on any bytes. The default (untrusted) read runs libhdf5 in a
// sandbox child, so a crash inside libhdf5 must come back as a loadstar::Error. When the child
// survived, the same file is read again in this process (trusted), where the sanitizers and the
// fuzzer's coverage see loadstar's own code.
#include <cstddef>
#include <cstdint>
#include <loadstar/data/hdf5.hpp>
#include <loadstar/error.hpp>

#include "fuzz_common.hpp"

namespace {

// Small limits keep one input from allocating gigabytes a sanitizer would report.
constexpr std::size_t limit = std::size_t{64} << 20;

template <class T>
void read_both_ways(const std::filesystem::path& path, const char* name) {
  bool survived = true;
  try {
    (void)loadstar::read_hdf5<T>(path, name, {}, {.max_bytes = limit, .max_fill_bytes = limit});
  } catch (const loadstar::FormatError& e) {
    survived = std::string(e.what()).find("the sandbox process") == std::string::npos;
  } catch (const loadstar::Error&) {
  }
  if (!survived) return;
  try {
    (void)loadstar::read_hdf5<T>(
        path, name, {},
        {.trust = loadstar::Trust::trusted, .max_bytes = limit, .max_fill_bytes = limit});
  } catch (const loadstar::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto path = fuzz_support::write_input(data, size, ".h5");
  read_both_ways<float>(path, "x");
  read_both_ways<std::int64_t>(path, "y");
  return 0;
}
