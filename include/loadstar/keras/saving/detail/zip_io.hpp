/// \file
/// The one place that includes libzip: reading and writing the zip container of Keras 3's
/// `.keras` archive (`metadata.json`, `config.json`, `model.weights.h5`).
#pragma once

#include "loadstar/config.hpp"

// libzip's header annotates pointers with Clang's nullability extension, which -Wpedantic reports.
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wnullability-extension"
#pragma clang diagnostic ignored "-Wnullability-completeness"
#endif
#include <zip.h>
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <list>
#include <string>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// `"keras archive 'model.keras'"`: how messages name an archive.
inline std::string archive_name(const std::filesystem::path& path) {
  return "keras archive '" + path.string() + "'";
}

/// Reads members of a zip archive; every problem is a `FormatError` naming the archive.
class ZipReader {
 public:
  LOADSTAR_DECL explicit ZipReader(const std::filesystem::path& path);
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;
  ~ZipReader() {
    if (zip_ != nullptr) zip_discard(zip_);
  }

  const std::string& where() const noexcept { return where_; }

  bool has(const std::string& name) const { return zip_name_locate(zip_, name.c_str(), 0) >= 0; }

  /// The members' names, in the archive's order.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    const zip_int64_t count = zip_get_num_entries(zip_, 0);
    for (zip_int64_t i = 0; i < count; ++i) {
      const char* name = zip_get_name(zip_, static_cast<zip_uint64_t>(i), 0);
      if (name != nullptr) out.emplace_back(name);
    }
    return out;
  }

  /// The bytes of member `name`; throws `FormatError` naming the archive and the member when it
  /// is missing, declares more than `max_bytes` uncompressed (a zip bomb) or more than its
  /// compressed bytes can hold, does not decompress to what it declares or fails its CRC-32.
  /// Memory grows with the data read, never to a declared size the file cannot back.
  LOADSTAR_DECL std::string read(const std::string& name, std::uint64_t max_bytes) const;

 private:
  std::string where_;
  zip_t* zip_ = nullptr;
};

/// Writes a zip archive of stored (uncompressed) members, as Python's `zipfile.ZipFile(f, "w")`
/// does for Keras; every failure is an `IoError` naming `shown`.
class ZipWriter {
 public:
  LOADSTAR_DECL ZipWriter(const std::filesystem::path& path, const std::filesystem::path& shown);
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;
  ~ZipWriter() {
    if (zip_ != nullptr) zip_discard(zip_);
  }

  /// Adds member `name` with `bytes` (kept until `close`, which writes everything).
  LOADSTAR_DECL void add(const std::string& name, std::string bytes);

  /// Writes the archive and closes it.
  LOADSTAR_DECL void close();

 private:
  [[noreturn]] LOADSTAR_DECL void fail(const std::string& what) const;

