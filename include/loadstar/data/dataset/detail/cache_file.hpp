/// \file
/// The on-disk record format of dataset caches, its writer, its reader and the builders' lock.
///
/// Layout (little-endian, as the machines we run on):
///   header, 48 bytes: magic "LDSCACHE", u32 format version, u32 0, u64 record count,
///                     u64 payload bytes, u32 crc32 of payload and offsets, u32 0
///   payload: the records, each the bytes of `serialize(element)`, back to back
///   offsets: record count + 1 u64 offsets into the payload (the last one is its length)
/// A cache is written to `<path>.tmp.<pid>` and renamed to `<path>` once complete, so a file at
/// `<path>` is always a finished cache; the checksum catches a file corrupted afterwards.
///
/// The CRC32 guards against accidents (a truncated copy, a flipped bit), not against a crafted
/// file: anyone can compute it. So the reader also checks everything a crafted file could lie
/// about before using it: the reserved fields are zero, the sizes add up to the file's size
/// without overflowing, the offsets start at 0, never decrease and end at the payload's size,
/// and each record's shapes fit in the record's bytes (`serialize.hpp`).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <array>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <new>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

inline constexpr std::array<char, 8> cache_magic{'L', 'D', 'S', 'C', 'A', 'C', 'H', 'E'};
inline constexpr std::uint32_t cache_format_version = 1;
inline constexpr std::size_t cache_header_bytes = 48;

struct CacheHeader {
  std::array<char, 8> magic = cache_magic;
  std::uint32_t version = cache_format_version;
  std::uint32_t reserved0 = 0;
  std::uint64_t count = 0;
  std::uint64_t payload_bytes = 0;
  std::uint32_t crc = 0;
  std::uint32_t reserved1 = 0;
  std::uint64_t reserved2 = 0;
};
static_assert(sizeof(CacheHeader) == cache_header_bytes);

inline std::string errno_text() {
  return std::strerror(errno);
}

inline std::uint32_t crc32_update(std::uint32_t crc, const void* data, std::size_t bytes) {
  // zlib's crc32 takes a uInt length: feed large buffers in pieces.
  const auto* p = static_cast<const Bytef*>(data);
  while (bytes > 0) {
    const auto piece = static_cast<uInt>(std::min<std::size_t>(bytes, 1u << 30));
    crc = static_cast<std::uint32_t>(::crc32(crc, p, piece));
    p += piece;
    bytes -= piece;
  }
  return crc;
}

