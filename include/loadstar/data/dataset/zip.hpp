/// \file
/// `zip`: datasets read in lockstep into tuples, and `concatenate`: one dataset after another.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The elements of `Ds...` read in lockstep as tuples `(a, b, ...)`, as `tf.data.Dataset.zip`:
/// the epoch ends with the shortest dataset (the others are not read past it). `reset()` resets
/// them all. The state is every dataset's state, so restoring costs what theirs cost.
/// \code
/// auto pairs = zip(from_tensor_slices(x), range(100));   // (x row, index)
/// \endcode
template <Dataset... Ds>
class ZipDataset : public DatasetBase<ZipDataset<Ds...>> {
  static_assert(sizeof...(Ds) > 0, "zip: needs at least one dataset");

 public:
  using element_type = std::tuple<element_t<Ds>...>;

  explicit ZipDataset(Ds... datasets) : datasets_(std::move(datasets)...) {}

  std::optional<element_type> next() {
    if (ended_) return std::nullopt;
    auto parts = pull(std::index_sequence_for<Ds...>{});
    const bool all = std::apply([](const auto&... p) { return (p.has_value() && ...); }, parts);
    if (!all) {
      ended_ = true;
      return std::nullopt;
    }
    return std::apply([](auto&... p) { return element_type(std::move(*p)...); }, parts);
  }
  void reset() {
    std::apply([](auto&... d) { (d.reset(), ...); }, datasets_);
    ended_ = false;
  }
  nlohmann::json state() const {
    nlohmann::json parts = nlohmann::json::array();
    std::apply([&](const auto&... d) { (parts.push_back(d.state()), ...); }, datasets_);
    return {{"op", "zip"}, {"ended", ended_}, {"datasets", std::move(parts)}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "zip");
    const auto& parts = s["datasets"];
    if (!parts.is_array() || parts.size() != sizeof...(Ds)) {
      throw CheckpointError("zip: state has " + std::to_string(parts.size()) +
                            " datasets but the zip has " + std::to_string(sizeof...(Ds)));
    }
    std::size_t i = 0;
    std::apply([&](auto&... d) { (d.restore(parts[i++]), ...); }, datasets_);
    ended_ = s["ended"];
  }

 private:
  // Pulls from the datasets in order, stopping at the first that has ended (tf.data's zip reads
  // no further inputs once one is exhausted).
  template <std::size_t... I>
  auto pull(std::index_sequence<I...>) {
    std::tuple<std::optional<element_t<Ds>>...> parts;
    bool going = true;
    ((going = going && (std::get<I>(parts) = std::get<I>(datasets_).next()).has_value()), ...);
    return parts;
  }

  std::tuple<Ds...> datasets_;
  bool ended_ = false;
};

/// The datasets `a, b, ...` zipped into tuples (see `ZipDataset`).
template <Dataset... Ds>
ZipDataset<std::remove_cvref_t<Ds>...> zip(Ds&&... datasets) {
  return ZipDataset<std::remove_cvref_t<Ds>...>(std::forward<Ds>(datasets)...);
}

/// The elements of `A` followed by those of `B`, as `tf.data.Dataset.concatenate`; the element
/// types must be the same. The state is which of the two is being read and both states.
/// \code
/// auto all = range(0, 5).concatenate(range(10, 15));   // 0..4, 10..14
/// \endcode
template <Dataset A, Dataset B>
class ConcatenateDataset : public DatasetBase<ConcatenateDataset<A, B>> {
  static_assert(std::is_same_v<element_t<A>, element_t<B>>,
                "concatenate: both datasets must have the same element type");

 public:
  using element_type = element_t<A>;

  ConcatenateDataset(A first, B second) : first_(std::move(first)), second_(std::move(second)) {}

  std::optional<element_type> next() {
    if (!in_second_) {
      if (auto element = first_.next()) return element;
      in_second_ = true;
    }
    return second_.next();
  }
  void reset() {
    first_.reset();
    second_.reset();
    in_second_ = false;
  }
  nlohmann::json state() const {
    return {{"op", "concatenate"},
            {"in_second", in_second_},
            {"first", first_.state()},
            {"second", second_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "concatenate");
    first_.restore(s["first"]);
    second_.restore(s["second"]);
    in_second_ = s["in_second"];
  }

 private:
  A first_;
  B second_;
  bool in_second_ = false;
};

/// A dataset of one element, `value`, as `tf.data.Dataset.from_tensors` (the whole value is the
/// element: a tensor of shape `(n, ...)` stays one element, unlike `from_tensor_slices`).
/// \code
/// auto one = from_tensors(Tensor<float>({2, 3}, 1.f)).repeat(10);
/// \endcode
template <class E>
class FromTensorsDataset : public DatasetBase<FromTensorsDataset<E>> {
 public:
  using element_type = E;

  explicit FromTensorsDataset(E value) : value_(std::move(value)) {}

  std::optional<element_type> next() {
    if (done_) return std::nullopt;
    done_ = true;
    return value_;
  }
  void reset() noexcept { done_ = false; }
  nlohmann::json state() const { return {{"op", "from_tensors"}, {"done", done_}}; }
  void restore(const nlohmann::json& state) {
    done_ = detail::expect_state(state, "from_tensors")["done"];
  }

 private:
  E value_;
  bool done_ = false;
};

/// The dataset whose one element is `value`.
template <class E>
FromTensorsDataset<std::remove_cvref_t<E>> from_tensors(E&& value) {
  return FromTensorsDataset<std::remove_cvref_t<E>>(std::forward<E>(value));
}

/// `(start + i, element_i)` for the elements of `D`, as `tf.data.Dataset.enumerate` (the count
/// restarts at `start` every epoch). The state is the count and the upstream's state.
/// \code
/// auto indexed = from_tensor_slices(x).enumerate();   // (0, x row 0), (1, x row 1), ...
/// \endcode
template <Dataset D>
class EnumerateDataset : public DatasetBase<EnumerateDataset<D>> {
 public:
  using element_type = std::tuple<std::int64_t, element_t<D>>;

  EnumerateDataset(D upstream, std::int64_t start)
      : upstream_(std::move(upstream)), start_(start), next_(start) {}

  std::optional<element_type> next() {
    auto element = upstream_.next();
    if (!element) return std::nullopt;
    return element_type(next_++, std::move(*element));
  }
  void reset() {
    upstream_.reset();
    next_ = start_;
  }
  nlohmann::json state() const {
    return {{"op", "enumerate"}, {"next", next_}, {"upstream", upstream_.state()}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "enumerate");
    upstream_.restore(s["upstream"]);
    next_ = s["next"].get<std::int64_t>();
  }

 private:
  D upstream_;
  std::int64_t start_;
  std::int64_t next_;
};

}  // namespace loadstar
