/// \file
/// Array-likes: what Determined accepts as `x`, `y` and `sample_weight` of an array loader.
///
/// An array-like is one tensor, a list of tensors (a multi-input or multi-output model), a map
/// from name to tensor (named inputs), or a tuple of tensors of different element types. Every
/// member has the same number of rows; these functions cut rows out of all members at once.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

namespace detail {
template <class T>
inline constexpr bool is_tensor_list_v = false;
template <TensorElement T>
inline constexpr bool is_tensor_list_v<std::vector<Tensor<T>>> = true;

template <class T>
inline constexpr bool is_tensor_map_v = false;
template <TensorElement T>
inline constexpr bool is_tensor_map_v<std::map<std::string, Tensor<T>>> = true;

template <class T>
inline constexpr bool is_tensor_tuple_v = false;
template <class... T>
inline constexpr bool is_tensor_tuple_v<std::tuple<T...>> = sizeof...(T) > 0 &&
                                                            (is_tensor_v<T> && ...);
}  // namespace detail

/// A list of tensors of one element type: the inputs of a multi-input model, by position.
template <class A>
concept TensorList = detail::is_tensor_list_v<std::remove_cvref_t<A>>;

/// A map from name to tensor: the inputs of a model, by the names of its `Input`s.
template <class A>
concept TensorMap = detail::is_tensor_map_v<std::remove_cvref_t<A>>;

/// A tuple of tensors whose element types may differ (images and token ids, say).
template <class A>
concept TensorTuple = detail::is_tensor_tuple_v<std::remove_cvref_t<A>>;

/// What an array loader accepts as `x` or `y`: a tensor, a list, a map or a tuple of tensors.
/// Semantic requirement: every member has the same number of rows along axis 0.
template <class A>
concept ArrayLike = AnyTensor<A> || TensorList<A> || TensorMap<A> || TensorTuple<A>;

/// Calls `f(name, tensor)` for every member of an array-like, in order. `name` is how error
/// messages refer to the member: `"x"`, `"x[1]"`, `"x['image']"`.
template <ArrayLike A, class F>
void for_each_member(const A& array, std::string_view name, F&& f) {
  if constexpr (AnyTensor<A>) {
    f(std::string(name), array);
  } else if constexpr (TensorList<A>) {
    for (std::size_t i = 0; i < array.size(); ++i) {
      f(std::string(name) + "[" + std::to_string(i) + "]", array[i]);
    }
  } else if constexpr (TensorMap<A>) {
    for (const auto& [key, tensor] : array)
      f(std::string(name) + "['" + key + "']", tensor);
  } else {
    std::size_t i = 0;
    std::apply(
        [&](const auto&... tensors) {
          ((f(std::string(name) + "[" + std::to_string(i++) + "]", tensors)), ...);
        },
        array);
  }
}

/// The number of members of an array-like (1 for a tensor).
template <ArrayLike A>
std::size_t member_count(const A& array) noexcept {
  if constexpr (AnyTensor<A>) {
    return 1;
  } else if constexpr (TensorTuple<A>) {
    return std::tuple_size_v<A>;
  } else {
    return array.size();
  }
}

/// The common number of rows of an array-like's members. Throws `ShapeError` for an empty list or
/// map, a scalar member, or members whose row counts differ, naming both members and counts.
/// `name` names the array-like in messages (`"x"`), `owner` the object that checks it.
template <ArrayLike A>
std::size_t rows_of(const A& array, std::string_view name, std::string_view owner) {
  if (member_count(array) == 0) {
    throw ShapeError(std::string(owner) + ": " + std::string(name) +
                     " is an empty collection of arrays");
  }
  std::size_t rows = 0;
  std::string first;
  for_each_member(array, name, [&](const std::string& member, const auto& tensor) {
    if (tensor.rank() == 0) {
      throw ShapeError(std::string(owner) + ": " + member +
                       " is a scalar but arrays need a batch axis (rank >= 1)");
    }
    if (first.empty()) {
      first = member;
      rows = tensor.rows();
    } else if (tensor.rows() != rows) {
      throw ShapeError(std::string(owner) + ": " + member + " has " +
                       std::to_string(tensor.rows()) + " rows but " + first + " has " +
                       std::to_string(rows));
    }
  });
  return rows;
}

/// Rows `[begin, end)` of every member, as views sharing storage.
template <ArrayLike A>
A slice_rows(const A& array, std::size_t begin, std::size_t end) {
  if constexpr (AnyTensor<A>) {
    return array.slice_rows(begin, end);
  } else if constexpr (TensorList<A>) {
    A out;
    out.reserve(array.size());
    for (const auto& t : array)
      out.push_back(t.slice_rows(begin, end));
    return out;
  } else if constexpr (TensorMap<A>) {
    A out;
    for (const auto& [key, t] : array)
      out.emplace(key, t.slice_rows(begin, end));
    return out;
  } else {
    return std::apply([&](const auto&... t) { return A{t.slice_rows(begin, end)...}; }, array);
  }
}

/// The rows named by `indices` of every member, as new tensors.
template <ArrayLike A, std::integral I>
A gather_rows(const A& array, std::span<const I> indices) {
  if constexpr (AnyTensor<A>) {
    return array.gather_rows(indices);
  } else if constexpr (TensorList<A>) {
    A out;
    out.reserve(array.size());
    for (const auto& t : array)
      out.push_back(t.gather_rows(indices));
    return out;
  } else if constexpr (TensorMap<A>) {
    A out;
    for (const auto& [key, t] : array)
      out.emplace(key, t.gather_rows(indices));
    return out;
  } else {
    return std::apply([&](const auto&... t) { return A{t.gather_rows(indices)...}; }, array);
  }
}

}  // namespace loadstar
