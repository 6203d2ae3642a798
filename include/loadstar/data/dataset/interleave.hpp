/// \file
/// `interleave`: datasets made from the elements of another, read round robin (many files),
/// optionally read ahead on threads.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/autotune.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// `f(element)` turns each element of `D` (a file name, say) into a dataset; `cycle_length` of
/// them are open at once and read round robin, `block_length` elements at a time, as
/// `tf.data.Dataset.interleave`. When one ends, the next element of `D` takes its place in the
/// cycle. Reading many files this way mixes them without opening them all.
///
/// With `options.num_parallel_calls > 1`, that many threads read the open datasets ahead of the
/// consumer (up to `2 * block_length` elements each, the datasets nearest the consumer's turn
/// first); `f` itself runs on the consuming thread. With `deterministic` (the default) the output
/// is the sequential order; without it, when the current dataset has nothing ready the consumer
/// takes from the next one that has, and the cycle goes on from there. With `AUTOTUNE` the
/// number of threads is tuned every 64 elements on the wall time per element as the consumer
/// sees it, by `detail::ThreadTuner`: it starts at 1 and climbs while that falls by a tenth or
/// more, up to `cycle_length` and the budget's `cpu_budget`, then keeps probing, giving a thread
/// back to the budget when one fewer costs at most a tenth more and taking one again when the
/// cost rises and the budget has one free. The elements read ahead, each reserved at the largest
/// size seen before it is read, never exceed the budget's `ram_budget` bytes (with a pipeline
/// budget, `options.autotune.pipeline`, shared with the pipeline's other autotuned operators; see
/// `autotune_report()`).
///
/// State: the input's state, the cycle position and, for every open dataset, the input's state
/// before the element that made it plus that dataset's state after the last element the
/// consumer took from it (elements read ahead are read again after a restore, as `prefetch`'s).
/// A restore remakes the open datasets (`cycle_length` calls of `f`) and restores each:
/// O(cycle_length), no replay. The state is exact with any thread count and without
/// `deterministic` too: the restored stream yields every element not yet consumed exactly once
/// (without `deterministic`, in a possibly different order).
/// \code
/// auto rows = from_generator(list_files)
///                 .interleave([](std::string f) { return from_hdf5<float, std::int64_t>(
///                                 f, "/x", "/y"); }, 4, 1, {.num_parallel_calls = 4});
/// \endcode
template <Dataset D, class F>
class InterleaveDataset : public DatasetBase<InterleaveDataset<D, F>> {
  static_assert(std::invocable<const F&, element_t<D>>,
                "interleave: the function must take an element of the input dataset");
  using Inner = std::remove_cvref_t<std::invoke_result_t<const F&, element_t<D>>>;
  static_assert(Dataset<Inner>, "interleave: the function must return a dataset");

 public:
  using element_type = element_t<Inner>;

