/// \file
/// What `fit`, `evaluate` and `predict` tell their callbacks (Keras's `callback.params`).
#pragma once

#include <cstddef>
#include <optional>
#include <ostream>

namespace loadstar::keras {

/// Keras's `callback.params`: the verbosity, the number of epochs and the steps of an epoch (or
/// of an evaluation or prediction pass; empty when unknown before the pass ends), and the stream
/// callbacks write to (`FitOptions::output`; `std::cout` when null).
struct CallbackParams {
  int verbose = 1;
  std::size_t epochs = 1;
  std::optional<std::size_t> steps;
  std::ostream* output = nullptr;
};

}  // namespace loadstar::keras
