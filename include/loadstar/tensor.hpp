/// \file
/// Umbrella header of the tensor area: `Tensor<T>`, `Shape`, `DType` and the Eigen views.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include "loadstar/tensor/dtype.hpp"
#include "loadstar/tensor/eigen.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"
