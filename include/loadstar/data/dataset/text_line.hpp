/// \file
/// `TextLineDataset`: the lines of text files, as `tf.data.TextLineDataset`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/file_cursor.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/detail/input_stream.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The lines of text files, file after file, each a `std::string` without its line ending, as
/// `tf.data.TextLineDataset`: lines end at `\n`; every `\r` is dropped from a line (TensorFlow's
/// `BufferedInputStream::ReadLine` does so, which handles `\r\n` endings); a last line without
/// `\n` is a line when it is not empty. `compression_type` is `""`, `"GZIP"` or `"ZLIB"`;
/// `buffer_size` the read buffer in bytes (tf.data's default, 256 KiB).
///
/// The state is the file's index and the (uncompressed) byte offset of the next line: a plain
/// file restores with a seek, a compressed one by inflating up to the offset.
/// \code
/// auto lines = TextLineDataset({"a.txt", "b.txt.gz"}).skip(1);
/// \endcode
class TextLineDataset : public DatasetBase<TextLineDataset> {
 public:
  using element_type = std::string;

  /// Throws `ConfigError` for an unknown `compression_type`.
  explicit TextLineDataset(std::vector<std::string> filenames, std::string compression_type = "",
                           std::size_t buffer_size = 256 * 1024)
      : files_(std::move(filenames), detail::parse_compression(compression_type, "TextLineDataset"),
               buffer_size, "TextLineDataset", "text file") {}

  std::optional<element_type> next() {
    while (!files_.done()) {
      files_.open_if_closed();
      std::string line;
      int end = '\r';
      while (end == '\r')  // `\r` is dropped wherever it stands.
        end = files_.reader().read_until('\n', '\r', line);
      if (end == '\n' || !line.empty()) return line;
      files_.next_file();
    }
    return std::nullopt;
  }

  void reset() { files_.reset(); }

  nlohmann::json state() const {
    nlohmann::json state{{"op", "text_line"}};
    files_.save(state);
    return state;
  }

  void restore(const nlohmann::json& state) {
    files_.restore(detail::expect_state(state, "text_line"));
  }

 private:
  detail::FileCursor files_;
};

}  // namespace loadstar
