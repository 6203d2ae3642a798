/// \file
/// `Conv2D`: Keras's 2-D convolution over channels-last images (im2col + GEMM).
#pragma once

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Conv2D`'s Keras arguments after `filters` and `kernel_size`, with Keras's defaults.
struct Conv2DOptions {
  Size2 strides = 1;
  std::string padding = "valid";
  Size2 dilation_rate = 1;
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Conv2D` (channels_last): inputs `(h, w, in)`, kernel `(kh, kw, in, filters)` as Keras
/// stores it, `bias` `(filters,)`; `valid` or `same` padding (TensorFlow's rule), strides and
/// dilation.
/// \code
/// Conv2D conv(32, 3, {.padding = "same", .activation = "relu"});
/// Conv2D strided(64, {3, 3}, {.strides = 2});
/// \endcode
class Conv2D : public detail::LayerBase {
 public:
  Conv2D(std::size_t filters, Size2 kernel_size, Conv2DOptions options = {})
      : LayerBase(options.name),
        filters_(filters),
        kernel_size_(kernel_size),
        activation_(activation_from_name(options.activation)),
        options_(std::move(options)) {
    same_ = detail::parse_padding(options_.padding, label());
    if (filters == 0 || kernel_size.h == 0 || kernel_size.w == 0 || options_.strides.h == 0 ||
        options_.strides.w == 0 || options_.dilation_rate.h == 0 || options_.dilation_rate.w == 0) {
      throw ConfigError(label() +
                        ": filters, kernel_size, strides and dilation_rate must be "
                        "positive");
    }
  }

