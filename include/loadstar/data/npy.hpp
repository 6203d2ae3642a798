/// \file
/// `read_npy` and `write_npy`: NumPy `.npy` files (format versions 1.0, 2.0 and 3.0) to and from
/// a `Tensor`.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "loadstar/data/detail/byte_order.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// What the header of a `.npy` file declares.
struct NpyHeader {
  /// The element kind: `'f'` (floating point), `'i'` (signed integer), `'u'` (unsigned
  /// integer) or `'b'` (bool).
  char kind = 'f';
  /// Bytes per element: 2, 4 or 8 for `'f'`, 1, 2, 4 or 8 for `'i'` and `'u'`, 1 for `'b'`.
  std::size_t item_size = 4;
  /// Whether the elements are stored big-endian.
  bool big_endian = false;
  /// The array's shape (C order).
  Shape shape;
  /// The format version, `1`, `2` or `3`.
  int major_version = 1;
  /// The offset of the first element from the start of the file.
  std::size_t data_offset = 0;

  /// NumPy's name of the element type (`"float32"`, `"int16"`, `"bool"`).
  std::string dtype_name() const {
    if (kind == 'b') return "bool";
    const std::string base = kind == 'f' ? "float" : kind == 'i' ? "int" : "uint";
    return base + std::to_string(item_size * 8);
  }
};

namespace detail {

/// `"npy file 'x.npy'"`: how messages name the file.
inline std::string npy_file_name(const std::filesystem::path& path) {
  return "npy file '" + path.string() + "'";
}

/// NumPy's magic string: `\x93NUMPY`.
inline constexpr unsigned char npy_magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/// The largest header accepted. NumPy itself refuses headers over 10000 bytes unless told
/// otherwise (`max_header_size`, numpy/lib/format.py); a header of a supported (non-structured)
/// dtype with at most `Shape::max_rank` dimensions is below 200 bytes.
inline constexpr std::size_t npy_max_header_bytes = 1u << 16;

/// An open file descriptor, closed on scope exit.
struct NpyFd {
  int fd = -1;
  NpyFd() = default;
  explicit NpyFd(int descriptor) : fd(descriptor) {}
  NpyFd(const NpyFd&) = delete;
  NpyFd& operator=(const NpyFd&) = delete;
  ~NpyFd() {
    if (fd >= 0) ::close(fd);
  }
};

/// Reads exactly `bytes` bytes at `offset` or as many as the file holds; returns how many.
inline std::size_t npy_read_at(int fd, const std::string& where, void* out, std::size_t bytes,
                               std::uint64_t offset) {
  auto* cursor = static_cast<unsigned char*>(out);
  std::size_t done = 0;
  while (done < bytes) {
    const std::size_t chunk = std::min<std::size_t>(bytes - done, std::size_t{1} << 30);
    const ssize_t got = ::pread(fd, cursor + done, chunk, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      throw IoError(where + ": cannot read (" + std::strerror(errno) + ")");
    }
    if (got == 0) break;
    done += static_cast<std::size_t>(got);
  }
  return done;
}

/// A parser of the header: the repr of a Python dict with the keys `descr`, `fortran_order` and
/// `shape` (numpy/lib/format.py writes `{'descr': '<f4', 'fortran_order': False, 'shape': (2,
/// 3), }`, padded with spaces and ended by a newline). Accepts the subset of Python literal
/// syntax those values use, both quote characters, Python 2's `3L` integers and trailing commas.
class NpyHeaderParser {
 public:
  NpyHeaderParser(std::string_view text, std::string where)
      : text_(text), where_(std::move(where)) {}

