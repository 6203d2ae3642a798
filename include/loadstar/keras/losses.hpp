/// \file
/// The losses, and `get_loss`, which resolves Keras's loss strings.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "loadstar/error.hpp"
#include "loadstar/keras/losses/binary_crossentropy.hpp"
#include "loadstar/keras/losses/categorical_crossentropy.hpp"
#include "loadstar/keras/losses/hinge.hpp"
#include "loadstar/keras/losses/huber.hpp"
#include "loadstar/keras/losses/kl_divergence.hpp"
#include "loadstar/keras/losses/loss.hpp"
#include "loadstar/keras/losses/mean_absolute_error.hpp"
#include "loadstar/keras/losses/mean_squared_error.hpp"
#include "loadstar/keras/losses/sparse_categorical_crossentropy.hpp"

namespace loadstar::keras {

/// The loss Keras's `tf.keras.losses.get` returns for a string, with Keras's defaults: a
/// function name (`"mse"`, `"mean_squared_error"`, `"mae"`, `"binary_crossentropy"`,
/// `"categorical_crossentropy"`, `"sparse_categorical_crossentropy"`, `"huber"`, `"kld"`,
/// `"kl_divergence"`, `"hinge"`, ...) or a class name (`"MeanSquaredError"`). Throws
/// `ConfigError` for any other name.
/// \code
/// std::unique_ptr<Loss> loss = get_loss("sparse_categorical_crossentropy");
/// \endcode
inline std::unique_ptr<Loss> get_loss(std::string_view name) {
  using namespace losses;
  if (name == "mse" || name == "MSE" || name == "mean_squared_error" ||
      name == "MeanSquaredError") {
    return std::make_unique<MeanSquaredError>();
  }
  if (name == "mae" || name == "MAE" || name == "mean_absolute_error" ||
      name == "MeanAbsoluteError") {
    return std::make_unique<MeanAbsoluteError>();
  }
  if (name == "binary_crossentropy" || name == "BinaryCrossentropy") {
    return std::make_unique<BinaryCrossentropy>();
  }
  if (name == "categorical_crossentropy" || name == "CategoricalCrossentropy") {
    return std::make_unique<CategoricalCrossentropy>();
  }
  if (name == "sparse_categorical_crossentropy" || name == "SparseCategoricalCrossentropy") {
    return std::make_unique<SparseCategoricalCrossentropy>();
  }
  if (name == "huber" || name == "huber_loss" || name == "Huber") {
    return std::make_unique<Huber>();
  }
  if (name == "kld" || name == "KLD" || name == "kl_divergence" ||
      name == "kullback_leibler_divergence" || name == "KLDivergence") {
    return std::make_unique<KLDivergence>();
  }
  if (name == "hinge" || name == "Hinge") return std::make_unique<Hinge>();
  throw ConfigError("unknown loss '" + std::string(name) +
                    "'; known: mse, mean_squared_error, mae, mean_absolute_error, "
                    "binary_crossentropy, categorical_crossentropy, "
                    "sparse_categorical_crossentropy, huber, kld, kl_divergence, hinge "
                    "(or their Keras class names)");
}

}  // namespace loadstar::keras
