/// \file
/// `trial::InvalidHP`: Determined's `det.InvalidHP`, the exception a trial throws when its
/// hyperparameters cannot be trained.
#pragma once

#include <string>

#include "loadstar/error.hpp"

namespace loadstar::trial {

/// Thrown by a trial (from its constructor, `build_model`, a data loader's build or a callback)
/// when its hyperparameters cannot work: a layer too wide for the memory, a kernel larger than
/// its input. The trial ends in state `INVALID` without using any of its `max_restarts`, and the
/// experiment's searcher is told (Determined's `ExitedReason.INVALID_HP`): `random` and
/// `adaptive_asha` create a replacement trial (a grid goes on with its other points), as
/// Determined's searchers do.
/// \code
/// if (hidden * width > 1 << 24) throw trial::InvalidHP("hidden * width exceeds the budget");
/// \endcode
class InvalidHP : public Error {
 public:
  explicit InvalidHP(const std::string& message = "the hyperparameters cannot be trained")
      : Error(message) {}
};

}  // namespace loadstar::trial