  /// Parses the dict into `header` (its `kind`, `item_size`, `big_endian` and `shape`).
  void parse(NpyHeader& header) {
    skip_space();
    expect('{', "'{' opening the header dict");
    bool have_descr = false;
    bool have_order = false;
    bool have_shape = false;
    skip_space();
    while (!at('}')) {
      const std::string key = string_literal("a quoted key");
      skip_space();
      expect(':', "':' after key '" + key + "'");
      skip_space();
      if (key == "descr") {
        if (at('[')) {
          fail(
              "descr is a list (a structured dtype), which is not supported; expected a plain "
              "numeric or bool dtype");
        }
        parse_descr(string_literal("a quoted descr"), header);
        have_descr = true;
      } else if (key == "fortran_order") {
        if (word("True")) {
          fail(
              "fortran_order is True (column-major data), which is not supported; save a "
              "C-order array (numpy.ascontiguousarray)");
        }
        if (!word("False")) fail("expected False or True for fortran_order");
        have_order = true;
      } else if (key == "shape") {
        header.shape = shape_tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "' (expected only descr, fortran_order and shape)");
      }
      skip_space();
      if (at(',')) {
        ++position_;
        skip_space();
      } else if (!at('}')) {
        fail("expected ',' or '}' after the value of '" + key + "'");
      }
    }
    ++position_;
    if (!have_descr || !have_order || !have_shape) {
      fail(std::string("missing key '") +
           (!have_descr   ? "descr"
            : !have_order ? "fortran_order"
                          : "shape") +
           "'");
    }
    skip_space();
    if (position_ != text_.size()) fail("unexpected text after the header dict");
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw FormatError(where_ + ": malformed header at byte " + std::to_string(position_) +
                      " of the header dict: " + what);
  }
  bool at(char c) const { return position_ < text_.size() && text_[position_] == c; }
  void expect(char c, const std::string& what) {
    if (!at(c)) fail("expected " + what);
    ++position_;
  }
  void skip_space() {
    while (position_ < text_.size() && (text_[position_] == ' ' || text_[position_] == '\t' ||
                                        text_[position_] == '\n' || text_[position_] == '\r')) {
      ++position_;
    }
  }
  bool word(std::string_view w) {
    if (text_.substr(position_, w.size()) != w) return false;
    position_ += w.size();
    return true;
  }
  std::string string_literal(const std::string& what) {
    if (!at('\'') && !at('"')) fail("expected " + what);
    const char quote = text_[position_++];
    const std::size_t start = position_;
    while (position_ < text_.size() && text_[position_] != quote) {
      if (text_[position_] == '\\' || text_[position_] == '\n') fail("unsupported string literal");
      ++position_;
    }
    if (position_ == text_.size()) fail("unterminated string literal");
    return std::string(text_.substr(start, position_++ - start));
  }
  std::uint64_t integer() {
    if (position_ >= text_.size() || text_[position_] < '0' || text_[position_] > '9') {
      fail("expected a non-negative integer in the shape");
    }
    std::uint64_t value = 0;
    while (position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9') {
      if (__builtin_mul_overflow(value, 10u, &value) ||
          __builtin_add_overflow(value, static_cast<unsigned>(text_[position_] - '0'), &value)) {
        fail("a dimension of the shape does not fit in 64 bits");
      }
      ++position_;
    }
    if (at('L')) ++position_;  // Python 2's long literal
    return value;
  }
  Shape shape_tuple() {
    expect('(', "'(' opening the shape tuple");
    std::uint64_t dims[Shape::max_rank];
    std::size_t rank = 0;
    skip_space();
    bool comma = true;
    while (!at(')')) {
      if (!comma) fail("expected ',' or ')' in the shape tuple");
      const std::uint64_t d = integer();
      if (rank == Shape::max_rank) {
        fail("the shape has more than " + std::to_string(Shape::max_rank) + " dimensions");
      }
      dims[rank++] = d;
      skip_space();
      comma = at(',');
      if (comma) ++position_;
      skip_space();
    }
    ++position_;
    // Python's `(3)` is the integer 3, not a tuple: NumPy never writes it.
    if (rank == 1 && !comma) fail("expected ',' after the only dimension of the shape tuple");
    std::uint64_t elements = 1;
    for (std::size_t i = 0; i < rank; ++i) {
      if (__builtin_mul_overflow(elements, dims[i], &elements) ||
          elements > std::numeric_limits<std::size_t>::max()) {
        fail("the shape's element count does not fit in 64 bits");
      }
    }
    return Shape(std::span<const std::uint64_t>(dims, rank));
  }
  void parse_descr(const std::string& descr, NpyHeader& header) {
    std::string_view rest = descr;
    char order = '=';
    if (!rest.empty() && (rest[0] == '<' || rest[0] == '>' || rest[0] == '|' || rest[0] == '=')) {
      order = rest[0];
      rest.remove_prefix(1);
    }
    const auto unsupported = [&] {
      fail("unsupported descr '" + descr +
           "'; expected f2, f4, f8, i1, i2, i4, i8, u1, u2, u4, u8 or b1 with an optional byte "
           "order "
           "(<, >, |, =)");
    };
    if (rest.size() != 2) unsupported();
    const char kind = rest[0];
    const char size = rest[1];
    const bool ok = (kind == 'f' && (size == '2' || size == '4' || size == '8')) ||
                    ((kind == 'i' || kind == 'u') &&
                     (size == '1' || size == '2' || size == '4' || size == '8')) ||
                    (kind == 'b' && size == '1');
    if (!ok) unsupported();
    header.kind = kind;
    header.item_size = static_cast<std::size_t>(size - '0');
    header.big_endian =
        header.item_size > 1 && (order == '>' || ((order == '=' || order == '|') &&
                                                  std::endian::native == std::endian::big));
  }

