/// \file
/// `Flatten`: collapses every axis but the batch axis into one.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Flatten`'s Keras arguments.
struct FlattenOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"`: the latter moves the channel axis
  /// (axis 1 of the batch) last before flattening, as Keras does, so that a Dense layer after it
  /// reads the weights a channels_last model would.
  std::string data_format = "channels_last";
  std::string name = {};
};

/// Keras's `Flatten`: `(batch, d1, d2, ...)` to `(batch, d1 * d2 * ...)`.
/// \code
/// Flatten flatten;
/// \endcode
class Flatten : public detail::ShapeOnlyLayer {
 public:
  explicit Flatten(FlattenOptions options = {}) : ShapeOnlyLayer(options.name) {
    channels_first_ = detail::parse_data_format(options.data_format, label());
  }

  std::string class_name() const override { return "Flatten"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Inputs with axes of unknown length give an output of unknown length (Keras's `(None,
  /// None)`), settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return Shape{input_shapes[0].elements()};
  }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The channels_last shape of a batch `x`'s samples (channels_first inputs are moved there).
  Shape last_of(const Tensor<float>& x) const {
    return detail::move_channels(x.shape().row_shape(), false);
  }

  bool channels_first_ = false;
  bool moves_ = false;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Flatten::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  // An unknown length (0) makes the product unknown (0) too.
  const Shape out{input_shapes[0].elements()};
  // Keras's Flatten.call: with channels_first and inputs of rank > 1 (batch axis included),
  // transpose by [0, 2, ..., rank - 1, 1] first. Rank-1 samples are left as they are.
  moves_ = channels_first_ && input_shapes[0].rank() >= 2;
  if (moves_) {
    to_last_ = detail::channel_axes(input_shapes[0].rank() + 1, false);
    to_first_ = detail::channel_axes(input_shapes[0].rank() + 1, true);
  }
  remember(input_shapes, out);
  return out;
}

void Flatten::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  if (!moves_) {
    ShapeOnlyLayer::forward(inputs, output, ctx);
    return;
  }
  check_inputs(inputs);
  ctx.backend.permute(inputs[0], to_last_,
                      output.reshape(last_of(inputs[0]).prepend(inputs[0].rows())));
}

void Flatten::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (!moves_) {
    ShapeOnlyLayer::backward(inputs, output, output_gradient, input_gradients, ctx);
    return;
  }
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.permute(
      output_gradient.reshape(last_of(input_gradients[0]).prepend(output_gradient.rows())),
      to_first_, input_gradients[0]);
}

nlohmann::json Flatten::get_config() const {
  auto config = base_config();
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  return config;
}

std::shared_ptr<Layer> Flatten::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Flatten");
  return detail::finish_layer(
      read,
      std::make_shared<Flatten>(FlattenOptions{
          .data_format = detail::config_channels_first(read) ? "channels_first" : "channels_last",
          .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
