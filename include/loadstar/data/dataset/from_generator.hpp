/// \file
/// `from_generator`: the values of a generator callable as the elements of a dataset.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {
template <class T>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;
}  // namespace detail

/// A callable that makes a fresh generator: a callable returning `std::optional<E>`, empty at
/// the end of the epoch.
template <class M>
concept GeneratorFactory = std::invocable<M&> && std::invocable < std::invoke_result_t<M&>
& > &&detail::is_optional_v<std::invoke_result_t<std::invoke_result_t<M&>&>>;

/// The values of a generator, as `tf.data.Dataset.from_generator`. `make()` is called at the
/// start of every epoch and returns a generator `g` whose calls `g()` yield the elements until
/// `std::nullopt`. The state is the number of elements taken this epoch; since a generator's
/// position cannot be saved, a restore makes a fresh generator and replays (discards) that many
/// elements: O(position). Where elements can be computed from their index, `range(n).map(f)`
/// restores in O(1) instead.
/// \code
/// auto ds = from_generator([] {
///   return [i = 0]() mutable -> std::optional<int> {
///     return i < 3 ? std::optional<int>(i++) : std::nullopt;
///   };
/// });
/// \endcode
template <GeneratorFactory M>
class GeneratorDataset : public DatasetBase<GeneratorDataset<M>> {
  using Generator = std::invoke_result_t<M&>;

 public:
  using element_type = typename std::invoke_result_t<Generator&>::value_type;

  explicit GeneratorDataset(M make) : make_(std::move(make)), generator_(make_()) {}

  GeneratorDataset(const GeneratorDataset& other)
      : make_(other.make_), generator_(make_()), index_(0) {
    replay(other.index_);
  }
  GeneratorDataset(GeneratorDataset&&) = default;
  GeneratorDataset& operator=(const GeneratorDataset&) = delete;
  GeneratorDataset& operator=(GeneratorDataset&&) = delete;

  std::optional<element_type> next() {
    if (done_) return std::nullopt;
    auto value = std::invoke(*generator_);
    if (!value) {
      done_ = true;
    } else {
      ++index_;
    }
    return value;
  }
  void reset() {
    generator_.emplace(make_());
    index_ = 0;
    done_ = false;
  }
  nlohmann::json state() const { return {{"op", "generator"}, {"index", index_}}; }
  void restore(const nlohmann::json& state) {
    const std::size_t index = detail::expect_state(state, "generator")["index"];
    reset();
    replay(index);
  }

 private:
  void replay(std::size_t count) {
    while (index_ < count) {
      if (!next()) {
        throw CheckpointError("generator: state is at element " + std::to_string(count) +
                              " but the generator ended after " + std::to_string(index_));
      }
    }
  }

  M make_;
  std::optional<Generator> generator_;
  std::size_t index_ = 0;
  bool done_ = false;
};

/// The values of the generators `make()` returns, one per epoch.
template <GeneratorFactory M>
GeneratorDataset<M> from_generator(M make) {
  return GeneratorDataset<M>(std::move(make));
}

}  // namespace loadstar
