// What every fuzz harness shares: the input written to a file the readers open by path.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace fuzz_support {

/// Writes `data` to a file of this process under the temporary directory and returns its path.
inline std::filesystem::path write_input(const std::uint8_t* data, std::size_t size,
                                         const char* suffix) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("loadstar-fuzz-" + std::to_string(::getpid()) + suffix);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) std::abort();
  if (size != 0 && std::fwrite(data, 1, size, file) != size) std::abort();
  std::fclose(file);
  return path;
}

}  // namespace fuzz_support
