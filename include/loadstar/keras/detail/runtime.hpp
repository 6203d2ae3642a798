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
  /// A node that is no later output of a call (`primary`).
  static constexpr std::size_t no_primary = static_cast<std::size_t>(-1);

  std::shared_ptr<Layer> layer;  // null for an input
  std::vector<std::size_t> inputs;
  /// For a later output of a layer with several (`Layer::output_count`): the node of the call's
  /// first output, whose `forward` writes this node's value and whose `backward` reads its
  /// gradient (this node has no inputs and runs nothing itself); `no_primary` otherwise.
  std::size_t primary = no_primary;
  /// Which output of its call this node is (Keras's tensor index): 0 for the first.
  std::size_t output_index = 0;
  /// On the node of a call's first output: the nodes of its later outputs, in order.
  std::vector<std::size_t> extras;
  /// Whether a loss or a consumer writes this node's gradient in a training step (a layer's
  /// output always is, unless it is one of several outputs that nothing reads).
  bool gradient_written = true;
  std::vector<GradientTarget> targets;
  /// One sample's shape as declared (`keras::none` where a length is unknown), and the shape
  /// of the current batch's samples (the same when every length is known).
  Shape declared, shape;
  // Buffers for the largest batch, and views of the current batch's rows.
  Tensor<float> value_full, gradient_full;
  Tensor<float> value, gradient;
  std::vector<Tensor<float>> scratch_full;  // per input slot, for accumulated gradients
  std::vector<Tensor<float>> input_values, input_gradients;
  /// On the node of a call's first output: the values and gradients of `extras` (a gradient
  /// empty where it is not written), given to the layer as `CallContext::extra_outputs` and
  /// `extra_output_gradients`.
  std::vector<Tensor<float>> extra_values, extra_gradients;

  /// Whether this node runs its layer: a layer call's first output.
  bool runs() const noexcept { return layer != nullptr && primary == no_primary; }
};

}  // namespace loadstar::keras::detail
