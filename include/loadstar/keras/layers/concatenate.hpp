/// \file
/// `Concatenate`: joins its inputs along an axis.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"
#include "loadstar/keras/losses/detail/row_loss.hpp"

namespace loadstar::keras::layers {

/// `Concatenate`'s Keras arguments, with Keras's default `axis = -1`.
struct ConcatenateOptions {
  int axis = -1;
  std::string name = {};
};

/// Keras's `Concatenate`: inputs equal in every axis but `axis` (counted with the batch axis, as
/// in Keras; negative from the end) joined along it.
/// \code
/// Concatenate concat;  // along the last axis
/// \endcode
class Concatenate : public detail::LayerBase {
 public:
  explicit Concatenate(ConcatenateOptions options = {})
      : LayerBase(options.name), axis_(options.axis) {}

  std::string class_name() const override { return "Concatenate"; }
  /// Along the last axis, the output's mask is the OR of the inputs' masks; along another, the
  /// inputs' masks joined along it, an unmasked input's steps all counting (Keras 3's
  /// `Concatenate.compute_mask`).
  MaskFlow mask_flow() const noexcept override {
    return along_last_ ? MaskFlow::any_of : MaskFlow::joins;
  }
  LOADSTAR_DECL void compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                                  const CallContext& ctx) override;

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Any axis may have an unknown length; the one joined along has one when an input's has.
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  int axis_;
  bool along_last_ = true;
  std::size_t axis_in_sample_ = 0;
  std::vector<std::size_t> extents_;
  detail::Scratch ones_;                   // the mask of an unmasked input
  std::vector<Tensor<float>> mask_parts_;  // compute_mask's parts, reused
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Concatenate::build(std::span<const Shape> input_shapes, std::uint64_t) {
  if (input_shapes.size() < 2) {
    throw ShapeError(label() + ": expects at least 2 inputs but got " +
                     std::to_string(input_shapes.size()));
  }
  const auto rank = static_cast<int>(input_shapes[0].rank()) + 1;  // with the batch axis
  const int axis = axis_ < 0 ? axis_ + rank : axis_;
  along_last_ = axis == rank - 1;
  if (axis < 1 || axis >= rank) {
    throw ConfigError(label() + ": axis " + std::to_string(axis_) +
                      " is not a non-batch axis of inputs of shape " + batch_str(input_shapes[0]));
  }
  axis_in_sample_ = static_cast<std::size_t>(axis - 1);
  Shape out = input_shapes[0];
  out[axis_in_sample_] = 0;
  extents_.clear();
  for (const Shape& s : input_shapes) {
    bool fits = s.rank() == out.rank();
    for (std::size_t i = 0; fits && i < s.rank(); ++i)
      fits = i == axis_in_sample_ || s[i] == input_shapes[0][i];
    if (!fits) {
      throw ShapeError(label() + ": inputs must match except along axis " + std::to_string(axis_) +
                       " but got shapes " + batch_str(input_shapes[0]) + " and " + batch_str(s));
    }
    extents_.push_back(s[axis_in_sample_]);
  }
  // An input of unknown length along the axis (None) gives the output an unknown length there.
  const bool known = std::find(extents_.begin(), extents_.end(), none) == extents_.end();
  for (const std::size_t extent : extents_)
    out[axis_in_sample_] += known ? extent : 0;
  remember(input_shapes, out);
  return out;
}

Shape Concatenate::output_shape_for(std::span<const Shape> input_shapes) const {
  Shape out = input_shapes[0];
  out[axis_in_sample_] = 0;
  for (const Shape& s : input_shapes) {
    for (std::size_t i = 0; i < s.rank(); ++i) {
      if (i != axis_in_sample_ && s[i] != input_shapes[0][i]) {
        throw ShapeError(label() + ": inputs must match except along axis " +
                         std::to_string(axis_) + " but got shapes " + batch_str(input_shapes[0]) +
                         " and " + batch_str(s));
      }
    }
    out[axis_in_sample_] += s[axis_in_sample_];
  }
  return out;
}

void Concatenate::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                          const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.concatenate(inputs, axis_in_sample_ + 1, output);
}

void Concatenate::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                           const Tensor<float>& output_gradient,
                           std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  // This batch's lengths along the axis (those of the build where they are known).
  extents_.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    extents_[i] = inputs[i].shape()[axis_in_sample_ + 1];
  ctx.backend.split(output_gradient, axis_in_sample_ + 1, extents_, input_gradients);
}

void Concatenate::compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                               const CallContext& ctx) {
  // An unmasked input's part of the mask is all 1: views of one buffer of ones.
  const auto has_mask = [&](std::size_t i) {
    return i < ctx.input_masks.size() && !ctx.input_masks[i].empty();
  };
  std::size_t largest = 0;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!has_mask(i)) {
      largest = std::max(largest, keras::detail::without_last_axis(inputs[i].shape()).elements());
    }
  }
  Tensor<float> ones;
  if (largest > 0) {
    ones = ones_.get(ctx.backend, Shape{largest});
    ctx.backend.fill(ones, 1.0F);
  }
  mask_parts_.resize(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (has_mask(i)) {
      mask_parts_[i] = ctx.input_masks[i];
    } else {
      const Shape shape = keras::detail::without_last_axis(inputs[i].shape());
      mask_parts_[i] = ones.slice_rows(0, shape.elements()).reshape(shape);
    }
  }
  ctx.backend.concatenate(mask_parts_, axis_in_sample_ + 1, mask);
}

nlohmann::json Concatenate::get_config() const {
  auto config = base_config();
  config["axis"] = axis_;
  return config;
}

std::shared_ptr<Layer> Concatenate::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Concatenate");
  return detail::finish_layer(
      read, std::make_shared<Concatenate>(ConcatenateOptions{.axis = detail::config_axis(read, -1),
                                                             .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
