/// \file
/// `prefetch`: elements produced ahead on a background thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stop_token>
#include <thread>
#include <utility>

#include "loadstar/data/dataset/autotune.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The elements of `D`, produced up to `buffer_size` ahead on a background `std::jthread`
/// (started by the first `next()`) into a bounded queue, so that the consumer's work overlaps
/// the pipeline's.
///
/// The state is the upstream's state recorded with the last element handed to the consumer, not
/// the producer's position: prefetched elements are produced again after a restore. An exception
/// from the upstream reaches the consumer in its place in the stream. Destruction, `reset()` and
/// `restore()` stop the producer: one blocked on a full queue stops at once, one busy producing
/// an element stops as soon as that element is done (an upstream call is never abandoned midway,
/// since its state would be torn).
///
/// With `buffer_size` `AUTOTUNE` (and the budget given to `prefetch(AUTOTUNE, budget)`), the
/// buffer starts at one element and grows by one each time the consumer had to wait although
/// the producer's time per element is below the consumer's time between calls (so that a
/// larger buffer absorbs the producer's jitter; a producer slower on average is not helped by
/// any buffer). The producer starts an element only when the buffered elements plus one of the
/// largest size seen fit in `ram_budget` bytes (one element is always allowed); the buffer size
/// in use is `autotune_report()["buffer_size"]`, also in the state. With a pipeline budget
/// (`prefetch(AUTOTUNE, {.pipeline = budget})`, see `AutotuneBudget`) the producer holds one of
/// its threads for the dataset's life, and each element is reserved from its bytes before it is
/// produced and given back when the consumer takes it, so the buffer shares `ram_budget` with the
/// pipeline's other autotuned operators.
/// \code
/// auto ds = from_tensor_slices(x, y).map(augment).batch(32).prefetch(2);
/// \endcode
template <Dataset D>
class PrefetchDataset : public DatasetBase<PrefetchDataset<D>> {
 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for a buffer size of 0, for a budget given with a fixed buffer size
  /// (it would be ignored) or not valid (see `detail::check_autotune_options`), and when a
  /// pipeline budget has no thread left for the producer.
  PrefetchDataset(D upstream, std::size_t buffer_size,
                  std::optional<AutotuneOptions> budget = std::nullopt)
      : shared_(std::make_unique<Shared>(std::move(upstream))), buffer_size_(buffer_size) {
    if (buffer_size == 0) throw ConfigError("prefetch: buffer_size must be positive but is 0");
    if (buffer_size == AUTOTUNE) {
      const AutotuneOptions options = budget.value_or(AutotuneOptions{});
      detail::check_autotune_options(options, "prefetch", true, "");
      shared_->autotune = true;
      shared_->lease.emplace(options, "prefetch");
      shared_->capacity = 1;
    } else {
      if (budget) {
        throw ConfigError("prefetch: an autotune budget was given but buffer_size is " +
                          std::to_string(buffer_size) + ", not AUTOTUNE");
      }
      shared_->capacity = buffer_size;
    }
    consumed_state_ = shared_->upstream.state();
  }
  PrefetchDataset(PrefetchDataset&& other) noexcept = default;
  PrefetchDataset& operator=(PrefetchDataset&&) = delete;
  PrefetchDataset(const PrefetchDataset&) = delete;
  PrefetchDataset& operator=(const PrefetchDataset&) = delete;
  ~PrefetchDataset() { stop(); }