  std::string_view text_;
  std::string where_;
  std::size_t position_ = 0;
};

/// Reads and checks the preamble and header of the `.npy` file open as `fd` of `file_bytes`
/// bytes: magic string, version, header length, dict, and that the file holds exactly the data
/// the shape and dtype declare.
inline NpyHeader read_npy_header(int fd, std::uint64_t file_bytes, const std::string& where) {
  unsigned char preamble[12];
  const std::size_t got = npy_read_at(fd, where, preamble, sizeof preamble, 0);
  if (got < 10) {
    throw FormatError(where + ": expected a preamble of at least 10 bytes but the file holds " +
                      std::to_string(got));
  }
  if (std::memcmp(preamble, npy_magic, sizeof npy_magic) != 0) {
    throw FormatError(where + ": expected the magic string \\x93NUMPY at the start of the file");
  }
  NpyHeader header;
  const unsigned major = preamble[6];
  const unsigned minor = preamble[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    throw FormatError(where + ": expected format version 1.0, 2.0 or 3.0 but found " +
                      std::to_string(major) + "." + std::to_string(minor));
  }
  header.major_version = static_cast<int>(major);
  std::size_t length_bytes = major == 1 ? 2 : 4;
  if (got < 8 + length_bytes) {
    throw FormatError(where + ": expected a preamble of " + std::to_string(8 + length_bytes) +
                      " bytes for version " + std::to_string(major) + ".0 but the file holds " +
                      std::to_string(got));
  }
  std::size_t header_bytes = std::size_t{preamble[8]} | (std::size_t{preamble[9]} << 8);
  if (major != 1) {
    header_bytes |= (std::size_t{preamble[10]} << 16) | (std::size_t{preamble[11]} << 24);
  }
  const std::size_t header_start = 8 + length_bytes;
  if (header_bytes > npy_max_header_bytes) {
    throw FormatError(where + ": header length " + std::to_string(header_bytes) +
                      " exceeds the limit of " + std::to_string(npy_max_header_bytes) + " bytes");
  }
  if (file_bytes < header_start + header_bytes) {
    throw FormatError(where + ": header length " + std::to_string(header_bytes) +
                      " runs past the end of the file (" + std::to_string(file_bytes) + " bytes)");
  }
  std::string text(header_bytes, '\0');
  npy_read_at(fd, where, text.data(), header_bytes, header_start);
  if (text.empty() || text.back() != '\n') {
    throw FormatError(where + ": expected the header to end with a newline");
  }
  // Versions 1.0 and 2.0 store latin-1, 3.0 utf-8; a supported header is plain ASCII either way.
  for (const char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80 ||
        (c < 0x20 && c != '\n' && c != '\t' && c != '\r')) {
      throw FormatError(where + ": the header holds a byte that is not printable ASCII");
    }
  }
  NpyHeaderParser(text, where).parse(header);
  header.data_offset = header_start + header_bytes;

  const std::uint64_t elements = header.shape.elements();
  std::uint64_t data_bytes = 0;
  if (__builtin_mul_overflow(elements, header.item_size, &data_bytes)) {
    throw FormatError(where + ": shape " + header.shape.str() + " of " + header.dtype_name() +
                      " is too large to address");
  }
  const std::uint64_t available = file_bytes - header.data_offset;
  if (available < data_bytes) {
    throw FormatError(where + ": shape " + header.shape.str() + " of " + header.dtype_name() +
                      " needs " + std::to_string(data_bytes) +
                      " bytes of data but the file holds " + std::to_string(available));
  }
  if (available > data_bytes) {
    throw FormatError(where + ": shape " + header.shape.str() + " of " + header.dtype_name() +
                      " needs " + std::to_string(data_bytes) +
                      " bytes of data but the file holds " + std::to_string(available) + " (" +
                      std::to_string(available - data_bytes) + " trailing bytes)");
  }
  return header;
}

