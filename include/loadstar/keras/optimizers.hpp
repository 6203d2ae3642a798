/// \file
/// The optimizers and schedules, and `get_optimizer`, which resolves Keras's optimizer strings.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/optimizers/adadelta.hpp"
#include "loadstar/keras/optimizers/adafactor.hpp"
#include "loadstar/keras/optimizers/adagrad.hpp"
#include "loadstar/keras/optimizers/adam.hpp"
#include "loadstar/keras/optimizers/adamax.hpp"
#include "loadstar/keras/optimizers/adamw.hpp"
#include "loadstar/keras/optimizers/ftrl.hpp"
#include "loadstar/keras/optimizers/lion.hpp"
#include "loadstar/keras/optimizers/loss_scale_optimizer.hpp"
#include "loadstar/keras/optimizers/nadam.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/keras/optimizers/rmsprop.hpp"
#include "loadstar/keras/optimizers/schedules.hpp"
#include "loadstar/keras/optimizers/sgd.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

/// The optimizer registry: Keras's optimizer names, in any case (`"sgd"`, `"adam"`, `"Adam"`,
/// `"adamw"`, `"rmsprop"`, `"adagrad"`, `"adadelta"`, `"nadam"`, `"adamax"`, `"lion"`, `"ftrl"`,
/// `"adafactor"`), made with Keras's defaults or from their
/// configs (Keras 2.0-2.3's `lr` and `decay` and Keras 2.11+'s `"Custom>Adam"` included).
template <>
struct RegistryTraits<Optimizer> {
  using Object = std::unique_ptr<Optimizer>;
  static constexpr const char* kind = "optimizer";
  static constexpr bool case_insensitive = true;
  LOADSTAR_DECL static void defaults(Registry<Optimizer>& registry);
};

/// The optimizer `tf.keras.optimizers.get` returns for a name, case-insensitive, with Keras's
/// defaults, resolved through `Registry<Optimizer>`: `"sgd"`, `"adam"`, `"adamw"`, `"rmsprop"`,
/// `"adagrad"`, `"adadelta"`, `"nadam"`, `"adamax"`, `"lion"`, `"ftrl"`, `"adafactor"`. Throws
/// `ConfigError` for any other name.
/// \code
/// std::unique_ptr<Optimizer> optimizer = get_optimizer("Adam");
/// \endcode
inline std::unique_ptr<Optimizer> get_optimizer(std::string_view name) {
  return Registry<Optimizer>::instance().create(std::string(name), nlohmann::json::object());
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<loadstar::keras::Optimizer>::defaults(Registry<Optimizer>& registry) {
  using namespace optimizers;
  registry.add("sgd", SGD::from_config);
  registry.add("adam", Adam::from_config);
  registry.add("adamw", AdamW::from_config);
  registry.add("rmsprop", RMSprop::from_config);
  registry.add("adagrad", Adagrad::from_config);
  registry.add("adadelta", Adadelta::from_config);
  registry.add("nadam", Nadam::from_config);
  registry.add("adamax", Adamax::from_config);
  registry.add("lion", Lion::from_config);
  registry.add("ftrl", Ftrl::from_config);
  registry.add("adafactor", Adafactor::from_config);
  registry.add("lossscaleoptimizer", LossScaleOptimizer::from_config);
}

namespace detail {
std::unique_ptr<Optimizer> optimizer_from_json(const nlohmann::json& value) {
  return Registry<Optimizer>::instance().create(value, current_custom_objects());
}
}  // namespace detail

}  // namespace loadstar::keras
#endif
