/// \file
/// The serialization customization point through which batches cross a process boundary.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
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

/// Appends bytes to a buffer whose size was computed beforehand with `Serializer<T>::size`.
class ByteWriter {
 public:
  explicit ByteWriter(std::byte* out) noexcept : cursor_(out) {}
  void write(const void* data, std::size_t bytes) noexcept {
    if (bytes != 0) std::memcpy(cursor_, data, bytes);
    cursor_ += bytes;
  }
  template <class T>
  requires std::is_trivially_copyable_v<T>
  void value(const T& v) noexcept { write(&v, sizeof(T)); }
  std::byte* cursor() const noexcept { return cursor_; }

 private:
  std::byte* cursor_;
};

/// Reads bytes back, throwing `FormatError` rather than reading past the end of the buffer.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) noexcept
      : cursor_(in.data()), end_(in.data() + in.size()) {}
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
  const std::byte* cursor_;
  const std::byte* end_;
};

/// The customization point: specialise `Serializer<T>` with
/// `static std::size_t size(const T&)` (the exact number of bytes `write` appends),
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
/// Semantic requirements: `write` appends exactly `size(v)` bytes and `read` of them gives a
/// value equal to `v` (for tensors, a copy with its own storage).
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

template <TensorElement T>
struct Serializer<Tensor<T>> {
  static std::size_t size(const Tensor<T>& t) noexcept {
    return sizeof(std::uint8_t) + t.rank() * sizeof(std::uint64_t) + t.bytes();
  }
  static void write(const Tensor<T>& t, ByteWriter& out) noexcept {
    out.value(static_cast<std::uint8_t>(t.rank()));
    for (std::size_t d : t.shape())
      out.value(static_cast<std::uint64_t>(d));
    out.write(t.data(), t.bytes());
  }
  static Tensor<T> read(ByteReader& in) {
    const auto rank = in.value<std::uint8_t>();
    if (rank > Shape::max_rank) {
      throw FormatError("serialized tensor: rank " + std::to_string(rank) + " exceeds " +
                        std::to_string(Shape::max_rank));
    }
    std::vector<std::size_t> dims(rank);
    for (auto& d : dims)
      d = static_cast<std::size_t>(in.value<std::uint64_t>());
    const Shape shape(dims);
    if (shape.elements() > in.remaining() / sizeof(T)) {
      throw FormatError("serialized tensor: shape " + shape.str() + " needs " +
                        std::to_string(shape.elements() * sizeof(T)) + " bytes but only " +
                        std::to_string(in.remaining()) + " remain");
    }
    // One copy out of the shared-memory slot into fresh aligned storage the caller owns.
    auto t = Tensor<T>::uninitialized(shape);
    in.read(t.data(), t.bytes());
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

/// Writes `value` into `out`, which must hold at least `serialized_size(value)` bytes; returns the
/// number of bytes written or throws `ShapeError` when `out` is too small.
template <Serializable T>
std::size_t serialize(const T& value, std::span<std::byte> out) {
  const std::size_t needed = Serializer<T>::size(value);
  if (needed > out.size()) {
    throw ShapeError("serialized batch: needs " + std::to_string(needed) +
                     " bytes but the buffer holds " + std::to_string(out.size()));
  }
  ByteWriter writer(out.data());
  Serializer<T>::write(value, writer);
  return needed;
}

/// Reads a `T` written by `serialize`; throws `FormatError` for truncated bytes.
template <Serializable T>
T deserialize(std::span<const std::byte> in) {
  ByteReader reader(in);
  return Serializer<T>::read(reader);
}

}  // namespace loadstar
