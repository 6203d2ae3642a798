/// \file
/// `map` and `map_with_seed`: a function applied to every element, optionally in parallel.
#pragma once

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/autotune.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/invoke.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/element_seed.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

namespace detail {
template <class F, class E, bool WithSeed>
struct MapResult {
  using type =
      std::remove_cvref_t<decltype(invoke_element(std::declval<const F&>(), std::declval<E>()))>;
};
template <class F, class E>
struct MapResult<F, E, true> {
  using type = std::remove_cvref_t<decltype(invoke_element(std::declval<const F&>(),
                                                           std::declval<E>(), std::uint64_t{}))>;
};
}  // namespace detail

/// `f` applied to every element of `D`: `f(element)`, or `f(members...)` for a tuple element;
/// with `map_with_seed`, `f(element, element_seed(seed, epoch, index))`, so that random
/// augmentations depend on the element's place in the stream only, never on the thread count.
///
/// With `options.num_parallel_calls > 1`, `f` runs on a oneTBB arena of that many threads over
/// windows of `options.window` elements, and must be safe to call concurrently (it is called
/// through a const reference). Output order is the input order unless `deterministic` is
/// false, which yields each window in completion order. An exception thrown by `f` reaches the
/// consumer when that element's turn comes, as a `WorkerError` "map: element 17 failed: <what>".
///
/// With `num_parallel_calls` `AUTOTUNE`, the first window holds one element, whose input and
/// output sizes set the window so that a window's inputs and outputs stay within the budget's
/// `ram_budget` bytes (elements of the largest size seen so far; at most `64 * cpu_budget`); with
/// a pipeline budget (`options.autotune.pipeline`) the window aims at the map's share of it (the
/// budget over the operators holding it), each element of a window is reserved from it, and the
/// window ends early when the other operators hold the rest. The thread count is tuned
/// per window on the wall time per element between window starts (the consumer's own work
/// included) by `detail::ThreadTuner`: it starts at 1, climbs by one while that falls by a tenth
/// or more, then keeps probing, giving a thread back to the budget when one fewer costs at most a
/// tenth more (a slow consumer) and taking one again when the cost rises and the budget has one
/// free (see `autotune_report()`). The output and the state's meaning do not change with the
/// choice.
///
/// State: the upstream's state at the start of the current window, the window's length and how
/// many of its outputs were consumed (and their order when not deterministic). A restore pulls
/// the window again from the upstream and recomputes only its unconsumed elements. Without
/// `deterministic` the state is exact too: the restored dataset yields the rest of the window in
/// the saved completion order, and later windows in their own completion order.
/// \code
/// auto ds = range(1000).map([](std::int64_t i) { return decode(i); }, {.num_parallel_calls = 4});
/// auto aug = from_tensor_slices(x).map_with_seed(
///     [](Tensor<float> image, std::uint64_t seed) { return random_crop(image, seed); }, 42);
/// \endcode
template <Dataset D, class F, bool WithSeed>
class MapDataset : public DatasetBase<MapDataset<D, F, WithSeed>> {
  using Input = element_t<D>;

 public:
  using element_type = typename detail::MapResult<F, Input, WithSeed>::type;
  static_assert(!std::is_void_v<element_type>, "map: the function must return an element");

  /// Throws `ConfigError` for `num_parallel_calls` of 0, for a `window` given with `AUTOTUNE`
  /// (which chooses it), for an autotune budget given without it or not valid (see
  /// `detail::check_autotune_options`), and when a pipeline budget has no thread left for it.
  MapDataset(D upstream, F f, std::uint64_t seed, MapOptions options)
      : upstream_(std::move(upstream)), f_(std::move(f)), seed_(seed), options_(options) {
    if (options.num_parallel_calls == 0) {
      throw ConfigError("map: num_parallel_calls must be positive but is 0");
    }
    detail::check_autotune_options(
        options.autotune, "map", options.num_parallel_calls == AUTOTUNE,
        "num_parallel_calls is " + std::to_string(options.num_parallel_calls));
    if (options.num_parallel_calls == AUTOTUNE) {
      if (options.window != 0) {
        throw ConfigError("map: window is " + std::to_string(options.window) +
                          " but with num_parallel_calls AUTOTUNE the window is chosen within the "
                          "memory budget; leave window 0");
      }
      lease_.emplace(options.autotune, "map");
      tuner_.emplace(lease_->budget().cpu_budget(), lease_->budget().cpu_budget());
      options_.num_parallel_calls = 1;
      options_.window = 1;  // The first window measures the element sizes.
    }
    if (options_.window == 0) options_.window = 64 * options_.num_parallel_calls;
    if (options_.num_parallel_calls > 1) {
      arena_ = std::make_shared<tbb::task_arena>(static_cast<int>(options_.num_parallel_calls));
    }
  }

  std::optional<element_type> next() {
    if (position_ < window_length_) return take_from_window();
    if (!arena_ && !tuner_) {
      // The sequential path: no window, no state copy per element.
      auto input = upstream_.next();
      if (!input) return std::nullopt;
      const std::size_t index = index_++;
      try {
        return call(std::move(*input), index);
      } catch (...) {
        throw detail::element_error("map", index, std::current_exception());
      }
    }
    if (tuner_) tune_threads();
    window_start_ = upstream_.state();
    window_index_ = index_;
    if (!fill_window(options_.window)) {
      period_start_.reset();  // The epoch's end: the next window starts a new period.
      return std::nullopt;
    }
    compute_window(0, options_.deterministic);
    if (tuner_) size_window();
    return take_from_window();
  }

  /// The values in use: `num_parallel_calls` and `window`, and with `AUTOTUNE` the budget and
  /// the most bytes a window held (inputs and outputs) so far.
  nlohmann::json autotune_report() const {
    nlohmann::json r = {{"num_parallel_calls", options_.num_parallel_calls},
                        {"window", options_.window}};
    if (tuner_) {
      r["cpu_budget"] = lease_->budget().cpu_budget();
      r["ram_budget"] = lease_->budget().ram_budget();
      r["peak_buffered_bytes"] = peak_bytes_;
      if (lease_->shared()) r["pipeline_budget"] = true;
    }
    return r;
  }

  void reset() {
    upstream_.reset();
    ++epoch_;
    index_ = 0;
    position_ = window_length_ = 0;
    release_window();
    period_start_.reset();
  }

