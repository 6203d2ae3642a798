/// \file
/// A read-only mapping of a whole file: the byte source of an uncompressed TFRecord file, whose
/// records are checked and copied straight from the page cache.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

namespace loadstar::detail {

/// A regular file mapped read-only (`MAP_PRIVATE`, `PROT_READ`, `MADV_SEQUENTIAL`) at its size
/// when opened. Reading it costs no copy into a buffer of ours, as `read()` does.
///
/// A page of the mapping that the file no longer holds (truncated since) raises SIGBUS where
/// `read()` gives a short read; so before taking bytes up to `end`, a reader asks `holds(end)`,
/// which asks the file's size again (`fstat`) whenever `end` passes the last size seen, and at
/// least every `recheck_bytes`. That turns a file truncated before the reader comes to the missing
/// bytes into an error; one truncated within the bytes it is reading at that moment is still a
/// SIGBUS, as with any mapped file.
class MappedFile {
 public:
  /// How far reading goes on after a size check before the next.
  static constexpr std::uint64_t recheck_bytes = 1 << 20;

  /// The mapping of `path`, or nothing where it is no non-empty regular file that can be opened
  /// and mapped: the caller reads it with `read()` then, and reports what went wrong.
  static std::optional<MappedFile> open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    struct stat info {};
    if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) || info.st_size <= 0 ||
        static_cast<std::uint64_t>(info.st_size) > std::numeric_limits<std::size_t>::max()) {
      ::close(fd);
      return std::nullopt;
    }
    const auto size = static_cast<std::size_t>(info.st_size);
    void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      ::close(fd);
      return std::nullopt;
    }
    // Readahead, and pages read once not kept ahead of others (a hint: ignoring it is harmless).
    (void)::madvise(data, size, MADV_SEQUENTIAL);
    return MappedFile(fd, static_cast<const char*>(data), size);
  }

  MappedFile(MappedFile&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)),
        data_(std::exchange(other.data_, nullptr)),
        size_(other.size_),
        seen_size_(other.seen_size_),
        checked_(other.checked_) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      release();
      fd_ = std::exchange(other.fd_, -1);
      data_ = std::exchange(other.data_, nullptr);
      size_ = other.size_;
      seen_size_ = other.seen_size_;
      checked_ = other.checked_;
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { release(); }

  /// The file's bytes, `size()` of them: the file as it was when opened.
  const char* data() const noexcept { return data_; }
  std::uint64_t size() const noexcept { return size_; }

  /// Whether the file still holds its first `end` bytes (`end <= size()`), checked with `fstat`
  /// when `end` passes the last check; false also when `fstat` fails.
  bool holds(std::uint64_t end) {
    if (end <= checked_) return true;
    struct stat info {};
    if (::fstat(fd_, &info) != 0) {
      seen_size_ = 0;
      return false;
    }
    seen_size_ = static_cast<std::uint64_t>(info.st_size);
    if (seen_size_ < end) return false;
    const std::uint64_t limit = std::min(seen_size_, size_);
    checked_ = std::max(end, std::min(limit, end + recheck_bytes));
    return true;
  }
  /// The size the last check found.
  std::uint64_t seen_size() const noexcept { return seen_size_; }

 private:
  MappedFile(int fd, const char* data, std::uint64_t size) noexcept
      : fd_(fd), data_(data), size_(size), seen_size_(size) {}

  void release() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), static_cast<std::size_t>(size_));
    if (fd_ >= 0) ::close(fd_);
    data_ = nullptr;
    fd_ = -1;
  }

  int fd_ = -1;
  const char* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t seen_size_ = 0;
  std::uint64_t checked_ = 0;  // The file held its first checked_ bytes at the last check.
};

}  // namespace loadstar::detail
