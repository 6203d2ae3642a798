/// \file
/// `CallArguments`: what a layer whose Keras call takes more than its inputs records in a
/// functional config's `inbound_nodes`, and reads back.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// A layer whose Keras call has arguments beyond one input or one list of inputs: Keras's
/// `MultiHeadAttention` is called `mha(query, value, key)`, and the attention layers take
/// `use_causal_mask=True`. tf.keras 2 records a call as `[[first input, {kwargs}]]` with the
/// other tensors among the keyword arguments (`{"value": ["x", 0, 0]}`); Keras 3 as
/// `{"args": [...], "kwargs": {...}}`. loadstar calls a layer on a list of inputs, so such a
/// layer applies the same keyword arguments to every call (a shared layer called with others is
/// refused when its config is read).
class CallArguments {
 public:
  CallArguments() = default;
  CallArguments(const CallArguments&) = default;
  CallArguments& operator=(const CallArguments&) = default;
  virtual ~CallArguments() = default;

  /// The names of the call's tensor arguments after the first, in the order of the layer's
  /// inputs (`{"value", "key"}`), when Keras passes the inputs as separate arguments; empty when
  /// it passes them as one list (`Attention()([query, value])`).
  virtual std::vector<std::string> tensor_arguments() const = 0;

  /// The call's other keyword arguments as Keras records them (`{"use_causal_mask": true}`); an
  /// empty object when the call takes Keras's defaults.
  virtual nlohmann::json call_kwargs() const = 0;

  /// Applies the keyword arguments (tensors taken out) of a call read from a config, `where`
  /// naming that call in messages. Throws `ConfigError` naming an argument loadstar does not
  /// support, or one that differs from an earlier call of the same layer.
  virtual void apply_call_kwargs(const nlohmann::json& kwargs, const std::string& where) = 0;

  /// The names among `tensor_arguments()` that a call read from a config gives (before
  /// `apply_call_kwargs`): a layer whose tensor arguments are optional learns which its inputs
  /// are. Nothing by default.
  virtual void tensor_arguments_given(const std::vector<std::string>& /*names*/) {}
};

/// Whether a keyword argument of a tf.keras 2 node is a tensor: `[layer name, node index,
/// tensor index]`.
inline bool is_tensor_reference(const nlohmann::json& value) {
  const auto index = [](const nlohmann::json& v) {
    return v.is_number_integer() && v.get<std::int64_t>() >= 0;
  };
  return value.is_array() && value.size() == 3 && value[0].is_string() && index(value[1]) &&
         index(value[2]);
}

/// A call of `layer` as tf.keras 2 records it in `inbound_nodes`, from the references `[layer
/// name, node index, tensor index]` of its inputs: `[[first, {"value": second, ...kwargs}]]`
/// for a layer called with separate tensor arguments, else every input with the kwargs.
inline nlohmann::json legacy_call(const CallArguments& layer, std::vector<nlohmann::json> inputs) {
  nlohmann::json kwargs = layer.call_kwargs();
  nlohmann::json call = nlohmann::json::array();
  const std::vector<std::string> names = layer.tensor_arguments();
  if (!names.empty() && !inputs.empty()) {
    for (std::size_t i = 1; i < inputs.size() && i - 1 < names.size(); ++i)
      kwargs[names[i - 1]] = inputs[i];
    inputs[0].push_back(std::move(kwargs));
    call.push_back(std::move(inputs[0]));
    return call;
  }
  for (auto& input : inputs) {
    input.push_back(kwargs);
    call.push_back(std::move(input));
  }
  return call;
}

/// Reads the keyword arguments of a tf.keras 2 call `node` (`[[name, node, tensor, {kwargs}],
/// ...]`; the first input's kwargs) of `layer`: appends the tensors of its named tensor
/// arguments to `inputs` in the layer's order (found by `find`, which returns null for a tensor
/// not made yet: then this returns `false`, to be tried again), and applies the other arguments
/// (`CallArguments::apply_call_kwargs`). `where` names the call in messages.
template <class Tensor, class Find>
bool read_legacy_call(CallArguments& layer, const nlohmann::json& node, const std::string& where,
                      Find&& find, std::vector<Tensor>& inputs) {
  nlohmann::json kwargs = nlohmann::json::object();
  if (!node.empty() && node[0].is_array() && node[0].size() > 3) {
    if (!node[0][3].is_object()) {
      throw ConfigError(where + ": expected the call's keyword arguments {...} but found " +
                        node[0][3].dump());
    }
    kwargs = node[0][3];
  }
  std::vector<Tensor> extra;
  std::vector<std::string> given;
  for (const std::string& name : layer.tensor_arguments()) {
    const auto it = kwargs.find(name);
    if (it == kwargs.end()) continue;
    if (!it->is_null()) {
      if (!is_tensor_reference(*it)) {
        throw ConfigError(where + ": " + name +
                          ": expected a tensor [layer name, node index, tensor index] but found " +
                          it->dump());
      }
      const Tensor* tensor = find(*it);
      if (tensor == nullptr) return false;
      extra.push_back(*tensor);
      given.push_back(name);
    }
    kwargs.erase(it);
  }
  layer.tensor_arguments_given(given);
  layer.apply_call_kwargs(kwargs, where);
  inputs.insert(inputs.end(), extra.begin(), extra.end());
  return true;
}

}  // namespace loadstar::keras::detail
