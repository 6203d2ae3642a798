/// \file
/// Stacking elements into batches and splitting batches into rows, member by member.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::detail {

/// How elements of type `E` stack into a batch: `batch_type` and `stack(elements)`.
template <class E>
struct Stacker;

/// How a batch of type `B` splits into rows: `row_type`, `rows(b)` and `row(b, i)`.
template <class B>
struct Unstacker;

template <class E>
concept Stackable = requires(const std::vector<E>& elements) {
  typename Stacker<E>::batch_type;
  { Stacker<E>::stack(elements) } -> std::same_as<typename Stacker<E>::batch_type>;
};

template <class B>
concept Unstackable = requires(const B& b, std::size_t i) {
  typename Unstacker<B>::row_type;
  { Unstacker<B>::rows(b) } -> std::same_as<std::size_t>;
  { Unstacker<B>::row(b, i) } -> std::same_as<typename Unstacker<B>::row_type>;
};

// A scalar of an element type stacks into a rank-1 tensor.
template <TensorElement T>
struct Stacker<T> {
  using batch_type = Tensor<T>;
  template <class Get>
  static batch_type stack_with(std::size_t n, Get&& get) {
    auto out = Tensor<T>::uninitialized(Shape{n});
    for (std::size_t i = 0; i < n; ++i)
      out.data()[i] = get(i);
    return out;
  }
  static batch_type stack(const std::vector<T>& elements) {
    return stack_with(elements.size(), [&](std::size_t i) -> const T& { return elements[i]; });
  }
};

template <TensorElement T>
struct Stacker<Tensor<T>> {
  using batch_type = Tensor<T>;
  // `get(i)` returns the i-th tensor; every one must have the shape of the first.
  template <class Get>
  static batch_type stack_with(std::size_t n, Get&& get) {
    const Shape row_shape = n == 0 ? Shape{} : get(0).shape();
    auto out = Tensor<T>::uninitialized(row_shape.prepend(n));
    const std::size_t row_size = row_shape.elements();
    for (std::size_t i = 0; i < n; ++i) {
      const Tensor<T>& t = get(i);
      if (t.shape() != row_shape) {
        throw ShapeError("batch: element " + std::to_string(i) + " has shape " + t.shape().str() +
                         " but element 0 has shape " + row_shape.str());
      }
      if (row_size != 0) std::memcpy(out.data() + i * row_size, t.data(), row_size * sizeof(T));
    }
    return out;
  }
  static batch_type stack(const std::vector<Tensor<T>>& elements) {
    return stack_with(elements.size(),
                      [&](std::size_t i) -> const Tensor<T>& { return elements[i]; });
  }
};

// A string stacks into a list of strings (a batch of text, as Keras's text utilities give it).
template <>
struct Stacker<std::string> {
  using batch_type = std::vector<std::string>;
  static batch_type stack(const std::vector<std::string>& elements) { return elements; }
};

// A variant (a CSV field of one of several types) stacks as the alternative it holds: every
// element must hold the same one.
template <class... E>
struct Stacker<std::variant<E...>> {
  using batch_type = std::variant<typename Stacker<E>::batch_type...>;
  static batch_type stack(const std::vector<std::variant<E...>>& elements) {
    const std::size_t index = elements.empty() ? 0 : elements[0].index();
    for (std::size_t i = 1; i < elements.size(); ++i) {
      if (elements[i].index() != index) {
        throw ShapeError("batch: element " + std::to_string(i) + " holds alternative " +
                         std::to_string(elements[i].index()) + " of its variant but element 0 " +
                         "holds alternative " + std::to_string(index));
      }
    }
    return stack_as(elements, index, std::index_sequence_for<E...>{});
  }

 private:
  template <std::size_t... I>
  static batch_type stack_as(const std::vector<std::variant<E...>>& elements, std::size_t index,
                             std::index_sequence<I...>) {
    batch_type out;
    ((I == index ? (out = stack_one<I>(elements), 0) : 0), ...);
    return out;
  }
  template <std::size_t I>
  static batch_type stack_one(const std::vector<std::variant<E...>>& elements) {
    using M = std::variant_alternative_t<I, std::variant<E...>>;
    std::vector<M> column;
    column.reserve(elements.size());
    for (const auto& e : elements)
      column.push_back(std::get<I>(e));
    return batch_type(std::in_place_index<I>, Stacker<M>::stack(column));
  }
};

template <class E>
struct Stacker<std::vector<E>> {
  using batch_type = std::vector<typename Stacker<E>::batch_type>;
  static batch_type stack(const std::vector<std::vector<E>>& elements) {
    batch_type out;
    if (elements.empty()) return out;
    const std::size_t members = elements[0].size();
    for (std::size_t i = 0; i < elements.size(); ++i) {
      if (elements[i].size() != members) {
        throw ShapeError("batch: element " + std::to_string(i) + " has " +
                         std::to_string(elements[i].size()) + " members but element 0 has " +
                         std::to_string(members));
      }
    }
    out.reserve(members);
    for (std::size_t m = 0; m < members; ++m) {
      std::vector<E> column;
      column.reserve(elements.size());
      for (const auto& e : elements)
        column.push_back(e[m]);
      out.push_back(Stacker<E>::stack(column));
    }
    return out;
  }
};

template <class E>
struct Stacker<std::map<std::string, E>> {
  using batch_type = std::map<std::string, typename Stacker<E>::batch_type>;
  static batch_type stack(const std::vector<std::map<std::string, E>>& elements) {
    batch_type out;
    if (elements.empty()) return out;
    for (const auto& [key, unused] : elements[0]) {
      std::vector<E> column;
      column.reserve(elements.size());
      for (std::size_t i = 0; i < elements.size(); ++i) {
        auto it = elements[i].find(key);
        if (it == elements[i].end()) {
          throw ShapeError("batch: element " + std::to_string(i) + " has no member '" + key +
                           "' but element 0 has");
        }
        column.push_back(it->second);
      }
      out.emplace(key, Stacker<E>::stack(column));
    }
    return out;
  }
};

