/// \file
/// `FusionRole`: what a built-in layer can take part in when a training step carries a ReLU's
/// gradient across two layers (`Layer::fusion_role`; the plan is in relu_fusion.hpp).
#pragma once

#include <cstdint>

namespace loadstar::keras::detail {

/// The parts a layer can play in a training step that carries the gradient of one layer's ReLU
/// through the backward of the next layer, as one fused device operation (relu_fusion.hpp pairs
/// the layers; a backend that has no such operation declines it and the layers run their own
/// calls). A set of flags: a `Dense` layer with a ReLU and a bias is both `masked_relu` and
/// `through_masked_relu`.
///
/// Two patterns are known, each with a producer and a consumer. A further fused pattern belongs
/// in the CUDA backend's step recorder, which sees a whole step's calls, not in more roles here
/// or more virtual functions on `Layer`.
enum class FusionRole : std::uint8_t {
  none = 0,
  /// Its ReLU (after a bias) may be recorded by its forward, and its gradient left to the backward
  /// of the next layer, which reads that record (`Dense` with a ReLU and a bias).
  masked_relu = 1U << 0U,
  /// Its backward may carry its input gradient through the recorded ReLU of the layer before it
  /// (`Dense`).
  through_masked_relu = 1U << 1U,
  /// Its ReLU gradient may be left to the backward of the next layer, which reads the ReLU from
  /// this layer's output (a convolution with a ReLU).
  relu_output = 1U << 2U,
  /// Its backward may carry its input gradient through a ReLU read from its input (max pooling).
  through_relu_output = 1U << 3U,
};

constexpr FusionRole operator|(FusionRole a, FusionRole b) noexcept {
  return static_cast<FusionRole>(static_cast<std::uint8_t>(a) | static_cast<std::uint8_t>(b));
}

/// Whether `roles` includes `role`.
constexpr bool has_role(FusionRole roles, FusionRole role) noexcept {
  return (static_cast<std::uint8_t>(roles) & static_cast<std::uint8_t>(role)) != 0;
}

}  // namespace loadstar::keras::detail
