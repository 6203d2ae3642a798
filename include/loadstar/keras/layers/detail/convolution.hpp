/// \file
/// The shared part of `Conv1D` and `Conv2D`: the backend's convolution kernels
/// (`Backend::conv2d_forward` and `conv2d_backward`) over channels-last batches, with
/// channels_first inputs moved to channels_last and back.
#pragma once

#include "loadstar/config.hpp"

#include <string>
#include <vector>

#include "loadstar/keras/detail/relu_fusion.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers::detail {

/// A convolution layer: the kernel `(k..., in, filters)` (Keras's layout in both data formats)
/// seen as the `(patch, filters)` matrix that im2col rows multiply, an optional bias and an
/// activation. With `groups > 1` the kernel is `(k..., in / groups, filters)` and output channel
/// `o` sees the input channels of its group `o / (filters / groups)` only: each group is its own
/// convolution of `in / groups` channels into `filters / groups` (the backend's
/// `grouped_conv2d_forward` and `grouped_conv2d_backward`, or else `conv2d_forward` and
/// `conv2d_backward` per group on the groups' channels gathered by `permute`), never a
/// block-diagonal kernel `groups` times the work. A 1-D convolution is a 2-D one of height 1. With
/// channels_first, the input is transposed to channels_last, convolved, and the output transposed
/// back (as TensorFlow does on the CPU, which has no NCHW kernels).
class Convolution : public LayerBase {
 public:
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  /// Writes its gradients when it is called once per step (`Backend::conv2d_backward`'s
  /// `accumulate`).
  bool writes_gradients() const noexcept override { return true; }
  /// With a ReLU: its backward may take the pre-activation gradient from the max pooling's after
  /// it, which reads the ReLU from this layer's output, where the backend fuses them.
  keras::detail::FusionRole fusion_role() const noexcept override {
    return activation_ == keras::Activation::relu ? keras::detail::FusionRole::relu_output
                                                  : keras::detail::FusionRole::none;
  }

 protected:
  /// The derived layer sets `channels_first_` (its data format) and `groups_` in its
  /// constructor, where `label()` can name it.
  Convolution(const std::string& name, std::size_t filters, const std::string& activation,
              bool use_bias, Initializer kernel_initializer, Initializer bias_initializer)
      : LayerBase(name),
        filters_(filters),
        activation_(activation_from_name(activation)),
        use_bias_(use_bias),
        kernel_initializer_(std::move(kernel_initializer)),
        bias_initializer_(std::move(bias_initializer)) {}

  /// The input's sample shape in channels_last order (what the geometry is computed from).
  Shape input_last(const Shape& in) const {
    return channels_first_ ? move_channels(in, false) : in;
  }

  /// Creates the weights (or checks them against the input's channels when built before),
  /// records the geometry `g` (batch 0) and returns the output shape in the layer's data format.
  LOADSTAR_DECL Shape finish_build(std::span<const Shape> input_shapes, const Conv2DGeometry& g,
                                   const Shape& kernel_shape, const Shape& out_last,
                                   std::uint64_t seed);

  /// The geometry (batch 0) for samples whose channels_last shape is `in_last`, and their
  /// channels_last output shape in `out_last`: what a layer that takes axes of unknown length
  /// computes for each batch's lengths. The default: the build's.
  virtual Conv2DGeometry geometry_for(const Shape& /*in_last*/, Shape& out_last) const {
    out_last = out_last_;
    return geometry_;
  }

  /// Keras's keys shared by `Conv1D` and `Conv2D` (the sizes are the subclass's).
  LOADSTAR_DECL nlohmann::json convolution_config() const;

  std::size_t filters_;
  keras::Activation activation_;
  bool use_bias_;
  Initializer kernel_initializer_;
  Initializer bias_initializer_;
  bool channels_first_ = false;
  std::size_t groups_ = 1;

 private:
  /// `x` itself with channels_last, else `x` transposed into `scratch` (of sample shape `last`).
  LOADSTAR_DECL Tensor<float> to_channels_last(Backend& backend, const Tensor<float>& x,
                                               Scratch& scratch, const Shape& last,
                                               std::size_t batch) const;

  LOADSTAR_DECL Conv2DGeometry geometry(std::size_t batch) const;
  /// Settles the geometry for the lengths of the batch `x` when they differ from the last's.
  LOADSTAR_DECL void settle(const Tensor<float>& x);

