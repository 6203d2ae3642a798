/// \file
/// `AUTOTUNE` support: element sizes for the memory budget, the budget a pipeline's autotuned
/// operators share and the thread-count controller.
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The bytes an element holds, as the autotune memory budget counts them: `e.bytes()` for a
/// tensor (or any type with that member), the sum of the members of a tuple, pair, vector or
/// map, the characters of a string, the alternative a variant holds, `sizeof` otherwise.
template <class E>
std::size_t element_bytes(const E& e) {
  if constexpr (requires {
                  { e.bytes() } -> std::convertible_to<std::size_t>;
                }) {
    return static_cast<std::size_t>(e.bytes());
  } else if constexpr (std::is_same_v<E, std::string>) {
    return e.size();
  } else if constexpr (requires { std::variant_size<E>::value; }) {
    return std::visit([](const auto& m) { return element_bytes(m); }, e);
  } else if constexpr (requires { std::tuple_size<E>::value; }) {
    return std::apply([](const auto&... m) { return (std::size_t{0} + ... + element_bytes(m)); },
                      e);
  } else if constexpr (requires { e.begin()->second; }) {
    std::size_t n = 0;
    for (const auto& [key, value] : e)
      n += element_bytes(key) + element_bytes(value);
    return n;
  } else if constexpr (requires {
                         e.begin();
                         e.end();
                       }) {
    std::size_t n = 0;
    for (const auto& m : e)
      n += element_bytes(m);
    return n;
  } else {
    return sizeof(E);
  }
}

namespace detail {
class BudgetLease;
}  // namespace detail

/// The budget of a whole pipeline, as `tf.data.Options().autotune.cpu_budget` and
/// `ram_budget`: every autotuned operator given it (`AutotuneOptions::pipeline`) draws its threads
/// and its buffered bytes from it, so that together they never hold more than `cpu_budget`
/// threads and `ram_budget` bytes. Thread-safe; operators take what they use and give it back
/// when they shrink, reset or are destroyed.
///
/// What counts: a map's calls at once (`num_parallel_calls`, the one on the calling thread
/// included), an interleave's reading threads and a prefetch's producer; each autotuned operator
/// holds at least one thread from its construction on (operators that run on one thread, a map
/// below a prefetch, count it each, so the budget bounds the threads at work from above). Bytes:
/// the elements of a map's window, an interleave's elements read ahead and a prefetch's buffer,
/// each reserved at the largest element seen before it is produced (an operator that holds none
/// may always take one element, so that the pipeline never stalls on a budget below an element).
/// \code
/// auto budget = std::make_shared<AutotuneBudget>(/*cpu_budget=*/4, /*ram_budget=*/64 << 20);
/// auto ds = range(1000).map(decode, {.num_parallel_calls = AUTOTUNE, .autotune = {.pipeline =
/// budget}})
///               .prefetch(AUTOTUNE, {.pipeline = budget});
/// \endcode
class AutotuneBudget {
 public:
  /// `cpu_budget` 0 means `std::thread::hardware_concurrency()`, `ram_budget` 0 means 256 MiB.
  /// Throws `ConfigError` for `AUTOTUNE` as either (a budget is a number, not a choice).
  explicit AutotuneBudget(std::size_t cpu_budget = 0, std::size_t ram_budget = 0)
      : cpu_(cpu_budget != 0 ? cpu_budget
                             : std::max<std::size_t>(1, std::thread::hardware_concurrency())),
        ram_(ram_budget != 0 ? ram_budget : std::size_t{256} << 20U) {
    if (cpu_budget == AUTOTUNE || ram_budget == AUTOTUNE) {
      throw ConfigError(std::string("autotune budget: ") +
                        (cpu_budget == AUTOTUNE ? "cpu_budget" : "ram_budget") +
                        " is AUTOTUNE, which only the tuned values accept; give a number (0 means "
                        "the default)");
    }
  }
  AutotuneBudget(const AutotuneBudget&) = delete;
  AutotuneBudget& operator=(const AutotuneBudget&) = delete;

