/// \file
/// `StateReader`: reads the fields of a checkpointed JSON state with messages that name the
/// object, the field, the expected type and what was found.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/detail/strings.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// `value` as JSON text for a message, whatever bytes its strings hold (a malformed UTF-8
/// sequence shows as U+FFFD instead of throwing `nlohmann::json::type_error`).
inline std::string shown(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Checks that every string and key of `value` (decoded from CBOR, or built from YAML, which
/// nothing has checked) is UTF-8; `FormatError` naming `what`, the JSON pointer and the byte
/// otherwise, so that nothing later throws `nlohmann::json::type_error` dumping it.
inline void check_json_text(const nlohmann::json& value, const std::string& what,
                            const std::string& pointer = "") {
  const auto check = [&](const std::string& text, const std::string& at) {
    if (const auto bad = invalid_utf8(text)) {
      throw FormatError("expected UTF-8 " + what + " but found the byte " +
                        byte_text(static_cast<unsigned char>(text[*bad])) + " at offset " +
                        std::to_string(*bad) + " of " + (at.empty() ? "the value" : at) + " (" +
                        shown(nlohmann::json(text)) + ")");
    }
  };
  if (value.is_string()) {
    check(value.get_ref<const std::string&>(), pointer);
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      check(key, "a key of " + (pointer.empty() ? std::string("the top level") : pointer));
      check_json_text(item, what, pointer + "/" + key);
    }
  } else if (value.is_array()) {
    std::size_t i = 0;
    for (const auto& item : value)
      check_json_text(item, what, pointer + "/" + std::to_string(i++));
  }
}

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
      throw CheckpointError(owner_ + " state: expected a JSON object but found " + shown(state_));
    }
  }

  template <class T>
  T get(const char* field) const {
    const auto found = state_.find(field);
    if (found == state_.end()) {
      throw CheckpointError(owner_ + " state: the field '" + field + "' is missing in " +
                            shown(state_));
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
                            expected<T>() + " but is " + shown(*found));
    }
    try {
      return found->template get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(owner_ + " state: the field '" + field + "' cannot be read from " +
                            shown(*found) + " (" + e.what() + ")");
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