  /// The kernel as the `(k... * in / groups, filters)` matrix that im2col rows of one group
  /// multiply.
  Tensor<float> kernel_matrix() const {
    return weights_[0].value.reshape({geometry_.patch_size() / groups_, filters_});
  }
  /// With groups, on a backend without `grouped_conv2d_forward`: the groups' inputs `x` and
  /// kernel columns gathered group by group (`x_groups_`, `kernel_groups_`), a convolution per
  /// group into `y_groups_`, scattered back into `y` `(rows, filters)`.
  LOADSTAR_DECL void forward_per_group(Backend& backend, const Tensor<float>& x,
                                       const Conv2DGeometry& g, const Tensor<float>& y);
  /// Its backward pass (the arguments of `Backend::conv2d_backward`, the weights' gradients the
  /// layer's own).
  LOADSTAR_DECL void backward_per_group(Backend& backend, const Tensor<float>& x,
                                        const Conv2DGeometry& g, keras::Activation activation,
                                        const Tensor<float>& y, const Tensor<float>& dy,
                                        const Tensor<float>& dx, bool accumulate);
  /// Gathers each group's slice of the last axis of `x`, seen as `(n, groups, width)`, into
  /// `gathered` `(groups, n * width)`, or back when `back`.
  LOADSTAR_DECL void regroup(Backend& backend, const Tensor<float>& x, std::size_t width,
                             const Tensor<float>& gathered, bool back) const;

  Conv2DGeometry geometry_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dy_last_;
  Scratch dx_last_;
  // The per-group path's gathered tensors, each `(groups, ...)`.
  Scratch x_groups_;
  Scratch kernel_groups_;
  Scratch y_groups_;
  Scratch dy_groups_;
  Scratch dkernel_groups_;
  Scratch dx_groups_;
  Scratch softmax_gradient_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

void Convolution::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  if (keras::detail::ReluGradientFusion* fused = keras::detail::fused_output(ctx))
    fused->gradient_written = false;
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> y = channels_first_ ? y_last_.get(backend, out_last_.prepend(batch)) : output;
  const Conv2DGeometry g = geometry(batch);
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const Tensor<float> bias = use_bias_ ? weights_[1].value : Tensor<float>();
  if (groups_ == 1) {
    backend.conv2d_forward(x, g, kernel_matrix(), bias, activation_, y.reshape({rows, filters_}));
  } else if (!backend.grouped_conv2d_forward(x, g, groups_, kernel_matrix(), bias, activation_,
                                             y.reshape({rows, filters_}))) {
    forward_per_group(backend, x, g, y.reshape({rows, filters_}));
  }
  if (channels_first_) backend.permute(y, to_first_, output);
}

void Convolution::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                           const Tensor<float>& output_gradient,
                           std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  const Conv2DGeometry g = geometry(batch);
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  // The columns are unfolded again by the backend rather than kept from forward, so a shared
  // layer stays correct.
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> dy = to_channels_last(backend, output_gradient, dy_last_, out_last_, batch)
                               .reshape({rows, filters_});
  // The max pooling after it carried the gradient through the ReLU
  // (`keras::detail::ReluGradientFusion::from_output`): the output gradient is the
  // pre-activation's.
  keras::detail::ReluGradientFusion* fused = keras::detail::fused_output(ctx);
  const bool carried = fused != nullptr && fused->gradient_written;
  if (fused != nullptr) fused->gradient_written = false;
  const keras::Activation activation = carried ? keras::Activation::linear : activation_;
  const Tensor<float> y =
      activation == keras::Activation::linear
          ? Tensor<float>()
          : to_channels_last(backend, output, y_last_, out_last_, batch).reshape({rows, filters_});
  const bool want_dx = !input_gradients.empty() && !input_gradients[0].empty();
  const Tensor<float> dx = !want_dx          ? Tensor<float>()
                           : channels_first_ ? dx_last_.get(backend, in_last_.prepend(batch))
                                             : input_gradients[0];
  const Tensor<float> bias = use_bias_ ? weights_[1].value : Tensor<float>();
  const Tensor<float> dkernel = weights_[0].gradient.reshape(kernel_matrix().shape());
  const Tensor<float> dbias = use_bias_ ? weights_[1].gradient : Tensor<float>();
  if (groups_ == 1) {
    backend.conv2d_backward(x, g, kernel_matrix(), bias, activation, y, dy, dkernel, dbias, dx,
                            ctx.accumulate_gradients);
  } else if (!backend.grouped_conv2d_backward(x, g, groups_, kernel_matrix(), bias, activation, y,
                                              dy, dkernel, dbias, dx, ctx.accumulate_gradients)) {
    backward_per_group(backend, x, g, activation, y, dy, dx, ctx.accumulate_gradients);
  }
  if (want_dx && channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
}

