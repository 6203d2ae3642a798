/// \file
/// `Shape`: the dimensions of a tensor, stored inline (no allocation) up to `Shape::max_rank`.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <ostream>
#include <ranges>
#include <string>

#include "loadstar/error.hpp"

namespace loadstar {

/// The dimensions of a row-major tensor, outermost first.
///
/// Rank 0 is a scalar (one element). Stored inline so that slicing a batch never allocates.
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

  /// A shape with the given dimensions; throws `ShapeError` beyond `max_rank` dimensions.
  constexpr Shape(std::initializer_list<std::size_t> dims) { assign(dims); }

  /// A shape from any range of integral dimensions; throws `ShapeError` on a negative dimension
  /// or beyond `max_rank` dimensions.
  template <std::ranges::input_range R>
  requires std::integral<std::ranges::range_value_t<R>>
  constexpr explicit Shape(const R& dims) { assign(dims); }

  constexpr std::size_t rank() const noexcept { return rank_; }
  constexpr std::size_t operator[](std::size_t axis) const noexcept { return dims_[axis]; }
  constexpr std::size_t& operator[](std::size_t axis) noexcept { return dims_[axis]; }
  constexpr const std::size_t* begin() const noexcept { return dims_.data(); }
  constexpr const std::size_t* end() const noexcept { return dims_.data() + rank_; }

  /// The number of elements: the product of the dimensions (1 for a scalar).
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

  /// This shape with axis 0 replaced by `rows`; requires rank >= 1.
  constexpr Shape with_rows(std::size_t rows) const noexcept {
    Shape s = *this;
    s.dims_[0] = rows;
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
      dims_[rank_++] = static_cast<std::size_t>(d);
    }
  }

  std::array<std::size_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

}  // namespace loadstar