  std::size_t cpu_budget() const noexcept { return cpu_; }
  std::size_t ram_budget() const noexcept { return ram_; }
  /// Threads and bytes the operators hold now, and the most they held at once.
  std::size_t threads_held() const {
    std::lock_guard lock(mutex_);
    return threads_;
  }
  std::size_t bytes_held() const {
    std::lock_guard lock(mutex_);
    return bytes_;
  }
  std::size_t peak_threads_held() const {
    std::lock_guard lock(mutex_);
    return peak_threads_;
  }
  std::size_t peak_bytes_held() const {
    std::lock_guard lock(mutex_);
    return peak_bytes_;
  }
  /// The operators that hold a share of it now.
  std::size_t operators() const {
    std::lock_guard lock(mutex_);
    return operators_;
  }

 private:
  friend class detail::BudgetLease;

  bool try_take_thread(bool joining = false) {
    std::lock_guard lock(mutex_);
    if (threads_ >= cpu_) return false;
    peak_threads_ = std::max(peak_threads_, ++threads_);
    if (joining) ++operators_;
    return true;
  }
  void leave(std::size_t threads, std::size_t bytes) {
    std::lock_guard lock(mutex_);
    threads_ -= threads;
    bytes_ -= bytes;
    --operators_;
  }
  void give_threads(std::size_t n) {
    std::lock_guard lock(mutex_);
    threads_ -= n;
  }
  // Takes `n` bytes when they fit, or regardless with `force`.
  bool take_bytes(std::size_t n, bool force) {
    std::lock_guard lock(mutex_);
    if (!force && bytes_ + n > ram_) return false;
    bytes_ += n;
    peak_bytes_ = std::max(peak_bytes_, bytes_);
    return true;
  }
  void give_bytes(std::size_t n) {
    std::lock_guard lock(mutex_);
    bytes_ -= n;
  }
  bool fits(std::size_t n) const {
    std::lock_guard lock(mutex_);
    return bytes_ + n <= ram_;
  }

  const std::size_t cpu_;
  const std::size_t ram_;
  mutable std::mutex mutex_;
  std::size_t threads_ = 0;
  std::size_t bytes_ = 0;
  std::size_t peak_threads_ = 0;
  std::size_t peak_bytes_ = 0;
  std::size_t operators_ = 0;
};

