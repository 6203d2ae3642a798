/// \file
/// The shared part of `DepthwiseConv1D`/`2D` and `SeparableConv1D`/`2D`: a depthwise convolution
/// over channels-last batches (the backend's `depthwise_forward`/`depthwise_backward`, direct loops
/// along the channels, which are contiguous: the operation is memory-bound, so no im2col),
/// followed for the separable layers by a pointwise (1x1) convolution through the backend's
/// convolution kernels. channels_first inputs are moved to channels_last and back.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// A depthwise convolution layer, with a pointwise convolution after it when `filters > 0` (the
/// separable layers). Weights in Keras's order and layouts: `depthwise_kernel`
/// `(k..., in, depth_multiplier)`, then `pointwise_kernel` `(1..., in * depth_multiplier,
/// filters)` for the separable layers, then `bias` (`in * depth_multiplier` or `filters`
/// elements). The bias and activation follow the last step. A 1-D layer is a 2-D one of height 1.
class DepthwiseConvolution : public LayerBase {
 public:
  /// Steps, heights and widths of unknown length, settled per batch; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  /// The derived layer sets `channels_first_` in its constructor, where `label()` can name it.
  DepthwiseConvolution(const std::string& name, std::size_t filters, std::size_t depth_multiplier,
                       const std::string& activation, bool use_bias,
                       Initializer depthwise_initializer, Initializer pointwise_initializer,
                       Initializer bias_initializer)
      : LayerBase(name),
        filters_(filters),
        depth_multiplier_(depth_multiplier),
        activation_(activation_from_name(activation)),
        use_bias_(use_bias),
        depthwise_initializer_(std::move(depthwise_initializer)),
        pointwise_initializer_(std::move(pointwise_initializer)),
        bias_initializer_(std::move(bias_initializer)) {}

  /// Throws `ConfigError` for a zero size, or for strides and dilation both above 1 (which Keras
  /// refuses).
  LOADSTAR_DECL void check_sizes(std::span<const std::size_t> kernel,
                                 std::span<const std::size_t> strides,
                                 std::span<const std::size_t> dilation) const;

  /// The input's sample shape in channels_last order.
  Shape input_last(const Shape& in) const {
    return channels_first_ ? move_channels(in, false) : in;
  }

  /// Builds for inputs of `spatial_rank` (1 or 2) spatial axes: the sizes are `{height, width}`
  /// (height 1 for one axis), `padding` `"valid"`, `"same"` (TensorFlow's rule) or `"causal"` (one
  /// axis: `(kernel - 1) * dilation` zeros before). Creates the weights (or checks them against
  /// the input's channels when built before) and returns the output shape in the layer's data
  /// format.
  LOADSTAR_DECL Shape build_spatial(std::span<const Shape> input_shapes, std::size_t spatial_rank,
                                    Size2 kernel, Size2 strides, Size2 dilation,
                                    const std::string& padding, std::uint64_t seed);

  /// Keras's keys shared by the four layers (the sizes are the subclass's).
  LOADSTAR_DECL nlohmann::json depthwise_config() const;

  std::size_t filters_;
  std::size_t depth_multiplier_;
  keras::Activation activation_;
  bool use_bias_;
  Initializer depthwise_initializer_;
  Initializer pointwise_initializer_;
  Initializer bias_initializer_;
  bool channels_first_ = false;

 private:
  /// `x` itself with channels_last, else `x` transposed into `scratch` (of sample shape `last`).
  LOADSTAR_DECL Tensor<float> to_channels_last(Backend& backend, const Tensor<float>& x,
                                               Scratch& scratch, const Shape& last,
                                               std::size_t batch) const;
  /// `z = depthwise(x) (+ bias)` through the backend (`x` channels-last, `z` as `(rows, out_c)`).
  LOADSTAR_DECL void depthwise(Backend& backend, const Tensor<float>& x, const Conv2DGeometry& g,
                               const Tensor<float>& bias, const Tensor<float>& z) const;
  /// The pointwise step's geometry: a 1x1 convolution of the depthwise output.
  LOADSTAR_DECL Conv2DGeometry pointwise_geometry(std::size_t batch) const;
  Tensor<float> pointwise_matrix() const {
    return weights_[1].value.reshape({geometry_.out_c, filters_});
  }
  Tensor<float> bias() const { return use_bias_ ? weights_.back().value : Tensor<float>(); }
  /// The geometry (batch 0) for samples of channels_last shape `in_last` (an unknown length
  /// giving one), and their channels_last output shape in `out_last`.
  LOADSTAR_DECL Conv2DGeometry geometry_for(const Shape& in_last, Shape& out_last) const;
  /// Settles the geometry for the lengths of the batch `x` when they differ from the last's.
  LOADSTAR_DECL void settle(const Tensor<float>& x);
  Tensor<float> bias_gradient() const {
    return use_bias_ ? weights_.back().gradient : Tensor<float>();
  }

