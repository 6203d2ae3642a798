/// \file
/// The registry of trial classes: the names an experiment's `entrypoint` may give.
#pragma once

#include "loadstar/config.hpp"

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/trial/keras_trial.hpp"
#include "loadstar/trial/trial_context.hpp"

namespace loadstar::trial {

namespace detail {

// Headers of the trial layer name loadstar::detail::StateReader as detail::StateReader from
// inside loadstar::trial; this keeps that name finding it once this namespace exists.
using loadstar::detail::StateReader;

using TrialFactory = std::function<std::unique_ptr<KerasTrial>(TrialContext&)>;

struct TrialRegistry {
  std::mutex mutex;
  std::map<std::string, TrialFactory> factories;
};

LOADSTAR_DECL TrialRegistry& trial_registry();

}  // namespace detail

/// Registers the trial class `T` under `name` (the config's `entrypoint`, e.g.
/// `model_def:FashionMNISTTrial`); a second registration of a name replaces the first. Returns
/// true, so that it can initialize a static (`LOADSTAR_REGISTER_TRIAL`).
template <class T>
requires std::derived_from<T, KerasTrial> && std::constructible_from<T, TrialContext&>
bool register_trial(const std::string& name) {
  auto& registry = detail::trial_registry();
  const std::lock_guard lock(registry.mutex);
  registry.factories[name] = [](TrialContext& context) -> std::unique_ptr<KerasTrial> {
    return std::make_unique<T>(context);
  };
  return true;
}

/// Whether a trial class is registered under `name`.
LOADSTAR_DECL bool has_trial(const std::string& name);

/// The registered names, sorted.
LOADSTAR_DECL std::vector<std::string> registered_trials();

/// A new trial of the class registered under `name`; throws `ConfigError` naming it and the
/// registered names when there is none.
LOADSTAR_DECL std::unique_ptr<KerasTrial> make_trial(const std::string& name,
                                                     TrialContext& context);

}  // namespace loadstar::trial

#define LOADSTAR_TRIAL_CONCAT_INNER(a, b) a##b
#define LOADSTAR_TRIAL_CONCAT(a, b) LOADSTAR_TRIAL_CONCAT_INNER(a, b)

/// Registers the trial class `Type` under `name` at static initialization:
/// `LOADSTAR_REGISTER_TRIAL(FashionMNISTTrial, "model_def:FashionMNISTTrial");`
#define LOADSTAR_REGISTER_TRIAL(Type, name)                                                        \
  [[maybe_unused]] static const bool LOADSTAR_TRIAL_CONCAT(loadstar_trial_registered_, __LINE__) = \
      ::loadstar::trial::register_trial<Type>(name)

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

TrialRegistry& trial_registry() {
  static TrialRegistry registry;
  return registry;
}

}  // namespace loadstar::trial::detail
namespace loadstar::trial {

bool has_trial(const std::string& name) {
  auto& registry = detail::trial_registry();
  const std::lock_guard lock(registry.mutex);
  return registry.factories.contains(name);
}

std::vector<std::string> registered_trials() {
  auto& registry = detail::trial_registry();
  const std::lock_guard lock(registry.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry.factories)
    names.push_back(name);
  return names;
}

std::unique_ptr<KerasTrial> make_trial(const std::string& name, TrialContext& context) {
  detail::TrialFactory factory;
  {
    auto& registry = detail::trial_registry();
    const std::lock_guard lock(registry.mutex);
    const auto found = registry.factories.find(name);
    if (found != registry.factories.end()) factory = found->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& registered : registered_trials())
      known += (known.empty() ? "'" : ", '") + registered + "'";
    throw ConfigError(
        "entrypoint '" + name + "': no trial class is registered under this name (" +
        (known.empty() ? std::string("none is registered") : "the registered ones are " + known) +
        ")");
  }
  return factory(context);
}

}  // namespace loadstar::trial
#endif