namespace detail {

/// Checks an operator's `AutotuneOptions`: `autotuned` says whether its value is `AUTOTUNE`,
/// `value` names the value otherwise ("num_parallel_calls is 2"). Throws `ConfigError` for a
/// budget given to an operator that is not autotuned (it would be ignored), for a pipeline budget
/// given with per-operator numbers (which one would hold?) and for `AUTOTUNE` as a budget.
inline void check_autotune_options(const AutotuneOptions& o, const std::string& op, bool autotuned,
                                   const std::string& value) {
  if (!autotuned && (o.cpu_budget != 0 || o.ram_budget != 0 || o.pipeline)) {
    throw ConfigError(op + ": an autotune budget was given but " + value + ", not AUTOTUNE");
  }
  if (o.pipeline && (o.cpu_budget != 0 || o.ram_budget != 0)) {
    throw ConfigError(op + ": autotune has a pipeline budget and " +
                      (o.cpu_budget != 0 ? "cpu_budget " + std::to_string(o.cpu_budget)
                                         : "ram_budget " + std::to_string(o.ram_budget)) +
                      "; the pipeline budget sets both, leave cpu_budget and ram_budget 0");
  }
  if (o.cpu_budget == AUTOTUNE || o.ram_budget == AUTOTUNE) {
    throw ConfigError(op + ": " + (o.cpu_budget == AUTOTUNE ? "cpu_budget" : "ram_budget") +
                      " is AUTOTUNE, which only the tuned values accept; give a number (0 means "
                      "the default)");
  }
}

/// An operator's share of an `AutotuneBudget`: the pipeline's (`AutotuneOptions::pipeline`), or
/// one of its own made from `cpu_budget` and `ram_budget`. It holds one thread from its
/// construction on; what it holds goes back to the budget when it gives it back or is destroyed.
/// A copy is a second operator: it takes its own thread (from a budget of its own when the
/// original had one). Not thread-safe itself: the operator guards it.
class BudgetLease {
 public:
  BudgetLease() = default;
  /// Throws `ConfigError` when the pipeline budget has no thread left for this operator.
  BudgetLease(const AutotuneOptions& options, const std::string& op)
      : budget_(options.pipeline
                    ? options.pipeline
                    : std::make_shared<AutotuneBudget>(options.cpu_budget, options.ram_budget)),
        own_(!options.pipeline),
        op_(op) {
    take_first_thread();
  }
  BudgetLease(const BudgetLease& other)
      : budget_(other.own_ ? std::make_shared<AutotuneBudget>(other.budget_->cpu_budget(),
                                                              other.budget_->ram_budget())
                           : other.budget_),
        own_(other.own_),
        op_(other.op_) {
    if (budget_) take_first_thread();
  }
  BudgetLease(BudgetLease&& other) noexcept
      : budget_(std::move(other.budget_)),
        own_(other.own_),
        op_(std::move(other.op_)),
        threads_(std::exchange(other.threads_, 0)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  BudgetLease& operator=(BudgetLease other) noexcept {
    std::swap(budget_, other.budget_);
    std::swap(own_, other.own_);
    std::swap(op_, other.op_);
    std::swap(threads_, other.threads_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~BudgetLease() {
    if (budget_ && threads_ > 0) budget_->leave(threads_, bytes_);
  }

  const AutotuneBudget& budget() const noexcept { return *budget_; }
  /// Whether the budget is the pipeline's, shared with other operators.
  bool shared() const noexcept { return !own_; }
  std::size_t threads() const noexcept { return threads_; }
  std::size_t bytes() const noexcept { return bytes_; }

  /// One more thread, when the budget has one free.
  bool try_add_thread() {
    if (!budget_->try_take_thread()) return false;
    ++threads_;
    return true;
  }
  /// Gives one thread back (never the last).
  void remove_thread() {
    if (threads_ <= 1) return;
    --threads_;
    budget_->give_threads(1);
  }
  /// Takes `n` bytes when they fit in the budget; with `force` (for an operator that must hold
  /// one element to make progress), regardless.
  bool take_bytes(std::size_t n, bool force = false) {
    if (n == 0) return true;
    if (!budget_->take_bytes(n, force)) return false;
    bytes_ += n;
    return true;
  }
  void give_bytes(std::size_t n) {
    n = std::min(n, bytes_);
    bytes_ -= n;
    budget_->give_bytes(n);
  }
  void give_all_bytes() { give_bytes(bytes_); }
  /// Whether `n` more bytes would fit in the budget now.
  bool fits(std::size_t n) const { return budget_->fits(n); }
  /// The bytes of `ram_budget` this operator may aim for: its share among the operators holding
  /// the budget now.
  std::size_t ram_share() const {
    return budget_->ram_budget() / std::max<std::size_t>(1, budget_->operators());
  }

 private:
  void take_first_thread() {
    if (!budget_->try_take_thread(true)) {
      throw ConfigError(op_ + ": the pipeline autotune budget has no thread left (cpu_budget " +
                        std::to_string(budget_->cpu_budget()) +
                        ", all held by other operators); each autotuned operator holds at least "
                        "one");
    }
    threads_ = 1;
  }

  std::shared_ptr<AutotuneBudget> budget_;
  bool own_ = true;
  std::string op_;
  std::size_t threads_ = 0;
  std::size_t bytes_ = 0;
};

/// Hill climbing on the thread count of an autotuned operator, which never stops measuring. Each
/// period reports a cost: the wall time per element as the consumer sees it (its own work between
/// calls included), so that threads the consumer cannot use show as threads that do not help.
/// - Climbing (from the start): one more thread each period while the cost falls by at least a
///   tenth, up to `thread_limit()`; the first step that does not help is taken back.
/// - Steady: every few periods (2 after climbing; 1 after a thread was given back; doubled after
///   each probe that failed, up to 16), or at once when the cost rose by more than a tenth, it
///   probes: one more thread when the cost rose by more than
///   a tenth since the last probe, when one fewer failed last time or when it has one thread,
///   else one fewer. One fewer is kept when the cost does not rise by more than a tenth (the
///   thread goes back to the budget); one more is kept when the cost falls by a tenth or more,
///   and climbing resumes.
/// The operator reports a thread the budget refused with `refused()`. Only the thread count
/// depends on the costs, never the output.
class ThreadTuner {
 public:
  /// At most `min(cpu_budget, useful)` threads (more threads than inputs cannot help).
  ThreadTuner(std::size_t cpu_budget, std::size_t useful)
      : limit_(std::max<std::size_t>(1, std::min(cpu_budget, useful))) {}

  /// The thread count for the next period, given the count and the cost of the last one.
  std::size_t step(std::size_t current, double cost) {
    switch (phase_) {
      case Phase::climbing:
        if (before_ && cost > *before_ * 0.9 && current > 1) {
          settle(*before_);  // The last added thread did not help: take it back.
          return current - 1;
        }
        if (current >= limit_) {
          settle(cost);
          return current;
        }
        before_ = cost;
        return current + 1;
      case Phase::steady:
        // A cost that rose by more than a tenth probes at once.
        if (--wait_ > 0 && cost <= reference_ * 1.1) return current;
        if (current < limit_ && (cost > reference_ * 1.1 || up_next_ || current == 1)) {
          phase_ = Phase::probing_up;
          before_ = cost;
          return current + 1;
        }
        if (current > 1) {
          phase_ = Phase::probing_down;
          before_ = cost;
          return current - 1;
        }
        settle(cost);  // One thread and no more to have.
        return current;
      case Phase::probing_down:
        if (cost <= *before_ * 1.1) {
          backoff_ = 1;  // Given back: try one fewer again soon.
          up_next_ = false;
          settle(cost);
          return current;
        }
        up_next_ = true;
        fail(*before_);
        return current + 1;
      case Phase::probing_up:
        if (cost <= *before_ * 0.9) {
          backoff_ = 2;
          if (current >= limit_) {
            settle(cost);
            return current;
          }
          phase_ = Phase::climbing;  // It helped: climb on.
          before_ = cost;
          return current + 1;
        }
        up_next_ = false;
        fail(*before_);
        return current - 1;
    }
    return current;
  }
  /// The operator could not have the thread `step` asked for: it keeps its count, whose cost was
  /// `cost`.
  void refused(double cost) {
    up_next_ = false;
    fail(cost);
  }
  /// Takes the operator's count as the choice so far (after a restore) and goes on measuring.
  /// The first probe is one fewer.
  void adopt() {
    settle(std::numeric_limits<double>::infinity());
    wait_ = backoff_ = 2;
  }
  /// Whether the climb is over (it keeps probing).
  bool converged() const noexcept { return phase_ != Phase::climbing; }
  /// The most threads it will choose.
  std::size_t thread_limit() const noexcept { return limit_; }

 private:
  enum class Phase { climbing, steady, probing_down, probing_up };
  // Steady at the current count, whose cost is `cost`, until the next probe.
  void settle(double cost) {
    phase_ = Phase::steady;
    reference_ = cost;
    before_.reset();
    wait_ = backoff_;
  }
  void fail(double cost) {
    backoff_ = std::min<std::size_t>(2 * backoff_, 16);
    settle(cost);
  }

  std::size_t limit_;
  Phase phase_ = Phase::climbing;
  std::optional<double> before_;  // The cost before the last step.
  double reference_ = 0;          // The cost at the current count, when steady.
  std::size_t wait_ = 0;          // Periods until the next probe.
  std::size_t backoff_ = 2;       // Periods between probes.
  bool up_next_ = false;          // The next probe is one more (else one fewer, when it can).
};

}  // namespace detail
}  // namespace loadstar