/// Opens `file` for reading and returns its descriptor and size.
inline std::uint64_t npy_open(const std::filesystem::path& file, const std::string& where,
                              NpyFd& fd) {
  fd.fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd.fd < 0) throw IoError(where + ": cannot open (" + std::strerror(errno) + ")");
  struct stat info {};
  if (::fstat(fd.fd, &info) != 0) {
    throw IoError(where + ": cannot stat (" + std::strerror(errno) + ")");
  }
  if (S_ISDIR(info.st_mode)) throw IoError(where + ": cannot open (is a directory)");
  if (!S_ISREG(info.st_mode)) throw IoError(where + ": cannot open (not a regular file)");
  return static_cast<std::uint64_t>(info.st_size);
}

/// Converts `count` stored elements of type `S` at `bytes` into `out`, swapping bytes first for
/// big-endian data. Integer targets reject values outside their range.
template <class S, TensorElement T>
void npy_convert(unsigned char* bytes, std::size_t count, bool swap, T* out, std::size_t first,
                 const std::string& where) {
  if constexpr (std::same_as<S, bool>) {
    // NumPy stores 0 and 1, but a file may hold any byte: only 0 is false. (Copying a byte other
    // than 0 or 1 into a C++ bool is undefined behaviour.)
    for (std::size_t i = 0; i < count; ++i)
      out[i] = static_cast<T>(bytes[i] != 0 ? 1 : 0);
  } else {
    if (swap) swap_bytes_in_place<sizeof(S)>(bytes, count);
    for (std::size_t i = 0; i < count; ++i) {
      S value;
      std::memcpy(&value, bytes + i * sizeof(S), sizeof(S));
      if constexpr (FloatingElement<T>) {
        out[i] = static_cast<T>(value);
      } else {
        static_assert(std::integral<S>, "floating-point elements are refused before conversion");
        if (!std::in_range<T>(value)) {
          throw ShapeError(where + ": element " + std::to_string(first + i) + " (" +
                           std::to_string(value) + ") does not fit in " +
                           std::string(dtype_name<T>()));
        }
        out[i] = static_cast<T>(value);
      }
    }
  }
}

/// Calls `f.template operator()<S>()` with `S` the C++ type of the stored elements.
template <class F>
void npy_dispatch(const NpyHeader& header, F&& f) {
  switch (header.kind) {
    case 'f':
      if (header.item_size == 2) return f.template operator()<float16>();
      if (header.item_size == 4) return f.template operator()<float>();
      return f.template operator()<double>();
    case 'b':
      return f.template operator()<bool>();
    case 'i':
      switch (header.item_size) {
        case 1:
          return f.template operator()<std::int8_t>();
        case 2:
          return f.template operator()<std::int16_t>();
        case 4:
          return f.template operator()<std::int32_t>();
        default:
          return f.template operator()<std::int64_t>();
      }
    default:
      switch (header.item_size) {
        case 1:
          return f.template operator()<std::uint8_t>();
        case 2:
          return f.template operator()<std::uint16_t>();
        case 4:
          return f.template operator()<std::uint32_t>();
        default:
          return f.template operator()<std::uint64_t>();
      }
  }
}

/// The element types NumPy has a dtype for: every `TensorElement` but `bfloat16`.
template <class T>
concept NpyElement = TensorElement<T> && !std::same_as<T, bfloat16>;

/// NumPy's descr of `T` as this machine stores it (`"<f4"`, `"|u1"`).
template <NpyElement T>
std::string npy_descr() {
  const char order = sizeof(T) == 1 ? '|' : std::endian::native == std::endian::little ? '<' : '>';
  const char kind = FloatingElement<T> ? 'f' : std::signed_integral<T> ? 'i' : 'u';
  return std::string{order, kind, static_cast<char>('0' + sizeof(T))};
}