  // The build's sizes.
  std::size_t spatial_rank_ = 2;
  Size2 kernel_ = 1, strides_ = 1, dilation_ = 1;
  std::string padding_;
  Conv2DGeometry geometry_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dy_last_;
  Scratch dx_last_;
  Scratch middle_;
  Scratch middle_gradient_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

void DepthwiseConvolution::check_sizes(std::span<const std::size_t> kernel,
                                       std::span<const std::size_t> strides,
                                       std::span<const std::size_t> dilation) const {
  const auto any = [](std::span<const std::size_t> v, auto test) {
    return std::any_of(v.begin(), v.end(), test);
  };
  const auto zero = [](std::size_t s) { return s == 0; };
  const auto above_one = [](std::size_t s) { return s > 1; };
  if ((filters_ == 0 && class_name().starts_with("Separable")) || depth_multiplier_ == 0 ||
      any(kernel, zero) || any(strides, zero) || any(dilation, zero)) {
    throw ConfigError(label() +
                      ": filters, kernel_size, strides, dilation_rate and depth_multiplier must "
                      "be positive");
  }
  if (any(strides, above_one) && any(dilation, above_one)) {
    throw ConfigError(label() +
                      ": strides above 1 cannot be combined with a dilation_rate above 1 (as in "
                      "Keras)");
  }
}

void DepthwiseConvolution::depthwise(Backend& backend, const Tensor<float>& x,
                                     const Conv2DGeometry& g, const Tensor<float>& bias,
                                     const Tensor<float>& z) const {
  backend.depthwise_forward(x, g, weights_[0].value, bias, z);
}

Conv2DGeometry DepthwiseConvolution::pointwise_geometry(std::size_t batch) const {
  return Conv2DGeometry{.batch = batch,
                        .in_h = geometry_.out_h,
                        .in_w = geometry_.out_w,
                        .in_c = geometry_.out_c,
                        .out_h = geometry_.out_h,
                        .out_w = geometry_.out_w,
                        .out_c = filters_};
}

void DepthwiseConvolution::forward(std::span<const Tensor<float>> inputs,
                                   const Tensor<float>& output, const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> y = channels_first_ ? y_last_.get(backend, out_last_.prepend(batch)) : output;
  Conv2DGeometry g = geometry_;
  g.batch = batch;
  const std::size_t rows = batch * g.out_h * g.out_w;
  if (filters_ == 0) {
    depthwise(backend, x, g, bias(), y);
    if (activation_ != keras::Activation::linear) backend.activation_forward(activation_, y, y);
  } else {
    const Tensor<float> middle = middle_.get(backend, {rows, g.out_c});
    depthwise(backend, x, g, Tensor<float>(), middle);
    backend.conv2d_forward(middle, pointwise_geometry(batch), pointwise_matrix(), bias(),
                           activation_, y.reshape({rows, filters_}));
  }
  if (channels_first_) backend.permute(y, to_first_, output);
}

void DepthwiseConvolution::backward(std::span<const Tensor<float>> inputs,
                                    const Tensor<float>& output,
                                    const Tensor<float>& output_gradient,
                                    std::span<const Tensor<float>> input_gradients,
                                    const CallContext& ctx) {
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  Conv2DGeometry g = geometry_;
  g.batch = batch;
  const std::size_t rows = batch * g.out_h * g.out_w;
  const std::size_t out_c = filters_ == 0 ? g.out_c : filters_;
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> dy =
      to_channels_last(backend, output_gradient, dy_last_, out_last_, batch).reshape({rows, out_c});
  const Tensor<float> y =
      activation_ == keras::Activation::linear
          ? Tensor<float>()
          : to_channels_last(backend, output, y_last_, out_last_, batch).reshape({rows, out_c});
  const bool want_dx = !input_gradients.empty() && !input_gradients[0].empty();
  const Tensor<float> dx = !want_dx          ? Tensor<float>()
                           : channels_first_ ? dx_last_.get(backend, in_last_.prepend(batch))
                                             : input_gradients[0];
  // The gradient of the depthwise step's output (before its bias, which is the layer's bias when
  // there is no pointwise step).
  Tensor<float> dz = dy;
  Tensor<float> dbias;
  if (filters_ == 0) {
    dbias = bias_gradient();
    if (activation_ != keras::Activation::linear) {
      Tensor<float> z;
      if (activation_gradient_needs_input(activation_)) {
        z = middle_.get(backend, {rows, out_c});
        depthwise(backend, x, g, bias(), z);
      }
      dz = middle_gradient_.get(backend, {rows, out_c});
      backend.activation_backward(activation_, z, y, dy, dz);
    }
  } else {
    // The depthwise output is computed again rather than kept from forward, so that a shared
    // layer stays correct.
    const Tensor<float> middle = middle_.get(backend, {rows, g.out_c});
    depthwise(backend, x, g, Tensor<float>(), middle);
    dz = middle_gradient_.get(backend, {rows, g.out_c});
    backend.conv2d_backward(
        middle, pointwise_geometry(batch), pointwise_matrix(), bias(), activation_, y, dy,
        weights_[1].gradient.reshape(pointwise_matrix().shape()), bias_gradient(), dz, true);
  }
  backend.depthwise_backward(x, g, weights_[0].value, dz, dx, weights_[0].gradient, dbias);
  if (want_dx && channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
}

Shape DepthwiseConvolution::build_spatial(std::span<const Shape> input_shapes,
                                          std::size_t spatial_rank, Size2 kernel, Size2 strides,
                                          Size2 dilation, const std::string& padding,
                                          std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], spatial_rank + 1);
  in_last_ = input_last(input_shapes[0]);
  spatial_rank_ = spatial_rank;
  kernel_ = kernel;
  strides_ = strides;
  dilation_ = dilation;
  padding_ = padding;
  const std::size_t in_c = in_last_[spatial_rank];
  if (in_c == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(input_shapes[0]));
  }
  const Conv2DGeometry g = geometry_for(in_last_, out_last_);
  const std::size_t out_c = filters_ == 0 ? g.out_c : filters_;
  if (!weights_.empty()) {
    const Shape& kernel = weights_[0].value.shape();
    if (kernel[kernel.rank() - 2] != in_c) {
      throw ShapeError(label() + ": depthwise_kernel is " + kernel.str() + " but the input has " +
                       std::to_string(in_c) + " channels");
    }
  } else {
    std::vector<std::size_t> dims;
    if (spatial_rank == 2) dims.push_back(g.kernel_h);
    dims.push_back(g.kernel_w);
    dims.push_back(in_c);
    dims.push_back(depth_multiplier_);
    Tensor<float> kernel{Shape(dims)};
    depthwise_initializer_.fill(kernel, seed);
    add_weight("depthwise_kernel", kernel);
    if (filters_ > 0) {
      std::vector<std::size_t> pointwise(spatial_rank, 1);
      pointwise.push_back(g.out_c);
      pointwise.push_back(filters_);
      Tensor<float> pointwise_kernel{Shape(pointwise)};
      pointwise_initializer_.fill(pointwise_kernel, SplitMix64::mix(seed + 2));
      add_weight("pointwise_kernel", pointwise_kernel);
    }
    if (use_bias_) {
      Tensor<float> bias({out_c});
      bias_initializer_.fill(bias, SplitMix64::mix(seed + 1));
      add_weight("bias", bias);
    }
  }
  geometry_ = g;
  to_last_ = channel_axes(in_last_.rank() + 1, false);
  to_first_ = channel_axes(in_last_.rank() + 1, true);
  const Shape out = channels_first_ ? move_channels(out_last_, true) : out_last_;
  remember(input_shapes, out);
  return out;
}