Shape Convolution::finish_build(std::span<const Shape> input_shapes, const Conv2DGeometry& g,
                                const Shape& kernel_shape, const Shape& out_last,
                                std::uint64_t seed) {
  in_last_ = input_last(input_shapes[0]);
  const std::size_t in_channels = in_last_[in_last_.rank() - 1];
  if (!weights_.empty()) {
    const Shape& kernel = weights_[0].value.shape();
    if (kernel[kernel.rank() - 2] * groups_ != in_channels) {
      throw ShapeError(label() + ": kernel is " + kernel.str() + " but the input has " +
                       std::to_string(in_channels) + " channels");
    }
  } else {
    if (in_channels % groups_ != 0) {
      throw ShapeError(label() + ": " + std::to_string(groups_) +
                       " groups must divide the input's " + std::to_string(in_channels) +
                       " channels");
    }
    std::vector<std::size_t> dims(kernel_shape.begin(), kernel_shape.end());
    dims[dims.size() - 2] = in_channels / groups_;
    Tensor<float> kernel{Shape(dims)};
    kernel_initializer_.fill(kernel, seed);
    add_weight("kernel", kernel);
    if (use_bias_) {
      Tensor<float> bias({filters_});
      bias_initializer_.fill(bias, SplitMix64::mix(seed + 1));
      add_weight("bias", bias);
    }
  }
  geometry_ = g;
  out_last_ = out_last;
  to_last_ = channel_axes(in_last_.rank() + 1, false);
  to_first_ = channel_axes(in_last_.rank() + 1, true);
  const Shape out = channels_first_ ? move_channels(out_last, true) : out_last;
  remember(input_shapes, out);
  return out;
}

void Convolution::settle(const Tensor<float>& x) {
  const Shape in_last = input_last(x.shape().row_shape());
  if (in_last == in_last_) return;
  Shape out_last;
  geometry_ = geometry_for(in_last, out_last);
  in_last_ = in_last;
  out_last_ = out_last;
}

nlohmann::json Convolution::convolution_config() const {
  auto config = base_config();
  config["filters"] = filters_;
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  config["groups"] = groups_;
  config["activation"] = activation_name(activation_);
  config["use_bias"] = use_bias_;
  config["kernel_initializer"] = kernel_initializer_.to_json();
  config["bias_initializer"] = bias_initializer_.to_json();
  write_weight_options(config, {"kernel", "bias"});
  config["activity_regularizer"] = regularizer_json(nullptr);
  return config;
}

void Convolution::regroup(Backend& backend, const Tensor<float>& x, std::size_t width,
                          const Tensor<float>& gathered, bool back) const {
  static constexpr std::size_t swap[] = {1, 0, 2};
  const std::size_t n = x.size() / (groups_ * width);
  const Tensor<float> spread = x.reshape({n, groups_, width});
  const Tensor<float> grouped = gathered.reshape({groups_, n, width});
  if (back) {
    backend.permute(grouped, swap, spread);
  } else {
    backend.permute(spread, swap, grouped);
  }
}

void Convolution::forward_per_group(Backend& backend, const Tensor<float>& x,
                                    const Conv2DGeometry& g, const Tensor<float>& y) {
  const std::size_t per_in = g.in_c / groups_, per_out = filters_ / groups_;
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const Tensor<float> kernel = kernel_matrix();
  const std::size_t taps = kernel.rows();
  Conv2DGeometry group = g;
  group.in_c = per_in;
  group.out_c = per_out;
  const Tensor<float> xs = x_groups_.get(backend, {groups_, x.size() / groups_});
  regroup(backend, x, per_in, xs, false);
  const Tensor<float> kernels = kernel_groups_.get(backend, {groups_, taps * per_out});
  regroup(backend, kernel, per_out, kernels, false);
  const Tensor<float> ys = y_groups_.get(backend, {groups_, rows * per_out});
  // A softmax runs over every output channel: after the groups are put back together.
  const keras::Activation activation =
      activation_ == keras::Activation::softmax ? keras::Activation::linear : activation_;
  const Tensor<float> biases =
      use_bias_ ? weights_[1].value.reshape({groups_, per_out}) : Tensor<float>();
  for (std::size_t k = 0; k < groups_; ++k) {
    backend.conv2d_forward(xs.row(k).reshape({g.batch, g.in_h, g.in_w, per_in}), group,
                           kernels.row(k).reshape({taps, per_out}),
                           use_bias_ ? biases.row(k) : Tensor<float>(), activation,
                           ys.row(k).reshape({rows, per_out}));
  }
  regroup(backend, y, per_out, ys, true);
  if (activation_ == keras::Activation::softmax) backend.activation_forward(activation_, y, y);
}

