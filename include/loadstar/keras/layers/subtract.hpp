/// \file
/// `Subtract`: the element-wise difference of its two inputs.
#pragma once

#include "loadstar/keras/layers/detail/merge.hpp"

namespace loadstar::keras::layers {

/// Keras's `Subtract`: `inputs[0] - inputs[1]`, two inputs whose shapes broadcast.
/// \code
/// auto residual = call(Subtract(), {x, y});
/// \endcode
class Subtract : public detail::Merge<detail::MergeOp::subtract> {
 public:
  using Merge::Merge;

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return make_from_config<Subtract>(config, "Subtract");
  }
};

}  // namespace loadstar::keras::layers
