/// \file
/// Helpers for the JSON states of pipeline operators.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// The `(num_shards, index)` of every `shard` in a dataset state, outermost first (states saved
/// before shards recorded them give none).
inline void collect_shards(const nlohmann::json& state,
                           std::vector<std::pair<std::size_t, std::size_t>>& out) {
  if (state.is_object()) {
    const auto op = state.find("op");
    if (op != state.end() && *op == "shard" && state.contains("num_shards") &&
        state.contains("index") && state["num_shards"].is_number_unsigned() &&
        state["index"].is_number_unsigned()) {
      out.emplace_back(state["num_shards"].get<std::size_t>(), state["index"].get<std::size_t>());
    }
    for (const auto& [key, value] : state.items())
      collect_shards(value, out);
  } else if (state.is_array()) {
    for (const auto& value : state)
      collect_shards(value, out);
  }
}

/// For an operator `op` that holds upstream elements across its consumption boundary (a shuffle
/// buffer, a map window, an interleave's open inputs, a cache being filled) and restores them by
/// replaying its upstream from `saved`: throws `CheckpointError` when a `shard` upstream of it was
/// saved with another `(num_shards, index)` than the dataset's (`live`, its upstream's state
/// now). The elements it held came from another rank's share, so the stream cannot go on exactly;
/// a `shard` downstream of `op` resumes on any number of ranks.
inline void require_same_shards(const nlohmann::json& saved, const nlohmann::json& live,
                                std::string_view op) {
  std::vector<std::pair<std::size_t, std::size_t>> was, is;
  collect_shards(saved, was);
  collect_shards(live, is);
  if (was.empty() || was == is) return;
  const auto describe = [](const std::vector<std::pair<std::size_t, std::size_t>>& shards) {
    std::string out;
    for (const auto& [num, index] : shards)
      out += (out.empty() ? "" : ", ") +
             ("shard(" + std::to_string(num) + ", " + std::to_string(index) + ")");
    return out.empty() ? std::string("no shard") : out;
  };
  throw CheckpointError(std::string(op) + ": the state was saved with " + describe(was) +
                        " upstream of this " + std::string(op) + " but the dataset has " +
                        describe(is) + "; the elements the " + std::string(op) +
                        " holds came from that share, so it cannot resume exactly on another "
                        "number of ranks (shard after the " +
                        std::string(op) + " to resume on any number)");
}

}  // namespace loadstar::detail