void Convolution::backward_per_group(Backend& backend, const Tensor<float>& x,
                                     const Conv2DGeometry& g, keras::Activation activation,
                                     const Tensor<float>& y, const Tensor<float>& dy,
                                     const Tensor<float>& dx, bool accumulate) {
  const std::size_t per_in = g.in_c / groups_, per_out = filters_ / groups_;
  const std::size_t rows = g.batch * g.out_h * g.out_w;
  const Tensor<float> kernel = kernel_matrix();
  const std::size_t taps = kernel.rows();
  Conv2DGeometry group = g;
  group.in_c = per_in;
  group.out_c = per_out;
  // A softmax's gradient mixes every output channel: taken before the groups are split.
  Tensor<float> dz = dy;
  if (activation == keras::Activation::softmax) {
    dz = softmax_gradient_.get(backend, {rows, filters_});
    backend.activation_backward(activation, Tensor<float>(), y, dy, dz);
    activation = keras::Activation::linear;
  }
  const Tensor<float> xs = x_groups_.get(backend, {groups_, x.size() / groups_});
  regroup(backend, x, per_in, xs, false);
  const Tensor<float> kernels = kernel_groups_.get(backend, {groups_, taps * per_out});
  regroup(backend, kernel, per_out, kernels, false);
  const Tensor<float> dys = dy_groups_.get(backend, {groups_, rows * per_out});
  regroup(backend, dz, per_out, dys, false);
  Tensor<float> ys;
  if (activation != keras::Activation::linear) {
    ys = y_groups_.get(backend, {groups_, rows * per_out});
    regroup(backend, y, per_out, ys, false);
  }
  // Accumulated gradients start from the kernel's gradient so far, gathered as the kernel is.
  const Tensor<float> dkernel = weights_[0].gradient.reshape(kernel.shape());
  const Tensor<float> dkernels = dkernel_groups_.get(backend, {groups_, taps * per_out});
  if (accumulate) regroup(backend, dkernel, per_out, dkernels, false);
  const Tensor<float> dxs =
      dx.empty() ? Tensor<float>() : dx_groups_.get(backend, {groups_, x.size() / groups_});
  const Tensor<float> biases =
      use_bias_ ? weights_[1].value.reshape({groups_, per_out}) : Tensor<float>();
  const Tensor<float> dbiases =
      use_bias_ ? weights_[1].gradient.reshape({groups_, per_out}) : Tensor<float>();
  for (std::size_t k = 0; k < groups_; ++k) {
    backend.conv2d_backward(
        xs.row(k).reshape({g.batch, g.in_h, g.in_w, per_in}), group,
        kernels.row(k).reshape({taps, per_out}), use_bias_ ? biases.row(k) : Tensor<float>(),
        activation, ys.empty() ? Tensor<float>() : ys.row(k).reshape({rows, per_out}),
        dys.row(k).reshape({rows, per_out}), dkernels.row(k).reshape({taps, per_out}),
        use_bias_ ? dbiases.row(k) : Tensor<float>(),
        dxs.empty() ? Tensor<float>() : dxs.row(k).reshape({g.batch, g.in_h, g.in_w, per_in}),
        accumulate);
  }
  regroup(backend, dkernel, per_out, dkernels, true);
  if (!dx.empty()) regroup(backend, dx, per_in, dxs, true);
}

Tensor<float> Convolution::to_channels_last(Backend& backend, const Tensor<float>& x,
                                            Scratch& scratch, const Shape& last,
                                            std::size_t batch) const {
  if (!channels_first_) return x;
  const Tensor<float> moved = scratch.get(backend, last.prepend(batch));
  backend.permute(x, to_last_, moved);
  return moved;
}

Conv2DGeometry Convolution::geometry(std::size_t batch) const {
  Conv2DGeometry g = geometry_;
  g.batch = batch;
  return g;
}

}  // namespace loadstar::keras::layers::detail
#endif