template <class... E>
struct Stacker<std::tuple<E...>> {
  using batch_type = std::tuple<typename Stacker<E>::batch_type...>;
  static batch_type stack(const std::vector<std::tuple<E...>>& elements) {
    return stack_members(elements, std::index_sequence_for<E...>{});
  }

 private:
  template <std::size_t... I>
  static batch_type stack_members(const std::vector<std::tuple<E...>>& elements,
                                  std::index_sequence<I...>) {
    return batch_type{stack_member<I>(elements)...};
  }
  template <std::size_t I>
  static auto stack_member(const std::vector<std::tuple<E...>>& elements) {
    using M = std::tuple_element_t<I, std::tuple<E...>>;
    if constexpr (TensorElement<M> || AnyTensor<M>) {
      // Tensors and scalars stack straight from the tuples, without a column copy.
      return Stacker<M>::stack_with(
          elements.size(), [&](std::size_t i) -> const M& { return std::get<I>(elements[i]); });
    } else {
      std::vector<M> column;
      column.reserve(elements.size());
      for (const auto& e : elements)
        column.push_back(std::get<I>(e));
      return Stacker<M>::stack(column);
    }
  }
};

template <class A, class B>
struct Stacker<std::pair<A, B>> {
  using batch_type = std::pair<typename Stacker<A>::batch_type, typename Stacker<B>::batch_type>;
  static batch_type stack(const std::vector<std::pair<A, B>>& elements) {
    std::vector<A> first;
    std::vector<B> second;
    for (const auto& [a, b] : elements) {
      first.push_back(a);
      second.push_back(b);
    }
    return {Stacker<A>::stack(first), Stacker<B>::stack(second)};
  }
};

template <TensorElement T>
struct Unstacker<Tensor<T>> {
  using row_type = Tensor<T>;
  static std::size_t rows(const Tensor<T>& t) {
    if (t.rank() == 0) throw ShapeError("unbatch: a scalar " + t.description() + " has no rows");
    return t.rows();
  }
  static row_type row(const Tensor<T>& t, std::size_t i) { return t.row(i); }
};

// Every member of a composite batch must have the same number of rows.
inline std::size_t same_rows(std::size_t rows, std::size_t member_rows, std::size_t member) {
  if (member_rows != rows) {
    throw ShapeError("unbatch: member " + std::to_string(member) + " has " +
                     std::to_string(member_rows) + " rows but member 0 has " +
                     std::to_string(rows));
  }
  return rows;
}

template <class B>
struct Unstacker<std::vector<B>> {
  using row_type = std::vector<typename Unstacker<B>::row_type>;
  static std::size_t rows(const std::vector<B>& b) {
    if (b.empty()) throw ShapeError("unbatch: an empty list of members has no rows");
    const std::size_t n = Unstacker<B>::rows(b[0]);
    for (std::size_t m = 1; m < b.size(); ++m)
      same_rows(n, Unstacker<B>::rows(b[m]), m);
    return n;
  }
  static row_type row(const std::vector<B>& b, std::size_t i) {
    row_type out;
    out.reserve(b.size());
    for (const auto& m : b)
      out.push_back(Unstacker<B>::row(m, i));
    return out;
  }
};

template <class B>
struct Unstacker<std::map<std::string, B>> {
  using row_type = std::map<std::string, typename Unstacker<B>::row_type>;
  static std::size_t rows(const std::map<std::string, B>& b) {
    if (b.empty()) throw ShapeError("unbatch: an empty map of members has no rows");
    std::size_t n = Unstacker<B>::rows(b.begin()->second);
    std::size_t m = 0;
    for (const auto& [key, member] : b)
      same_rows(n, Unstacker<B>::rows(member), m++);
    return n;
  }
  static row_type row(const std::map<std::string, B>& b, std::size_t i) {
    row_type out;
    for (const auto& [key, member] : b)
      out.emplace(key, Unstacker<B>::row(member, i));
    return out;
  }
};

template <class... B>
struct Unstacker<std::tuple<B...>> {
  using row_type = std::tuple<typename Unstacker<B>::row_type...>;
  static std::size_t rows(const std::tuple<B...>& b) {
    const std::size_t n =
        Unstacker<std::tuple_element_t<0, std::tuple<B...>>>::rows(std::get<0>(b));
    std::size_t m = 0;
    std::apply(
        [&](const auto&... member) {
          ((same_rows(n, Unstacker<std::remove_cvref_t<decltype(member)>>::rows(member), m++)),
           ...);
        },
        b);
    return n;
  }
  static row_type row(const std::tuple<B...>& b, std::size_t i) {
    return std::apply(
        [&](const auto&... member) {
          return row_type{Unstacker<std::remove_cvref_t<decltype(member)>>::row(member, i)...};
        },
        b);
  }
};

template <class A, class B>
struct Unstacker<std::pair<A, B>> {
  using row_type = std::pair<typename Unstacker<A>::row_type, typename Unstacker<B>::row_type>;
  static std::size_t rows(const std::pair<A, B>& b) {
    return same_rows(Unstacker<A>::rows(b.first), Unstacker<B>::rows(b.second), 1);
  }
  static row_type row(const std::pair<A, B>& b, std::size_t i) {
    return {Unstacker<A>::row(b.first, i), Unstacker<B>::row(b.second, i)};
  }
};

}  // namespace loadstar::detail
