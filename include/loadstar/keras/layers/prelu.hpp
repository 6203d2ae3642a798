/// \file
/// `PReLU`: a leaky rectifier whose negative slopes are weights.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <vector>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `PReLU`'s Keras arguments, with Keras's defaults.
struct PReLUOptions {
  Initializer alpha_initializer = Initializer::zeros();
  /// The sample axes (1-based, Keras's numbering with the batch axis 0) along which one slope is
  /// shared: `{1, 2}` for one slope per channel of an image.
  std::vector<std::size_t> shared_axes = {};
  std::string name = {};
};

/// Keras's `PReLU`: `x` above 0, `alpha * x` below, with a weight `alpha` of the sample's shape
/// (size 1 along `shared_axes`).
/// \code
/// PReLU per_channel({.shared_axes = {1, 2}});
/// \endcode
class PReLU : public detail::SameShapeLayer {
 public:
  LOADSTAR_DECL explicit PReLU(PReLUOptions options = {});

  std::string class_name() const override { return "PReLU"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// `alpha` has the input's shape (but for `shared_axes`): every length must be known.
  bool takes_unknown_axes() const noexcept override { return false; }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  PReLUOptions options_;
  /// The kernel `op` over a batch of `rows` samples: each element's slope under `slope_map`.
  LOADSTAR_DECL keras::detail::LayerKernel kernel(keras::detail::LayerOp op,
                                                  std::size_t rows) const;

  /// The batch axis (size unknown here) and a sample's axes, and their strides into `alpha` (0
  /// along the batch and the shared axes).
  std::vector<std::size_t> dims_, alpha_strides_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

PReLU::PReLU(PReLUOptions options) : SameShapeLayer(options.name), options_(std::move(options)) {
  for (const std::size_t axis : options_.shared_axes) {
    if (axis == 0) throw ConfigError(label() + ": shared_axes cannot hold the batch axis 0");
  }
}

Shape PReLU::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  std::vector<std::size_t> dims(in.begin(), in.end());
  for (const std::size_t axis : options_.shared_axes) {
    if (axis > in.rank()) {
      throw ShapeError(label() + ": shared axis " + std::to_string(axis) +
                       " is not an axis of inputs of shape " + batch_str(in));
    }
    dims[axis - 1] = 1;
  }
  const Shape alpha_shape(dims);
  // Each element's slope: its index with the shared axes at 0, in alpha's row-major order.
  dims_.assign(1, 0);
  dims_.insert(dims_.end(), in.begin(), in.end());
  alpha_strides_.assign(dims_.size(), 0);
  std::size_t stride = 1;
  for (std::size_t a = in.rank(); a-- > 0;) {
    if (dims[a] == 1) continue;
    alpha_strides_[a + 1] = stride;
    stride *= dims[a];
  }
  if (!weights_.empty()) {
    if (weights_[0].value.shape() != alpha_shape) {
      throw ShapeError(label() + ": alpha is " + weights_[0].value.shape().str() +
                       " but inputs of shape " + batch_str(in) + " need " + alpha_shape.str());
    }
  } else {
    Tensor<float> alpha(alpha_shape);
    options_.alpha_initializer.fill(alpha, seed);
    add_weight("alpha", alpha);
  }
  remember(input_shapes, in);
  return in;
}

void PReLU::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                    const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::prelu, inputs[0].rows()),
                           std::array{inputs[0], weights_[0].value, output}, output.size());
}

void PReLU::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                     const Tensor<float>& output_gradient,
                     std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  const Variable& alpha = weights_[0];
  if (!input_gradients.empty() && !input_gradients[0].empty()) {
    ctx.backend.layer_kernel(
        kernel(keras::detail::LayerOp::prelu_backward, inputs[0].rows()),
        std::array{inputs[0], alpha.value, output_gradient, input_gradients[0]},
        input_gradients[0].size());
  }
  // d(-alpha * relu(-x)) / d alpha = min(x, 0), summed over the elements sharing a slope.
  if (!alpha.gradient.empty()) {
    ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::prelu_alpha_gradient, inputs[0].rows()),
                             std::array{inputs[0], alpha.value, output_gradient, alpha.gradient},
                             alpha.gradient.size());
  }
}

nlohmann::json PReLU::get_config() const {
  auto config = base_config();
  config["alpha_initializer"] = options_.alpha_initializer.to_json();
  write_weight_options(config, {"alpha"});
  config["shared_axes"] =
      options_.shared_axes.empty() ? nlohmann::json(nullptr) : nlohmann::json(options_.shared_axes);
  return config;
}

std::shared_ptr<Layer> PReLU::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "PReLU");
  PReLUOptions options{.alpha_initializer = detail::config_initializer(read, "alpha_initializer",
                                                                       Initializer::zeros()),
                       .name = detail::config_name(read)};
  if (read.has("shared_axes")) {
    const nlohmann::json& v = *read.find("shared_axes");
    const auto axis = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() > 0;
    };
    if (axis(v)) {
      options.shared_axes = {v.get<std::size_t>()};
    } else if (v.is_array() && std::all_of(v.begin(), v.end(), axis)) {
      options.shared_axes = v.get<std::vector<std::size_t>>();
    } else {
      read.fail("shared_axes", "a positive axis or a list of them");
    }
  }
  return detail::finish_layer(read, std::make_shared<PReLU>(options));
}

keras::detail::LayerKernel PReLU::kernel(keras::detail::LayerOp op, std::size_t rows) const {
  std::vector<std::size_t> dims = dims_;
  dims[0] = rows;
  keras::detail::LayerKernel kernel{.op = op};
  kernel.map = keras::detail::broadcast_map(dims.data(), alpha_strides_.data(), dims.size());
  return kernel;
}

}  // namespace loadstar::keras::layers
#endif
