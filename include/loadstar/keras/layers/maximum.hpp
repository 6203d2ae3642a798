/// \file
/// `Maximum`: the element-wise maximum of its inputs.
#pragma once

#include "loadstar/keras/layers/detail/merge.hpp"

namespace loadstar::keras::layers {

/// Keras's `Maximum`: the maximum of two or more inputs whose shapes broadcast; the
/// gradient goes to the first input holding it, as TensorFlow's.
/// \code
/// auto top = call(Maximum(), {a, b});
/// \endcode
class Maximum : public detail::Merge<detail::MergeOp::maximum> {
 public:
  using Merge::Merge;

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return make_from_config<Maximum>(config, "Maximum");
  }
};

}  // namespace loadstar::keras::layers
