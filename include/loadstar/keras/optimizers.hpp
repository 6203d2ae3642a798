/// \file
/// The optimizers and schedules, and `get_optimizer`, which resolves Keras's optimizer strings.
#pragma once

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <string_view>

#include "loadstar/error.hpp"
#include "loadstar/keras/optimizers/adadelta.hpp"
#include "loadstar/keras/optimizers/adagrad.hpp"
#include "loadstar/keras/optimizers/adam.hpp"
#include "loadstar/keras/optimizers/adamw.hpp"
#include "loadstar/keras/optimizers/optimizer.hpp"
#include "loadstar/keras/optimizers/rmsprop.hpp"
#include "loadstar/keras/optimizers/schedules.hpp"
#include "loadstar/keras/optimizers/sgd.hpp"

namespace loadstar::keras {

/// The optimizer `tf.keras.optimizers.get` returns for a name, case-insensitive, with Keras's
/// defaults: `"sgd"`, `"adam"`, `"adamw"`, `"rmsprop"`, `"adagrad"`, `"adadelta"`. Throws
/// `ConfigError` for any other name.
/// \code
/// std::unique_ptr<Optimizer> optimizer = get_optimizer("Adam");
/// \endcode
inline std::unique_ptr<Optimizer> get_optimizer(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "sgd") return std::make_unique<optimizers::SGD>();
  if (lower == "adam") return std::make_unique<optimizers::Adam>();
  if (lower == "adamw") return std::make_unique<optimizers::AdamW>();
  if (lower == "rmsprop") return std::make_unique<optimizers::RMSprop>();
  if (lower == "adagrad") return std::make_unique<optimizers::Adagrad>();
  if (lower == "adadelta") return std::make_unique<optimizers::Adadelta>();
  throw ConfigError("unknown optimizer '" + std::string(name) +
                    "'; known: sgd, adam, adamw, rmsprop, adagrad, adadelta");
}

}  // namespace loadstar::keras
