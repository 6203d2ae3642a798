/// \file
/// The shared part of `Conv3D` and `Conv3DTranspose`: a 3-D convolution over channels-last
/// volumes as direct loops (the filters, contiguous in the kernel and the output, innermost), its
/// input and kernel gradients; the transposed convolution runs the same loops the other way.
/// channels_first inputs are moved to channels_last and back.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/convolution_transpose.hpp"
#include "loadstar/keras/layers/detail/pooling3d.hpp"

namespace loadstar::keras::layers::detail {

/// A 3-D convolution from `(batch, in..., in_c)` to `(batch, out..., out_c)` with the kernel
/// `(k..., in_c, out_c)`; axes in depth, height, width order.
struct Conv3DGeometry {
  std::size_t batch = 0, in_c = 0, out_c = 0;
  std::array<std::size_t, 3> in{}, out{}, kernel{}, stride{}, dilation{}, pad{};
};

/// Calls `f(input_offset, output_offset, tap)` (elements, channel 0) for every pair of an output
/// position and a kernel tap that reads an input position inside the volume.
template <class F>
void conv3d_pairs(const Conv3DGeometry& g, F&& f) {
  const std::size_t taps = g.kernel[0] * g.kernel[1] * g.kernel[2];
  for (std::size_t b = 0; b < g.batch; ++b)
    for (std::size_t od = 0; od < g.out[0]; ++od)
      for (std::size_t oh = 0; oh < g.out[1]; ++oh)
        for (std::size_t ow = 0; ow < g.out[2]; ++ow) {
          const std::size_t o = (((b * g.out[0] + od) * g.out[1] + oh) * g.out[2] + ow) * g.out_c;
          const std::size_t position[] = {od, oh, ow};
          for (std::size_t t = 0; t < taps; ++t) {
            const std::size_t k[] = {t / (g.kernel[1] * g.kernel[2]), t / g.kernel[2] % g.kernel[1],
                                     t % g.kernel[2]};
            std::size_t index[3];
            bool inside = true;
            for (std::size_t a = 0; a < 3 && inside; ++a) {
              const std::size_t i = position[a] * g.stride[a] + k[a] * g.dilation[a];
              inside = i >= g.pad[a] && i - g.pad[a] < g.in[a];
              index[a] = i - g.pad[a];
            }
            if (!inside) continue;
            const std::size_t in =
                (((b * g.in[0] + index[0]) * g.in[1] + index[1]) * g.in[2] + index[2]) * g.in_c;
            f(in, o, t);
          }
        }
}

/// `z = conv(x)` (written).
inline void conv3d_forward(const float* x, const Conv3DGeometry& g, const float* kernel, float* z) {
  std::fill(z, z + g.batch * g.out[0] * g.out[1] * g.out[2] * g.out_c, 0.0F);
  conv3d_pairs(g, [&](std::size_t in, std::size_t out, std::size_t tap) {
    float* y = z + out;
    for (std::size_t c = 0; c < g.in_c; ++c) {
      const float v = x[in + c];
      const float* k = kernel + (tap * g.in_c + c) * g.out_c;
      for (std::size_t f = 0; f < g.out_c; ++f)
        y[f] += v * k[f];
    }
  });
}

/// The input gradient of `conv3d_forward` from `dz` (written): also the transposed convolution.
inline void conv3d_input_gradient(const float* dz, const Conv3DGeometry& g, const float* kernel,
                                  float* dx) {
  std::fill(dx, dx + g.batch * g.in[0] * g.in[1] * g.in[2] * g.in_c, 0.0F);
  conv3d_pairs(g, [&](std::size_t in, std::size_t out, std::size_t tap) {
    const float* d = dz + out;
    for (std::size_t c = 0; c < g.in_c; ++c) {
      const float* k = kernel + (tap * g.in_c + c) * g.out_c;
      float sum = 0.0F;
      for (std::size_t f = 0; f < g.out_c; ++f)
        sum += d[f] * k[f];
      dx[in + c] += sum;
    }
  });
}

/// The kernel gradient of `conv3d_forward` from `x` and `dz`, added to `dkernel`.
inline void conv3d_kernel_gradient(const float* x, const Conv3DGeometry& g, const float* dz,
                                   float* dkernel) {
  conv3d_pairs(g, [&](std::size_t in, std::size_t out, std::size_t tap) {
    const float* d = dz + out;
    for (std::size_t c = 0; c < g.in_c; ++c) {
      const float v = x[in + c];
      float* k = dkernel + (tap * g.in_c + c) * g.out_c;
      for (std::size_t f = 0; f < g.out_c; ++f)
        k[f] += v * d[f];
    }
  });
}

/// `Conv3D` (the convolution `g` from the input to the output, kernel `(k..., in, filters)`) or,
/// with `transpose`, `Conv3DTranspose` (the convolution `g` from the output to the input, kernel
/// `(k..., filters, in)`; its forward pass is that convolution's input gradient). Both add the
/// bias and apply the activation after.
class Convolution3D : public LayerBase {
 public:
  /// Depths, heights and widths of unknown length (a video's frames), settled per batch; the
  /// channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  Convolution3D(const std::string& name, bool transpose, std::size_t filters,
                const std::string& activation, bool use_bias, Initializer kernel_initializer,
                Initializer bias_initializer)
      : LayerBase(name),
        transpose_(transpose),
        filters_(filters),
        activation_(activation_from_name(activation)),
        use_bias_(use_bias),
        kernel_initializer_(std::move(kernel_initializer)),
        bias_initializer_(std::move(bias_initializer)) {}

