/// \file
/// `Average`: the element-wise mean of its inputs.
#pragma once

#include "loadstar/keras/layers/detail/merge.hpp"

namespace loadstar::keras::layers {

/// Keras's `Average`: the mean of two or more inputs whose shapes broadcast.
/// \code
/// auto ensemble = call(Average(), {a, b, c});
/// \endcode
class Average : public detail::Merge<detail::MergeOp::average> {
 public:
  using Merge::Merge;

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    return make_from_config<Average>(config, "Average");
  }
};

}  // namespace loadstar::keras::layers
