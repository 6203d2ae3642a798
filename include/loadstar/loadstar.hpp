/// \file
/// Everything loadstar offers on the CPU: tensors, the data loaders and the Keras executor. CUDA
/// and MPI headers are opt-in includes.
#pragma once

#include "loadstar/config.hpp"
#include "loadstar/data.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras.hpp"
#include "loadstar/tensor.hpp"