  std::string class_name() const override { return "Conv2D"; }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override {
    expect_inputs(input_shapes, 1);
    const Shape& in = input_shapes[0];
    expect_rank(in, 3);
    const auto h =
        axis_geometry(in[0], kernel_size_.h, options_.strides.h, options_.dilation_rate.h, same_);
    const auto w =
        axis_geometry(in[1], kernel_size_.w, options_.strides.w, options_.dilation_rate.w, same_);
    if (h.out == 0 || w.out == 0) {
      throw ShapeError(label() + ": a " + std::to_string(kernel_size_.h) + "x" +
                       std::to_string(kernel_size_.w) + " kernel does not fit inputs of shape " +
                       in.str() + " with valid padding");
    }
    if (!weights_.empty()) {
      if (weights_[0].value.dim(2) != in[2]) {
        throw ShapeError(label() + ": kernel is " + weights_[0].value.shape().str() +
                         " but the input has " + std::to_string(in[2]) + " channels");
      }
    } else {
      Tensor<float> kernel({kernel_size_.h, kernel_size_.w, in[2], filters_});
      options_.kernel_initializer.fill(kernel, seed);
      add_weight("kernel", kernel);
      if (options_.use_bias) {
        Tensor<float> bias({filters_});
        options_.bias_initializer.fill(bias, SplitMix64::mix(seed + 1));
        add_weight("bias", bias);
      }
    }
    geometry_ = Conv2DGeometry{.in_h = in[0],
                               .in_w = in[1],
                               .in_c = in[2],
                               .out_h = h.out,
                               .out_w = w.out,
                               .out_c = filters_,
                               .kernel_h = kernel_size_.h,
                               .kernel_w = kernel_size_.w,
                               .stride_h = options_.strides.h,
                               .stride_w = options_.strides.w,
                               .dilation_h = options_.dilation_rate.h,
                               .dilation_w = options_.dilation_rate.w,
                               .pad_top = h.pad_before,
                               .pad_left = w.pad_before};
    const Shape out{h.out, w.out, filters_};
    remember(input_shapes, out);
    return out;
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    Backend& backend = ctx.backend;
    const Conv2DGeometry g = geometry(inputs[0].rows());
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    const Tensor<float> columns = columns_.get(backend, {rows, g.patch_size()});
    backend.im2col(inputs[0], g, columns);
    const Tensor<float> y = output.reshape({rows, filters_});
    backend.gemm(columns, false, kernel_matrix(), false, y);
    if (options_.use_bias) backend.bias_add(y, weights_[1].value);
    if (activation_ != keras::Activation::linear) backend.activation_forward(activation_, y, y);
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    Backend& backend = ctx.backend;
    const Conv2DGeometry g = geometry(inputs[0].rows());
    const std::size_t rows = g.batch * g.out_h * g.out_w;
    // The columns are unfolded again rather than kept from forward, so a shared layer stays
    // correct; im2col is cheap next to the GEMMs.
    const Tensor<float> columns = columns_.get(backend, {rows, g.patch_size()});
    backend.im2col(inputs[0], g, columns);
    Tensor<float> dz = output_gradient.reshape({rows, filters_});
    if (activation_ != keras::Activation::linear) {
      Tensor<float> z;
      if (activation_gradient_needs_input(activation_)) {
        z = pre_activation_.get(backend, {rows, filters_});
        backend.gemm(columns, false, kernel_matrix(), false, z);
        if (options_.use_bias) backend.bias_add(z, weights_[1].value);
      }
      const Tensor<float> gradient = gradient_.get(backend, {rows, filters_});
      backend.activation_backward(activation_, z, output.reshape({rows, filters_}), dz, gradient);
      dz = gradient;
    }
    backend.gemm(columns, true, dz, false, weights_[0].gradient.reshape(kernel_matrix().shape()),
                 1.0F, 1.0F);
    if (options_.use_bias) backend.column_sums(dz, weights_[1].gradient, 1.0F);
    if (!input_gradients.empty() && !input_gradients[0].empty()) {
      backend.gemm(dz, false, kernel_matrix(), true, columns);
      backend.col2im(columns, g, input_gradients[0]);
    }
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["filters"] = filters_;
    config["kernel_size"] = {kernel_size_.h, kernel_size_.w};
    config["strides"] = {options_.strides.h, options_.strides.w};
    config["padding"] = same_ ? "same" : "valid";
    config["data_format"] = "channels_last";
    config["dilation_rate"] = {options_.dilation_rate.h, options_.dilation_rate.w};
    config["groups"] = 1;
    config["activation"] = activation_name(activation_);
    config["use_bias"] = options_.use_bias;
    config["kernel_initializer"] = options_.kernel_initializer.to_json();
    config["bias_initializer"] = options_.bias_initializer.to_json();
    for (const char* key : {"kernel_regularizer", "bias_regularizer", "activity_regularizer",
                            "kernel_constraint", "bias_constraint"})
      config[key] = nullptr;
    return config;
  }

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "Conv2D");
    detail::expect_channels_last(read);
    read.expect("groups", 1, "loadstar has no grouped convolutions");
    if (!read.has("kernel_size")) read.fail("kernel_size", "a positive integer or a list of two");
    const std::string padding = read.get("padding", "valid");
    if (padding != "valid" && padding != "same") read.fail("padding", "\"valid\" or \"same\"");
    return detail::finish_layer(
        read, std::make_shared<Conv2D>(
                  read.positive("filters"), detail::config_size2(read, "kernel_size", 1),
                  Conv2DOptions{
                      .strides = detail::config_size2(read, "strides", 1),
                      .padding = padding,
                      .dilation_rate = detail::config_size2(read, "dilation_rate", 1),
                      .activation = detail::config_activation(read),
                      .use_bias = read.get("use_bias", true),
                      .kernel_initializer = detail::config_initializer(
                          read, "kernel_initializer", Initializer::glorot_uniform()),
                      .bias_initializer = detail::config_initializer(read, "bias_initializer",
                                                                     Initializer::zeros()),
                      .name = detail::config_name(read),
                  }));
  }

 private:
  Conv2DGeometry geometry(std::size_t batch) const {
    Conv2DGeometry g = geometry_;
    g.batch = batch;
    return g;
  }

  /// The kernel as the `(kh * kw * in, filters)` matrix that im2col rows multiply.
  Tensor<float> kernel_matrix() const {
    return weights_[0].value.reshape({geometry_.patch_size(), filters_});
  }

  std::size_t filters_;
  Size2 kernel_size_;
  keras::Activation activation_;
  Conv2DOptions options_;
  bool same_ = false;
  Conv2DGeometry geometry_;
  detail::Scratch columns_;
  detail::Scratch pre_activation_;
  detail::Scratch gradient_;
};

}  // namespace loadstar::keras::layers
