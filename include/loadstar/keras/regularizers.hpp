/// \file
/// The regularizers (`L1`, `L2`, `L1L2`, `OrthogonalRegularizer`) and their registry, which
/// resolves Keras's names and configs.
#pragma once

#include "loadstar/config.hpp"

#include <initializer_list>
#include <memory>

#include <nlohmann/json.hpp>

#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/regularizers/l1.hpp"
#include "loadstar/keras/regularizers/l1_l2.hpp"
#include "loadstar/keras/regularizers/l2.hpp"
#include "loadstar/keras/regularizers/orthogonal_regularizer.hpp"
#include "loadstar/keras/regularizers/regularizer.hpp"

namespace loadstar::keras {

/// The regularizer registry: Keras's class names (`"L1"`, `"L2"`, `"L1L2"`,
/// `"OrthogonalRegularizer"`) and their snake_case strings (`"l1"`, `"l2"`, `"l1_l2"`,
/// `"orthogonal_regularizer"`), each made with Keras's defaults or from its config.
template <>
struct RegistryTraits<Regularizer> {
  using Object = std::shared_ptr<Regularizer>;
  static constexpr const char* kind = "regularizer";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Regularizer>& registry);
};

/// The regularizer a Keras config value describes (a name such as `"l2"` or a
/// `{"class_name": "L2", "config": {"l2": 0.01}}`), or null for JSON null. Throws `ConfigError`
/// for an unknown name, listing the known ones.
/// \code
/// std::shared_ptr<Regularizer> l2 = get_regularizer("l2");
/// \endcode
inline std::shared_ptr<Regularizer> get_regularizer(const nlohmann::json& name_or_config) {
  if (name_or_config.is_null()) return nullptr;
  return Registry<Regularizer>::instance().create(name_or_config);
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<Regularizer>::defaults(Registry<Regularizer>& registry) {
  using namespace regularizers;
  const auto add = [&](std::initializer_list<const char*> names, auto factory) {
    for (const char* name : names)
      registry.add(name, factory);
  };
  add({"L1", "l1"}, L1::from_config);
  add({"L2", "l2"}, L2::from_config);
  add({"L1L2", "l1_l2"}, L1L2::from_config);
  add({"OrthogonalRegularizer", "orthogonal_regularizer"}, OrthogonalRegularizer::from_config);
}

}  // namespace loadstar::keras
#endif