  /// Throws `ConfigError` for a `cycle_length`, `block_length` or `num_parallel_calls` of 0, for
  /// a `cycle_length` or `block_length` of `AUTOTUNE`, for an autotune budget given without
  /// `AUTOTUNE` or not valid (see `detail::check_autotune_options`), and when a pipeline budget
  /// has no thread left for it.
  InterleaveDataset(D input, F f, std::size_t cycle_length, std::size_t block_length,
                    InterleaveOptions options = {})
      : input_(std::move(input)),
        f_(std::move(f)),
        cycle_length_(cycle_length),
        block_length_(block_length),
        options_(options),
        shared_(std::make_unique<Shared>()) {
    if (cycle_length == 0) {
      throw ConfigError("interleave: cycle_length must be positive but is 0");
    }
    if (block_length == 0) {
      throw ConfigError("interleave: block_length must be positive but is 0");
    }
    if (cycle_length == AUTOTUNE || block_length == AUTOTUNE) {
      throw ConfigError(std::string("interleave: ") +
                        (cycle_length == AUTOTUNE ? "cycle_length" : "block_length") +
                        " is AUTOTUNE, which only num_parallel_calls accepts here; give a number");
    }
    if (options.num_parallel_calls == 0) {
      throw ConfigError("interleave: num_parallel_calls must be positive but is 0");
    }
    detail::check_autotune_options(
        options.autotune, "interleave", options.num_parallel_calls == AUTOTUNE,
        "num_parallel_calls is " + std::to_string(options.num_parallel_calls));
    shared_->slots.resize(cycle_length);
    shared_->capacity = 2 * block_length;
    if (options.num_parallel_calls == AUTOTUNE) {
      shared_->lease.emplace(options.autotune, "interleave");
      tuner_.emplace(shared_->lease->budget().cpu_budget(), cycle_length);
      threads_wanted_ = 1;
    } else if (options.num_parallel_calls > 1) {
      threads_wanted_ = std::min(options.num_parallel_calls, cycle_length);
    }
  }
  InterleaveDataset(const InterleaveDataset& other)
      : InterleaveDataset(other.input_, other.f_, other.cycle_length_, other.block_length_,
                          other.options_) {
    restore(other.state());
  }
  InterleaveDataset(InterleaveDataset&& other) noexcept = default;
  InterleaveDataset& operator=(InterleaveDataset&&) = delete;
  InterleaveDataset& operator=(const InterleaveDataset&) = delete;
  ~InterleaveDataset() { stop(); }

  std::optional<element_type> next() {
    if (!started_) {
      started_ = true;
      for (std::size_t i = 0; i < cycle_length_; ++i)
        open(i);
    }
    while (true) {
      if (input_done_ && open_slots() == 0) return std::nullopt;
      if (!slots()[current_].inner) {
        advance();
        continue;
      }
      std::optional<element_type> element;
      if (parallel()) {
        if (!take_ready(element)) {
          open(current_);
          advance();
          continue;
        }
      } else {
        Slot& slot = slots()[current_];
        element = slot.inner->next();
        if (!element) {
          slot.inner.reset();
          open(current_);
          advance();
          continue;
        }
      }
      if (++in_block_ >= block_length_) advance();
      return element;
    }
  }

  void reset() {
    stop();
    input_.reset();
    for (auto& slot : slots())
      slot.clear();
    started_ = input_done_ = false;
    current_ = in_block_ = 0;
    period_start_.reset();
    taken_ = 0;
  }