Conv2DGeometry DepthwiseConvolution::geometry_for(const Shape& in_last, Shape& out_last) const {
  const std::size_t in_h = spatial_rank_ == 2 ? in_last[0] : 1;
  const std::size_t in_w = in_last[spatial_rank_ - 1];
  const std::size_t in_c = in_last[spatial_rank_];
  const bool same = padding_ == "same";
  // An axis of unknown length (0) gives one of unknown length, settled per batch.
  const AxisGeometry h = in_h == 0 ? AxisGeometry{0, 0}
                                   : axis_geometry(in_h, kernel_.h, strides_.h, dilation_.h, same);
  AxisGeometry w;
  if (in_w == 0) {
    w = {0, 0};
  } else if (padding_ == "causal") {
    w = {(in_w + strides_.w - 1) / strides_.w, (kernel_.w - 1) * dilation_.w};
  } else {
    w = axis_geometry(in_w, kernel_.w, strides_.w, dilation_.w, same);
  }
  if ((in_h != 0 && h.out == 0) || (in_w != 0 && w.out == 0)) {
    throw ShapeError(label() + ": a kernel of size " +
                     (spatial_rank_ == 2 ? std::to_string(kernel_.h) + "x" : std::string()) +
                     std::to_string(kernel_.w) + " does not fit inputs of shape " +
                     batch_str(channels_first_ ? move_channels(in_last, true) : in_last) +
                     " with valid padding");
  }
  const std::size_t out_c = filters_ == 0 ? in_c * depth_multiplier_ : filters_;
  out_last = spatial_rank_ == 2 ? Shape{h.out, w.out, out_c} : Shape{w.out, out_c};
  return Conv2DGeometry{.in_h = in_h,
                        .in_w = in_w,
                        .in_c = in_c,
                        .out_h = h.out,
                        .out_w = w.out,
                        .out_c = in_c * depth_multiplier_,
                        .kernel_h = kernel_.h,
                        .kernel_w = kernel_.w,
                        .stride_h = strides_.h,
                        .stride_w = strides_.w,
                        .dilation_h = dilation_.h,
                        .dilation_w = dilation_.w,
                        .pad_top = h.pad_before,
                        .pad_left = w.pad_before};
}