  nlohmann::json state() const {
    nlohmann::json s = {{"op", "map"}, {"epoch", epoch_}};
    if (tuner_) s["autotune"] = autotune_report();
    if (position_ >= window_length_) {
      s["index"] = index_;
      s["upstream"] = upstream_.state();
      s["consumed"] = 0;
      return s;
    }
    s["index"] = window_index_;
    s["upstream"] = window_start_;
    s["window"] = window_length_;
    s["consumed"] = position_;
    if (!options_.deterministic) s["order"] = order_;
    return s;
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "map");
    if (s["consumed"] != 0) detail::require_same_shards(s["upstream"], upstream_.state(), "map");
    upstream_.restore(s["upstream"]);
    epoch_ = s["epoch"];
    index_ = s["index"];
    position_ = window_length_ = 0;
    release_window();
    period_start_.reset();
    if (tuner_ && s.contains("autotune") && s["autotune"].contains("window")) {
      // Keep the choice of the run that saved the state, within this dataset's budget (as many
      // of its threads as the budget has free).
      const std::size_t threads = s["autotune"]["num_parallel_calls"];
      const std::size_t window = s["autotune"]["window"];
      hold_threads(std::clamp<std::size_t>(threads, 1, tuner_->thread_limit()));
      if (window > 1 && window <= window_limit_) options_.window = window;
      tuner_->adopt();
    }
    const std::size_t consumed = s["consumed"];
    if (consumed == 0) return;
    window_start_ = s["upstream"];
    window_index_ = index_;
    const std::size_t length = s["window"];
    if (!fill_window(length, false) || window_length_ != length) {
      throw CheckpointError("map: state has a window of " + std::to_string(length) +
                            " elements but the upstream gave " + std::to_string(window_length_));
    }
    if (s.contains("order")) {
      order_ = s["order"].get<std::vector<std::size_t>>();
    }
    compute_window(consumed, true);
    position_ = consumed;
    if (lease_) lease_->give_bytes(consumed * slot_bytes_);  // Those were handed over before.
  }

 private:
  element_type call(Input&& input, std::size_t index) const {
    if constexpr (WithSeed) {
      return detail::invoke_element(f_, std::move(input), element_seed(seed_, epoch_, index));
    } else {
      return detail::invoke_element(f_, std::move(input));
    }
  }

  // Pulls up to `length` elements into the window (fewer when `budget` and the autotune memory
  // budget says so); false when there were none. With `AUTOTUNE`, each element's input and
  // output are reserved from the budget at the largest sizes seen (the first always, so that
  // the window is never empty).
  bool fill_window(std::size_t length, bool budget = true) {
    inputs_.resize(length);
    outputs_.resize(length);
    errors_.resize(length);
    std::size_t n = 0;
    window_in_bytes_ = window_largest_in_ = 0;
    release_window();
    slot_bytes_ = sized_ ? std::max<std::size_t>(1, largest_in_ + largest_out_) : 0;
    while (n < length) {
      if (tuner_ && !lease_->take_bytes(slot_bytes_, !budget || n == 0)) {
        break;  // The window may hold no more within the memory budget.
      }
      auto input = upstream_.next();
      if (!input) {
        if (tuner_) lease_->give_bytes(slot_bytes_);
        break;
      }
      if (tuner_) {
        const std::size_t b = element_bytes(*input);
        window_in_bytes_ += b;
        window_largest_in_ = std::max(window_largest_in_, b);
      }
      inputs_[n++] = std::move(*input);
    }
    window_length_ = n;
    position_ = 0;
    index_ += n;
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), std::size_t{0});
    return n > 0;
  }

  // Computes the window's outputs `order_[first..)`; without `keep_order`, `order_` becomes the
  // completion order.
  void compute_window(std::size_t first, bool keep_order) {
    // Tasks read the slots from a copy, since without `keep_order` they rewrite `order_`.
    const std::vector<std::size_t> slots = order_;
    std::atomic<std::size_t> completed{first};
    auto body = [&](std::size_t k) {
      const std::size_t slot = slots[k];
      errors_[slot] = nullptr;
      try {
        outputs_[slot].emplace(call(std::move(*inputs_[slot]), window_index_ + slot));
      } catch (...) {
        errors_[slot] = std::current_exception();
      }
      inputs_[slot].reset();
      if (!keep_order) order_[completed.fetch_add(1, std::memory_order_relaxed)] = slot;
    };
    run(first, window_length_, body);
  }

  // With `AUTOTUNE`, before each window: the cost of the last period (from the last window's
  // start to now, per element) chooses the thread count of this one.
  void tune_threads() {
    const auto now = std::chrono::steady_clock::now();
    // A copy holds one thread of its own, whatever the original ran.
    if (lease_->threads() != options_.num_parallel_calls) set_threads(lease_->threads());
    if (period_start_ && period_measured_ && period_length_ > 0) {
      const double cost = std::chrono::duration<double>(now - *period_start_).count() /
                          static_cast<double>(period_length_);
      const std::size_t want = tuner_->step(options_.num_parallel_calls, cost);
      if (hold_threads(want) < want) tuner_->refused(cost);
    }
    period_start_ = now;
  }

  // Takes threads from the budget, or gives them back, to hold `want` (as many as it has free);
  // returns the count held.
  std::size_t hold_threads(std::size_t want) {
    while (lease_->threads() < want && lease_->try_add_thread()) {
    }
    while (lease_->threads() > want)
      lease_->remove_thread();
    set_threads(lease_->threads());
    return lease_->threads();
  }

  // Gives back the budget bytes the window still holds.
  void release_window() {
    if (lease_) lease_->give_all_bytes();
  }

  // With `AUTOTUNE`, after each window: sizes the window to the memory budget (after the first).
  void size_window() {
    period_length_ = window_length_;
    period_measured_ = sized_;  // The first window, of one element, says nothing about threads.
    if (window_length_ == 0) return;
    std::size_t out_bytes = 0, largest_out = 0;
    for (std::size_t k = 0; k < window_length_; ++k) {
      if (!outputs_[k]) continue;
      const std::size_t b = element_bytes(*outputs_[k]);
      out_bytes += b;
      largest_out = std::max(largest_out, b);
    }
    largest_in_ = std::max(largest_in_, window_largest_in_);
    largest_out_ = std::max(largest_out_, largest_out);
    peak_bytes_ = std::max(peak_bytes_, window_in_bytes_ + out_bytes);
    const std::size_t per_element = std::max<std::size_t>(1, largest_in_ + largest_out_);
    window_limit_ = std::clamp<std::size_t>(lease_->ram_share() / per_element, 1,
                                            64 * lease_->budget().cpu_budget());
    if (!sized_) {
      sized_ = true;
      options_.window = window_limit_;
      return;
    }
    options_.window = std::min(options_.window, window_limit_);
  }

  void set_threads(std::size_t threads) {
    if (threads == options_.num_parallel_calls && (threads > 1) == static_cast<bool>(arena_)) {
      return;
    }
    options_.num_parallel_calls = threads;
    arena_.reset();
    if (threads > 1) arena_ = std::make_shared<tbb::task_arena>(static_cast<int>(threads));
  }

  template <class Body>
  void run(std::size_t first, std::size_t last, Body& body) {
    if (!arena_ || last - first < 2) {
      for (std::size_t k = first; k < last; ++k)
        body(k);
      return;
    }
    arena_->execute([&] { tbb::parallel_for(first, last, [&](std::size_t k) { body(k); }); });
  }

  element_type take_from_window() {
    const std::size_t slot = order_[position_++];
    if (lease_) lease_->give_bytes(slot_bytes_);  // Handed over: the consumer holds it now.
    if (errors_[slot]) {
      auto error = std::exchange(errors_[slot], nullptr);
      outputs_[slot].reset();
      throw detail::element_error("map", window_index_ + slot, error);
    }
    element_type out = std::move(*outputs_[slot]);
    outputs_[slot].reset();
    return out;
  }

  D upstream_;
  F f_;
  std::uint64_t seed_;
  MapOptions options_;
  std::shared_ptr<tbb::task_arena> arena_;
  std::uint64_t epoch_ = 0;
  std::size_t index_ = 0;  // Elements pulled from the upstream this epoch.
  // The current window: elements [window_index_, window_index_ + window_length_) of the epoch.
  nlohmann::json window_start_;
  std::size_t window_index_ = 0;
  std::size_t window_length_ = 0;
  std::size_t position_ = 0;  // Outputs of the window consumed.
  std::vector<std::size_t> order_;
  std::vector<std::optional<Input>> inputs_;
  std::vector<std::optional<element_type>> outputs_;
  std::vector<std::exception_ptr> errors_;
  // With `AUTOTUNE`.
  std::optional<detail::BudgetLease> lease_;
  std::optional<detail::ThreadTuner> tuner_;
  std::optional<std::chrono::steady_clock::time_point> period_start_;  // The last window's start.
  std::size_t period_length_ = 0;                                      // Its elements.
  bool period_measured_ = false;  // Whether its time chooses threads.
  std::size_t slot_bytes_ = 0;    // Reserved from the budget for each element of the window.
  bool sized_ = false;
  std::size_t window_limit_ = 1;
  std::size_t largest_in_ = 0, largest_out_ = 0;
  std::size_t window_in_bytes_ = 0, window_largest_in_ = 0;
  std::size_t peak_bytes_ = 0;
};

}  // namespace loadstar
