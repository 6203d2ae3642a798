/// \file
/// `Shape`: the dimensions of a tensor, stored inline (no allocation) up to `Shape::max_rank`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string>

#include "loadstar/error.hpp"

namespace loadstar {

/// The dimensions of a row-major tensor, outermost first.
///
/// Rank 0 is a scalar (one element). Stored inline so that slicing a batch never allocates.
/// Invariant: the number of elements fits in `std::size_t`; every constructor and `with_rows` and
/// `prepend` check it (dimensions read from files may be anything), so `elements()` never wraps.
/// \code
/// Shape s{32, 28, 28};
/// s.rank();        // 3
/// s.elements();    // 25088
/// s.str();         // "(32, 28, 28)"
/// \endcode
class Shape {
 public:
  /// The largest rank a shape can have.
  static constexpr std::size_t max_rank = 8;

  /// A rank-0 shape (a scalar).
  constexpr Shape() noexcept = default;

  /// A shape with the given dimensions; throws `ShapeError` beyond `max_rank` dimensions or when
  /// the number of elements does not fit in `std::size_t`.
  constexpr Shape(std::initializer_list<std::size_t> dims) { assign(dims); }

  /// A shape from any range of integral dimensions; throws `ShapeError` on a negative dimension,
  /// beyond `max_rank` dimensions or when the number of elements does not fit in `std::size_t`.
  template <std::ranges::input_range R>
  requires std::integral<std::ranges::range_value_t<R>>
  constexpr explicit Shape(const R& dims) { assign(dims); }

  constexpr std::size_t rank() const noexcept { return rank_; }
  constexpr std::size_t operator[](std::size_t axis) const noexcept { return dims_[axis]; }
  constexpr std::size_t& operator[](std::size_t axis) noexcept { return dims_[axis]; }
  constexpr const std::size_t* begin() const noexcept { return dims_.data(); }
  constexpr const std::size_t* end() const noexcept { return dims_.data() + rank_; }

  /// The number of elements: the product of the dimensions (1 for a scalar); never wraps (see the
  /// class invariant).
  constexpr std::size_t elements() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i)
      n *= dims_[i];
    return n;
  }

  /// The number of elements in one row along axis 0 (the product of dimensions 1..rank-1).
  constexpr std::size_t row_elements() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 1; i < rank_; ++i)
      n *= dims_[i];
    return n;
  }

  /// The size in bytes of the elements when each takes `element_bytes`; throws `ShapeError` when
  /// it does not fit in `std::size_t`.
  constexpr std::size_t bytes(std::size_t element_bytes) const {
    std::size_t n = 0;
    if (__builtin_mul_overflow(elements(), element_bytes, &n)) {
      throw ShapeError("shape " + str() + ": " + std::to_string(element_bytes) +
                       "-byte elements need more bytes than memory can address");
    }
    return n;
  }

  /// The product of `dims`, or nothing when it does not fit in `std::size_t` (for sizes read
  /// from files, checked before a `Shape` is made of them).
  template <std::ranges::input_range R>
  requires std::integral<std::ranges::range_value_t<R>>
  static constexpr std::optional<std::size_t> checked_product(const R& dims) noexcept {
    std::size_t n = 1;
    bool overflow = false;
    for (auto d : dims) {
      if constexpr (std::is_signed_v<decltype(d)>) {
        if (d < 0) return std::nullopt;
      }
      if constexpr (sizeof(d) > sizeof(std::size_t)) {
        if (static_cast<std::uintmax_t>(d) > std::numeric_limits<std::size_t>::max()) {
          overflow = true;
        }
      }
      overflow = __builtin_mul_overflow(n, static_cast<std::size_t>(d), &n) || overflow;
    }
    // A zero dimension makes the product 0 whatever the others are, as NumPy's size is.
    if (overflow && std::ranges::find(dims, 0) == std::ranges::end(dims)) return std::nullopt;
    return overflow ? 0 : n;
  }

  /// This shape with axis 0 replaced by `rows`; requires rank >= 1. Throws `ShapeError` when the
  /// number of elements does not fit in `std::size_t`.
  constexpr Shape with_rows(std::size_t rows) const {
    Shape s = *this;
    s.dims_[0] = rows;
    if (rows > dims_[0]) s.check_elements();
    return s;
  }

  /// This shape without axis 0 (the shape of one row); requires rank >= 1.
  constexpr Shape row_shape() const noexcept {
    Shape s;
    s.rank_ = rank_ - 1;
    for (std::size_t i = 1; i < rank_; ++i)
      s.dims_[i - 1] = dims_[i];
    return s;
  }

  /// This shape with `rows` prepended as a new axis 0; throws `ShapeError` at `max_rank`.
  constexpr Shape prepend(std::size_t rows) const {
    if (rank_ == max_rank)
      throw ShapeError("shape " + str() + ": cannot add an axis beyond rank 8");
    Shape s;
    s.rank_ = rank_ + 1;
    s.dims_[0] = rows;
    for (std::size_t i = 0; i < rank_; ++i)
      s.dims_[i + 1] = dims_[i];
    s.check_elements();
    return s;
  }

  friend constexpr bool operator==(const Shape& a, const Shape& b) noexcept {
    return a.rank_ == b.rank_ && std::equal(a.begin(), a.end(), b.begin());
  }

  /// The shape as NumPy prints it: `"(32, 784)"`, `"(10,)"`, `"()"`.
  std::string str() const {
    std::string s = "(";
    for (std::size_t i = 0; i < rank_; ++i) {
      if (i > 0) s += ", ";
      s += std::to_string(dims_[i]);
    }
    if (rank_ == 1) s += ",";
    return s + ")";
  }

  friend std::ostream& operator<<(std::ostream& out, const Shape& shape) {
    return out << shape.str();
  }

 private:
  template <class R>
  constexpr void assign(const R& dims) {
    for (auto d : dims) {
      if (rank_ == max_rank) {
        throw ShapeError("shape: at most " + std::to_string(max_rank) +
                         " dimensions are supported but more were given");
      }
      if constexpr (std::is_signed_v<decltype(d)>) {
        if (d < 0) {
          throw ShapeError("shape: dimension " + std::to_string(rank_) +
                           " must be non-negative but is " + std::to_string(d));
        }
      }
      if constexpr (sizeof(d) > sizeof(std::size_t)) {
        if (static_cast<std::uintmax_t>(d) > std::numeric_limits<std::size_t>::max()) {
          throw ShapeError("shape: dimension " + std::to_string(rank_) + " is " +
                           std::to_string(d) + ", more than memory can address");
        }
      }
      dims_[rank_++] = static_cast<std::size_t>(d);
    }
    check_elements();
  }

  /// Throws `ShapeError` when the product of the dimensions does not fit in `std::size_t`.
  constexpr void check_elements() const {
    std::span<const std::size_t> dims(dims_.data(), rank_);
    if (!checked_product(dims)) {
      throw ShapeError("shape " + str() + ": the number of elements overflows std::size_t");
    }
  }

  std::array<std::size_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace loadstar
