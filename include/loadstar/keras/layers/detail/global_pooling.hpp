/// \file
/// The shared part of the global pooling layers (1-D, 2-D and 3-D, average and max).
#pragma once

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of the global pooling layers.
struct GlobalPoolingOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  /// Keep the pooled axes with size 1 (`(1, 1, c)` instead of `(c,)`), as Keras's `keepdims`.
  bool keepdims = false;
  std::string name = {};
};

/// The arguments of `GlobalAveragePooling2D` and `GlobalMaxPooling2D`.
using GlobalPooling2DOptions = GlobalPoolingOptions;
/// The arguments of `GlobalAveragePooling1D` and `GlobalMaxPooling1D`.
using GlobalPooling1DOptions = GlobalPoolingOptions;
/// The arguments of `GlobalAveragePooling3D` and `GlobalMaxPooling3D`.
using GlobalPooling3DOptions = GlobalPoolingOptions;

namespace detail {

/// A global pooling layer over `Rank` spatial axes: one value per channel, the mean (or with
/// `Max` the maximum) over the spatial axes. channels_first inputs are transposed to
/// channels_last first; the output's values are the same in both formats.
template <bool Max, std::size_t Rank>
class GlobalPooling : public LayerBase {
 public:
  explicit GlobalPooling(GlobalPoolingOptions options)
      : LayerBase(options.name), keepdims_(options.keepdims) {
    channels_first_ = parse_data_format(options.data_format, label());
  }

  std::string class_name() const override {
    if constexpr (Rank == 1) return Max ? "GlobalMaxPooling1D" : "GlobalAveragePooling1D";
    if constexpr (Rank == 3) return Max ? "GlobalMaxPooling3D" : "GlobalAveragePooling3D";
    return Max ? "GlobalMaxPooling2D" : "GlobalAveragePooling2D";
  }

  /// Spatial axes of unknown length (a text model's steps); the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    expect_inputs(input_shapes, 1);
    expect_rank(input_shapes[0], Rank + 1);
    in_last_ = channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0];
    const std::size_t channels = in_last_[Rank];
    if (channels == 0) {
      throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                       batch_str(input_shapes[0]));
    }
    to_last_ = channel_axes(Rank + 2, false);
    to_first_ = channel_axes(Rank + 2, true);
    std::vector<std::size_t> dims(keepdims_ ? Rank + 1 : 1, 1);
    dims[channels_first_ || !keepdims_ ? 0 : Rank] = channels;
    const Shape out(dims);
    remember(input_shapes, out);
    return out;
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    const Tensor<float> y = output.reshape({output.rows(), in_last_[Rank]});
    ctx.backend.global_pool_forward(channels_last(ctx.backend, inputs[0]), Max, y);
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    if (input_gradients.empty() || input_gradients[0].empty()) return;
    Backend& backend = ctx.backend;
    const Tensor<float> dy = output_gradient.reshape({output_gradient.rows(), in_last_[Rank]});
    const Tensor<float> x = channels_last(backend, inputs[0]);
    const Tensor<float> dx =
        channels_first_ ? dx_last_.get(backend, x.shape()) : input_gradients[0];
    backend.global_pool_backward(x, Max, dy, dx);
    if (channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
    config["keepdims"] = keepdims_;
    return config;
  }

 protected:
  bool channels_first() const noexcept { return channels_first_; }

  static GlobalPoolingOptions options_from_config(const ConfigReader& read) {
    return {.data_format = config_channels_first(read) ? "channels_first" : "channels_last",
            .keepdims = read.get("keepdims", false),
            .name = config_name(read)};
  }

 private:
  Tensor<float> channels_last(Backend& backend, const Tensor<float>& x) {
    if (!channels_first_) return x;
    const Tensor<float> moved =
        x_last_.get(backend, move_channels(x.shape().row_shape(), false).prepend(x.rows()));
    backend.permute(x, to_last_, moved);
    return moved;
  }

  bool keepdims_;
  bool channels_first_ = false;
  Shape in_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch dx_last_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers
