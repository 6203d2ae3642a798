/// \file
/// `Dense`: Keras's densely connected layer, `activation(x * kernel + bias)`.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/detail/relu_fusion.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Dense`'s Keras arguments after `units`, with Keras's defaults.
struct DenseOptions {
  std::string activation = "linear";
  bool use_bias = true;
  Initializer kernel_initializer = Initializer::glorot_uniform();
  Initializer bias_initializer = Initializer::zeros();
  std::string name = {};
};

/// Keras's `Dense`: `activation(x * kernel + bias)` over the last axis; weights `kernel`
/// `(in, units)` and `bias` `(units,)`.
/// \code
/// Dense hidden(128, {.activation = "relu"});
/// Dense logits(10);
/// \endcode
class Dense : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras's `supports_masking`): a `Dense` on every step.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  LOADSTAR_DECL explicit Dense(std::size_t units, DenseOptions options = {});

  std::string class_name() const override { return "Dense"; }
  std::size_t units() const noexcept { return units_; }
  keras::Activation activation() const noexcept { return activation_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Any axis but the last (the features) may have an unknown length.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    Shape out = input_shapes[0];
    out[out.rank() - 1] = units_;
    return out;
  }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;
  /// Writes its gradients when it is called once per step (`Backend::weight_gradients`).
  bool writes_gradients() const noexcept override { return true; }
  /// Its input gradient may go through the previous `Dense` layer's ReLU; with a ReLU and a bias,
  /// its forward may record the ReLU and leave its gradient to the next `Dense` layer's backward
  /// (where the backend fuses them: `Backend::dense_forward_relu_mask`).
  keras::detail::FusionRole fusion_role() const noexcept override {
    using keras::detail::FusionRole;
    return activation_ == keras::Activation::relu && options_.use_bias
               ? FusionRole::through_masked_relu | FusionRole::masked_relu
               : FusionRole::through_masked_relu;
  }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  /// The layer described by a Keras config (the registry's factory).
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  LOADSTAR_DECL void affine(Backend& backend, const Tensor<float>& x, const Tensor<float>& y);
  /// The empty tensor given for the bias (and its gradient) of a layer without one.
  static const Tensor<float>& no_bias() noexcept {
    static const Tensor<float> empty;
    return empty;
  }

  std::size_t units_;
  std::size_t features_ = 0;
  keras::Activation activation_;
  DenseOptions options_;
  detail::Scratch pre_activation_;
  detail::Scratch gradient_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Dense::Dense(std::size_t units, DenseOptions options)
    : LayerBase(options.name),
      units_(units),
      activation_(activation_from_name(options.activation)),
      options_(std::move(options)) {
  if (units == 0) throw ConfigError("dense layer '" + name() + "': units must be positive");
}

Shape Dense::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() < 1) {
    throw ShapeError(label() +
                     ": expects inputs of rank 1 or more (without the batch axis) but "
                     "got " +
                     in.str());
  }
  const std::size_t features = in[in.rank() - 1];
  if (features == 0) {
    throw ShapeError(label() + ": the last axis of its input (the features) must have a known " +
                     "length but the input is " + batch_str(in));
  }
  if (!weights_.empty()) {
    if (weights_[0].value.dim(0) != features) {
      throw ShapeError(label() + ": kernel is " + std::to_string(features_) + "x" +
                       std::to_string(units_) + " but the input has " + std::to_string(features) +
                       " features");
    }
  } else {
    features_ = features;
    Tensor<float> kernel({features, units_});
    options_.kernel_initializer.fill(kernel, seed);
    add_weight("kernel", kernel);
    if (options_.use_bias) {
      Tensor<float> bias({units_});
      options_.bias_initializer.fill(bias, SplitMix64::mix(seed + 1));
      add_weight("bias", bias);
    }
  }
  Shape out = in;
  out[out.rank() - 1] = units_;
  remember(input_shapes, out);
  return out;
}

