/// \file
/// The CUDA backend of the executor (opt-in, not part of `<loadstar/loadstar.hpp>`): include this
/// in a trainer and link Meson's `loadstar-cuda` dependency. It declares the backend only and
/// brings no CUDA header into the trainer (`<loadstar/cuda/error.hpp>` has `check` for a
/// trainer's own CUDA calls).
/// \code
/// #include <loadstar/cuda.hpp>
/// #include <loadstar/keras.hpp>
/// using namespace loadstar::keras;
/// model.compile({.optimizer = "adam", .loss = "mse", .backend = cuda_backend(0)});
/// \endcode
#pragma once

#include "loadstar/cuda/cuda_backend.hpp"
#include "loadstar/error.hpp"
