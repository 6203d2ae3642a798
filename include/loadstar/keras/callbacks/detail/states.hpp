/// \file
/// The callbacks' states in a checkpoint or backup: a list of `{"class_name", "state"}` objects,
/// one for each callback in hook order, written by `callback_states` and read back by
/// `load_callback_states`.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <string>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// The states of `callbacks` (a range of pointers to callbacks) in hook order.
template <class Callbacks>
nlohmann::json callback_states(const Callbacks& callbacks) {
  nlohmann::json states = nlohmann::json::array();
  for (const auto& cb : callbacks)
    states.push_back({{"class_name", cb->class_name()}, {"state", cb->get_state()}});
  return states;
}

/// Loads each of `callbacks` from `states` (as `callback_states` wrote them), after checking
/// that `states` names the same callbacks in the same order. Throws `CheckpointError` starting
/// with `owner` (the file) and naming the callbacks saved and those of `whose` ("fit", "the
/// trial") when they differ, or the entry that is malformed.
template <class Callbacks>
void load_callback_states(const nlohmann::json& states, const Callbacks& callbacks,
                          const std::string& owner, const std::string& whose) {
  std::string saved_names;
  std::string names;
  if (states.is_array()) {
    for (const auto& entry : states) {
      const auto name = entry.is_object() ? entry.find("class_name") : entry.end();
      const bool known = entry.is_object() && name != entry.end() && name->is_string();
      saved_names += (saved_names.empty() ? "" : ", ") +
                     (known ? name->template get<std::string>() : std::string("?"));
    }
  }
  for (const auto& cb : callbacks)
    names += (names.empty() ? "" : ", ") + cb->class_name();
  if (!states.is_array() || saved_names != names) {
    throw CheckpointError(owner + ": saved with the callbacks [" + saved_names + "] but " + whose +
                          " has [" + names + "]");
  }
  std::size_t i = 0;
  for (const auto& cb : callbacks) {
    const loadstar::detail::StateReader read(
        owner + ": callback " + std::to_string(i) + " (" + cb->class_name() + ")", states[i]);
    const auto saved = read.get<nlohmann::json>("state");
    if (!saved.is_null()) cb->load_state(saved);
    ++i;
  }
}

}  // namespace loadstar::keras::detail
