/// \file
/// `StateReader`: reads the fields of a checkpointed JSON state with messages that name the
/// object, the field, the expected type and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"

namespace loadstar::detail {

/// Reads fields of the state `state` saved by `owner` (`"early stopping"`); throws
/// `CheckpointError` for a state that is not an object, a missing field or one of another type.
/// \code
/// const StateReader read("early stopping", state);
/// wait_ = read.get<std::size_t>("wait");
/// \endcode
class StateReader {
 public:
  StateReader(std::string owner, const nlohmann::json& state)
      : owner_(std::move(owner)), state_(state) {
    if (!state_.is_object()) {
      throw CheckpointError(owner_ + " state: expected a JSON object but found " + state_.dump());
    }
  }

  template <class T>
  T get(const char* field) const {
    const auto found = state_.find(field);
    if (found == state_.end()) {
      throw CheckpointError(owner_ + " state: the field '" + field + "' is missing in " +
                            state_.dump());
    }
    const bool ok = [&] {
      if constexpr (std::is_same_v<T, bool>) {
        return found->is_boolean();
      } else if constexpr (std::is_unsigned_v<T>) {
        // JSON built in C++ from an int is signed even when non-negative.
        return found->is_number_unsigned() ||
               (found->is_number_integer() && found->template get<std::int64_t>() >= 0);
      } else if constexpr (std::is_arithmetic_v<T>) {
        return found->is_number();
      } else if constexpr (std::is_same_v<T, std::string>) {
        return found->is_string();
      } else {
        return true;
      }
    }();
    if (!ok) {
      throw CheckpointError(owner_ + " state: the field '" + field + "' should be " +
                            expected<T>() + " but is " + found->dump());
    }
    try {
      return found->template get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(owner_ + " state: the field '" + field + "' cannot be read from " +
                            found->dump() + " (" + e.what() + ")");
    }
  }

  const nlohmann::json& json() const noexcept { return state_; }

 private:
  template <class T>
  static std::string expected() {
    if constexpr (std::is_same_v<T, bool>) return "a boolean";
    if constexpr (std::is_unsigned_v<T>) return "a non-negative integer";
    if constexpr (std::is_arithmetic_v<T>) return "a number";
    if constexpr (std::is_same_v<T, std::string>) return "a string";
    return "a value";
  }

  std::string owner_;
  const nlohmann::json& state_;
};

}  // namespace loadstar::detail
