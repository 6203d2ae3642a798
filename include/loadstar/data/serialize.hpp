/// \file
/// The serialization customization point through which batches cross a process boundary.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// The alignment of tensor data inside serialized bytes, relative to the start of the buffer, so
/// that a reader whose buffer starts aligned (a shared-memory slot) can view tensors in place.
inline constexpr std::size_t serialized_alignment = 64;

/// Appends bytes to a buffer of at least `Serializer<T>::size` bytes, or to one of a given
/// capacity, past which it only counts.
class ByteWriter {
 public:
  explicit ByteWriter(std::byte* out) noexcept : begin_(out) {}
  /// Writes at most `capacity` bytes: what goes past them is counted in `written()`, not written,
  /// and `overflowed()` tells. `mirror` (`mirror_bytes` long) is where this same buffer is also
  /// mapped, when tensors may have been built inside it: their data is then referenced by its
  /// offset rather than copied (see `locate`).
  ByteWriter(std::byte* out, std::size_t capacity, const std::byte* mirror = nullptr,
             std::size_t mirror_bytes = 0) noexcept
      : begin_(out), capacity_(capacity), mirror_(mirror), mirror_bytes_(mirror_bytes) {}
  void write(const void* data, std::size_t bytes) noexcept {
    if (bytes != 0 && fits(bytes)) std::memcpy(begin_ + offset_, data, bytes);
    offset_ += bytes;
  }
  /// Pads with zeros up to the next multiple of `serialized_alignment` from the start.
  void align() noexcept {
    const std::size_t pad =
        (serialized_alignment - offset_ % serialized_alignment) % serialized_alignment;
    if (pad != 0 && fits(pad)) std::memset(begin_ + offset_, 0, pad);
    offset_ += pad;
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void value(const T& v) noexcept { write(&v, sizeof(T)); }
  std::byte* cursor() const noexcept { return begin_ + offset_; }
  /// The bytes written so far (counted ones included).
  std::size_t written() const noexcept { return offset_; }
  /// Whether more than the capacity was asked for.
  bool overflowed() const noexcept { return offset_ > capacity_; }
  /// The offset from the start of the buffer of the `bytes` at `data`, when they lie inside the
  /// buffer's mirror, aligned to `serialized_alignment`: data built in place, which a reader of
  /// this buffer finds there without a copy.
  std::optional<std::uint64_t> locate(const void* data, std::size_t bytes) const noexcept {
    const auto at = reinterpret_cast<std::uintptr_t>(data);
    const auto base = reinterpret_cast<std::uintptr_t>(mirror_);
    if (mirror_ == nullptr || bytes == 0 || at < base || at - base > mirror_bytes_ ||
        bytes > mirror_bytes_ - (at - base) || (at - base) % serialized_alignment != 0) {
      return std::nullopt;
    }
    return at - base;
  }

 private:
  bool fits(std::size_t bytes) const noexcept {
    return offset_ <= capacity_ && bytes <= capacity_ - offset_;
  }

  std::byte* begin_;
  std::size_t offset_ = 0;
  std::size_t capacity_ = static_cast<std::size_t>(-1);
  const std::byte* mirror_ = nullptr;
  std::size_t mirror_bytes_ = 0;
};

/// Reads bytes back, throwing `FormatError` rather than reading past the end of the buffer.
/// Given an `owner` that keeps the buffer alive and unchanged, tensors are read as views of the
/// buffer instead of copies.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in, std::shared_ptr<void> owner = {}) noexcept
      : begin_(in.data()),
        cursor_(in.data()),
        end_(in.data() + in.size()),
        owner_(std::move(owner)) {}
  /// Skips the padding `ByteWriter::align` wrote.
  void align() {
    const auto offset = static_cast<std::size_t>(cursor_ - begin_);
    const std::size_t pad =
        (serialized_alignment - offset % serialized_alignment) % serialized_alignment;
    skip(pad);
  }
  /// Advances past `bytes` bytes and returns where they start.
  const std::byte* skip(std::size_t bytes) {
    if (bytes > remaining()) {
      throw FormatError("serialized batch: expected " + std::to_string(bytes) +
                        " more bytes but only " + std::to_string(remaining()) + " remain");
    }
    const std::byte* at = cursor_;
    cursor_ += bytes;
    return at;
  }
  /// The `bytes` at `offset` from the start of the buffer, wherever the cursor is; throws
  /// `FormatError` when they do not lie inside it.
  const std::byte* at(std::uint64_t offset, std::size_t bytes) const {
    const auto size = static_cast<std::size_t>(end_ - begin_);
    if (offset > size || bytes > size - offset) {
      throw FormatError("serialized batch: " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(offset) + " lie outside its " + std::to_string(size) +
                        " bytes");
    }
    return begin_ + offset;
  }
  /// What keeps the buffer alive, or null when tensors must be copied out of it.
  const std::shared_ptr<void>& owner() const noexcept { return owner_; }
  void read(void* data, std::size_t bytes) {
    if (bytes > static_cast<std::size_t>(end_ - cursor_)) {
      throw FormatError("serialized batch: expected " + std::to_string(bytes) +
                        " more bytes but only " + std::to_string(end_ - cursor_) + " remain");
    }
    if (bytes != 0) std::memcpy(data, cursor_, bytes);
    cursor_ += bytes;
  }
  template <class T>
  requires std::is_trivially_copyable_v<T> T value() {
    T v;
    read(&v, sizeof(T));
    return v;
  }
  std::size_t remaining() const noexcept { return static_cast<std::size_t>(end_ - cursor_); }

