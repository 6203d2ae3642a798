/// \file
/// `interleave`: datasets made from the elements of another, read round robin (many files).
#pragma once

#include <concepts>
#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// `f(element)` turns each element of `D` (a file name, say) into a dataset; `cycle_length` of
/// them are open at once and read round robin, `block_length` elements at a time, as
/// `tf.data.Dataset.interleave`. When one ends, the next element of `D` takes its place in the
/// cycle. Reading many files this way mixes them without opening them all.
///
/// State: the input's state, the cycle position and, for every open dataset, the input's state
/// before the element that made it plus that dataset's own state. A restore remakes the open
/// datasets (`cycle_length` calls of `f`) and restores each: O(cycle_length), no replay.
/// \code
/// auto rows = from_generator(list_files)
///                 .interleave([](std::string f) { return from_hdf5<float, std::int64_t>(
///                                 f, "/x", "/y"); }, 4);
/// \endcode
template <Dataset D, class F>
class InterleaveDataset : public DatasetBase<InterleaveDataset<D, F>> {
  static_assert(std::invocable<const F&, element_t<D>>,
                "interleave: the function must take an element of the input dataset");
  using Inner = std::remove_cvref_t<std::invoke_result_t<const F&, element_t<D>>>;
  static_assert(Dataset<Inner>, "interleave: the function must return a dataset");

 public:
  using element_type = element_t<Inner>;

  /// Throws `ConfigError` for a `cycle_length` or `block_length` of 0.
  InterleaveDataset(D input, F f, std::size_t cycle_length, std::size_t block_length)
      : input_(std::move(input)),
        f_(std::move(f)),
        cycle_length_(cycle_length),
        block_length_(block_length) {
    if (cycle_length == 0) {
      throw ConfigError("interleave: cycle_length must be positive but is 0");
    }
    if (block_length == 0) {
      throw ConfigError("interleave: block_length must be positive but is 0");
    }
    slots_.resize(cycle_length);
  }

  std::optional<element_type> next() {
    if (!started_) {
      started_ = true;
      for (std::size_t i = 0; i < cycle_length_; ++i)
        open(i);
    }
    while (true) {
      if (input_done_ && open_slots() == 0) return std::nullopt;
      Slot& slot = slots_[current_];
      if (!slot.inner) {
        advance();
        continue;
      }
      auto element = slot.inner->next();
      if (!element) {
        slot.inner.reset();
        open(current_);
        advance();
        continue;
      }
      if (++in_block_ >= block_length_) advance();
      return element;
    }
  }

  void reset() {
    input_.reset();
    for (auto& slot : slots_)
      slot = Slot{};
    started_ = input_done_ = false;
    current_ = in_block_ = 0;
  }

  nlohmann::json state() const {
    nlohmann::json slots = nlohmann::json::array();
    for (const auto& slot : slots_) {
      if (slot.inner) {
        slots.push_back({{"opened_at", slot.opened_at}, {"inner", slot.inner->state()}});
      } else {
        slots.push_back(nullptr);
      }
    }
    return {{"op", "interleave"},  {"input", input_.state()}, {"input_done", input_done_},
            {"started", started_}, {"current", current_},     {"in_block", in_block_},
            {"slots", slots}};
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "interleave");
    if (s["started"] == true) detail::require_same_shards(s["input"], input_.state(), "interleave");
    const auto& slots = s["slots"];
    if (!slots.is_array() || slots.size() != cycle_length_) {
      throw CheckpointError("interleave: state has " + std::to_string(slots.size()) +
                            " slots but the cycle length is " + std::to_string(cycle_length_));
    }
    for (std::size_t i = 0; i < cycle_length_; ++i) {
      slots_[i] = Slot{};
      if (slots[i].is_null()) continue;
      input_.restore(slots[i]["opened_at"]);
      auto element = input_.next();
      if (!element) {
        throw CheckpointError("interleave: the input ended where slot " + std::to_string(i) +
                              " was opened");
      }
      slots_[i].inner.emplace(f_(std::move(*element)));
      slots_[i].inner->restore(slots[i]["inner"]);
      slots_[i].opened_at = slots[i]["opened_at"];
    }
    input_.restore(s["input"]);
    input_done_ = s["input_done"];
    started_ = s["started"];
    current_ = s["current"];
    in_block_ = s["in_block"];
  }

 private:
  struct Slot {
    std::optional<Inner> inner;
    nlohmann::json opened_at;  // The input's state before the element that made `inner`.
  };

  void open(std::size_t i) {
    if (input_done_) return;
    auto before = input_.state();
    auto element = input_.next();
    if (!element) {
      input_done_ = true;
      return;
    }
    slots_[i].inner.emplace(f_(std::move(*element)));
    slots_[i].opened_at = std::move(before);
  }
  void advance() noexcept {
    current_ = (current_ + 1) % cycle_length_;
    in_block_ = 0;
  }
  std::size_t open_slots() const noexcept {
    std::size_t n = 0;
    for (const auto& slot : slots_)
      n += slot.inner ? 1 : 0;
    return n;
  }

  D input_;
  F f_;
  std::size_t cycle_length_;
  std::size_t block_length_;
  std::vector<Slot> slots_;
  bool started_ = false;
  bool input_done_ = false;
  std::size_t current_ = 0;
  std::size_t in_block_ = 0;
};

}  // namespace loadstar
