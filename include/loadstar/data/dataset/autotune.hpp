/// \file
/// `AUTOTUNE` support: element sizes for the memory budget and the thread-count controller.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/dataset/detail/base.hpp"

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

/// The budget with its defaults filled in.
inline std::size_t cpu_budget_of(const AutotuneOptions& o) {
  if (o.cpu_budget != 0) return o.cpu_budget;
  return std::max<std::size_t>(1, std::thread::hardware_concurrency());
}
inline std::size_t ram_budget_of(const AutotuneOptions& o) {
  return o.ram_budget != 0 ? o.ram_budget : std::size_t{256} << 20U;
}

/// Hill climbing on the thread count of an autotuned operator. Each measurement period reports
/// a cost (the consumer's wait per element, or the time per element): the count grows by one
/// while the cost falls by at least a tenth, up to the CPU budget and `useful` (more threads
/// than inputs cannot help); the first step that does not help is taken back and the count is
/// kept from then on. It converges after at most `min(cpu_budget, useful)` periods.
class ThreadTuner {
 public:
  ThreadTuner(const AutotuneOptions& options, std::size_t useful)
      : cpu_(cpu_budget_of(options)),
        ram_(ram_budget_of(options)),
        limit_(std::max<std::size_t>(1, std::min(cpu_, useful))) {}

  /// The thread count for the next period, given the count and the cost of the last one.
  std::size_t step(std::size_t current, double cost) {
    if (converged_) return current;
    if (last_cost_ && cost > *last_cost_ * 0.9 && current > 1) {
      converged_ = true;  // The last added thread did not help: take it back.
      return current - 1;
    }
    last_cost_ = cost;
    if (cost <= 0 || current >= limit_) {
      converged_ = true;
      return std::min(current, limit_);
    }
    return current + 1;
  }
  /// Takes `threads` as the converged choice (after a restore).
  void adopt(std::size_t threads) {
    (void)threads;
    converged_ = true;
  }
  bool converged() const noexcept { return converged_; }
  std::size_t cpu_budget() const noexcept { return cpu_; }
  std::size_t ram_budget() const noexcept { return ram_; }
  /// The most threads it will choose.
  std::size_t thread_limit() const noexcept { return limit_; }

 private:
  std::size_t cpu_;
  std::size_t ram_;
  std::size_t limit_;
  std::optional<double> last_cost_;
  bool converged_ = false;
};

}  // namespace detail
}  // namespace loadstar