 private:
  const std::byte* begin_;
  const std::byte* cursor_;
  const std::byte* end_;
  std::shared_ptr<void> owner_;
};

/// The customization point: specialise `Serializer<T>` with
/// `static std::size_t size(const T&)` (a bound on the bytes `write` appends),
/// `static void write(const T&, ByteWriter&)` and `static T read(ByteReader&)`. Provided for
/// `Tensor<T>`, arithmetic types, `std::string`, and recursively for `std::vector`, `std::map`,
/// `std::pair`, `std::tuple` and `std::optional`.
/// \code
/// template <> struct loadstar::Serializer<Point> {
///   static std::size_t size(const Point&) { return 2 * sizeof(float); }
///   static void write(const Point& p, ByteWriter& out) { out.value(p.x); out.value(p.y); }
///   static Point read(ByteReader& in) { return {in.value<float>(), in.value<float>()}; }
/// };
/// \endcode
template <class T>
struct Serializer {};

/// A type whose values `Serializer<T>` can write to bytes and read back.
///
/// Semantic requirements: `write` appends at most `size(v)` bytes and `read` of them gives a
/// value equal to `v` (for tensors, a copy with its own storage, or a view of the buffer when the
/// reader has an owner).
template <class T>
concept Serializable = requires(const T& v, ByteWriter& out, ByteReader& in) {
  { Serializer<T>::size(v) } -> std::same_as<std::size_t>;
  Serializer<T>::write(v, out);
  { Serializer<T>::read(in) } -> std::same_as<T>;
};

template <class T>
requires std::is_arithmetic_v<T>
struct Serializer<T> {
  static std::size_t size(const T&) noexcept { return sizeof(T); }
  static void write(const T& v, ByteWriter& out) noexcept { out.value(v); }
  static T read(ByteReader& in) { return in.value<T>(); }
};

/// A tensor is its rank, its dimensions, then its data aligned to `serialized_alignment`; or,
/// when its data already lies inside the buffer being written (built there in place, see
/// `ByteWriter::locate`), the rank with `in_place` set, the dimensions and the data's offset.
template <TensorElement T>
struct Serializer<Tensor<T>> {
  static constexpr std::uint8_t in_place = 0x80;