  std::string where_;
  zip_t* zip_ = nullptr;
  std::list<std::string> members_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

ZipReader::ZipReader(const std::filesystem::path& path) : where_(archive_name(path)) {
  int error = 0;
  zip_ = zip_open(path.c_str(), ZIP_RDONLY | ZIP_CHECKCONS, &error);
  if (zip_ == nullptr) {
    zip_error_t details;
    zip_error_init_with_code(&details, error);
    const std::string reason = zip_error_strerror(&details);
    zip_error_fini(&details);
    if (error == ZIP_ER_OPEN || error == ZIP_ER_READ || error == ZIP_ER_NOENT) {
      throw IoError(where_ + ": cannot open (" + reason + ")");
    }
    throw FormatError(where_ + ": not a zip archive Keras can have written (" + reason + ")");
  }
}

std::string ZipReader::read(const std::string& name, std::uint64_t max_bytes) const {
  const zip_int64_t index = zip_name_locate(zip_, name.c_str(), 0);
  if (index < 0) throw FormatError(where_ + ": member '" + name + "' missing");
  const std::string member = where_ + ": member '" + name + "'";
  zip_stat_t stat;
  zip_stat_init(&stat);
  if (zip_stat_index(zip_, static_cast<zip_uint64_t>(index), 0, &stat) != 0 ||
      (stat.valid & ZIP_STAT_SIZE) == 0 || (stat.valid & ZIP_STAT_COMP_SIZE) == 0 ||
      (stat.valid & ZIP_STAT_COMP_METHOD) == 0) {
    throw FormatError(member + " has no size (" + zip_strerror(zip_) + ")");
  }
  if (stat.size > max_bytes) {
    throw FormatError(member + " declares " + std::to_string(stat.size) +
                      " bytes, more than the limit of " + std::to_string(max_bytes));
  }
  // What the member's own bytes can hold (libzip's zip_open has checked that they lie within
  // the file): an expansion the compression method can give, none when stored; deflate's longest
  // match, 258 bytes, costs at least two bits: 1,032 to 1.
  const std::uint64_t limit = stat.comp_method == ZIP_CM_STORE     ? stat.comp_size
                              : stat.comp_method == ZIP_CM_DEFLATE ? stat.comp_size * 1032 + 1032
                                                                   : max_bytes;
  if (stat.size > limit) {
    throw FormatError(member + " declares " + std::to_string(stat.size) + " bytes but its " +
                      std::to_string(stat.comp_size) + " " +
                      (stat.comp_method == ZIP_CM_STORE ? "stored" : "deflated") +
                      " bytes can hold at most " + std::to_string(limit));
  }
  zip_file_t* file = zip_fopen_index(zip_, static_cast<zip_uint64_t>(index), 0);
  if (file == nullptr) {
    throw FormatError("cannot open " + member + " (" + zip_strerror(zip_) + ")");
  }
  // Read in chunks, the string growing with what arrives: a size the directory declares is
  // allocated at once only when the archive stores that many bytes.
  std::string bytes;
  if (stat.comp_method == ZIP_CM_STORE) bytes.reserve(static_cast<std::size_t>(stat.size));
  constexpr std::uint64_t chunk = std::uint64_t{1} << 20;
  zip_int64_t got = 0;
  while (bytes.size() < stat.size) {
    const std::size_t at = bytes.size();
    const std::uint64_t want = std::min<std::uint64_t>(chunk, stat.size - at);
    bytes.resize(at + static_cast<std::size_t>(want));
    got = zip_fread(file, bytes.data() + at, want);
    bytes.resize(at + static_cast<std::size_t>(std::max<zip_int64_t>(got, 0)));
    if (got <= 0) break;
  }
  // libzip checks the CRC-32 when the data ends, on the read after the last byte.
  char extra = 0;
  if (got >= 0 && bytes.size() == stat.size) got = zip_fread(file, &extra, 1);
  const std::string reason = zip_file_strerror(file);
  zip_error_t* error = zip_file_get_error(file);
  const bool bad_crc = got < 0 && zip_error_code_zip(error) == ZIP_ER_CRC;
  zip_fclose(file);
  if (bad_crc) {
    throw FormatError(member + ": expected data matching its CRC-32 but found other data (" +
                      reason + ")");
  }
  if (bytes.size() != stat.size) {
    throw FormatError(member + " declares " + std::to_string(stat.size) + " bytes but yields " +
                      std::to_string(bytes.size()) + (got < 0 ? " (" + reason + ")" : ""));
  }
  if (got < 0) throw FormatError(member + " cannot be read (" + reason + ")");
  if (got > 0) {
    throw FormatError(member + " declares " + std::to_string(stat.size) + " bytes but holds more");
  }
  return bytes;
}

ZipWriter::ZipWriter(const std::filesystem::path& path, const std::filesystem::path& shown)
    : where_(archive_name(shown)) {
  int error = 0;
  zip_ = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  if (zip_ == nullptr) {
    zip_error_t details;
    zip_error_init_with_code(&details, error);
    const std::string reason = zip_error_strerror(&details);
    zip_error_fini(&details);
    throw IoError(where_ + ": cannot create (" + reason + ")");
  }
}

void ZipWriter::add(const std::string& name, std::string bytes) {
  const std::string& kept = members_.emplace_back(std::move(bytes));
  zip_source_t* source = zip_source_buffer(zip_, kept.data(), kept.size(), 0);
  if (source == nullptr) fail("cannot add member '" + name + "'");
  const zip_int64_t index = zip_file_add(zip_, name.c_str(), source, ZIP_FL_ENC_UTF_8);
  if (index < 0) {
    zip_source_free(source);
    fail("cannot add member '" + name + "'");
  }
  if (zip_set_file_compression(zip_, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0) != 0) {
    fail("cannot store member '" + name + "'");
  }
}

void ZipWriter::close() {
  if (zip_close(zip_) != 0) fail("cannot write the archive");
  zip_ = nullptr;
}

void ZipWriter::fail(const std::string& what) const {
  throw IoError(where_ + ": " + what + " (" + zip_strerror(zip_) + ")");
}

}  // namespace loadstar::keras::detail
#endif
