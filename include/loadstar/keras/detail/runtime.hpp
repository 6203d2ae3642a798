/// \file
/// The executor's plan of a model: its nodes in topological order with their buffers.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "loadstar/keras/layer.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// Where a layer writes the gradient with respect to one of its inputs.
enum class GradientTarget {
  /// The input is a model input: no gradient is needed.
  none,
  /// The first contribution to the producer's gradient: written into it directly.
  direct,
  /// A later contribution: written into scratch, then added to the producer's gradient.
  accumulate,
};

/// One node of the plan: a model input or one layer call.
struct RuntimeNode {
  std::shared_ptr<Layer> layer;  // null for an input
  std::vector<std::size_t> inputs;
  std::vector<GradientTarget> targets;
  /// One sample's shape as declared (`keras::none` where a length is unknown), and the shape
  /// of the current batch's samples (the same when every length is known).
  Shape declared, shape;
  // Buffers for the largest batch, and views of the current batch's rows.
  Tensor<float> value_full, gradient_full;
  Tensor<float> value, gradient;
  std::vector<Tensor<float>> scratch_full;  // per input slot, for accumulated gradients
  std::vector<Tensor<float>> input_values, input_gradients;
};

}  // namespace loadstar::keras::detail
