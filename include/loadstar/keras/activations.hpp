/// \file
/// `Activation`: Keras's activation functions by name (`"relu"`, `"softmax"`, ...). The enumeration
/// itself is in keras/backend/kinds.hpp, which every backend's kernels share.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/backend/kinds.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

namespace detail {
inline constexpr std::array<std::pair<std::string_view, Activation>, 24> activation_names{{
    {"linear", Activation::linear},
    {"relu", Activation::relu},
    {"sigmoid", Activation::sigmoid},
    {"tanh", Activation::tanh},
    {"softmax", Activation::softmax},
    {"elu", Activation::elu},
    {"selu", Activation::selu},
    {"softplus", Activation::softplus},
    {"softsign", Activation::softsign},
    {"gelu", Activation::gelu},
    {"swish", Activation::swish},
    {"hard_sigmoid", Activation::hard_sigmoid},
    {"exponential", Activation::exponential},
    {"relu6", Activation::relu6},
    {"leaky_relu", Activation::leaky_relu},
    {"mish", Activation::mish},
    {"hard_silu", Activation::hard_silu},
    {"log_sigmoid", Activation::log_sigmoid},
    {"hard_tanh", Activation::hard_tanh},
    {"tanh_shrink", Activation::tanh_shrink},
    {"soft_shrink", Activation::soft_shrink},
    {"hard_shrink", Activation::hard_shrink},
    {"squareplus", Activation::squareplus},
    {"sparse_plus", Activation::sparse_plus},
}};

/// Keras's other names of the activations above: Keras 3 saves `swish` as `silu`; `hard_swish`
/// is `hard_silu`; `celu` at its default `alpha=1` is `elu`.
inline constexpr std::array<std::pair<std::string_view, Activation>, 3> activation_aliases{{
    {"silu", Activation::swish},
    {"hard_swish", Activation::hard_silu},
    {"celu", Activation::elu},
}};
}  // namespace detail

/// The activation registry makes `Activation`s: every element-wise activation of
/// `tf.keras.activations` and Keras 3's `keras.activations` (with their default parameters) is
/// registered under its names, and users may add aliases that map to one of them.
template <>
struct RegistryTraits<Activation> {
  using Object = Activation;
  static constexpr const char* kind = "activation";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Activation>& registry);
};

/// The activation named `name` as Keras spells it, resolved through `Registry<Activation>`;
/// `""` and `"None"` mean `linear` as in Keras. Throws `ConfigError` listing the known names for
/// an unknown one.
LOADSTAR_DECL Activation activation_from_name(std::string_view name);

/// Keras's name of the activation (`"relu"`).
LOADSTAR_DECL std::string activation_name(Activation kind);

/// Whether the activation's derivative needs its input: all others are computed from the output
/// alone, so that a layer need not keep its pre-activation between `forward` and `backward`.
constexpr bool activation_gradient_needs_input(Activation kind) noexcept {
  return kind == Activation::gelu || kind == Activation::swish || kind == Activation::mish ||
         kind == Activation::hard_silu || kind == Activation::tanh_shrink ||
         kind == Activation::squareplus;
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<loadstar::keras::Activation>::defaults(Registry<Activation>& registry) {
  for (const auto& [name, value] : detail::activation_names)
    registry.add(std::string(name), [value = value](const nlohmann::json&) { return value; });
  for (const auto& [name, value] : detail::activation_aliases)
    registry.add(std::string(name), [value = value](const nlohmann::json&) { return value; });
}

Activation activation_from_name(std::string_view name) {
  if (name.empty() || name == "None") return Activation::linear;
  return Registry<Activation>::instance().create(std::string(name), nlohmann::json::object());
}

std::string activation_name(Activation kind) {
  for (const auto& [known, k] : detail::activation_names)
    if (k == kind) return std::string(known);
  return "linear";
}

}  // namespace loadstar::keras
#endif