void DepthwiseConvolution::settle(const Tensor<float>& x) {
  const Shape in_last = input_last(x.shape().row_shape());
  if (in_last == in_last_) return;
  geometry_ = geometry_for(in_last, out_last_);
  in_last_ = in_last;
}

Shape DepthwiseConvolution::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out_last;
  geometry_for(input_last(input_shapes[0]), out_last);
  return channels_first_ ? move_channels(out_last, true) : out_last;
}

nlohmann::json DepthwiseConvolution::depthwise_config() const {
  auto config = base_config();
  if (filters_ > 0) config["filters"] = filters_;
  config["depth_multiplier"] = depth_multiplier_;
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  config["activation"] = activation_name(activation_);
  config["use_bias"] = use_bias_;
  config["depthwise_initializer"] = depthwise_initializer_.to_json();
  if (filters_ > 0) config["pointwise_initializer"] = pointwise_initializer_.to_json();
  config["bias_initializer"] = bias_initializer_.to_json();
  for (const char* key : {"depthwise_regularizer", "bias_regularizer", "activity_regularizer",
                          "depthwise_constraint", "bias_constraint"})
    config[key] = nullptr;
  if (filters_ > 0) {
    config["pointwise_regularizer"] = nullptr;
    config["pointwise_constraint"] = nullptr;
  }
  return config;
}

Tensor<float> DepthwiseConvolution::to_channels_last(Backend& backend, const Tensor<float>& x,
                                                     Scratch& scratch, const Shape& last,
                                                     std::size_t batch) const {
  if (!channels_first_) return x;
  const Tensor<float> moved = scratch.get(backend, last.prepend(batch));
  backend.permute(x, to_last_, moved);
  return moved;
}

}  // namespace loadstar::keras::layers::detail
#endif