void Dense::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                    const CallContext& ctx) {
  check_inputs(inputs);
  const std::size_t rows = inputs[0].size() / features_;
  const Tensor<float> y = output.reshape({rows, units_});
  const Tensor<float> x = inputs[0].reshape({rows, features_});
  if (keras::detail::ReluGradientFusion* fusion = keras::detail::fused_output(ctx)) {
    fusion->mask_written = false;
    fusion->gradient_written = false;
    if (keras::detail::has_role(fusion_role(), keras::detail::FusionRole::masked_relu) &&
        !weights_[1].gradient.empty()) {
      fusion->bias_gradient = weights_[1].gradient;
      fusion->mask_written = ctx.backend.dense_forward_relu_mask(
          x, weights_[0].value, weights_[1].value, y, fusion->mask);
      if (fusion->mask_written) return;
    }
  }
  if (ctx.backend.dense_forward(x, weights_[0].value,
                                options_.use_bias ? weights_[1].value : no_bias(), activation_,
                                y)) {
    return;
  }
  affine(ctx.backend, x, y);
  if (activation_ != keras::Activation::linear) ctx.backend.activation_forward(activation_, y, y);
}

void Dense::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                     const Tensor<float>& output_gradient,
                     std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  Backend& backend = ctx.backend;
  const std::size_t rows = inputs[0].size() / features_;
  const Tensor<float> x = inputs[0].reshape({rows, features_});
  Tensor<float> dz = output_gradient.reshape({rows, units_});
  // The next layer's backward carried the gradient through this layer's ReLU and wrote its bias
  // gradient (`keras::detail::ReluGradientFusion`): the output gradient is the pre-activation's.
  keras::detail::ReluGradientFusion* fused = keras::detail::fused_output(ctx);
  const bool carried = fused != nullptr && fused->gradient_written;
  if (fused != nullptr) fused->mask_written = fused->gradient_written = false;
  // A frozen layer's weights take no step (optimizers skip non-trainable variables): no weight
  // gradients, only the input's.
  const bool frozen = !weights_[0].trainable;
  if (carried) {
    if (!frozen) {
      backend.weight_gradients(x, dz, weights_[0].gradient, no_bias(), ctx.accumulate_gradients);
    }
  } else if (activation_ != keras::Activation::linear) {
    Tensor<float> z;
    if (activation_gradient_needs_input(activation_)) {
      // The pre-activation is recomputed rather than kept, so a shared layer stays correct.
      z = pre_activation_.get(backend, {rows, units_});
      affine(backend, x, z);
    }
    const Tensor<float> gradient = gradient_.get(backend, {rows, units_});
    backend.activation_backward(activation_, z, output.reshape({rows, units_}), dz, gradient);
    dz = gradient;
  }
  if (!carried && !frozen) {
    backend.weight_gradients(x, dz, weights_[0].gradient,
                             options_.use_bias ? weights_[1].gradient : no_bias(),
                             ctx.accumulate_gradients);
  }
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const Tensor<float> dx = input_gradients[0].reshape({rows, features_});
  keras::detail::ReluGradientFusion* input = keras::detail::fused_input(ctx);
  if (input != nullptr && input->mask_written && input->mask != nullptr &&
      backend.dense_input_gradient_relu(dz, weights_[0].value, *input->mask, dx,
                                        input->bias_gradient)) {
    input->gradient_written = true;
    return;
  }
  backend.gemm(dz, false, weights_[0].value, true, dx);
}

nlohmann::json Dense::get_config() const {
  auto config = base_config();
  config["units"] = units_;
  config["activation"] = activation_name(activation_);
  config["use_bias"] = options_.use_bias;
  config["kernel_initializer"] = options_.kernel_initializer.to_json();
  config["bias_initializer"] = options_.bias_initializer.to_json();
  write_weight_options(config, {"kernel", "bias"});
  config["activity_regularizer"] = regularizer_json(nullptr);
  return config;
}

std::shared_ptr<Layer> Dense::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Dense");
  return detail::finish_layer(
      read,
      std::make_shared<Dense>(read.positive("units"),
                              DenseOptions{
                                  .activation = detail::config_activation(read),
                                  .use_bias = read.get("use_bias", true),
                                  .kernel_initializer = detail::config_initializer(
                                      read, "kernel_initializer", Initializer::glorot_uniform()),
                                  .bias_initializer = detail::config_initializer(
                                      read, "bias_initializer", Initializer::zeros()),
                                  .name = detail::config_name(read),
                              }));
}

void Dense::affine(Backend& backend, const Tensor<float>& x, const Tensor<float>& y) {
  backend.gemm(x, false, weights_[0].value, false, y);
  if (options_.use_bias) backend.bias_add(y, weights_[1].value);
}

}  // namespace loadstar::keras::layers
#endif