  static std::size_t size(const Tensor<T>& t) noexcept {
    return sizeof(std::uint8_t) + t.rank() * sizeof(std::uint64_t) + serialized_alignment - 1 +
           t.bytes();
  }
  static void write(const Tensor<T>& t, ByteWriter& out) noexcept {
    const std::optional<std::uint64_t> offset = out.locate(t.data(), t.bytes());
    out.value(static_cast<std::uint8_t>(t.rank() | (offset ? in_place : 0U)));
    for (std::size_t d : t.shape())
      out.value(static_cast<std::uint64_t>(d));
    if (offset) {
      out.value(*offset);
      return;
    }
    out.align();
    out.write(t.data(), t.bytes());
  }
  static Tensor<T> read(ByteReader& in) {
    const auto tag = in.value<std::uint8_t>();
    const bool placed = (tag & in_place) != 0;
    const auto rank = static_cast<std::uint8_t>(tag & ~in_place);
    if (rank > Shape::max_rank) {
      throw FormatError("serialized tensor: rank " + std::to_string(rank) + " exceeds " +
                        std::to_string(Shape::max_rank));
    }
    std::uint64_t dims[Shape::max_rank];
    for (std::size_t i = 0; i < rank; ++i)
      dims[i] = in.value<std::uint64_t>();
    const std::span<const std::uint64_t> dims_read(dims, rank);
    // The dimensions come from the bytes: their product must not wrap before the check below
    // trusts it (nor before `Shape` refuses it with a `ShapeError`).
    const auto elements = Shape::checked_product(dims_read);
    std::string text;
    for (std::size_t i = 0; i < rank; ++i)
      text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
    if (!elements) {
      throw FormatError("serialized tensor: shape (" + text + (rank == 1 ? ",)" : ")") +
                        " has more elements than memory can address");
    }
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
    if (placed) {
      const auto offset = in.value<std::uint64_t>();
      if (__builtin_mul_overflow(*elements, sizeof(T), &bytes)) {
        throw FormatError("serialized tensor: shape (" + text + (rank == 1 ? ",)" : ")") +
                          " needs more than 2^64 bytes");
      }
      if (offset % serialized_alignment != 0) {
        throw FormatError("serialized tensor: data at offset " + std::to_string(offset) +
                          " is not aligned to " + std::to_string(serialized_alignment) + " bytes");
      }
      data = in.at(offset, bytes);
    } else {
      in.align();
      if (*elements > in.remaining() / sizeof(T)) {
        const bool wraps = __builtin_mul_overflow(*elements, sizeof(T), &bytes);
        throw FormatError("serialized tensor: shape (" + text + (rank == 1 ? ",)" : ")") +
                          " needs " + (wraps ? "more than 2^64" : std::to_string(bytes)) +
                          " bytes but only " + std::to_string(in.remaining()) + " remain");
      }
      bytes = *elements * sizeof(T);
      data = in.skip(bytes);
    }
    const Shape shape(dims_read);
    if (in.owner()) {
      // A view of the buffer (a shared-memory slot), kept alive and unchanged by the owner.
      return Tensor<T>::wrap(reinterpret_cast<T*>(const_cast<std::byte*>(data)), shape, in.owner());
    }
    // One copy into fresh aligned storage the caller owns.
    auto t = Tensor<T>::uninitialized(shape);
    if (bytes != 0) std::memcpy(t.data(), data, bytes);
    return t;
  }
};

template <>
struct Serializer<std::string> {
  static std::size_t size(const std::string& s) noexcept {
    return sizeof(std::uint64_t) + s.size();
  }
  static void write(const std::string& s, ByteWriter& out) noexcept {
    out.value(static_cast<std::uint64_t>(s.size()));
    out.write(s.data(), s.size());
  }
  static std::string read(ByteReader& in) {
    const auto n = in.value<std::uint64_t>();
    if (n > in.remaining()) {
      throw FormatError("serialized string: length " + std::to_string(n) + " exceeds the " +
                        std::to_string(in.remaining()) + " remaining bytes");
    }
    std::string s(static_cast<std::size_t>(n), '\0');
    in.read(s.data(), s.size());
    return s;
  }
};

template <Serializable T>
struct Serializer<std::vector<T>> {
  static std::size_t size(const std::vector<T>& v) noexcept {
    std::size_t n = sizeof(std::uint64_t);
    for (const auto& e : v)
      n += Serializer<T>::size(e);
    return n;
  }
  static void write(const std::vector<T>& v, ByteWriter& out) {
    out.value(static_cast<std::uint64_t>(v.size()));
    for (const auto& e : v)
      Serializer<T>::write(e, out);
  }
  static std::vector<T> read(ByteReader& in) {
    const auto n = in.value<std::uint64_t>();
    if (n > in.remaining()) {
      throw FormatError("serialized vector: " + std::to_string(n) + " elements exceed the " +
                        std::to_string(in.remaining()) + " remaining bytes");
    }
    std::vector<T> v;
    v.reserve(static_cast<std::size_t>(n));
    for (std::uint64_t i = 0; i < n; ++i)
      v.push_back(Serializer<T>::read(in));
    return v;
  }
};

