/// \file
/// Calling an element function with an element, unpacking tuples as tf.data does.
#pragma once

#include <concepts>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "loadstar/error.hpp"

namespace loadstar::detail {

// Whether `f(members..., extra...)` is valid for a tuple or pair `T`.
template <class F, class T, class... Extra>
inline constexpr bool applicable_v = false;
template <class F, class... M, class... Extra>
inline constexpr bool applicable_v<F, std::tuple<M...>, Extra...> =
    std::invocable<const F&, M..., Extra...>;
template <class F, class A, class B, class... Extra>
inline constexpr bool applicable_v<F, std::pair<A, B>, Extra...> =
    std::invocable<const F&, A, B, Extra...>;

template <class F, class E, class... Extra>
concept ElementCallable =
    std::invocable<const F&, E, Extra...> || applicable_v<F, std::remove_cvref_t<E>, Extra...>;

/// `f(element, extra...)`, or `f(members..., extra...)` for a tuple element that `f` does not
/// take whole (tf.data's `map(lambda x, y: ...)`).
template <class F, class E, class... Extra>
requires ElementCallable<F, E, Extra...>
decltype(auto) invoke_element(const F& f, E&& element, Extra... extra) {
  if constexpr (std::invocable<const F&, E, Extra...>) {
    return std::invoke(f, std::forward<E>(element), extra...);
  } else {
    return std::apply(
        [&](auto&&... members) {
          return std::invoke(f, std::forward<decltype(members)>(members)..., extra...);
        },
        std::forward<E>(element));
  }
}

/// The exception to raise at the consumer for element `index` of operator `op` that failed with
/// `error`: a `WorkerError` carrying the index and the original message.
inline WorkerError element_error(const char* op, std::size_t index, std::exception_ptr error) {
  std::string what = "unknown exception";
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  return WorkerError(std::string(op) + ": element " + std::to_string(index) + " failed: " + what);
}

}  // namespace loadstar::detail
