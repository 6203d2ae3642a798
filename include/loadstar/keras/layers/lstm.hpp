/// \file
/// `LSTM`: Keras's long short-term memory (Hochreiter and Schmidhuber 1997), gates `i, f, c, o`.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/recurrent.hpp"

namespace loadstar::keras::layers {

/// Keras's `LSTM` over inputs `(batch, timesteps, features)`, the timesteps known or
/// unknown (`none`, settled per batch):
/// the last output `(batch, units)`, or every output `(batch, timesteps, units)` with
/// `return_sequences`. Weights as Keras lays them out: `kernel`, `recurrent_kernel`, `bias`.
/// \code
/// LSTM encoder(64, {.return_sequences = true});
/// \endcode
class LSTM : public detail::RecurrentLayer {
 public:
  explicit LSTM(std::size_t units, RecurrentOptions options = {})
      : RecurrentLayer(detail::CellKind::lstm, units, std::move(options)) {}

  /// The layer described by a Keras config (the registry's factory).
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return detail::recurrent_from_config<LSTM>(config, detail::CellKind::lstm);
  }
};

}  // namespace loadstar::keras::layers
