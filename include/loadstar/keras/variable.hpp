/// \file
/// `Variable`: one weight of a layer or optimizer, with its Keras name and its gradient.
#pragma once

#include <string>

#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// A weight: its value, the gradient of the loss with respect to it, and its Keras name.
///
/// `name` is the weight's own name (`"kernel"`, `"bias"`, `"moving_mean"`); a layer's weights are
/// listed in Keras's order (`kernel` before `bias`; `gamma, beta, moving_mean, moving_variance`
/// for `BatchNormalization`), so that `get_weights()` and the Keras HDF5 layout
/// (`model_weights/<layer>/<layer>/<name>:0`) follow from the order alone.
/// Non-trainable weights (`BatchNormalization`'s moving statistics) have no gradient.
struct Variable {
  std::string name;
  Tensor<float> value;
  Tensor<float> gradient;
  bool trainable = true;
};

}  // namespace loadstar::keras
