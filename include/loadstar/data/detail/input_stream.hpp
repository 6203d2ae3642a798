/// \file
/// A buffered sequential reader of a file, plain or compressed with zlib (GZIP or ZLIB framing),
/// that counts the uncompressed bytes it delivered: the byte source of the TFRecord, text-line
/// and CSV datasets.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar::detail {

/// A file's compression, as tf.data's `compression_type` names it.
enum class Compression { none, gzip, zlib };

/// `""`, `"GZIP"` or `"ZLIB"`; throws `ConfigError` naming `who` for anything else.
inline Compression parse_compression(std::string_view type, std::string_view who) {
  if (type.empty()) return Compression::none;
  if (type == "GZIP") return Compression::gzip;
  if (type == "ZLIB") return Compression::zlib;
  throw ConfigError(std::string(who) +
                    ": compression_type must be \"\", \"GZIP\" or \"ZLIB\" but is \"" +
                    std::string(type) + "\"");
}

/// Reads one file front to back. `read` fills the caller's buffer from an internal buffer of
/// `buffer_size` bytes (0: straight from the file) or through zlib's inflate; `offset()` is the
/// number of (uncompressed) bytes delivered so far, the position a dataset state records.
class InputStream {
 public:
  /// Opens `path`; `where` (`"tfrecord file 'a.tfrecord'"`) begins every error message. Throws
  /// `IoError` when the file cannot be opened.
  InputStream(const std::string& path, Compression compression, std::size_t buffer_size,
              std::string where)
      : where_(std::move(where)), compression_(compression) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      throw IoError(where_ + ": cannot open (" + std::generic_category().message(errno) + ")");
    }
    struct stat info {};
    if (::fstat(fd_, &info) != 0 || !S_ISREG(info.st_mode)) {
      ::close(fd_);
      throw IoError(where_ + ": cannot open (not a regular file)");
    }
    file_bytes_ = static_cast<std::uint64_t>(info.st_size);
    if (compression_ == Compression::none) {
      buffer_.resize(buffer_size);
    } else {
      // zlib needs room to work in; tf.data uses the same size for its input and output buffers.
      buffer_.resize(std::max<std::size_t>(buffer_size, 4096));
      z_ = z_stream{};
      // 15 + 16: a gzip header and trailer; 15: a zlib header and trailer (zlib.h, inflateInit2).
      const int window = compression_ == Compression::gzip ? 15 + 16 : 15;
      if (inflateInit2(&z_, window) != Z_OK) {
        ::close(fd_);
        throw IoError(where_ + ": cannot initialise zlib");
      }
    }
  }
  ~InputStream() {
    if (fd_ >= 0) ::close(fd_);
    if (compression_ != Compression::none) inflateEnd(&z_);
  }
  InputStream(const InputStream&) = delete;
  InputStream& operator=(const InputStream&) = delete;

  /// Reads up to `n` bytes into `out`; fewer only at the end of the data. Throws `FormatError`
  /// for corrupt or truncated compressed data, `IoError` for a failing read.
  std::size_t read(char* out, std::size_t n) {
    const std::size_t got =
        compression_ == Compression::none ? read_plain(out, n) : read_inflated(out, n);
    offset_ += got;
    return got;
  }

  /// Appends up to `n` bytes to `out`, fewer only at the end of the data; returns how many. From
  /// a plain file's buffer the bytes are appended as they are, without zero-filling `out` first.
  std::size_t read_append(std::string& out, std::size_t n) {
    std::size_t total = 0;
    if (compression_ == Compression::none) {
      while (total < n) {
        if (position_ < filled_) {
          const std::size_t take = std::min(n - total, filled_ - position_);
          out.append(buffer_.data() + position_, take);
          position_ += take;
          total += take;
        } else if (n - total >= buffer_.size()) {
          const std::size_t old = out.size();
          out.resize(old + n - total);
          const std::size_t got = read_file(out.data() + old, n - total);
          out.resize(old + got);
          total += got;
          break;
        } else {
          filled_ = read_file(buffer_.data(), buffer_.size());
          position_ = 0;
          if (filled_ == 0) break;
        }
      }
      offset_ += total;
      return total;
    }
    const std::size_t old = out.size();
    out.resize(old + n);
    total = read(out.data() + old, n);
    out.resize(old + total);
    return total;
  }

  /// Reads and drops `n` bytes (fewer at the end of the data); returns how many it dropped.
  std::uint64_t skip(std::uint64_t n) {
    if (compression_ == Compression::none && position_ == 0 && filled_ == 0 &&
        file_offset_ + n <= file_bytes_) {
      file_offset_ += n;  // Nothing buffered: move the file position only.
      offset_ += n;
      return n;
    }
    std::vector<char> scratch(std::min<std::uint64_t>(n, 1 << 16));
    std::uint64_t dropped = 0;
    while (dropped < n) {
      const std::size_t want =
          static_cast<std::size_t>(std::min<std::uint64_t>(n - dropped, scratch.size()));
      const std::size_t got = read(scratch.data(), want);
      dropped += got;
      if (got < want) break;
    }
    return dropped;
  }

  /// The uncompressed bytes delivered so far.
  std::uint64_t offset() const noexcept { return offset_; }
  /// The file's size on disk, when it is the data's size (uncompressed files).
  std::optional<std::uint64_t> data_bytes() const noexcept {
    if (compression_ == Compression::none) return file_bytes_;
    return std::nullopt;
  }
  const std::string& where() const noexcept { return where_; }

 private:
  /// Reads up to `n` bytes of the file at the file position.
  std::size_t read_file(char* out, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      const ssize_t got = ::pread(fd_, out + total, n - total, static_cast<off_t>(file_offset_));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw IoError(where_ + ": read failed at byte offset " + std::to_string(file_offset_) +
                      " (" + std::generic_category().message(errno) + ")");
      }
      if (got == 0) break;
      total += static_cast<std::size_t>(got);
      file_offset_ += static_cast<std::uint64_t>(got);
    }
    return total;
  }

  std::size_t read_plain(char* out, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      if (position_ < filled_) {
        const std::size_t take = std::min(n - total, filled_ - position_);
        std::memcpy(out + total, buffer_.data() + position_, take);
        position_ += take;
        total += take;
        continue;
      }
      if (n - total >= buffer_.size()) return total + read_file(out + total, n - total);
      filled_ = read_file(buffer_.data(), buffer_.size());
      position_ = 0;
      if (filled_ == 0) break;
    }
    return total;
  }

  std::size_t read_inflated(char* out, std::size_t n) {
    std::size_t total = 0;
    while (total < n && !finished_) {
      if (z_.avail_in == 0) {
        const std::size_t got = read_file(buffer_.data(), buffer_.size());
        z_.next_in = reinterpret_cast<Bytef*>(buffer_.data());
        z_.avail_in = static_cast<uInt>(got);
        if (got == 0) {
          if (!stream_started_ && compressed_read_ == 0) {
            finished_ = true;  // An empty file: no data.
            break;
          }
          throw FormatError(where_ +
                            ": truncated compressed stream: the file ends at byte offset " +
                            std::to_string(file_bytes_) + " (uncompressed byte offset " +
                            std::to_string(offset_ + total) + ") before the end of the " +
                            (compression_ == Compression::gzip ? "GZIP" : "ZLIB") + " stream");
        }
        compressed_read_ += got;
      }
      stream_started_ = true;
      z_.next_out = reinterpret_cast<Bytef*>(out + total);
      z_.avail_out = static_cast<uInt>(std::min<std::size_t>(n - total, 1U << 30));
      const uInt before_out = z_.avail_out;
      const uInt before_in = z_.avail_in;
      const int status = inflate(&z_, Z_NO_FLUSH);
      total += before_out - z_.avail_out;
      if (status == Z_STREAM_END) {
        // Concatenated streams (as `cat a.gz b.gz` makes) read as one, like gzip itself.
        if (z_.avail_in == 0 && file_offset_ >= file_bytes_) {
          finished_ = true;
        } else {
          inflateReset(&z_);
          stream_started_ = false;
        }
      } else if (status != Z_OK && !(status == Z_BUF_ERROR && before_in == 0)) {
        const std::uint64_t at = compressed_read_ - z_.avail_in;
        throw FormatError(
            where_ + ": corrupt " + (compression_ == Compression::gzip ? "GZIP" : "ZLIB") +
            " data at compressed byte offset " + std::to_string(at) +
            " (uncompressed byte offset " + std::to_string(offset_ + total) +
            "): " + (z_.msg != nullptr ? z_.msg : "zlib error " + std::to_string(status)));
      }
    }
    return total;
  }

  std::string where_;
  Compression compression_;
  int fd_ = -1;
  std::uint64_t file_bytes_ = 0;
  std::uint64_t file_offset_ = 0;  // Next byte of the file to read.
  std::uint64_t offset_ = 0;       // Uncompressed bytes delivered.
  std::vector<char> buffer_;
  std::size_t position_ = 0, filled_ = 0;  // Plain files: the unread part of buffer_.
  z_stream z_{};
  std::uint64_t compressed_read_ = 0;
  bool stream_started_ = false;
  bool finished_ = false;
};