  /// Throws `ConfigError` for a zero size, strides and dilation both above 1 for a transposed
  /// convolution (which Keras refuses), or an output padding not below its stride.
  LOADSTAR_DECL void check_sizes(const Size3& kernel, const Size3& strides, const Size3& dilation,
                                 const Size3& output_padding) const;

  /// Builds for `(d, h, w, c)` inputs (in the layer's data format): `output_padding` only for the
  /// transposed convolution (empty: Keras's `None`).
  LOADSTAR_DECL Shape build_volume(std::span<const Shape> input_shapes, const Size3& kernel,
                                   const Size3& strides, const Size3& dilation, bool same,
                                   std::optional<Size3> output_padding, std::uint64_t seed);

  /// Keras's keys shared by both layers (the sizes are the subclass's).
  LOADSTAR_DECL nlohmann::json convolution3d_config() const;

  bool transpose_;
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
  /// `z = layer(x)` before the activation (`z` channels-last).
  LOADSTAR_DECL void pre_activation(Backend& backend, const Tensor<float>& x, std::size_t batch,
                                    const Tensor<float>& z) const;
  /// The geometry (batch 0) for samples of channels_last shape `in_last` (an unknown length
  /// giving one), and their channels_last output shape in `out_last`.
  LOADSTAR_DECL Conv3DGeometry geometry_for(const Shape& in_last, Shape& out_last) const;
  /// Settles the geometry for the lengths of the batch `x` when they differ from the last's.
  LOADSTAR_DECL void settle(const Tensor<float>& x);

  // The build's sizes.
  Size3 kernel_{}, strides_{}, dilation_{};
  bool same_ = false;
  std::optional<Size3> output_padding_;
  Conv3DGeometry geometry_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dy_last_;
  Scratch dx_last_;
  Scratch z_;
  Scratch dz_;
};

}  // namespace loadstar::keras::layers::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

void Convolution3D::check_sizes(const Size3& kernel, const Size3& strides, const Size3& dilation,
                                const Size3& output_padding) const {
  const auto zero = [](std::size_t s) { return s == 0; };
  const auto above_one = [](std::size_t s) { return s > 1; };
  if (filters_ == 0 || std::any_of(kernel.begin(), kernel.end(), zero) ||
      std::any_of(strides.begin(), strides.end(), zero) ||
      std::any_of(dilation.begin(), dilation.end(), zero)) {
    throw ConfigError(label() +
                      ": filters, kernel_size, strides and dilation_rate must be positive");
  }
  if (transpose_ && std::any_of(strides.begin(), strides.end(), above_one) &&
      std::any_of(dilation.begin(), dilation.end(), above_one)) {
    throw ConfigError(label() +
                      ": strides above 1 cannot be combined with a dilation_rate above 1 (as in "
                      "Keras)");
  }
  for (std::size_t i = 0; i < 3; ++i) {
    if (output_padding[i] >= strides[i]) {
      throw ConfigError(label() + ": output_padding must be below the strides but is " +
                        std::to_string(output_padding[i]) + " for a stride of " +
                        std::to_string(strides[i]));
    }
  }
}

