/// \file
/// `read_idx`: MNIST-format IDX files (plain or gzip-compressed) read into a `Tensor`.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include "loadstar/data/detail/byte_order.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

namespace detail {

/// An element type an IDX file may store, from the type code of its header
/// (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
struct IdxType {
  std::uint8_t code;
  std::string_view name;
  std::size_t size;
};

inline std::optional<IdxType> idx_type(std::uint8_t code) noexcept {
  switch (code) {
    case 0x08:
      return IdxType{code, "uint8", 1};
    case 0x09:
      return IdxType{code, "int8", 1};
    case 0x0B:
      return IdxType{code, "int16", 2};
    case 0x0C:
      return IdxType{code, "int32", 4};
    case 0x0D:
      return IdxType{code, "float32", 4};
    case 0x0E:
      return IdxType{code, "float64", 8};
    default:
      return std::nullopt;
  }
}

/// Whether stored elements of `type` can be read as `T`: the same type, or a narrower signed
/// integer (int8, int16) widened into `int32_t`.
template <TensorElement T>
bool idx_type_readable_as(const IdxType& type) noexcept {
  if (type.name == dtype_name<T>()) return true;
  return std::same_as<T, std::int32_t> && (type.code == 0x09 || type.code == 0x0B);
}

inline std::string hex_byte(unsigned value) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", value & 0xffu);
  return text;
}

struct GzCloser {
  void operator()(gzFile file) const noexcept { gzclose(file); }
};

/// An open IDX file: gzread transparently reads gzip-compressed and plain files.
class IdxReader {
 public:
  explicit IdxReader(const std::filesystem::path& path) : path_(path) {
    std::error_code error;
    if (std::filesystem::is_directory(path, error)) {
      throw IoError(name() + ": cannot open (is a directory)");
    }
    errno = 0;
    file_.reset(gzopen(path.c_str(), "rb"));
    if (!file_) {
      throw IoError(name() + ": cannot open (" +
                    (errno != 0 ? std::strerror(errno) : "out of memory") + ")");
    }
    // A larger buffer than zlib's 8 KiB default: fewer read() calls for tens of megabytes.
    gzbuffer(file_.get(), 1u << 17);
  }

  /// `"idx file 'train.gz'"`: how messages name the file.
  std::string name() const { return "idx file '" + path_.string() + "'"; }

  /// Reads up to `bytes` bytes into `out`; returns how many were read (fewer only at the end of
  /// the file). Throws `FormatError` for corrupt gzip data (a CRC or length check failing) and
  /// `IoError` when the operating system reports an error.
  std::size_t read(void* out, std::size_t bytes) {
    auto* cursor = static_cast<unsigned char*>(out);
    std::size_t done = 0;
    while (done < bytes) {
      // gzread takes an unsigned and returns an int: read at most 1 GiB per call.
      const auto chunk = static_cast<unsigned>(std::min<std::size_t>(bytes - done, 1u << 30));
      const int got = gzread(file_.get(), cursor + done, chunk);
      if (got < 0) fail();
      done += static_cast<std::size_t>(got);
      if (static_cast<unsigned>(got) < chunk) {
        int code = Z_OK;
        gzerror(file_.get(), &code);
        // Z_BUF_ERROR is zlib's "unexpected end of file": the caller reports the truncation.
        if (code != Z_OK && code != Z_BUF_ERROR) fail();
        break;
      }
    }
    return done;
  }

  /// Whether the file is read as is (not gzip-compressed); valid after the first read.
  bool plain() const noexcept { return gzdirect(file_.get()) == 1; }

 private:
  [[noreturn]] void fail() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    if (code == Z_ERRNO) throw IoError(name() + ": cannot read (" + std::strerror(errno) + ")");
    // zlib prefixes its messages with the path, which ours already names.
    std::string reason = message != nullptr ? message : "unknown error";
    if (const std::string prefix = path_.string() + ": "; reason.starts_with(prefix)) {
      reason.erase(0, prefix.size());
    }
    throw FormatError(name() + ": corrupt gzip data (" + reason + ")");
  }

  std::filesystem::path path_;
  std::unique_ptr<gzFile_s, GzCloser> file_;
};

}  // namespace detail

