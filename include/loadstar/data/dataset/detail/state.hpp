/// \file
/// Helpers for the JSON states of pipeline operators.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// Checks that `state` was taken from an operator of kind `op` and returns it; throws
/// `CheckpointError` naming both kinds otherwise.
inline const nlohmann::json& expect_state(const nlohmann::json& state, std::string_view op) {
  if (!state.is_object() || !state.contains("op") || !state["op"].is_string()) {
    throw CheckpointError(std::string(op) +
                          ": state is not a dataset state: " + loadstar::detail::shown(state));
  }
  if (state["op"].get<std::string>() != op) {
    throw CheckpointError(std::string(op) + ": state was taken from a '" +
                          state["op"].get<std::string>() + "' dataset");
  }
  return state;
}

}  // namespace loadstar::detail
