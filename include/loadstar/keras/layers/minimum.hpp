/// \file
/// `Minimum`: the element-wise minimum of its inputs.
#pragma once

#include "loadstar/keras/layers/detail/merge.hpp"

namespace loadstar::keras::layers {

/// Keras's `Minimum`: the minimum of two or more inputs whose shapes broadcast; the
/// gradient goes to the first input holding it, as TensorFlow's.
/// \code
/// auto bottom = call(Minimum(), {a, b});
/// \endcode
class Minimum : public detail::Merge<detail::MergeOp::minimum> {
 public:
  using Merge::Merge;

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return make_from_config<Minimum>(config, "Minimum");
  }
};

}  // namespace loadstar::keras::layers
