/// \file
/// Durable file writes for checkpointing callbacks: whole files written, flushed to disk and
/// renamed into place, so that a killed process leaves either the old file or the new one.
#pragma once

#include "loadstar/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// The text of `errno`, for messages.
inline std::string errno_text() {
  return std::strerror(errno);
}

/// Writes `bytes` to `path` (replacing it) and flushes it to disk (`fsync`); throws `IoError`.
LOADSTAR_DECL void write_synced(const std::filesystem::path& path, std::string_view bytes);

/// Flushes the entries of directory `path` (created, renamed or removed files) to disk.
LOADSTAR_DECL void sync_directory(const std::filesystem::path& path);

/// Renames `from` to `to` (atomically replacing `to`); throws `IoError`.
LOADSTAR_DECL void rename_into_place(const std::filesystem::path& from,
                                     const std::filesystem::path& to);

/// Writes `bytes` to `path` through a temporary file beside it that is flushed and renamed into
/// place, then flushes the directory: `path` holds the old bytes or the new ones, never a part.
LOADSTAR_DECL void write_atomically(const std::filesystem::path& path, std::string_view bytes);

/// The bytes of `path`; throws `IoError` when it cannot be read.
LOADSTAR_DECL std::string read_bytes(const std::filesystem::path& path);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

void write_synced(const std::filesystem::path& path, std::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw IoError("'" + path.string() + "': cannot create: " + errno_text());
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = errno_text();
      ::close(fd);
      throw IoError("'" + path.string() + "': cannot write: " + why);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string why = errno_text();
    ::close(fd);
    throw IoError("'" + path.string() + "': cannot flush to disk: " + why);
  }
  if (::close(fd) != 0) throw IoError("'" + path.string() + "': cannot close: " + errno_text());
}

void sync_directory(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError("'" + path.string() + "': cannot open the directory: " + errno_text());
  const int synced = ::fsync(fd);
  const std::string why = synced != 0 ? errno_text() : std::string();
  ::close(fd);
  if (synced != 0) throw IoError("'" + path.string() + "': cannot flush the directory: " + why);
}

void rename_into_place(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code error;
  std::filesystem::rename(from, to, error);
  if (error) {
    throw IoError("'" + from.string() + "': cannot rename to '" + to.string() +
                  "': " + error.message());
  }
}

void write_atomically(const std::filesystem::path& path, std::string_view bytes) {
  std::filesystem::path temporary = path;
  temporary += ".tmp";
  write_synced(temporary, bytes);
  rename_into_place(temporary, path);
  sync_directory(path.has_parent_path() ? path.parent_path() : std::filesystem::path("."));
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("'" + path.string() + "': cannot open for reading");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw IoError("'" + path.string() + "': cannot read");
  return bytes;
}

}  // namespace loadstar::keras::detail
#endif
