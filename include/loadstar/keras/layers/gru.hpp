/// \file
/// `GRU`: Keras's gated recurrent unit (Cho et al. 2014), gates `z, r, h`, `reset_after` as
/// Keras 2/3 (default) or Keras 1.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/recurrent.hpp"

namespace loadstar::keras::layers {

/// Keras's `GRU` over inputs `(batch, timesteps, features)`, the timesteps known or
/// unknown (`none`, settled per batch):
/// the last output `(batch, units)`, or every output `(batch, timesteps, units)` with
/// `return_sequences`. Weights as Keras lays them out: `kernel`, `recurrent_kernel`, `bias`.
/// \code
/// GRU encoder(64, {.return_sequences = true});
/// \endcode
class GRU : public detail::RecurrentLayer {
 public:
  explicit GRU(std::size_t units, RecurrentOptions options = {})
      : RecurrentLayer(detail::CellKind::gru, units, std::move(options)) {}

  /// The layer described by a Keras config (the registry's factory).
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return detail::recurrent_from_config<GRU>(config, detail::CellKind::gru);
  }
};

}  // namespace loadstar::keras::layers
