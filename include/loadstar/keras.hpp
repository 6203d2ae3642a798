/// \file
/// The Keras-compatible executor: layers, losses, metrics, optimizers, callbacks, `Input`, the
/// functional `Model` and `Sequential`.
/// \code
/// #include <loadstar/keras.hpp>
/// using namespace loadstar::keras;
/// Sequential model{Input({28, 28}), Flatten(), Dense(128, {.activation = "relu"}), Dense(10)};
/// \endcode
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include "loadstar/keras/callbacks.hpp"
#include "loadstar/keras/constraints.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layers.hpp"
#include "loadstar/keras/losses.hpp"
#include "loadstar/keras/metrics.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/model_layer.hpp"
#include "loadstar/keras/optimizers.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/keras/regularizers.hpp"
#include "loadstar/keras/saving/model_config.hpp"
#include "loadstar/keras/saving/saving.hpp"
#include "loadstar/keras/sequential.hpp"
