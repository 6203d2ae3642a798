/// \file
/// `Logs`: the named numbers Keras hands to callbacks, in the order they were logged.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loadstar::keras {

/// Keras's `logs` dictionary: `loss`, then the metrics in `compile` order, then `val_` entries;
/// iteration keeps that order (the progress bar prints it), lookup is by name.
///
/// Logs may be deferred (`defer`): filled at their first read, so that a training step on a
/// device backend hands logs to callbacks without waiting for the device; a callback that reads
/// them waits then. Copying deferred logs reads them.
class Logs {
 public:
  using value_type = std::pair<std::string, double>;

  Logs() = default;
  Logs(const Logs& other) : entries_((other.resolve(), other.entries_)) {}
  Logs(Logs&&) noexcept = default;
  Logs& operator=(const Logs& other) {
    if (this != &other) {
      other.resolve();
      fill_ = nullptr;
      entries_ = other.entries_;  // reuses this object's capacity
    }
    return *this;
  }
  Logs& operator=(Logs&&) noexcept = default;
  ~Logs() = default;

  /// Sets `name` to `value`, appending it when new.
  LOADSTAR_DECL void set(std::string_view name, double value);
  /// The value of `name`, if logged.
  LOADSTAR_DECL std::optional<double> get(std::string_view name) const;
  bool contains(std::string_view name) const { return get(name).has_value(); }
  void clear() noexcept {
    fill_ = nullptr;
    entries_.clear();
  }
  bool empty() const {
    resolve();
    return entries_.empty();
  }
  std::size_t size() const {
    resolve();
    return entries_.size();
  }
  auto begin() const {
    resolve();
    return entries_.cbegin();
  }
  auto end() const {
    resolve();
    return entries_.cend();
  }

  /// Makes these logs deferred: `fill` writes them at the first read (it may wait for a device
  /// and throw what it found; the logs stay deferred then, and the next read tries again).
  void defer(std::function<void(Logs&)> fill) { fill_ = std::move(fill); }
  /// Whether the logs are filled (reading them will not wait).
  bool ready() const noexcept { return !fill_; }
  /// These logs as `source` is when they are read: `source`'s entries at once when it is
  /// filled, or deferred until read. `source` must outlive the deferral (a model's step logs,
  /// followed by the loop's logs until the next step).
  void follow(const Logs& source) {
    if (source.ready()) {
      *this = source;
    } else {
      defer([&source](Logs& out) { out.entries_ = (source.resolve(), source.entries_); });
    }
  }

 private:
  /// Fills deferred logs.
  void resolve() const {
    if (!fill_) return;
    auto fill = std::move(fill_);
    fill_ = nullptr;  // `fill` sets entries through `set`
    try {
      fill(const_cast<Logs&>(*this));
    } catch (...) {
      fill_ = std::move(fill);
      throw;
    }
  }

  LOADSTAR_DECL std::vector<value_type>::iterator find(std::string_view name);
  std::vector<value_type> entries_;
  mutable std::function<void(Logs&)> fill_;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void Logs::set(std::string_view name, double value) {
  resolve();
  auto it = find(name);
  if (it != entries_.end()) {
    it->second = value;
  } else {
    entries_.emplace_back(std::string(name), value);
  }
}

std::optional<double> Logs::get(std::string_view name) const {
  resolve();
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const value_type& e) { return e.first == name; });
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

auto Logs::find(std::string_view name) -> std::vector<value_type>::iterator {
  return std::find_if(entries_.begin(), entries_.end(),
                      [&](const value_type& e) { return e.first == name; });
}

}  // namespace loadstar::keras
#endif
