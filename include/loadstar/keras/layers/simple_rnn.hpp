/// \file
/// `SimpleRNN`: Keras's a fully connected recurrent layer, `h_t = activation(x_t W + h_{t-1} U +
/// b)`.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/recurrent.hpp"

namespace loadstar::keras::layers {

/// Keras's `SimpleRNN` over inputs `(batch, timesteps, features)`, the timesteps known or
/// unknown (`none`, settled per batch):
/// the last output `(batch, units)`, or every output `(batch, timesteps, units)` with
/// `return_sequences`. Weights as Keras lays them out: `kernel`, `recurrent_kernel`, `bias`.
/// \code
/// SimpleRNN encoder(64, {.return_sequences = true});
/// \endcode
class SimpleRNN : public detail::RecurrentLayer {
 public:
  explicit SimpleRNN(std::size_t units, RecurrentOptions options = {})
      : RecurrentLayer(detail::CellKind::simple_rnn, units, std::move(options)) {}

  /// The layer described by a Keras config (the registry's factory).
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return detail::recurrent_from_config<SimpleRNN>(config, detail::CellKind::simple_rnn);
  }
};

}  // namespace loadstar::keras::layers