  std::optional<element_type> next() {
    if (ended_) return std::nullopt;
    if (!producer_) start();
    Slot slot;
    {
      std::unique_lock lock(shared_->mutex);
      if (shared_->autotune) {
        const auto now = std::chrono::steady_clock::now();
        if (last_call_) average(shared_->consumer_seconds, now - *last_call_);
        if (shared_->queue.empty()) {
          shared_->not_empty.wait(lock, [&] { return !shared_->queue.empty(); });
          // Waited: a larger buffer helps when the producer keeps up on average.
          if (shared_->producer_seconds < shared_->consumer_seconds &&
              shared_->capacity < max_capacity) {
            ++shared_->capacity;
          }
        }
        last_call_ = std::chrono::steady_clock::now();
      } else {
        shared_->not_empty.wait(lock, [&] { return !shared_->queue.empty(); });
      }
      slot = std::move(shared_->queue.front());
      shared_->queue.pop_front();
      shared_->buffered_bytes -= slot.bytes;
      if (shared_->lease) shared_->lease->give_bytes(slot.bytes);
    }
    shared_->not_full.notify_one();
    consumed_state_ = std::move(slot.state);
    if (slot.error) std::rethrow_exception(slot.error);
    if (!slot.element) ended_ = true;
    return std::move(slot.element);
  }
  void reset() {
    stop();
    shared_->upstream.reset();
    consumed_state_ = shared_->upstream.state();
  }
  nlohmann::json state() const {
    nlohmann::json s = {{"op", "prefetch"}, {"upstream", consumed_state_}};
    if (shared_->autotune) s["autotune"] = autotune_report();
    return s;
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "prefetch");
    stop();
    shared_->upstream.restore(s["upstream"]);
    consumed_state_ = s["upstream"];
    if (shared_->autotune && s.contains("autotune")) {
      shared_->capacity =
          std::clamp<std::size_t>(s["autotune"]["buffer_size"].get<std::size_t>(), 1, max_capacity);
    }
  }

  /// The buffer size in use and, with `AUTOTUNE`, the memory budget and the most bytes of
  /// elements buffered at once so far.
  nlohmann::json autotune_report() const {
    std::lock_guard lock(shared_->mutex);
    nlohmann::json r = {{"buffer_size", shared_->capacity}};
    if (shared_->autotune) {
      r["ram_budget"] = shared_->lease->budget().ram_budget();
      r["peak_buffered_bytes"] = shared_->peak_bytes;
      if (shared_->lease->shared()) r["pipeline_budget"] = true;
    }
    return r;
  }

 private:
  struct Slot {
    std::optional<element_type> element;
    nlohmann::json state;  // The upstream's state after this element.
    std::exception_ptr error;
    std::size_t bytes = 0;
  };
  static constexpr std::size_t max_capacity = 1024;
  // Kept on the heap so that moving the dataset (before the producer starts) leaves the
  // producer's references valid.
  struct Shared {
    explicit Shared(D d) : upstream(std::move(d)) {}
    D upstream;
    std::mutex mutex;
    std::condition_variable_any not_empty;
    std::condition_variable_any not_full;
    std::deque<Slot> queue;
    std::size_t capacity = 1;
    // With `AUTOTUNE`: the producer's thread and the buffered bytes, from the budget.
    bool autotune = false;
    std::optional<detail::BudgetLease> lease;
    std::size_t buffered_bytes = 0;
    std::size_t largest_element = 0;
    std::size_t peak_bytes = 0;
    double producer_seconds = 0;  // Running averages per element.
    double consumer_seconds = 0;
  };

  static void average(double& mean, std::chrono::steady_clock::duration sample) {
    const double x = std::chrono::duration<double>(sample).count();
    mean = mean == 0 ? x : 0.8 * mean + 0.2 * x;
  }

  void start() {
    ended_ = false;
    // The producer touches only the heap-allocated `Shared`, never `this`.
    producer_.emplace([shared = shared_.get()](std::stop_token stop) {
      if (shared->autotune) {
        produce_within_budget(*shared, stop);
      } else {
        produce(*shared, shared->capacity, stop);
      }
    });
  }

  static void produce(Shared& shared, std::size_t capacity, std::stop_token stop) {
    while (!stop.stop_requested()) {
      Slot slot;
      try {
        slot.element = shared.upstream.next();
      } catch (...) {
        slot.error = std::current_exception();
      }
      slot.state = shared.upstream.state();
      const bool last = !slot.element && !slot.error;
      {
        std::unique_lock lock(shared.mutex);
        if (!shared.not_full.wait(lock, stop, [&] { return shared.queue.size() < capacity; })) {
          return;
        }
        shared.queue.push_back(std::move(slot));
      }
      shared.not_empty.notify_one();
      if (last) return;
    }
  }

  // The autotuned producer: waits for room (in elements, and the largest element's bytes
  // reserved from the budget) before producing an element, so that what it holds never exceeds
  // the budget.
  static void produce_within_budget(Shared& shared, std::stop_token stop) {
    while (true) {
      std::size_t reserved = 0;
      {
        std::unique_lock lock(shared.mutex);
        const auto room = [&] {
          if (shared.queue.size() >= shared.capacity) return false;
          reserved = shared.largest_element;
          return shared.lease->take_bytes(reserved, shared.queue.empty());
        };
        if (shared.lease->shared()) {
          // Other operators give bytes back without notifying this one: look again now and then.
          while (!shared.not_full.wait_for(lock, stop, std::chrono::milliseconds(2), room)) {
            if (stop.stop_requested()) return;
          }
        } else if (!shared.not_full.wait(lock, stop, room)) {
          return;
        }
      }
      const auto started = std::chrono::steady_clock::now();
      Slot slot;
      try {
        slot.element = shared.upstream.next();
      } catch (...) {
        slot.error = std::current_exception();
      }
      slot.state = shared.upstream.state();
      if (slot.element) slot.bytes = element_bytes(*slot.element);
      const bool last = !slot.element && !slot.error;
      {
        std::lock_guard lock(shared.mutex);
        average(shared.producer_seconds, std::chrono::steady_clock::now() - started);
        // The reservation becomes the element's size (more only for an element larger than any
        // before it).
        if (slot.bytes > reserved) {
          shared.lease->take_bytes(slot.bytes - reserved, true);
        } else {
          shared.lease->give_bytes(reserved - slot.bytes);
        }
        shared.buffered_bytes += slot.bytes;
        shared.largest_element = std::max(shared.largest_element, slot.bytes);
        shared.peak_bytes = std::max(shared.peak_bytes, shared.buffered_bytes);
        shared.queue.push_back(std::move(slot));
      }
      shared.not_empty.notify_one();
      if (last || stop.stop_requested()) return;
    }
  }

  void stop() {
    if (producer_ && producer_->joinable()) {
      producer_->request_stop();
      producer_->join();
    }
    producer_.reset();
    if (shared_) {
      shared_->queue.clear();
      shared_->buffered_bytes = 0;
      if (shared_->lease) shared_->lease->give_all_bytes();
    }
    ended_ = false;
    last_call_.reset();
  }

  std::unique_ptr<Shared> shared_;
  std::size_t buffer_size_;
  nlohmann::json consumed_state_;
  bool ended_ = false;
  std::optional<std::chrono::steady_clock::time_point> last_call_;
  // Emplaced in place: GCC 12 warns about a moved-from temporary's stop state.
  std::optional<std::jthread> producer_;
};

}  // namespace loadstar
