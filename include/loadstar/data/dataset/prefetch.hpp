/// \file
/// `prefetch`: elements produced ahead on a background thread.
#pragma once

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
/// \code
/// auto ds = from_tensor_slices(x, y).map(augment).batch(32).prefetch(2);
/// \endcode
template <Dataset D>
class PrefetchDataset : public DatasetBase<PrefetchDataset<D>> {
 public:
  using element_type = element_t<D>;

  /// Throws `ConfigError` for a buffer size of 0.
  PrefetchDataset(D upstream, std::size_t buffer_size)
      : shared_(std::make_unique<Shared>(std::move(upstream))), buffer_size_(buffer_size) {
    if (buffer_size == 0) throw ConfigError("prefetch: buffer_size must be positive but is 0");
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
      shared_->not_empty.wait(lock, [&] { return !shared_->queue.empty(); });
      slot = std::move(shared_->queue.front());
      shared_->queue.pop_front();
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
  nlohmann::json state() const { return {{"op", "prefetch"}, {"upstream", consumed_state_}}; }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "prefetch");
    stop();
    shared_->upstream.restore(s["upstream"]);
    consumed_state_ = s["upstream"];
  }

 private:
  struct Slot {
    std::optional<element_type> element;
    nlohmann::json state;  // The upstream's state after this element.
    std::exception_ptr error;
  };
  // Kept on the heap so that moving the dataset (before the producer starts) leaves the
  // producer's references valid.
  struct Shared {
    explicit Shared(D d) : upstream(std::move(d)) {}
    D upstream;
    std::mutex mutex;
    std::condition_variable_any not_empty;
    std::condition_variable_any not_full;
    std::deque<Slot> queue;
  };

  void start() {
    ended_ = false;
    // The producer touches only the heap-allocated `Shared`, never `this`.
    producer_.emplace([shared = shared_.get(), capacity = buffer_size_](std::stop_token stop) {
      produce(*shared, capacity, stop);
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

  void stop() {
    if (producer_ && producer_->joinable()) {
      producer_->request_stop();
      producer_->join();
    }
    producer_.reset();
    if (shared_) shared_->queue.clear();
    ended_ = false;
  }

  std::unique_ptr<Shared> shared_;
  std::size_t buffer_size_;
  nlohmann::json consumed_state_;
  bool ended_ = false;
  // Emplaced in place: GCC 12 warns about a moved-from temporary's stop state.
  std::optional<std::jthread> producer_;
};

}  // namespace loadstar
