/// \file
/// The weight constraints (`MaxNorm`, `MinMaxNorm`, `NonNeg`, `UnitNorm`) and their registry,
/// which resolves Keras's names and configs.
#pragma once

#include "loadstar/config.hpp"

#include <initializer_list>
#include <memory>

#include <nlohmann/json.hpp>

#include "loadstar/keras/constraints/constraint.hpp"
#include "loadstar/keras/constraints/max_norm.hpp"
#include "loadstar/keras/constraints/min_max_norm.hpp"
#include "loadstar/keras/constraints/non_neg.hpp"
#include "loadstar/keras/constraints/unit_norm.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

/// The constraint registry: Keras's class names (`"MaxNorm"`, `"MinMaxNorm"`, `"NonNeg"`,
/// `"UnitNorm"`) and their snake_case strings (`"max_norm"`, `"min_max_norm"`, `"non_neg"`,
/// `"unit_norm"`), each made with Keras's defaults or from its config.
template <>
struct RegistryTraits<Constraint> {
  using Object = std::shared_ptr<Constraint>;
  static constexpr const char* kind = "constraint";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Constraint>& registry);
};

/// The constraint a Keras config value describes (a name such as `"non_neg"` or a
/// `{"class_name": "MaxNorm", "config": {...}}`), or null for JSON null. Throws `ConfigError`
/// for an unknown name, listing the known ones.
inline std::shared_ptr<Constraint> get_constraint(const nlohmann::json& name_or_config) {
  if (name_or_config.is_null()) return nullptr;
  return Registry<Constraint>::instance().create(name_or_config);
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<Constraint>::defaults(Registry<Constraint>& registry) {
  using namespace constraints;
  const auto add = [&](std::initializer_list<const char*> names, auto factory) {
    for (const char* name : names)
      registry.add(name, factory);
  };
  add({"MaxNorm", "max_norm"}, MaxNorm::from_config);
  add({"MinMaxNorm", "min_max_norm"}, MinMaxNorm::from_config);
  add({"NonNeg", "non_neg"}, NonNeg::from_config);
  add({"UnitNorm", "unit_norm"}, UnitNorm::from_config);
}

}  // namespace loadstar::keras
#endif
