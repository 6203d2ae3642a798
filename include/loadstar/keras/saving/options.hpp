/// \file
/// The options of `save_model`, `load_model` and `load_weights` (keras/saving/saving.hpp), apart
/// so that `Model`'s members `save` and `load_weights` can take them.
#pragma once

#include <chrono>

#include "loadstar/data/hdf5_options.hpp"

namespace loadstar::keras {

/// The options of `save_model` and `Model::save`.
/// \code
/// save_model(model, "model.h5", {.include_optimizer = false});
/// \endcode
struct SaveOptions {
  /// Keras's `include_optimizer`: write `training_config` and the optimizer's state
  /// (`/optimizer_weights`, or `optimizer/vars` in a `.keras` archive) of a compiled model.
  bool include_optimizer = true;
  /// `false`: an existing file at the path is an `IoError` instead of being replaced.
  bool overwrite = true;
};

/// The options of `load_model`.
struct LoadOptions {
  /// Compile the model from the file's `training_config` (or `compile_config`) when it has one,
  /// and restore the optimizer's slots and iteration count.
  bool compile = true;
  /// `untrusted` (the default): libhdf5 and libzip parse the file in a forked child first, so
  /// that a corrupt or hostile file is a `FormatError`, never a crash (see `Trust` for what
  /// `trusted` gives up).
  Trust trust = Trust::untrusted;
  /// How long the sandbox child may parse an untrusted file before this process kills it and
  /// throws `FormatError` (libhdf5 loops forever on some corrupt files); zero waits for ever.
  std::chrono::milliseconds sandbox_deadline = std::chrono::seconds(120);
};

/// The options of `load_weights` and `Model::load_weights`.
struct LoadWeightsOptions {
  /// Match the file's layers to the model's by name instead of by position (legacy `.h5` files);
  /// layers of the model the file lacks keep their weights.
  bool by_name = false;
  /// Skip layers whose weight count or shapes differ from the file's instead of throwing.
  bool skip_mismatch = false;
  /// Also restore the optimizer's state (slots and iteration count) of a whole-model file into
  /// the model's compiled optimizer.
  bool optimizer = false;
  /// As `LoadOptions::trust`.
  Trust trust = Trust::untrusted;
  /// As `LoadOptions::sandbox_deadline`.
  std::chrono::milliseconds sandbox_deadline = std::chrono::seconds(120);
};

}  // namespace loadstar::keras
