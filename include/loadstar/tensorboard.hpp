/// \file
/// TensorBoard's event files: `EventWriter` (scalars, histograms, the hparams plugin, session
/// restarts) on Debian's protobuf library. Not part of `<loadstar/loadstar.hpp>`: it needs
/// libprotobuf and libprotoc (Meson's `loadstar-trial` dependency brings both).
/// \code
/// #include <loadstar/tensorboard.hpp>
/// \endcode
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include "loadstar/tensorboard/event_writer.hpp"
