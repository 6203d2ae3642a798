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
      : filenames_(std::move(filenames)),
        compression_(detail::parse_compression(compression_type, "TextLineDataset")),
        buffer_size_(buffer_size) {}

  TextLineDataset(const TextLineDataset& other)
      : filenames_(other.filenames_),
        compression_(other.compression_),
        buffer_size_(other.buffer_size_) {
    restore(other.state());
  }
  TextLineDataset(TextLineDataset&&) noexcept = default;
  TextLineDataset& operator=(TextLineDataset&&) noexcept = default;

  std::optional<element_type> next() {
    while (file_ < filenames_.size()) {
      if (!reader_) open(0);
      std::string line;
      int end = '\r';
      while (end == '\r')  // `\r` is dropped wherever it stands.
        end = reader_->read_until('\n', '\r', line);
      if (end == '\n' || !line.empty()) return line;
      reader_.reset();
      ++file_;
    }
    return std::nullopt;
  }

  void reset() {
    reader_.reset();
    file_ = 0;
  }

  nlohmann::json state() const {
    return {{"op", "text_line"},
            {"files", filenames_.size()},
            {"file", file_},
            {"offset", reader_ ? nlohmann::json(reader_->offset()) : nlohmann::json(nullptr)}};
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "text_line");
    const std::size_t files = s["files"];
    const std::size_t file = s["file"];
    if (files != filenames_.size() || file > files) {
      throw CheckpointError("TextLineDataset: state was taken with " + std::to_string(files) +
                            " files, at file " + std::to_string(file) + ", but the dataset has " +
                            std::to_string(filenames_.size()));
    }
    reset();
    file_ = file;
    if (!s["offset"].is_null()) open(s["offset"].get<std::uint64_t>());
  }

 private:
  void open(std::uint64_t offset) {
    reader_ = std::make_unique<detail::CharReader>(filenames_[file_], compression_, buffer_size_,
                                                   "text file '" + filenames_[file_] + "'");
    if (offset > 0 && !reader_->skip(offset)) {
      throw CheckpointError("TextLineDataset: state is at byte offset " + std::to_string(offset) +
                            " of '" + filenames_[file_] + "' but the data end before it");
    }
  }

  std::vector<std::string> filenames_;
  detail::Compression compression_;
  std::size_t buffer_size_;
  std::size_t file_ = 0;
  std::unique_ptr<detail::CharReader> reader_;
};

}  // namespace loadstar
