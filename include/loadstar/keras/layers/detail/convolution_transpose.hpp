/// \file
/// The shared part of `Conv1DTranspose` and `Conv2DTranspose`: the adjoint of a convolution,
/// computed with the backend's `gemm`, `im2col` and `col2im` over channels-last batches, with
/// channels_first inputs moved to channels_last and back.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// One axis of a transposed convolution: the output size and the zeros before it of the
/// convolution it is the adjoint of (Keras's `deconv_output_length`, TensorFlow's padding).
struct TransposeAxis {
  std::size_t out = 0;
  std::size_t pad_before = 0;
};

/// Keras's output length of a transposed convolution along one axis of `in` elements, and
/// TensorFlow's padding of the convolution from that output back to `in` (`same`: half the
/// total, the extra zero after; `valid`: none).
LOADSTAR_DECL TransposeAxis transpose_axis(std::size_t in, std::size_t kernel, std::size_t stride,
                                           std::size_t dilation, bool same,
                                           std::optional<std::size_t> output_padding) noexcept;

/// A transposed convolution layer: inputs `(spatial..., in)` channels-last, kernel
/// `(k..., filters, in)` (Keras's layout), which is the kernel of the convolution `g` from the
/// output `(out..., filters)` to the input; the forward pass is that convolution's input gradient
/// (`col2im(x * kernel^T)`), plus the bias and the activation.
class ConvolutionTranspose : public LayerBase {
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
  ConvolutionTranspose(const std::string& name, std::size_t filters, const std::string& activation,
                       bool use_bias, Initializer kernel_initializer, Initializer bias_initializer)
      : LayerBase(name),
        filters_(filters),
        activation_(activation_from_name(activation)),
        use_bias_(use_bias),
        kernel_initializer_(std::move(kernel_initializer)),
        bias_initializer_(std::move(bias_initializer)) {}

  /// Throws `ConfigError` for a zero size, strides and dilation both above 1 (which Keras
  /// refuses) or an output padding not below its stride.
  LOADSTAR_DECL void check_sizes(std::span<const std::size_t> kernel,
                                 std::span<const std::size_t> strides,
                                 std::span<const std::size_t> dilation,
                                 std::span<const std::size_t> output_padding) const;

  /// Builds for inputs of `spatial_rank` (1 or 2) spatial axes; the sizes are `{height, width}`
  /// (height 1 for one axis) and `output_padding` empty for Keras's `None`.
  LOADSTAR_DECL Shape build_spatial(std::span<const Shape> input_shapes, std::size_t spatial_rank,
                                    Size2 kernel, Size2 strides, Size2 dilation, bool same,
                                    std::optional<Size2> output_padding, std::uint64_t seed);

  /// Keras's keys shared by both layers (the sizes are the subclass's).
  LOADSTAR_DECL nlohmann::json transpose_config() const;

  std::size_t filters_;
  keras::Activation activation_;
  bool use_bias_;
  Initializer kernel_initializer_;
  Initializer bias_initializer_;
  bool channels_first_ = false;

 private:
  LOADSTAR_DECL Tensor<float> to_channels_last(Backend& backend, const Tensor<float>& x,
                                               Scratch& scratch, const Shape& last,
                                               std::size_t batch) const;
  /// `z = col2im(x * kernel^T) (+ bias)` (`z` channels-last).
  LOADSTAR_DECL void pre_activation(Backend& backend, const Tensor<float>& x,
                                    const Conv2DGeometry& g, const Tensor<float>& z);
  /// The kernel as the `(k... * filters, in)` matrix of the convolution `g`.
  Tensor<float> kernel_matrix() const {
    return weights_[0].value.reshape({geometry_.patch_size(), geometry_.out_c});
  }
  /// The geometry (batch 0, of the convolution from the output to the input) for samples of
  /// channels_last shape `in_last` (an unknown length giving one), and their channels_last
  /// output shape in `out_last`.
  LOADSTAR_DECL Conv2DGeometry geometry_for(const Shape& in_last, Shape& out_last) const;
  /// Settles the geometry for the lengths of the batch `x` when they differ from the last's.
  LOADSTAR_DECL void settle(const Tensor<float>& x);