/// The header dict NumPy writes for `T` and `shape`, padded with spaces and a newline so that
/// the data start at a multiple of 64 bytes (numpy/lib/format.py, `ARRAY_ALIGN`).
template <NpyElement T>
std::string npy_header_text(const Shape& shape, std::size_t preamble_bytes) {
  std::string dims;
  for (std::size_t i = 0; i < shape.rank(); ++i) {
    if (i != 0) dims += ", ";
    dims += std::to_string(shape[i]);
  }
  if (shape.rank() == 1) dims += ",";
  std::string text =
      "{'descr': '" + npy_descr<T>() + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const std::size_t total = preamble_bytes + text.size() + 1;
  text.append((64 - total % 64) % 64, ' ');
  text += '\n';
  return text;
}

/// Writes all of `bytes` to `fd`.
inline void npy_write_all(int fd, const void* bytes, std::size_t size, const std::string& where,
                          const std::filesystem::path& temporary) {
  const auto* cursor = static_cast<const unsigned char*>(bytes);
  while (size != 0) {
    const ssize_t put = ::write(fd, cursor, std::min<std::size_t>(size, std::size_t{1} << 30));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw IoError(where + ": cannot write '" + temporary.string() + "' (" + std::strerror(errno) +
                    ")");
    }
    cursor += put;
    size -= static_cast<std::size_t>(put);
  }
}

}  // namespace detail

/// Reads the header of the `.npy` file `file` (its element type, byte order and shape) and
/// checks that the file holds exactly the data they declare, without reading the data.
/// \throws IoError when the file cannot be opened or read.
/// \throws FormatError for everything `read_npy` refuses in a header.
inline NpyHeader read_npy_header(const std::filesystem::path& file) {
  const std::string where = detail::npy_file_name(file);
  detail::NpyFd fd;
  const std::uint64_t file_bytes = detail::npy_open(file, where, fd);
  return detail::read_npy_header(fd.fd, file_bytes, where);
}

namespace detail {

/// `read_npy` of the `.npy` data open as `fd`, `file_bytes` long (a file, or an `.npz` member in
/// a memfd); messages begin with `where`.
template <TensorElement T>
Tensor<T> read_npy_fd(int fd, std::uint64_t file_bytes, const std::string& where) {
  const NpyHeader header = read_npy_header(fd, file_bytes, where);
  if (std::integral<T> && header.kind == 'f') {
    throw ShapeError(where + ": holds " + header.dtype_name() + " values but " +
                     std::string(dtype_name<T>()) + " was requested");
  }
  // The data fit in the file, so this allocation is bounded by the file's size.
  Tensor<T> out;
  try {
    out = Tensor<T>::uninitialized(header.shape);
  } catch (const MemoryError&) {
    throw FormatError(where + ": cannot allocate " + std::to_string(header.shape.elements()) +
                      " elements of " + std::string(dtype_name<T>()));
  }
  const std::size_t count = header.shape.elements();
  if (count == 0) return out;
  // The stored type is T's, in this machine's order: read straight into the tensor.
  const bool native = !header.big_endian || header.item_size == 1;
  // bfloat16 is stored by no NumPy dtype: always converted.
  const bool same_kind = (FloatingElement<T> && !std::same_as<T, bfloat16> && header.kind == 'f') ||
                         (std::signed_integral<T> && header.kind == 'i') ||
                         (std::unsigned_integral<T> && header.kind == 'u');
  if (native && same_kind && header.item_size == sizeof(T)) {
    npy_read_at(fd, where, out.data(), out.bytes(), header.data_offset);
    return out;
  }
  // Otherwise convert in chunks of 1 MiB of stored data.
  npy_dispatch(header, [&]<class S>() {
    if constexpr (std::integral<T> && FloatingElement<S>) {
      // Refused above; not instantiated with a conversion that would need it.
    } else {
      constexpr std::size_t chunk = (std::size_t{1} << 20) / sizeof(S);
      std::vector<unsigned char> buffer(std::min(count, chunk) * sizeof(S));
      for (std::size_t first = 0; first < count; first += chunk) {
        const std::size_t n = std::min(chunk, count - first);
        npy_read_at(fd, where, buffer.data(), n * sizeof(S),
                    header.data_offset + first * sizeof(S));
        npy_convert<S, T>(buffer.data(), n, header.big_endian && sizeof(S) > 1, out.data() + first,
                          first, where);
      }
    }
  });
  return out;
}

}  // namespace detail

