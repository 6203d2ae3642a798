/// \file
/// `UnitNormalization`: scales each sample to unit L2 norm over some axes.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <vector>

#include "loadstar/keras/detail/layer_kernels.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `UnitNormalization`'s Keras arguments, with Keras's defaults.
struct UnitNormalizationOptions {
  /// The axes normalised over, numbered as Keras does with the batch axis as 0 (`-1`: the last).
  std::vector<int> axis = {-1};
  std::string name = {};
};

/// Keras's `UnitNormalization`: `x / sqrt(max(sum(x^2), 1e-12))` with the sum over `axis` per
/// sample (`tf.math.l2_normalize`).
/// \code
/// UnitNormalization unit;
/// \endcode
class UnitNormalization : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras's `supports_masking`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  LOADSTAR_DECL explicit UnitNormalization(UnitNormalizationOptions options = {});

  std::string class_name() const override { return "UnitNormalization"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Axes of unknown length anywhere, settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
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
  /// Sets `groups_` and the axes of samples of shape `in` when it differs from the last's.
  LOADSTAR_DECL void settle(const Shape& in);
  /// The kernel `op` over a batch of `rows` samples.
  LOADSTAR_DECL keras::detail::LayerKernel kernel(keras::detail::LayerOp op,
                                                  std::size_t rows) const;

  UnitNormalizationOptions options_;
  std::vector<bool> normalised_;  // per sample axis
  Shape indexed_;                 // the sample shape `dims_` and `strides_` are for
  /// The batch axis (its size set per batch) and a sample's axes, and their strides into the
  /// groups (the coordinates on the axes not normalised over, the batch's first).
  std::vector<std::size_t> dims_, strides_;
  std::size_t groups_ = 1;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

UnitNormalization::UnitNormalization(UnitNormalizationOptions options)
    : LayerBase(options.name), options_(std::move(options)) {
  if (options_.axis.empty()) throw ConfigError(label() + ": axis must name at least one axis");
}

Shape UnitNormalization::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  const auto rank = static_cast<int>(in.rank()) + 1;
  std::vector<bool> normalised(in.rank(), false);
  for (const int a : options_.axis) {
    const int axis = a < 0 ? a + rank : a;
    if (axis < 1 || axis >= rank || normalised[std::size_t(axis - 1)]) {
      throw ShapeError(label() + ": axis " + std::to_string(a) +
                       " is not a distinct axis of a sample of inputs of shape " + batch_str(in));
    }
    normalised[std::size_t(axis - 1)] = true;
  }
  normalised_ = std::move(normalised);
  indexed_ = Shape();
  if (!keras::detail::has_unknown_axis(in)) settle(in);
  remember(input_shapes, in);
  return in;
}

void UnitNormalization::settle(const Shape& in) {
  if (in == indexed_ && !dims_.empty()) return;
  dims_.assign(1, 0);
  dims_.insert(dims_.end(), in.begin(), in.end());
  strides_.assign(dims_.size(), 0);
  groups_ = 1;
  for (std::size_t i = in.rank(); i-- > 0;) {
    if (normalised_[i]) continue;
    strides_[i + 1] = groups_;
    groups_ *= in[i];
  }
  strides_[0] = groups_;
  indexed_ = in;
}

keras::detail::LayerKernel UnitNormalization::kernel(keras::detail::LayerOp op,
                                                     std::size_t rows) const {
  std::vector<std::size_t> dims = dims_;
  dims[0] = rows;
  keras::detail::LayerKernel kernel{.op = op};
  kernel.map = keras::detail::broadcast_map(dims.data(), strides_.data(), dims.size());
  return kernel;
}

void UnitNormalization::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0].shape().row_shape());
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::unit_normalize, inputs[0].rows()),
                           std::array{inputs[0], output}, inputs[0].rows() * groups_);
}

void UnitNormalization::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                 const Tensor<float>& output_gradient,
                                 std::span<const Tensor<float>> input_gradients,
                                 const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(inputs[0].shape().row_shape());
  ctx.backend.layer_kernel(
      kernel(keras::detail::LayerOp::unit_normalize_backward, inputs[0].rows()),
      std::array{inputs[0], output_gradient, input_gradients[0]}, inputs[0].rows() * groups_);
}

nlohmann::json UnitNormalization::get_config() const {
  auto config = base_config();
  config["axis"] =
      options_.axis.size() == 1 ? nlohmann::json(options_.axis[0]) : nlohmann::json(options_.axis);
  return config;
}

std::shared_ptr<Layer> UnitNormalization::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "UnitNormalization");
  std::vector<int> axis = {-1};
  if (read.has("axis")) {
    const nlohmann::json& v = *read.find("axis");
    if (v.is_number_integer()) {
      axis = {v.get<int>()};
    } else if (v.is_array() && !v.empty() && std::all_of(v.begin(), v.end(), [](const auto& a) {
                 return a.is_number_integer();
               })) {
      axis = v.get<std::vector<int>>();
    } else {
      read.fail("axis", "an integer or a list of integers");
    }
  }
  return detail::finish_layer(read, std::make_shared<UnitNormalization>(UnitNormalizationOptions{
                                        .axis = axis, .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