  // The build's sizes.
  std::size_t spatial_rank_ = 2;
  Size2 kernel_ = 1, strides_ = 1, dilation_ = 1;
  bool same_ = false;
  std::optional<Size2> output_padding_;
  /// The convolution from the output to the input (batch 0).
  Conv2DGeometry geometry_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dy_last_;
  Scratch dx_last_;
  Scratch columns_;
  Scratch z_;
  Scratch dz_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

TransposeAxis transpose_axis(std::size_t in, std::size_t kernel, std::size_t stride,
                             std::size_t dilation, bool same,
                             std::optional<std::size_t> output_padding) noexcept {
  const std::size_t span = (kernel - 1) * dilation + 1;
  std::size_t out = 0;
  if (!output_padding) {
    out = same ? in * stride : in * stride + (span > stride ? span - stride : 0);
  } else {
    const std::size_t pad = same ? span / 2 : 0;
    out = (in - 1) * stride + span + *output_padding - 2 * pad;
  }
  if (!same) return {out, 0};
  const std::size_t needed = (in - 1) * stride + span;
  return {out, needed > out ? (needed - out) / 2 : 0};
}

void ConvolutionTranspose::check_sizes(std::span<const std::size_t> kernel,
                                       std::span<const std::size_t> strides,
                                       std::span<const std::size_t> dilation,
                                       std::span<const std::size_t> output_padding) const {
  const auto any = [](std::span<const std::size_t> v, auto test) {
    return std::any_of(v.begin(), v.end(), test);
  };
  const auto zero = [](std::size_t s) { return s == 0; };
  const auto above_one = [](std::size_t s) { return s > 1; };
  if (filters_ == 0 || any(kernel, zero) || any(strides, zero) || any(dilation, zero)) {
    throw ConfigError(label() +
                      ": filters, kernel_size, strides and dilation_rate must be positive");
  }
  if (any(strides, above_one) && any(dilation, above_one)) {
    throw ConfigError(label() +
                      ": strides above 1 cannot be combined with a dilation_rate above 1 (as in "
                      "Keras)");
  }
  for (std::size_t i = 0; i < output_padding.size(); ++i) {
    if (output_padding[i] >= strides[i]) {
      throw ConfigError(label() + ": output_padding must be below the strides but is " +
                        std::to_string(output_padding[i]) + " for a stride of " +
                        std::to_string(strides[i]));
    }
  }
}

Shape ConvolutionTranspose::build_spatial(std::span<const Shape> input_shapes,
                                          std::size_t spatial_rank, Size2 kernel, Size2 strides,
                                          Size2 dilation, bool same,
                                          std::optional<Size2> output_padding, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], spatial_rank + 1);
  in_last_ = channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0];
  spatial_rank_ = spatial_rank;
  kernel_ = kernel;
  strides_ = strides;
  dilation_ = dilation;
  same_ = same;
  output_padding_ = output_padding;
  const std::size_t in_c = in_last_[spatial_rank];
  if (in_c == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(input_shapes[0]));
  }
  geometry_ = geometry_for(in_last_, out_last_);
  if (!weights_.empty()) {
    const Shape& k = weights_[0].value.shape();
    if (k[k.rank() - 1] != in_c) {
      throw ShapeError(label() + ": kernel is " + k.str() + " but the input has " +
                       std::to_string(in_c) + " channels");
    }
  } else {
    std::vector<std::size_t> dims;
    if (spatial_rank == 2) dims.push_back(kernel.h);
    dims.push_back(kernel.w);
    dims.push_back(filters_);
    dims.push_back(in_c);
    Tensor<float> k{Shape(dims)};
    kernel_initializer_.fill(k, seed);
    add_weight("kernel", k);
    if (use_bias_) {
      Tensor<float> bias({filters_});
      bias_initializer_.fill(bias, SplitMix64::mix(seed + 1));
      add_weight("bias", bias);
    }
  }
  to_last_ = channel_axes(in_last_.rank() + 1, false);
  to_first_ = channel_axes(in_last_.rank() + 1, true);
  const Shape out = channels_first_ ? move_channels(out_last_, true) : out_last_;
  remember(input_shapes, out);
  return out;
}

void ConvolutionTranspose::pre_activation(Backend& backend, const Tensor<float>& x,
                                          const Conv2DGeometry& g, const Tensor<float>& z) {
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const Tensor<float> columns = columns_.get(backend, {rows, g.patch_size()});
  backend.gemm(x.reshape({rows, g.out_c}), false, kernel_matrix(), true, columns);
  backend.col2im(columns, g, z);
  if (use_bias_)
    backend.bias_add(z.reshape({g.batch * g.in_h * g.in_w, filters_}), weights_[1].value);
}

void ConvolutionTranspose::forward(std::span<const Tensor<float>> inputs,
                                   const Tensor<float>& output, const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> y = channels_first_ ? y_last_.get(backend, out_last_.prepend(batch)) : output;
  Conv2DGeometry g = geometry_;
  g.batch = batch;
  pre_activation(backend, x, g, y);
  if (activation_ != keras::Activation::linear) backend.activation_forward(activation_, y, y);
  if (channels_first_) backend.permute(y, to_first_, output);
}

