/// \file
/// `Logs`: the named numbers Keras hands to callbacks, in the order they were logged.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loadstar::keras {

/// Keras's `logs` dictionary: `loss`, then the metrics in `compile` order, then `val_` entries;
/// iteration keeps that order (the progress bar prints it), lookup is by name.
class Logs {
 public:
  using value_type = std::pair<std::string, double>;

  /// Sets `name` to `value`, appending it when new.
  LOADSTAR_DECL void set(std::string_view name, double value);
  /// The value of `name`, if logged.
  LOADSTAR_DECL std::optional<double> get(std::string_view name) const;
  bool contains(std::string_view name) const { return get(name).has_value(); }
  void clear() noexcept { entries_.clear(); }
  bool empty() const noexcept { return entries_.empty(); }
  std::size_t size() const noexcept { return entries_.size(); }
  auto begin() const noexcept { return entries_.begin(); }
  auto end() const noexcept { return entries_.end(); }

 private:
  LOADSTAR_DECL std::vector<value_type>::iterator find(std::string_view name);
  std::vector<value_type> entries_;
};

}  // namespace loadstar::keras

// The definitions of what is declared above: in every translation unit when header-only, in
// the library alone when separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

LOADSTAR_DECL void Logs::set(std::string_view name, double value) {
  auto it = find(name);
  if (it != entries_.end()) {
    it->second = value;
  } else {
    entries_.emplace_back(std::string(name), value);
  }
}

LOADSTAR_DECL std::optional<double> Logs::get(std::string_view name) const {
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const value_type& e) { return e.first == name; });
  if (it == entries_.end()) return std::nullopt;
  return it->second;
}

LOADSTAR_DECL auto Logs::find(std::string_view name) -> std::vector<value_type>::iterator {
  return std::find_if(entries_.begin(), entries_.end(),
                      [&](const value_type& e) { return e.first == name; });
}

}  // namespace loadstar::keras
#endif