/// Reads an IDX file (the format of MNIST and Fashion-MNIST), gzip-compressed or plain, into a
/// tensor of the stored shape.
///
/// The stored element type must be `T`'s (uint8 as `std::uint8_t`, int32 as `std::int32_t`,
/// float32 as `float`, float64 as `double`); int8 and int16 may also be read as `std::int32_t`.
/// The data are read with one `gzread` into the tensor's storage and byte-swapped in place.
/// \code
/// auto images = read_idx<std::uint8_t>("train-images-idx3-ubyte.gz", 3); // (60000, 28, 28)
/// auto labels = read_idx<std::uint8_t>("train-labels-idx1-ubyte.gz", 1); // (60000,)
/// \endcode
/// \param expected_rank when given, the rank the file must have.
/// \throws IoError when the file cannot be opened or read.
/// \throws FormatError for a bad magic number, an unknown type code, a truncated header or data,
///         data beyond the declared shape, or corrupt gzip data.
/// \throws ShapeError when the stored type cannot be read as `T` or the rank differs from
///         `expected_rank`.
template <TensorElement T>
Tensor<T> read_idx(const std::filesystem::path& file,
                   std::optional<std::size_t> expected_rank = {}) {
  detail::IdxReader reader(file);

  unsigned char magic[4];
  if (const std::size_t got = reader.read(magic, 4); got < 4) {
    throw FormatError(reader.name() +
                      ": expected a header of at least 4 bytes but the file ends after " +
                      std::to_string(got));
  }
  if (magic[0] != 0 || magic[1] != 0) {
    throw FormatError(reader.name() +
                      ": expected a magic number starting with 0x00 0x00 but found " +
                      detail::hex_byte(magic[0]) + " " + detail::hex_byte(magic[1]));
  }
  const auto type = detail::idx_type(magic[2]);
  if (!type) {
    throw FormatError(reader.name() + ": expected a type code of 0x08, 0x09, 0x0b, 0x0c, 0x0d or " +
                      "0x0e but found " + detail::hex_byte(magic[2]));
  }
  const std::size_t rank = magic[3];
  if (rank > Shape::max_rank) {
    throw FormatError(reader.name() + ": expected a rank of at most " +
                      std::to_string(Shape::max_rank) + " but found " + std::to_string(rank));
  }

  unsigned char dims_bytes[4 * Shape::max_rank];
  const std::size_t header_bytes = 4 + 4 * rank;
  if (const std::size_t got = reader.read(dims_bytes, 4 * rank); got < 4 * rank) {
    throw FormatError(reader.name() + ": expected a header of " + std::to_string(header_bytes) +
                      " bytes for rank " + std::to_string(rank) + " but the file ends after " +
                      std::to_string(4 + got));
  }
  std::size_t dims[Shape::max_rank];
  std::size_t elements = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < rank; ++i) {
    dims[i] = detail::load_big_endian_u32(dims_bytes + 4 * i);
    overflow = overflow || __builtin_mul_overflow(elements, dims[i], &elements);
  }
  const Shape shape(std::span<const std::size_t>(dims, rank));
  std::size_t data_bytes = 0;
  if (overflow || __builtin_mul_overflow(elements, type->size, &data_bytes)) {
    throw FormatError(reader.name() + ": header declares shape " + shape.str() +
                      ", too many elements to address");
  }

  if (!detail::idx_type_readable_as<T>(*type)) {
    throw ShapeError(
        reader.name() + ": holds " + std::string(type->name) + " values but " +
        std::string(dtype_name<T>()) + " was requested" +
        (type->code == 0x09 || type->code == 0x0B ? " (int8 and int16 read as int32)" : ""));
  }
  if (expected_rank && *expected_rank != rank) {
    throw ShapeError(reader.name() + ": expected rank " + std::to_string(*expected_rank) +
                     " but the file holds a " + std::string(type->name) + " array of shape " +
                     shape.str());
  }

  const auto truncated = [&](std::size_t got) {
    return FormatError(reader.name() + ": expected " + std::to_string(data_bytes) +
                       " bytes of data but the file ends after " + std::to_string(got));
  };
  const auto trailing = [&] {
    return FormatError(reader.name() + ": expected the file to end after " +
                       std::to_string(data_bytes) + " bytes of data but it holds more");
  };
  // A plain file's size is known: check it before allocating what a corrupt header declares.
  if (reader.plain()) {
    std::error_code error;
    const auto file_bytes = std::filesystem::file_size(file, error);
    // The header was read whole, so the file holds at least `header_bytes`; comparing what
    // follows it cannot overflow as `header_bytes + data_bytes` could.
    if (!error && file_bytes - header_bytes < data_bytes) {
      throw truncated(static_cast<std::size_t>(file_bytes) - header_bytes);
    }
    if (!error && file_bytes - header_bytes > data_bytes) throw trailing();
  } else {
    // Deflate expands at most 1032 times (zlib's FAQ: 258 bytes per 2 bits at best), so a gzip
    // file cannot hold more than 1032 times its size: a header declaring more is refused before
    // allocating what it declares.
    std::error_code error;
    const auto file_bytes = std::filesystem::file_size(file, error);
    constexpr std::uint64_t max_ratio = 1032;
    if (!error && file_bytes <= std::numeric_limits<std::uint64_t>::max() / max_ratio &&
        data_bytes > file_bytes * max_ratio) {
      throw FormatError(reader.name() + ": header declares shape " + shape.str() + " (" +
                        std::to_string(data_bytes) + " bytes) but a gzip file of " +
                        std::to_string(file_bytes) + " bytes decompresses to at most " +
                        std::to_string(file_bytes * max_ratio));
    }
  }

  Tensor<T> out;
  try {
    out = Tensor<T>::uninitialized(shape);
  } catch (const MemoryError&) {
    throw FormatError(reader.name() + ": header declares shape " + shape.str() + " (" +
                      std::to_string(data_bytes) + " bytes), more than can be allocated");
  }
  auto* bytes = reinterpret_cast<unsigned char*>(out.data());
  if (const std::size_t got = reader.read(bytes, data_bytes); got < data_bytes) {
    throw truncated(got);
  }
  // Reading one byte more also makes zlib check the gzip trailer (CRC and length).
  unsigned char extra;
  if (reader.read(&extra, 1) != 0) throw trailing();

  switch (type->size) {
    case 2:
      detail::big_endian_to_native<2>(bytes, elements);
      break;
    case 4:
      detail::big_endian_to_native<4>(bytes, elements);
      break;
    case 8:
      detail::big_endian_to_native<8>(bytes, elements);
      break;
    default:
      break;
  }
  if constexpr (std::same_as<T, std::int32_t>) {
    // Widen int8 or int16 in place, from the last element to the first: element i is written to
    // bytes [4i, 4i + 4), which hold only elements >= i of the narrower type, already converted.
    if (type->code == 0x09 || type->code == 0x0B) {
      for (std::size_t i = elements; i-- > 0;) {
        std::int32_t value;
        if (type->code == 0x09) {
          std::int8_t narrow;
          std::memcpy(&narrow, bytes + i, 1);
          value = narrow;
        } else {
          std::int16_t narrow;
          std::memcpy(&narrow, bytes + 2 * i, 2);
          value = narrow;
        }
        std::memcpy(bytes + 4 * i, &value, 4);
      }
    }
  }
  return out;
}

}  // namespace loadstar