template <Serializable K, Serializable V, class Compare, class Allocator>
struct Serializer<std::map<K, V, Compare, Allocator>> {
  using Map = std::map<K, V, Compare, Allocator>;
  static std::size_t size(const Map& m) noexcept {
    std::size_t n = sizeof(std::uint64_t);
    for (const auto& [k, v] : m)
      n += Serializer<K>::size(k) + Serializer<V>::size(v);
    return n;
  }
  static void write(const Map& m, ByteWriter& out) {
    out.value(static_cast<std::uint64_t>(m.size()));
    for (const auto& [k, v] : m) {
      Serializer<K>::write(k, out);
      Serializer<V>::write(v, out);
    }
  }
  static Map read(ByteReader& in) {
    const auto n = in.value<std::uint64_t>();
    Map m;
    for (std::uint64_t i = 0; i < n; ++i) {
      K k = Serializer<K>::read(in);
      V v = Serializer<V>::read(in);
      m.emplace(std::move(k), std::move(v));
    }
    return m;
  }
};

template <Serializable A, Serializable B>
struct Serializer<std::pair<A, B>> {
  static std::size_t size(const std::pair<A, B>& p) noexcept {
    return Serializer<A>::size(p.first) + Serializer<B>::size(p.second);
  }
  static void write(const std::pair<A, B>& p, ByteWriter& out) {
    Serializer<A>::write(p.first, out);
    Serializer<B>::write(p.second, out);
  }
  static std::pair<A, B> read(ByteReader& in) {
    A a = Serializer<A>::read(in);
    B b = Serializer<B>::read(in);
    return {std::move(a), std::move(b)};
  }
};

template <Serializable... T>
struct Serializer<std::tuple<T...>> {
  static std::size_t size(const std::tuple<T...>& t) noexcept {
    return std::apply([](const T&... e) { return (std::size_t{0} + ... + Serializer<T>::size(e)); },
                      t);
  }
  static void write(const std::tuple<T...>& t, ByteWriter& out) {
    std::apply([&](const T&... e) { (Serializer<T>::write(e, out), ...); }, t);
  }
  static std::tuple<T...> read(ByteReader& in) {
    // Braced initialisation evaluates its elements left to right, in the order they were written.
    return std::tuple<T...>{Serializer<T>::read(in)...};
  }
};

template <Serializable T>
struct Serializer<std::optional<T>> {
  static std::size_t size(const std::optional<T>& o) noexcept {
    return sizeof(std::uint8_t) + (o ? Serializer<T>::size(*o) : 0);
  }
  static void write(const std::optional<T>& o, ByteWriter& out) {
    out.value(static_cast<std::uint8_t>(o.has_value()));
    if (o) Serializer<T>::write(*o, out);
  }
  static std::optional<T> read(ByteReader& in) {
    if (in.value<std::uint8_t>() == 0) return std::nullopt;
    return Serializer<T>::read(in);
  }
};

/// The number of bytes `serialize(value, ...)` writes.
template <Serializable T>
std::size_t serialized_size(const T& value) {
  return Serializer<T>::size(value);
}

/// Writes `value` into `out`, which must hold at least `serialized_size(value)` bytes (a bound:
/// tensor data is padded to `serialized_alignment`); returns the number of bytes written or throws
/// `ShapeError` when `out` is too small.
template <Serializable T>
std::size_t serialize(const T& value, std::span<std::byte> out) {
  const std::size_t needed = Serializer<T>::size(value);
  if (needed > out.size()) {
    throw ShapeError("serialized batch: needs " + std::to_string(needed) +
                     " bytes but the buffer holds " + std::to_string(out.size()));
  }
  ByteWriter writer(out.data());
  Serializer<T>::write(value, writer);
  return writer.written();
}

/// Reads a `T` written by `serialize`; throws `FormatError` for truncated bytes. With an `owner`
/// keeping `in` alive and unchanged, and `in` aligned to `serialized_alignment`, tensors view `in`
/// instead of being copied.
template <Serializable T>
T deserialize(std::span<const std::byte> in, std::shared_ptr<void> owner = {}) {
  ByteReader reader(in, std::move(owner));
  return Serializer<T>::read(reader);
}

}  // namespace loadstar