void ConvolutionTranspose::backward(std::span<const Tensor<float>> inputs,
                                    const Tensor<float>& output,
                                    const Tensor<float>& output_gradient,
                                    std::span<const Tensor<float>> input_gradients,
                                    const CallContext& ctx) {
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  Conv2DGeometry g = geometry_;
  g.batch = batch;
  const std::size_t out_rows = batch * g.in_h * g.in_w;
  const std::size_t in_rows = batch * g.out_h * g.out_w;
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  Tensor<float> dz = to_channels_last(backend, output_gradient, dy_last_, out_last_, batch);
  if (activation_ != keras::Activation::linear) {
    const Tensor<float> y = to_channels_last(backend, output, y_last_, out_last_, batch);
    Tensor<float> z;
    if (activation_gradient_needs_input(activation_)) {
      z = z_.get(backend, out_last_.prepend(batch));
      pre_activation(backend, x, g, z);
    }
    const Tensor<float> gradient = dz_.get(backend, out_last_.prepend(batch));
    backend.activation_backward(activation_, z, y, dz, gradient);
    dz = gradient;
  }
  // The output gradient unfolded by the convolution from the output to the input.
  const Tensor<float> columns = columns_.get(backend, {in_rows, g.patch_size()});
  backend.im2col(dz, g, columns);
  backend.gemm(columns, true, x.reshape({in_rows, g.out_c}), false,
               weights_[0].gradient.reshape(kernel_matrix().shape()), 1.0F, 1.0F);
  if (use_bias_) backend.column_sums(dz.reshape({out_rows, filters_}), weights_[1].gradient, 1.0F);
  const bool want_dx = !input_gradients.empty() && !input_gradients[0].empty();
  if (!want_dx) return;
  const Tensor<float> dx =
      channels_first_ ? dx_last_.get(backend, in_last_.prepend(batch)) : input_gradients[0];
  backend.gemm(columns, false, kernel_matrix(), false, dx.reshape({in_rows, g.out_c}));
  if (channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
}

Conv2DGeometry ConvolutionTranspose::geometry_for(const Shape& in_last, Shape& out_last) const {
  const std::size_t in_h = spatial_rank_ == 2 ? in_last[0] : 1;
  const std::size_t in_w = in_last[spatial_rank_ - 1];
  const std::size_t in_c = in_last[spatial_rank_];
  const auto padding = [&](bool height) -> std::optional<std::size_t> {
    if (!output_padding_) return std::nullopt;
    return height ? output_padding_->h : output_padding_->w;
  };
  // An axis of unknown length (0) gives one of unknown length, settled per batch.
  const TransposeAxis h = in_h == 0            ? TransposeAxis{0, 0}
                          : spatial_rank_ == 2 ? transpose_axis(in_h, kernel_.h, strides_.h,
                                                                dilation_.h, same_, padding(true))
                                               : TransposeAxis{1, 0};
  const TransposeAxis w =
      in_w == 0 ? TransposeAxis{0, 0}
                : transpose_axis(in_w, kernel_.w, strides_.w, dilation_.w, same_, padding(false));
  if ((in_h != 0 && h.out == 0) || (in_w != 0 && w.out == 0)) {
    throw ShapeError(label() + ": inputs of shape " +
                     (channels_first_ ? move_channels(in_last, true) : in_last).str() +
                     " give an empty output");
  }
  out_last = spatial_rank_ == 2 ? Shape{h.out, w.out, filters_} : Shape{w.out, filters_};
  return Conv2DGeometry{.in_h = h.out,
                        .in_w = w.out,
                        .in_c = filters_,
                        .out_h = in_h,
                        .out_w = in_w,
                        .out_c = in_c,
                        .kernel_h = kernel_.h,
                        .kernel_w = kernel_.w,
                        .stride_h = strides_.h,
                        .stride_w = strides_.w,
                        .dilation_h = dilation_.h,
                        .dilation_w = dilation_.w,
                        .pad_top = h.pad_before,
                        .pad_left = w.pad_before};
}

void ConvolutionTranspose::settle(const Tensor<float>& x) {
  const Shape sample = x.shape().row_shape();
  const Shape in_last = channels_first_ ? move_channels(sample, false) : sample;
  if (in_last == in_last_) return;
  geometry_ = geometry_for(in_last, out_last_);
  in_last_ = in_last;
}

Shape ConvolutionTranspose::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out_last;
  geometry_for(channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0], out_last);
  return channels_first_ ? move_channels(out_last, true) : out_last;
}

nlohmann::json ConvolutionTranspose::transpose_config() const {
  auto config = base_config();
  config["filters"] = filters_;
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  config["activation"] = activation_name(activation_);
  config["use_bias"] = use_bias_;
  config["kernel_initializer"] = kernel_initializer_.to_json();
  config["bias_initializer"] = bias_initializer_.to_json();
  for (const char* key : {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                          "kernel_constraint", "bias_constraint"})
    config[key] = nullptr;
  return config;
}

Tensor<float> ConvolutionTranspose::to_channels_last(Backend& backend, const Tensor<float>& x,
                                                     Scratch& scratch, const Shape& last,
                                                     std::size_t batch) const {
  if (!channels_first_) return x;
  const Tensor<float> moved = scratch.get(backend, last.prepend(batch));
  backend.permute(x, to_last_, moved);
  return moved;
}

}  // namespace loadstar::keras::layers::detail
#endif