/// An owned POSIX file descriptor.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) noexcept : fd_(fd) {}
  FileDescriptor(FileDescriptor&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    if (this != &other) {
      close();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  ~FileDescriptor() { close(); }
  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void close() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

/// An exclusive advisory `flock` on `<path>.lock`. The kernel releases it when the process
/// exits or dies, so a crash while building a cache never leaves a lock that blocks the next run
/// (tf.data's lock files do: tensorflow#28798).
class CacheLock {
 public:
  /// Takes the lock, waiting for it when `wait`; `locked()` tells whether it was taken.
  CacheLock(const std::filesystem::path& cache, bool wait) {
    const std::string path = cache.string() + ".lock";
    fd_ = FileDescriptor(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd_) {
      throw IoError("cache '" + cache.string() + "': cannot write the lock file '" + path +
                    "': " + errno_text());
    }
    int rc = 0;
    do {
      rc = ::flock(fd_.get(), LOCK_EX | (wait ? 0 : LOCK_NB));
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      if (!wait && errno == EWOULDBLOCK) {
        fd_.close();
        return;
      }
      throw IoError("cache '" + cache.string() + "': cannot lock '" + path + "': " + errno_text());
    }
    locked_ = true;
  }
  bool locked() const noexcept { return locked_; }

 private:
  FileDescriptor fd_;
  bool locked_ = false;
};

/// Writes a cache to `<path>.tmp.<pid>`, renamed to `path` by `finish()`; destroyed unfinished,
/// it removes the temporary file.
class CacheWriter {
 public:
  explicit CacheWriter(std::filesystem::path path)
      : path_(std::move(path)), temporary_(path_.string() + ".tmp." + std::to_string(::getpid())) {
    fd_ =
        FileDescriptor(::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd_) {
      throw IoError("cache '" + path_.string() + "': cannot write '" + temporary_.string() +
                    "': " + errno_text());
    }
    const CacheHeader placeholder{};
    write_all(&placeholder, sizeof placeholder);
    offsets_.push_back(0);
  }
  CacheWriter(const CacheWriter&) = delete;
  CacheWriter& operator=(const CacheWriter&) = delete;
  ~CacheWriter() {
    if (fd_) {
      fd_.close();
      std::error_code ignored;
      std::filesystem::remove(temporary_, ignored);
    }
  }

  /// Appends one element as a record.
  template <Serializable E>
  void append(const E& element) {
    // `serialized_size` is a bound (tensor data may be padded): write what `serialize` wrote.
    buffer_.resize(serialized_size(element));
    const std::size_t bytes = serialize(element, std::span<std::byte>(buffer_));
    write_all(buffer_.data(), bytes);
    crc_ = crc32_update(crc_, buffer_.data(), bytes);
    offsets_.push_back(offsets_.back() + bytes);
  }

  /// Writes the offsets and the header, flushes the file to disk and renames it into place.
  void finish() {
    const std::size_t table_bytes = offsets_.size() * sizeof(std::uint64_t);
    write_all(offsets_.data(), table_bytes);
    crc_ = crc32_update(crc_, offsets_.data(), table_bytes);
    CacheHeader header;
    header.count = offsets_.size() - 1;
    header.payload_bytes = offsets_.back();
    header.crc = crc_;
    if (::pwrite(fd_.get(), &header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
        ::fsync(fd_.get()) != 0) {
      throw IoError("cache '" + path_.string() + "': cannot write '" + temporary_.string() +
                    "': " + errno_text());
    }
    fd_.close();
    std::error_code error;
    std::filesystem::rename(temporary_, path_, error);
    if (error) {
      std::filesystem::remove(temporary_, error);
      throw IoError("cache '" + path_.string() + "': cannot rename '" + temporary_.string() +
                    "' into place: " + error.message());
    }
  }

  std::size_t count() const noexcept { return offsets_.size() - 1; }

 private:
  void write_all(const void* data, std::size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t written = ::write(fd_.get(), p, bytes);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) {
        throw IoError("cache '" + path_.string() + "': cannot write '" + temporary_.string() +
                      "': " + errno_text());
      }
      p += written;
      bytes -= static_cast<std::size_t>(written);
    }
  }

  std::filesystem::path path_;
  std::filesystem::path temporary_;
  FileDescriptor fd_;
  std::vector<std::uint64_t> offsets_;
  std::vector<std::byte> buffer_;
  std::uint32_t crc_ = static_cast<std::uint32_t>(::crc32(0, nullptr, 0));
};

/// Reads a finished cache: checks its header, size and checksum on opening (throwing
/// `FormatError` for a file that is not a complete, intact cache) and reads records by index.
class CacheReader {
 public:
  explicit CacheReader(std::filesystem::path path) : path_(std::move(path)) {
    fd_ = FileDescriptor(::open(path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd_) throw IoError("cache '" + path_.string() + "': cannot open: " + errno_text());
    struct stat info {};
    if (::fstat(fd_.get(), &info) != 0) {
      throw IoError("cache '" + path_.string() + "': cannot stat: " + errno_text());
    }
    const auto file_bytes = static_cast<std::uint64_t>(info.st_size);
    CacheHeader header;
    if (file_bytes < sizeof header) {
      throw FormatError("cache '" + path_.string() + "': truncated: " + std::to_string(file_bytes) +
                        " bytes is less than the " + std::to_string(sizeof header) +
                        "-byte header");
    }
    read_at(&header, sizeof header, 0);
    if (header.magic != cache_magic) {
      throw FormatError("cache '" + path_.string() + "': not a loadstar cache (bad magic)");
    }
    if (header.version != cache_format_version) {
      throw FormatError("cache '" + path_.string() + "': format version " +
                        std::to_string(header.version) + " is not the supported version " +
                        std::to_string(cache_format_version));
    }
    if (header.reserved0 != 0 || header.reserved1 != 0 || header.reserved2 != 0) {
      throw FormatError("cache '" + path_.string() +
                        "': corrupt header: reserved fields must be 0 but hold " +
                        std::to_string(header.reserved0) + ", " + std::to_string(header.reserved1) +
                        " and " + std::to_string(header.reserved2));
    }
    // Each term is at most the file's size before they are added: the sum cannot wrap.
    const bool sizes_fit =
        header.count < file_bytes / sizeof(std::uint64_t) && header.payload_bytes <= file_bytes;
    const std::uint64_t expected = sizes_fit ? sizeof header + header.payload_bytes +
                                                   (header.count + 1) * sizeof(std::uint64_t)
                                             : 0;
    if (!sizes_fit || expected != file_bytes) {
      throw FormatError(
          "cache '" + path_.string() + "': truncated or corrupt: the header describes " +
          std::to_string(header.count) + " records in " + std::to_string(header.payload_bytes) +
          " bytes but the file has " + std::to_string(file_bytes));
    }
    // Checks the checksum over the whole file once, in pieces.
    std::uint32_t crc = static_cast<std::uint32_t>(::crc32(0, nullptr, 0));
    std::vector<std::byte> piece(std::size_t{1} << 20);
    for (std::uint64_t at = sizeof header; at < file_bytes;) {
      const auto n =
          static_cast<std::size_t>(std::min<std::uint64_t>(piece.size(), file_bytes - at));
      read_at(piece.data(), n, at);
      crc = crc32_update(crc, piece.data(), n);
      at += n;
    }
    if (crc != header.crc) {
      throw FormatError("cache '" + path_.string() + "': checksum mismatch: stored " +
                        std::to_string(header.crc) + " but computed " + std::to_string(crc));
    }
    offsets_.resize(header.count + 1);
    read_at(offsets_.data(), offsets_.size() * sizeof(std::uint64_t),
            sizeof header + header.payload_bytes);
    // Checked once here, so that a record's offsets never make `read` allocate or read beyond
    // the payload.
    if (offsets_.front() != 0 || offsets_.back() != header.payload_bytes) {
      throw FormatError("cache '" + path_.string() + "': corrupt offsets: expected them to run " +
                        "from 0 to the payload's " + std::to_string(header.payload_bytes) +
                        " bytes but they run from " + std::to_string(offsets_.front()) + " to " +
                        std::to_string(offsets_.back()));
    }
    for (std::size_t i = 1; i < offsets_.size(); ++i) {
      if (offsets_[i] < offsets_[i - 1]) {
        throw FormatError("cache '" + path_.string() + "': corrupt offsets: record " +
                          std::to_string(i - 1) + " ends at " + std::to_string(offsets_[i]) +
                          ", before it begins at " + std::to_string(offsets_[i - 1]));
      }
    }
    payload_at_ = sizeof header;
  }

  /// The number of records.
  std::size_t size() const noexcept { return offsets_.size() - 1; }

  /// Record `index`, deserialised; `buffer` is scratch space reused between calls.
  template <Serializable E>
  E read(std::size_t index, std::vector<std::byte>& buffer) const {
    // The offsets were checked on opening: within the payload, in order.
    const std::uint64_t begin = offsets_[index];
    const std::uint64_t end = offsets_[index + 1];
    buffer.resize(static_cast<std::size_t>(end - begin));
    read_at(buffer.data(), buffer.size(), payload_at_ + begin);
    try {
      return deserialize<E>(std::span<const std::byte>(buffer));
    } catch (const Error& e) {
      throw FormatError("cache '" + path_.string() + "': record " + std::to_string(index) + ": " +
                        e.what());
    } catch (const std::bad_alloc&) {
      throw FormatError("cache '" + path_.string() + "': record " + std::to_string(index) +
                        ": cannot allocate what it declares");
    }
  }

  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  void read_at(void* data, std::size_t bytes, std::uint64_t offset) const {
    auto* p = static_cast<char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd_.get(), p, bytes, static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw FormatError("cache '" + path_.string() + "': truncated: cannot read " +
                          std::to_string(bytes) + " bytes at offset " + std::to_string(offset));
      }
      p += n;
      bytes -= static_cast<std::size_t>(n);
      offset += static_cast<std::uint64_t>(n);
    }
  }

  std::filesystem::path path_;
  FileDescriptor fd_;
  std::vector<std::uint64_t> offsets_;
  std::uint64_t payload_at_ = 0;
};

}  // namespace loadstar::detail
