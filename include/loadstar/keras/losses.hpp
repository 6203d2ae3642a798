/// \file
/// The losses, and `get_loss`, which resolves Keras's loss strings.
#pragma once

#include "loadstar/config.hpp"

#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/losses/binary_crossentropy.hpp"
#include "loadstar/keras/losses/binary_focal_crossentropy.hpp"
#include "loadstar/keras/losses/categorical_crossentropy.hpp"
#include "loadstar/keras/losses/categorical_focal_crossentropy.hpp"
#include "loadstar/keras/losses/categorical_hinge.hpp"
#include "loadstar/keras/losses/cosine_similarity.hpp"
#include "loadstar/keras/losses/hinge.hpp"
#include "loadstar/keras/losses/huber.hpp"
#include "loadstar/keras/losses/kl_divergence.hpp"
#include "loadstar/keras/losses/log_cosh.hpp"
#include "loadstar/keras/losses/loss.hpp"
#include "loadstar/keras/losses/mean_absolute_error.hpp"
#include "loadstar/keras/losses/mean_absolute_percentage_error.hpp"
#include "loadstar/keras/losses/mean_squared_error.hpp"
#include "loadstar/keras/losses/mean_squared_logarithmic_error.hpp"
#include "loadstar/keras/losses/poisson.hpp"
#include "loadstar/keras/losses/sparse_categorical_crossentropy.hpp"
#include "loadstar/keras/losses/squared_hinge.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

/// The loss registry: Keras's loss function names (`"mse"`, `"mean_squared_error"`, `"mae"`,
/// `"binary_crossentropy"`, `"categorical_crossentropy"`, `"sparse_categorical_crossentropy"`,
/// `"huber"`, `"kld"`, `"kl_divergence"`, `"hinge"`, ...) and class names (`"MeanSquaredError"`),
/// each made with Keras's defaults or from its config.
template <>
struct RegistryTraits<Loss> {
  using Object = std::unique_ptr<Loss>;
  static constexpr const char* kind = "loss";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Loss>& registry);
};

/// The loss Keras's `tf.keras.losses.get` returns for a string, with Keras's defaults, resolved
/// through `Registry<Loss>`: a function name (`"mse"`, `"mean_squared_error"`, `"mae"`,
/// `"binary_crossentropy"`, `"categorical_crossentropy"`, `"sparse_categorical_crossentropy"`,
/// `"huber"`, `"kld"`, `"kl_divergence"`, `"hinge"`, ...) or a class name (`"MeanSquaredError"`).
/// Throws `ConfigError` for any other name.
/// \code
/// std::unique_ptr<Loss> loss = get_loss("sparse_categorical_crossentropy");
/// \endcode
inline std::unique_ptr<Loss> get_loss(std::string_view name) {
  return Registry<Loss>::instance().create(std::string(name), nlohmann::json::object());
}

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<loadstar::keras::Loss>::defaults(Registry<Loss>& registry) {
  using namespace losses;
  const auto add = [&](std::initializer_list<const char*> names, auto factory) {
    for (const char* name : names)
      registry.add(name, factory);
  };
  add({"mse", "MSE", "mean_squared_error", "MeanSquaredError"}, MeanSquaredError::from_config);
  add({"mae", "MAE", "mean_absolute_error", "MeanAbsoluteError"}, MeanAbsoluteError::from_config);
  add({"binary_crossentropy", "BinaryCrossentropy"}, BinaryCrossentropy::from_config);
  add({"categorical_crossentropy", "CategoricalCrossentropy"},
      CategoricalCrossentropy::from_config);
  add({"sparse_categorical_crossentropy", "SparseCategoricalCrossentropy"},
      SparseCategoricalCrossentropy::from_config);
  add({"huber", "huber_loss", "Huber"}, Huber::from_config);
  add({"kld", "KLD", "kl_divergence", "kullback_leibler_divergence", "KLDivergence"},
      KLDivergence::from_config);
  add({"hinge", "Hinge"}, Hinge::from_config);
  add({"squared_hinge", "SquaredHinge"}, SquaredHinge::from_config);
  add({"categorical_hinge", "CategoricalHinge"}, CategoricalHinge::from_config);
  add({"mape", "MAPE", "mean_absolute_percentage_error", "MeanAbsolutePercentageError"},
      MeanAbsolutePercentageError::from_config);
  add({"msle", "MSLE", "mean_squared_logarithmic_error", "MeanSquaredLogarithmicError"},
      MeanSquaredLogarithmicError::from_config);
  add({"log_cosh", "logcosh", "LogCosh"}, LogCosh::from_config);
  add({"poisson", "Poisson"}, Poisson::from_config);
  add({"cosine_similarity", "CosineSimilarity"}, CosineSimilarity::from_config);
  add({"binary_focal_crossentropy", "BinaryFocalCrossentropy"},
      BinaryFocalCrossentropy::from_config);
  add({"categorical_focal_crossentropy", "CategoricalFocalCrossentropy"},
      CategoricalFocalCrossentropy::from_config);
}

}  // namespace loadstar::keras
#endif