Shape Convolution3D::build_volume(std::span<const Shape> input_shapes, const Size3& kernel,
                                  const Size3& strides, const Size3& dilation, bool same,
                                  std::optional<Size3> output_padding, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 4);
  in_last_ = channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0];
  const std::size_t in_c = in_last_[3];
  if (in_c == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(input_shapes[0]));
  }
  kernel_ = kernel;
  strides_ = strides;
  dilation_ = dilation;
  same_ = same;
  output_padding_ = output_padding;
  const Conv3DGeometry g = geometry_for(in_last_, out_last_);
  const Shape kernel_shape{kernel[0], kernel[1], kernel[2], g.in_c, g.out_c};
  if (!weights_.empty()) {
    if (weights_[0].value.shape() != kernel_shape) {
      throw ShapeError(label() + ": kernel is " + weights_[0].value.shape().str() +
                       " but the input has " + std::to_string(in_c) + " channels");
    }
  } else {
    Tensor<float> k(kernel_shape);
    kernel_initializer_.fill(k, seed);
    add_weight("kernel", k);
    if (use_bias_) {
      Tensor<float> bias({filters_});
      bias_initializer_.fill(bias, SplitMix64::mix(seed + 1));
      add_weight("bias", bias);
    }
  }
  geometry_ = g;
  to_last_ = channel_axes(5, false);
  to_first_ = channel_axes(5, true);
  const Shape result = channels_first_ ? move_channels(out_last_, true) : out_last_;
  remember(input_shapes, result);
  return result;
}

Conv3DGeometry Convolution3D::geometry_for(const Shape& in_last, Shape& out_last) const {
  const std::size_t in_c = in_last[3];
  Conv3DGeometry g{.in_c = transpose_ ? filters_ : in_c, .out_c = transpose_ ? in_c : filters_};
  std::array<std::size_t, 3> out{};
  for (std::size_t a = 0; a < 3; ++a) {
    std::size_t pad = 0;
    if (in_last[a] == 0) {
      out[a] = 0;  // a length settled per batch
    } else if (transpose_) {
      const TransposeAxis axis = transpose_axis(
          in_last[a], kernel_[a], strides_[a], dilation_[a], same_,
          output_padding_ ? std::optional<std::size_t>((*output_padding_)[a]) : std::nullopt);
      out[a] = axis.out;
      pad = axis.pad_before;
    } else {
      const AxisGeometry axis =
          axis_geometry(in_last[a], kernel_[a], strides_[a], dilation_[a], same_);
      out[a] = axis.out;
      pad = axis.pad_before;
    }
    if (in_last[a] != 0 && out[a] == 0) {
      throw ShapeError(label() + ": a " + std::to_string(kernel_[0]) + "x" +
                       std::to_string(kernel_[1]) + "x" + std::to_string(kernel_[2]) +
                       " kernel does not fit inputs of shape " +
                       batch_str(channels_first_ ? move_channels(in_last, true) : in_last) +
                       " with valid padding");
    }
    g.in[a] = transpose_ ? out[a] : in_last[a];
    g.out[a] = transpose_ ? in_last[a] : out[a];
    g.kernel[a] = kernel_[a];
    g.stride[a] = strides_[a];
    g.dilation[a] = dilation_[a];
    g.pad[a] = pad;
  }
  out_last = Shape{out[0], out[1], out[2], filters_};
  return g;
}

