/// \file
/// `GlobalAveragePooling2D` and `GlobalMaxPooling2D`: one value per channel.
#pragma once

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of the global pooling layers.
struct GlobalPooling2DOptions {
  std::string name = {};
};

namespace detail {

template <bool Max>
class GlobalPooling2D : public LayerBase {
 public:
  explicit GlobalPooling2D(GlobalPooling2DOptions options) : LayerBase(options.name) {}

  std::string class_name() const override {
    return Max ? "GlobalMaxPooling2D" : "GlobalAveragePooling2D";
  }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    expect_inputs(input_shapes, 1);
    expect_rank(input_shapes[0], 3);
    const Shape out{input_shapes[0][2]};
    remember(input_shapes, out);
    return out;
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    ctx.backend.global_pool_forward(inputs[0], Max, output);
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    if (input_gradients.empty() || input_gradients[0].empty()) return;
    ctx.backend.global_pool_backward(inputs[0], Max, output_gradient, input_gradients[0]);
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["data_format"] = "channels_last";
    config["keepdims"] = false;
    return config;
  }
};

}  // namespace detail

/// Keras's `GlobalAveragePooling2D`: `(h, w, c)` to `(c,)`, the mean over `h * w`.
/// \code
/// GlobalAveragePooling2D gap;
/// \endcode
class GlobalAveragePooling2D : public detail::GlobalPooling2D<false> {
 public:
  explicit GlobalAveragePooling2D(GlobalPooling2DOptions options = {})
      : GlobalPooling2D(std::move(options)) {}
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalAveragePooling2D");
    detail::expect_channels_last(read);
    read.expect("keepdims", false, "loadstar drops the pooled axes");
    return detail::finish_layer(read,
                                std::make_shared<GlobalAveragePooling2D>(
                                    GlobalPooling2DOptions{.name = detail::config_name(read)}));
  }
};

/// Keras's `GlobalMaxPooling2D`: `(h, w, c)` to `(c,)`, the maximum over `h * w`.
/// \code
/// GlobalMaxPooling2D gmp;
/// \endcode
class GlobalMaxPooling2D : public detail::GlobalPooling2D<true> {
 public:
  explicit GlobalMaxPooling2D(GlobalPooling2DOptions options = {})
      : GlobalPooling2D(std::move(options)) {}
  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "GlobalMaxPooling2D");
    detail::expect_channels_last(read);
    read.expect("keepdims", false, "loadstar drops the pooled axes");
    return detail::finish_layer(read, std::make_shared<GlobalMaxPooling2D>(GlobalPooling2DOptions{
                                          .name = detail::config_name(read)}));
  }
};

}  // namespace loadstar::keras::layers