  nlohmann::json state() const {
    nlohmann::json slots_state = nlohmann::json::array();
    for (const auto& slot : slots()) {
      if (slot.inner) {
        slots_state.push_back({{"opened_at", slot.opened_at},
                               {"inner", parallel() ? slot.consumed_state : slot.inner->state()}});
      } else {
        slots_state.push_back(nullptr);
      }
    }
    nlohmann::json s = {{"op", "interleave"},        {"input", input_.state()},
                        {"input_done", input_done_}, {"started", started_},
                        {"current", current_},       {"in_block", in_block_},
                        {"slots", slots_state}};
    if (tuner_) s["autotune"] = autotune_report();
    return s;
  }

  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "interleave");
    if (s["started"] == true) detail::require_same_shards(s["input"], input_.state(), "interleave");
    const auto& slots_state = s["slots"];
    if (!slots_state.is_array() || slots_state.size() != cycle_length_) {
      throw CheckpointError("interleave: state has " + std::to_string(slots_state.size()) +
                            " slots but the cycle length is " + std::to_string(cycle_length_));
    }
    stop();
    for (std::size_t i = 0; i < cycle_length_; ++i) {
      Slot& slot = slots()[i];
      slot.clear();
      if (slots_state[i].is_null()) continue;
      input_.restore(slots_state[i]["opened_at"]);
      auto element = input_.next();
      if (!element) {
        throw CheckpointError("interleave: the input ended where slot " + std::to_string(i) +
                              " was opened");
      }
      slot.inner.emplace(f_(std::move(*element)));
      slot.inner->restore(slots_state[i]["inner"]);
      slot.opened_at = slots_state[i]["opened_at"];
      slot.consumed_state = slots_state[i]["inner"];
    }
    input_.restore(s["input"]);
    input_done_ = s["input_done"];
    started_ = s["started"];
    current_ = s["current"];
    in_block_ = s["in_block"];
    period_start_.reset();
    taken_ = 0;
    if (tuner_ && s.contains("autotune")) {
      // Keep the choice of the run that saved the state, as far as the budget has threads free.
      hold_threads(std::clamp<std::size_t>(s["autotune"]["num_parallel_calls"].get<std::size_t>(),
                                           1, tuner_->thread_limit()));
      tuner_->adopt();
    }
  }

  /// The values in use: `num_parallel_calls` (threads reading ahead) and, with `AUTOTUNE`, the
  /// budget and the most bytes of elements read ahead at once so far.
  nlohmann::json autotune_report() const {
    nlohmann::json r = {{"num_parallel_calls", parallel() ? threads_wanted_ : std::size_t{1}}};
    if (tuner_) {
      std::lock_guard lock(shared_->mutex);
      r["cpu_budget"] = shared_->lease->budget().cpu_budget();
      r["ram_budget"] = shared_->lease->budget().ram_budget();
      r["peak_buffered_bytes"] = shared_->peak_bytes;
      if (shared_->lease->shared()) r["pipeline_budget"] = true;
    }
    return r;
  }

 private:
  struct Item {
    std::optional<element_type> element;
    nlohmann::json state;  // The inner dataset's state after this element.
    std::exception_ptr error;
    std::size_t bytes = 0;
  };
  struct Slot {
    std::optional<Inner> inner;
    nlohmann::json opened_at;  // The input's state before the element that made `inner`.
    // With threads: the state after the last element the consumer took, and what the threads
    // read ahead (guarded by `Shared::mutex`; `inner` is read by the thread that set `busy`).
    nlohmann::json consumed_state;
    std::deque<Item> ahead;
    bool busy = false;
    bool ended = false;
    void clear() {
      inner.reset();
      opened_at = nullptr;
      consumed_state = nullptr;
      ahead.clear();
      busy = ended = false;
    }
  };
  // On the heap, so that the threads' references survive a move of the dataset.
  struct Shared {
    mutable std::mutex mutex;
    std::condition_variable_any work;   // A slot can be read ahead, or stop.
    std::condition_variable_any ready;  // An element was read ahead.
    std::vector<Slot> slots;
    std::size_t capacity = 2;  // Elements read ahead per slot.
    std::size_t current = 0;   // The consumer's slot, which the threads serve first.
    // With `AUTOTUNE`: the threads and the bytes read ahead, from the budget.
    std::optional<detail::BudgetLease> lease;
    std::size_t buffered_bytes = 0;
    std::size_t reserved_bytes = 0;  // For the elements being read.
    std::size_t in_flight = 0;
    std::size_t largest_element = 0;
    std::size_t peak_bytes = 0;
  };

  std::vector<Slot>& slots() noexcept { return shared_->slots; }
  const std::vector<Slot>& slots() const noexcept { return shared_->slots; }
  bool parallel() const noexcept { return threads_wanted_ > 1 || tuner_.has_value(); }

  void open(std::size_t i) {
    Slot& slot = slots()[i];
    if (input_done_) return;
    auto before = input_.state();
    auto element = input_.next();
    if (!element) {
      input_done_ = true;
      return;
    }
    std::optional<Inner> inner;
    inner.emplace(f_(std::move(*element)));
    auto initial = parallel() ? inner->state() : nlohmann::json();
    std::lock_guard lock(shared_->mutex);
    slot.clear();
    slot.inner.emplace(std::move(*inner));
    slot.opened_at = std::move(before);
    slot.consumed_state = std::move(initial);
    shared_->work.notify_all();
  }
  void advance() noexcept {
    current_ = (current_ + 1) % cycle_length_;
    in_block_ = 0;
  }
  std::size_t open_slots() const noexcept {
    std::size_t n = 0;
    for (const auto& slot : slots())
      n += slot.inner ? 1 : 0;
    return n;
  }

  // Takes the current slot's next element read ahead into `out` (waiting for it); false when
  // that dataset has ended (its slot is then closed). Without `deterministic`, moves `current_`
  // to the next slot that has something ready when the current one has not.
  bool take_ready(std::optional<element_type>& out) {
    start_threads();
    std::unique_lock lock(shared_->mutex);
    auto ready = [&](const Slot& s) { return !s.ahead.empty() || s.ended; };
    if (!options_.deterministic && !ready(slots()[current_])) {
      for (std::size_t k = 1; k < cycle_length_; ++k) {
        const std::size_t j = (current_ + k) % cycle_length_;
        if (slots()[j].inner && ready(slots()[j])) {
          current_ = j;
          in_block_ = 0;
          break;
        }
      }
    }
    shared_->current = current_;
    Slot& slot = slots()[current_];
    if (!ready(slot)) {
      shared_->work.notify_all();
      const auto can_go = [&] { return ready(slot) || (!slot.busy && blocked(*shared_)); };
      if (shared_->lease && shared_->lease->shared()) {
        // Other operators give bytes back without notifying this one: look again now and then.
        while (!shared_->ready.wait_for(lock, std::chrono::milliseconds(2), can_go)) {
        }
      } else {
        shared_->ready.wait(lock, can_go);
      }
    }
    if (!ready(slot)) {
      // The threads may read no further ahead within the memory budget: read it here.
      slot.busy = true;
      lock.unlock();
      Item item = fetch(slot);
      lock.lock();
      slot.busy = false;
      if (!item.element && !item.error) {
        slot.clear();
        return false;
      }
      slot.consumed_state = std::move(item.state);
      lock.unlock();
      count_taken();
      if (item.error) std::rethrow_exception(item.error);
      out = std::move(item.element);
      return true;
    }
    if (slot.ahead.empty()) {  // Ended, and nothing is being read from it.
      slot.clear();
      return false;
    }
    Item item = std::move(slot.ahead.front());
    slot.ahead.pop_front();
    shared_->buffered_bytes -= item.bytes;
    if (shared_->lease) shared_->lease->give_bytes(item.bytes);
    slot.consumed_state = std::move(item.state);
    shared_->work.notify_all();
    lock.unlock();
    count_taken();
    if (item.error) std::rethrow_exception(item.error);
    out = std::move(item.element);
    return true;
  }

  // With `AUTOTUNE`, every 64 elements: the wall time per element since the last time is the
  // cost the thread count is tuned on (see `ThreadTuner`).
  void count_taken() {
    if (!tuner_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!period_start_) {
      period_start_ = now;
      taken_ = 0;
      return;
    }
    if (++taken_ < 64) return;
    const double cost = std::chrono::duration<double>(now - *period_start_).count() / 64.0;
    period_start_ = now;
    taken_ = 0;
    const std::size_t want = tuner_->step(threads_wanted_, cost);
    if (hold_threads(want) < want) tuner_->refused(cost);
  }

  // Takes reading threads from the budget, or gives them back, to hold `want` (as many as it has
  // free), and starts or stops threads to match; returns the count held.
  std::size_t hold_threads(std::size_t want) {
    std::size_t held = 0;
    {
      std::lock_guard lock(shared_->mutex);
      auto& lease = *shared_->lease;
      while (lease.threads() < want && lease.try_add_thread()) {
      }
      while (lease.threads() > want)
        lease.remove_thread();
      held = lease.threads();
    }
    threads_wanted_ = held;
    if (threads_.empty()) return held;  // Not reading yet: `start_threads` starts them.
    start_threads();
    while (threads_.size() > held) {
      threads_.back().request_stop();
      shared_->work.notify_all();
      threads_.pop_back();  // Joins: the thread is gone when its budget share is back.
    }
    return held;
  }

  void start_threads() {
    while (threads_.size() < threads_wanted_) {
      threads_.emplace_back(
          [shared = shared_.get()](std::stop_token stop) { read(*shared, stop); });
    }
  }

  // A reading thread: serves the open slot nearest the consumer's turn that has room.
  static void read(Shared& shared, std::stop_token stop) {
    std::unique_lock lock(shared.mutex);
    while (true) {
      Slot* slot = nullptr;
      const auto find = [&] {
        const std::size_t n = shared.slots.size();
        for (std::size_t k = 0; k < n; ++k) {
          Slot& s = shared.slots[(shared.current + k) % n];
          if (!s.inner || s.busy || s.ended || s.ahead.size() >= shared.capacity) continue;
          if (!reserve(shared)) return false;
          slot = &s;
          return true;
        }
        return false;
      };
      if (shared.lease && shared.lease->shared()) {
        // Other operators give bytes back without notifying this one: look again now and then.
        while (!shared.work.wait_for(lock, stop, std::chrono::milliseconds(2), find)) {
          if (stop.stop_requested()) return;
        }
      } else if (!shared.work.wait(lock, stop, find)) {
        return;
      }
      slot->busy = true;
      const std::size_t reserved = shared.largest_element;  // Taken from the budget by `find`.
      shared.reserved_bytes += reserved;
      ++shared.in_flight;
      lock.unlock();
      Item item = fetch(*slot);
      lock.lock();
      slot->busy = false;
      shared.reserved_bytes -= reserved;
      --shared.in_flight;
      if (shared.lease) shared.lease->give_bytes(reserved);
      if (!item.element && !item.error) {
        slot->ended = true;
      } else {
        // The reservation becomes the element's size (more only for an element larger than any
        // before it).
        if (shared.lease) shared.lease->take_bytes(item.bytes, true);
        shared.buffered_bytes += item.bytes;
        shared.largest_element = std::max(shared.largest_element, item.bytes);
        shared.peak_bytes = std::max(shared.peak_bytes, shared.buffered_bytes);
        slot->ahead.push_back(std::move(item));
      }
      shared.ready.notify_all();
      shared.work.notify_all();
    }
  }

  // Whether reading one more element ahead could exceed the memory budget, which holds the
  // elements read ahead and those being read (each reserved at the largest size seen). Before
  // any size is known, one element is read at a time.
  static bool blocked(const Shared& shared) {
    if (!shared.lease) return false;
    if (shared.largest_element == 0) return shared.in_flight > 0;
    return !shared.lease->fits(shared.largest_element);
  }
  // Reserves the bytes of one more element read ahead; false when `blocked`.
  static bool reserve(Shared& shared) {
    if (!shared.lease) return true;
    if (shared.largest_element == 0) return shared.in_flight == 0;
    return shared.lease->take_bytes(shared.largest_element);
  }

  static Item fetch(Slot& slot) {
    Item item;
    try {
      item.element = slot.inner->next();
    } catch (...) {
      item.error = std::current_exception();
    }
    item.state = slot.inner->state();
    if (item.element) item.bytes = element_bytes(*item.element);
    return item;
  }

  void stop() {
    for (auto& t : threads_)
      t.request_stop();
    if (shared_) shared_->work.notify_all();
    threads_.clear();  // Joins.
    if (!shared_) return;
    for (auto& slot : slots()) {
      slot.ahead.clear();
      slot.ended = slot.busy = false;
    }
    shared_->buffered_bytes = shared_->reserved_bytes = shared_->in_flight = 0;
    if (shared_->lease) shared_->lease->give_all_bytes();
  }

  D input_;
  F f_;
  std::size_t cycle_length_;
  std::size_t block_length_;
  InterleaveOptions options_;
  std::unique_ptr<Shared> shared_;
  std::optional<detail::ThreadTuner> tuner_;
  std::size_t threads_wanted_ = 1;
  std::vector<std::jthread> threads_;
  std::size_t taken_ = 0;  // Elements of the tuning period.
  std::optional<std::chrono::steady_clock::time_point> period_start_;
  bool started_ = false;
  bool input_done_ = false;
  std::size_t current_ = 0;
  std::size_t in_block_ = 0;
};

}  // namespace loadstar