/// Reads a NumPy `.npy` file into a tensor of the stored shape.
///
/// Format versions 1.0, 2.0 and 3.0 are read, as written by `numpy.save`, with elements of
/// float16, float32, float64, int8 to int64, uint8 to uint64 or bool in either byte order, in C
/// order. They are converted to `T`: any of them to a floating-point `T` (bool as 0 and 1, 64-bit
/// integers rounded; to `bfloat16`, which NumPy has no dtype for, rounding to nearest even),
/// integers and bools to an integer `T` when every value fits. A scalar array gives a rank-0
/// tensor. \code auto x = read_npy<float>("x.npy");          // float64, int8, bool... converted to
/// float auto labels = read_npy<std::int64_t>("y.npy"); \endcode \throws IoError when the file is
/// missing, a directory or unreadable. \throws FormatError naming the file and what was wrong for a
/// bad magic string or version, a
///         header length past the end of the file, a header that is not the dict NumPy writes
///         (missing or unknown keys, a bad shape tuple, more than `Shape::max_rank` dimensions),
///         an unsupported dtype (structured, complex, strings, objects),
///         `fortran_order` True, or data shorter or longer than the shape declares.
/// \throws ShapeError when floating-point data are read as an integer `T`, or an integer does
///         not fit in `T`.
template <TensorElement T>
Tensor<T> read_npy(const std::filesystem::path& file) {
  const std::string where = detail::npy_file_name(file);
  detail::NpyFd fd;
  const std::uint64_t file_bytes = detail::npy_open(file, where, fd);
  return detail::read_npy_fd<T>(fd.fd, file_bytes, where);
}

/// Writes `tensor` as a NumPy `.npy` file (format version 1.0, `T`'s dtype in this machine's byte
/// order, C order) that `numpy.load` reads back with the same shape and values.
///
/// Nothing is lost on failure: the file is written under a temporary name beside `file` and
/// renamed into place, replacing an existing file.
/// \code
/// write_npy("predictions.npy", model.predict(x));
/// \endcode
/// \throws IoError when the temporary file cannot be created, written or renamed.
/// \throws DeviceError when `tensor` lives in device memory.
template <TensorElement T>
void write_npy(const std::filesystem::path& file, const Tensor<T>& tensor) {
  static_assert(!std::same_as<T, bfloat16>,
                "NumPy has no bfloat16 dtype: write tensor.cast<float>() (exact) instead");
  namespace fs = std::filesystem;
  tensor.require_host("write_npy");
  const std::string where = detail::npy_file_name(file);
  static std::atomic<unsigned> counter{0};
  const fs::path temporary =
      file.parent_path() / ("." + file.filename().string() + ".tmp-" + std::to_string(::getpid()) +
                            "-" + std::to_string(counter++));
  detail::NpyFd fd(::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.fd < 0) {
    throw IoError(where + ": cannot create '" + temporary.string() + "' (" + std::strerror(errno) +
                  ")");
  }
  // Removes the temporary file on every early exit.
  struct Cleanup {
    const fs::path& path;
    bool armed = true;
    ~Cleanup() {
      std::error_code ignored;
      if (armed) fs::remove(path, ignored);
    }
  } cleanup{temporary};
  constexpr std::size_t preamble_bytes = 10;
  const std::string text = detail::npy_header_text<T>(tensor.shape(), preamble_bytes);
  std::string preamble(reinterpret_cast<const char*>(detail::npy_magic), 6);
  preamble += '\x01';
  preamble += '\x00';
  preamble += static_cast<char>(text.size() & 0xff);
  preamble += static_cast<char>(text.size() >> 8);
  detail::npy_write_all(fd.fd, preamble.data(), preamble.size(), where, temporary);
  detail::npy_write_all(fd.fd, text.data(), text.size(), where, temporary);
  if (!tensor.empty())
    detail::npy_write_all(fd.fd, tensor.data(), tensor.bytes(), where, temporary);
  if (::fsync(fd.fd) != 0) {
    throw IoError(where + ": cannot flush '" + temporary.string() + "' (" + std::strerror(errno) +
                  ")");
  }
  std::error_code error;
  fs::rename(temporary, file, error);
  if (error) {
    throw IoError(where + ": cannot rename '" + temporary.string() + "' into place (" +
                  error.message() + ")");
  }
  cleanup.armed = false;
}

}  // namespace loadstar
