/// \file
/// `Deferred<T>`: a value that a device backend may still be computing (a loss or a metric's
/// sums), read when someone needs it, so that a training step does not wait for the device.
#pragma once

#include "loadstar/config.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace loadstar::keras {

/// A `T` that is either known or still being computed (by a device, in stream order). `get()`
/// returns it, waiting for the device the first time when it is not known yet, and throws what
/// computing it found wrong (a label out of range), each time it is asked, until it succeeds.
/// Copies share the value: it is computed once. The CPU backend's values are known at once and
/// cost no allocation.
///
/// Not thread-safe: a `Deferred` and its copies are read from one thread at a time, as the
/// backend that made them is used.
/// \code
/// Deferred<double> loss = loss_object.compute_deferred(backend, y_true, y_pred, nullptr, grad);
/// // ... queue more work on the device ...
/// double value = loss.get();  // waits here, not above
/// \endcode
template <class T>
class Deferred {
 public:
  Deferred() = default;
  /// A known value.
  Deferred(T value) : value_(std::move(value)) {}  // NOLINT: implicit, a known value is one
  /// A value that `resolve` computes at the first `get()` (it may wait for a device).
  explicit Deferred(std::function<T()> resolve)
      : state_(std::make_shared<State>(State{std::move(resolve), std::nullopt})) {}

  /// Whether the value is known, so that `get()` will not wait or throw.
  bool ready() const noexcept { return !state_ || state_->value.has_value(); }

  /// The value; waits for it the first time when it is not known yet.
  const T& get() const {
    if (!state_) return value_;
    if (!state_->value) state_->value = state_->resolve();
    return *state_->value;
  }

  /// A `Deferred` of `f(value)`: computed now when the value is known, at the first `get()`
  /// otherwise.
  template <class F>
  auto then(F f) const -> Deferred<std::invoke_result_t<F&, const T&>> {
    using U = std::invoke_result_t<F&, const T&>;
    if (ready()) return Deferred<U>(f(get()));
    return Deferred<U>(std::function<U()>(
        [source = *this, f = std::move(f)]() mutable { return f(source.get()); }));
  }

 private:
  struct State {
    std::function<T()> resolve;
    std::optional<T> value;
  };
  std::shared_ptr<State> state_;
  T value_{};
};

}  // namespace loadstar::keras