void Convolution3D::settle(const Tensor<float>& x) {
  const Shape sample = x.shape().row_shape();
  const Shape in_last = channels_first_ ? move_channels(sample, false) : sample;
  if (in_last == in_last_) return;
  geometry_ = geometry_for(in_last, out_last_);
  in_last_ = in_last;
}

Shape Convolution3D::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out_last;
  geometry_for(channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0], out_last);
  return channels_first_ ? move_channels(out_last, true) : out_last;
}

void Convolution3D::pre_activation(Backend& backend, const Tensor<float>& x, std::size_t batch,
                                   const Tensor<float>& z) const {
  Conv3DGeometry g = geometry_;
  g.batch = batch;
  const bool transpose = transpose_;
  const Tensor<float> tensors[] = {x, weights_[0].value, z};
  backend.host_kernel(tensors, [g, transpose](std::span<const Tensor<float>> t) {
    if (transpose) {
      conv3d_input_gradient(t[0].data(), g, t[1].data(), t[2].data());
    } else {
      conv3d_forward(t[0].data(), g, t[1].data(), t[2].data());
    }
  });
  if (use_bias_) backend.bias_add(z, weights_[1].value);
}

void Convolution3D::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                            const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  const Tensor<float> y = channels_first_ ? y_last_.get(backend, out_last_.prepend(batch)) : output;
  pre_activation(backend, x, batch, y);
  if (activation_ != keras::Activation::linear) backend.activation_forward(activation_, y, y);
  if (channels_first_) backend.permute(y, to_first_, output);
}

void Convolution3D::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const Tensor<float>& output_gradient,
                             std::span<const Tensor<float>> input_gradients,
                             const CallContext& ctx) {
  settle(inputs[0]);
  Backend& backend = ctx.backend;
  const std::size_t batch = inputs[0].rows();
  const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_, batch);
  Tensor<float> dz = to_channels_last(backend, output_gradient, dy_last_, out_last_, batch);
  if (activation_ != keras::Activation::linear) {
    const Tensor<float> y = to_channels_last(backend, output, y_last_, out_last_, batch);
    Tensor<float> z;
    if (activation_gradient_needs_input(activation_)) {
      z = z_.get(backend, out_last_.prepend(batch));
      pre_activation(backend, x, batch, z);
    }
    const Tensor<float> gradient = dz_.get(backend, out_last_.prepend(batch));
    backend.activation_backward(activation_, z, y, dz, gradient);
    dz = gradient;
  }
  if (use_bias_) backend.column_sums(dz, weights_[1].gradient, 1.0F);
  const bool want_dx = !input_gradients.empty() && !input_gradients[0].empty();
  const Tensor<float> dx = !want_dx          ? Tensor<float>()
                           : channels_first_ ? dx_last_.get(backend, in_last_.prepend(batch))
                                             : input_gradients[0];
  Conv3DGeometry g = geometry_;
  g.batch = batch;
  const bool transpose = transpose_;
  const Tensor<float> tensors[] = {x, weights_[0].value, dz, dx, weights_[0].gradient};
  backend.host_kernel(tensors, [g, transpose](std::span<const Tensor<float>> t) {
    // The convolution g reads `from` and writes `to`: the layer's input and output, or the other
    // way round when transposed.
    const float* from = transpose ? t[2].data() : t[0].data();
    const float* to = transpose ? t[0].data() : t[2].data();
    conv3d_kernel_gradient(from, g, to, t[4].data());
    if (t[3].empty()) return;
    if (transpose) {
      conv3d_forward(t[2].data(), g, t[1].data(), t[3].data());
    } else {
      conv3d_input_gradient(t[2].data(), g, t[1].data(), t[3].data());
    }
  });
  if (want_dx && channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
}

nlohmann::json Convolution3D::convolution3d_config() const {
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

Tensor<float> Convolution3D::to_channels_last(Backend& backend, const Tensor<float>& x,
                                              Scratch& scratch, const Shape& last,
                                              std::size_t batch) const {
  if (!channels_first_) return x;
  const Tensor<float> moved = scratch.get(backend, last.prepend(batch));
  backend.permute(x, to_last_, moved);
  return moved;
}

}  // namespace loadstar::keras::layers::detail
#endif
