/// \file
/// `Softmax`: the softmax over an axis, as a layer.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Softmax`'s Keras arguments, with Keras's default `axis = -1`.
struct SoftmaxOptions {
  int axis = -1;
  std::string name = {};
};

/// Keras's `Softmax` layer over `axis` (counted with the batch axis; negative from the end).
/// \code
/// Softmax softmax;
/// \endcode
class Softmax : public detail::LayerBase {
 public:
  /// Keras adds a large negative number at masked positions before the softmax, which loadstar
  /// does not: a masked input is refused.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::refused; }
  explicit Softmax(SoftmaxOptions options = {}) : LayerBase(options.name), axis_(options.axis) {}

  std::string class_name() const override { return "Softmax"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
  }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  int axis_;
  std::size_t axis_with_batch_ = 1;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Softmax::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const auto rank = static_cast<int>(input_shapes[0].rank()) + 1;
  const int axis = axis_ < 0 ? axis_ + rank : axis_;
  if (axis < 1 || axis >= rank) {
    throw ConfigError(label() + ": axis " + std::to_string(axis_) +
                      " is not a non-batch axis of inputs of shape " + batch_str(input_shapes[0]));
  }
  axis_with_batch_ = static_cast<std::size_t>(axis);
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

void Softmax::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.softmax_forward(inputs[0], output, axis_with_batch_);
}

void Softmax::backward(std::span<const Tensor<float>>, const Tensor<float>& output,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.softmax_backward(output, output_gradient, input_gradients[0], axis_with_batch_);
}

nlohmann::json Softmax::get_config() const {
  auto config = base_config();
  config["axis"] = axis_;
  return config;
}

std::shared_ptr<Layer> Softmax::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Softmax");
  return detail::finish_layer(
      read, std::make_shared<Softmax>(SoftmaxOptions{.axis = detail::config_axis(read, -1),
                                                     .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
