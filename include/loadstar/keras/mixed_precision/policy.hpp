/// \file
/// `keras::mixed_precision::Policy`: Keras's dtype policy of a layer (the dtype it computes in and
/// the dtype of its variables), and the global policy new layers take.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/tensor/dtype.hpp"

namespace loadstar::keras::mixed_precision {

/// A dtype policy, as Keras's `DTypePolicy` (tf.keras 2.x's `mixed_precision.Policy`):
/// `"float32"`, `"mixed_float16"` and `"mixed_bfloat16"` (compute in half precision, variables
/// in float32), `"float16"` and `"bfloat16"` (both in half precision).
///
/// loadstar computes in float32 on every backend and rounds the values Keras holds in the compute
/// dtype to it: each layer's inputs, the weights as it uses them, its output and the gradient
/// flowing into it (keras/mixed_precision/detail/mixed_plan.hpp). Variables of a mixed policy stay
/// float32; those of `"float16"` / `"bfloat16"` are rounded after every update.
/// \code
/// keras::mixed_precision::set_global_policy("mixed_bfloat16");
/// layers::Dense hidden(64, {.activation = "relu"});  // computes in bfloat16
/// layers::Activation output("softmax");
/// output.set_dtype_policy("float32");                // kept in float32, as Keras recommends
/// \endcode
class Policy {
 public:
  /// The policy of that name; any other name throws `ConfigError` naming it.
  Policy(std::string_view name = "float32") : kind_(parse(name)) {}    // NOLINT: "float32" is one
  Policy(const char* name) : Policy(std::string_view(name)) {}         // NOLINT
  Policy(const std::string& name) : Policy(std::string_view(name)) {}  // NOLINT

  /// Keras's name: `"mixed_float16"`.
  std::string name() const { return std::string(names()[static_cast<std::size_t>(kind_)]); }
  /// The dtype layers compute in (`float16` for `"mixed_float16"`).
  DType compute_dtype() const noexcept {
    switch (kind_) {
      case Kind::mixed_float16:
      case Kind::float16:
        return DType::float16;
      case Kind::mixed_bfloat16:
      case Kind::bfloat16:
        return DType::bfloat16;
      case Kind::float32:
        break;
    }
    return DType::float32;
  }
  /// The dtype of the variables (`float32` for the mixed policies).
  DType variable_dtype() const noexcept {
    return kind_ == Kind::float16    ? DType::float16
           : kind_ == Kind::bfloat16 ? DType::bfloat16
                                     : DType::float32;
  }
  /// Whether values are rounded to a half-precision compute dtype.
  bool is_half() const noexcept { return compute_dtype() != DType::float32; }

  /// The layer config value tf.keras 2.x writes: the name for a one-dtype policy (`"float32"`),
  /// `{"class_name": "Policy", "config": {"name": "mixed_float16"}}` for a mixed one (Keras 3's
  /// `.keras` files turn either into a `DTypePolicy`).
  nlohmann::json to_json() const {
    if (variable_dtype() == compute_dtype()) return name();
    return {{"class_name", "Policy"}, {"config", {{"name", name()}}}};
  }

  /// Reads a layer config's `dtype`: a name (`"mixed_float16"`), tf.keras 2.x's
  /// `{"class_name": "Policy", "config": {"name": ...}}` or Keras 3's `{"module": "keras",
  /// "class_name": "DTypePolicy", "config": {"name": ...}}`. Anything else throws `ConfigError`
  /// starting with `owner`.
  static Policy from_json(const nlohmann::json& value, const std::string& owner) {
    if (value.is_string()) return checked(value.get<std::string>(), owner);
    if (value.is_object() && value.contains("class_name") && value["class_name"].is_string()) {
      const std::string class_name = value["class_name"].get<std::string>();
      if (class_name != "Policy" && class_name != "DTypePolicy") {
        throw ConfigError(owner +
                          ": expected a policy name, Policy or DTypePolicy but found the "
                          "class '" +
                          class_name + "'");
      }
      if (value.contains("config") && value["config"].is_object() &&
          value["config"].contains("name") && value["config"]["name"].is_string())
        return checked(value["config"]["name"].get<std::string>(), owner);
    }
    throw ConfigError(owner + ": expected a policy name or {\"class_name\": " +
                      "\"DTypePolicy\", \"config\": {\"name\": ...}} but found " + value.dump());
  }

  friend bool operator==(const Policy&, const Policy&) = default;

 private:
  enum class Kind : std::uint8_t { float32, mixed_float16, mixed_bfloat16, float16, bfloat16 };

  static constexpr std::array<std::string_view, 5> names() noexcept {
    return {"float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16"};
  }

  static Kind parse(std::string_view name) {
    const auto all = names();
    for (std::size_t i = 0; i < all.size(); ++i)
      if (all[i] == name) return static_cast<Kind>(i);
    throw ConfigError(
        "dtype policy: expected 'float32', 'mixed_float16', 'mixed_bfloat16', "
        "'float16' or 'bfloat16' but found '" +
        std::string(name) + "'");
  }

  static Policy checked(const std::string& name, const std::string& owner) {
    try {
      return Policy(name);
    } catch (const ConfigError& error) {
      throw ConfigError(owner + ": " + error.what());
    }
  }

  Kind kind_;
};

namespace detail {
/// The global policy's storage (one byte, so that it can be atomic).
inline std::atomic<Policy>& global_policy_storage() noexcept {
  static std::atomic<Policy> policy{Policy("float32")};
  return policy;
}
/// The policy a `PolicyScope` sets for its thread, if any.
inline std::optional<Policy>& scoped_policy() noexcept {
  thread_local std::optional<Policy> policy;
  return policy;
}
}  // namespace detail

/// The policy layers made from now on take when given none (Keras's `dtype_policy()`): the
/// innermost `PolicyScope` of this thread, else the process's, `"float32"` until set.
inline Policy global_policy() noexcept {
  if (const auto& scoped = detail::scoped_policy()) return *scoped;
  return detail::global_policy_storage().load();
}

/// Sets the global policy for this thread while it lives (a trial's policy, in a process that
/// runs trials in parallel threads), and puts the previous one back.
class PolicyScope {
 public:
  explicit PolicyScope(const Policy& policy) : previous_(detail::scoped_policy()) {
    detail::scoped_policy() = policy;
  }
  PolicyScope(const PolicyScope&) = delete;
  PolicyScope& operator=(const PolicyScope&) = delete;
  ~PolicyScope() { detail::scoped_policy() = previous_; }

 private:
  std::optional<Policy> previous_;
};

/// Sets the global policy (Keras's `keras.mixed_precision.set_global_policy`, Keras 3's
/// `keras.config.set_dtype_policy`): layers made afterwards compute in it, and `compile` wraps
/// the optimizer of a model made under `"mixed_float16"` in a `LossScaleOptimizer`.
inline void set_global_policy(const Policy& policy) noexcept {
  detail::global_policy_storage().store(policy);
}

}  // namespace loadstar::keras::mixed_precision