/// Character-at-a-time access to an `InputStream` through a buffer of its own, for the text
/// parsers: `offset()` is the (uncompressed) offset of the next character `get` returns.
class CharReader {
 public:
  CharReader(const std::string& path, Compression compression, std::size_t buffer_size,
             std::string where)
      : stream_(path, compression, compression == Compression::none ? 0 : buffer_size,
                std::move(where)),
        chunk_(std::max<std::size_t>(buffer_size, 4096)) {}

  /// The next character, or -1 at the end of the data.
  int get() {
    if (position_ == filled_ && !fill()) return -1;
    return static_cast<unsigned char>(chunk_[position_++]);
  }
  /// The next character without consuming it, or -1 at the end of the data.
  int peek() {
    if (position_ == filled_ && !fill()) return -1;
    return static_cast<unsigned char>(chunk_[position_]);
  }
  /// Appends the characters up to (not including) the next of `a`, `b` or `c` to `out` and
  /// returns that character (consumed), or -1 at the end of the data.
  int read_until(char a, char b, char c, std::string& out) {
    while (true) {
      if (position_ == filled_ && !fill()) return -1;
      const char* begin = chunk_.data() + position_;
      const char* end = chunk_.data() + filled_;
      const char* hit = begin;
      while (hit != end && *hit != a && *hit != b && *hit != c)
        ++hit;
      out.append(begin, hit);
      position_ += static_cast<std::size_t>(hit - begin);
      if (hit != end) {
        ++position_;
        return static_cast<unsigned char>(*hit);
      }
    }
  }
  int read_until(char a, char b, std::string& out) { return read_until(a, b, b, out); }
  /// Drops `n` characters; false when the data end first.
  bool skip(std::uint64_t n) {
    const std::uint64_t buffered = filled_ - position_;
    if (n <= buffered) {
      position_ += static_cast<std::size_t>(n);
      return true;
    }
    position_ = filled_;
    return stream_.skip(n - buffered) == n - buffered;
  }
  std::uint64_t offset() const noexcept { return stream_.offset() - (filled_ - position_); }
  const std::string& where() const noexcept { return stream_.where(); }

 private:
  bool fill() {
    filled_ = stream_.read(chunk_.data(), chunk_.size());
    position_ = 0;
    return filled_ > 0;
  }

  InputStream stream_;
  std::vector<char> chunk_;
  std::size_t position_ = 0, filled_ = 0;
};

}  // namespace loadstar::detail
