/// \file
/// `Multiply`: the element-wise product of its inputs.
#pragma once

#include "loadstar/keras/layers/detail/merge.hpp"

namespace loadstar::keras::layers {

/// Keras's `Multiply`: the product of two or more inputs whose shapes broadcast.
/// \code
/// auto gated = call(Multiply(), {values, gates});
/// \endcode
class Multiply : public detail::Merge<detail::MergeOp::multiply> {
 public:
  using Merge::Merge;

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return make_from_config<Multiply>(config, "Multiply");
  }
};

}  // namespace loadstar::keras::layers
