/// \file
/// `Softmax`: the softmax over an axis, as a layer.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "loadstar/keras/detail/call_arguments.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Softmax`'s Keras arguments, with Keras's default `axis = -1`.
struct SoftmaxOptions {
  int axis = -1;
  std::string name = {};
};

/// Keras's `Softmax` layer over `axis` (counted with the batch axis; negative from the end).
///
/// Keras's call argument `mask` is the layer's second input: a tensor of the inputs' rank, each
/// axis of the inputs' length or 1 (broadcast); where it is not above 0.5 the input is replaced
/// by -1e9 before the softmax and the output is 0 (Keras 3's `Softmax.call`), so a position
/// masked along the whole axis gives zeros. The mask gets no gradient. A mask flowing from an
/// earlier layer (`Embedding(mask_zero=True)`), which Keras would broadcast against the inputs
/// from their last axis, is refused.
/// \code
/// Softmax softmax;
/// auto probabilities = call(std::make_shared<Softmax>(), {scores, mask});
/// \endcode
class Softmax : public detail::LayerBase, public keras::detail::CallArguments {
 public:
  MaskFlow mask_flow() const noexcept override { return MaskFlow::refused; }
  explicit Softmax(SoftmaxOptions options = {}) : LayerBase(options.name), axis_(options.axis) {}

  std::string class_name() const override { return "Softmax"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
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

  /// `mask` when the layer is called with one (its second input), or before its first call.
  std::vector<std::string> tensor_arguments() const override {
    if (built() && !masked_) return {};
    return {"mask"};
  }
  void tensor_arguments_given(const std::vector<std::string>& names) override {
    masked_ = !names.empty();
  }
  nlohmann::json call_kwargs() const override { return nlohmann::json::object(); }
  LOADSTAR_DECL void apply_call_kwargs(const nlohmann::json& kwargs,
                                       const std::string& where) override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  int axis_;
  std::size_t axis_with_batch_ = 1;
  bool masked_ = false;
  detail::Scratch masked_inputs_;
  // The mask's stride per axis (0 where it broadcasts) and an element's index: sized by `build`.
  std::vector<std::size_t> mask_strides_, index_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Softmax::build(std::span<const Shape> input_shapes, std::uint64_t) {
  if (input_shapes.size() != 1 && input_shapes.size() != 2) {
    throw ShapeError(label() + ": expects its inputs and at most a mask but got " +
                     std::to_string(input_shapes.size()) + " inputs");
  }
  const auto rank = static_cast<int>(input_shapes[0].rank()) + 1;
  const int axis = axis_ < 0 ? axis_ + rank : axis_;
  if (axis < 1 || axis >= rank) {
    throw ConfigError(label() + ": axis " + std::to_string(axis_) +
                      " is not a non-batch axis of inputs of shape " + batch_str(input_shapes[0]));
  }
  masked_ = input_shapes.size() == 2;
  if (masked_) {
    const Shape& in = input_shapes[0];
    const Shape& mask = input_shapes[1];
    bool fits = mask.rank() == in.rank();
    for (std::size_t i = 0; fits && i < in.rank(); ++i)
      fits = mask[i] == 1 || mask[i] == in[i] || mask[i] == keras::none || in[i] == keras::none;
    if (!fits) {
      throw ShapeError(label() +
                       ": expects a mask of the inputs' rank whose every axis is 1 or "
                       "the inputs' length (inputs " +
                       batch_str(in) + ") but got a mask of shape " + batch_str(mask));
    }
  }
  axis_with_batch_ = static_cast<std::size_t>(axis);
  mask_strides_.assign(static_cast<std::size_t>(rank), 0);
  index_.assign(static_cast<std::size_t>(rank), 0);
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

void Softmax::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  if (!masked_) {
    ctx.backend.softmax_forward(inputs[0], output, axis_with_batch_);
    return;
  }
  // Keras 3: where(mask > 0.5, x, -1e9), the softmax, then where(mask > 0.5, y, 0).
  const Shape& shape = inputs[0].shape();
  const Shape& mask_shape = inputs[1].shape();
  if (mask_shape.rank() != shape.rank() || mask_shape[0] != shape[0]) {
    throw ShapeError(label() + ": expects a mask of " + std::to_string(shape[0]) +
                     " samples and rank " + std::to_string(shape.rank()) +
                     " but got one of shape " + mask_shape.str());
  }
  for (std::size_t i = 1; i < shape.rank(); ++i) {
    if (mask_shape[i] != 1 && mask_shape[i] != shape[i]) {
      throw ShapeError(label() + ": expects a mask whose every axis is 1 or the inputs' length " +
                       "(inputs " + shape.str() + ") but got one of shape " + mask_shape.str());
    }
  }
  // For each element of the inputs, its element of the mask (0 strides on broadcast axes).
  std::size_t stride = 1;
  for (std::size_t i = shape.rank(); i-- > 0;) {
    mask_strides_[i] = mask_shape[i] == 1 ? 0 : stride;
    stride *= mask_shape[i];
  }
  const auto visit = [&](auto&& f) {
    std::fill(index_.begin(), index_.end(), 0);
    std::size_t at = 0;
    for (std::size_t e = 0, n = shape.elements(); e < n; ++e) {
      f(e, at);
      for (std::size_t i = shape.rank(); i-- > 0;) {
        at += mask_strides_[i];
        if (++index_[i] < shape[i]) break;
        at -= mask_strides_[i] * shape[i];
        index_[i] = 0;
      }
    }
  };
  const Tensor<float> masked = masked_inputs_.get(ctx.backend, shape);
  const Tensor<float> before[] = {inputs[0], inputs[1], masked};
  ctx.backend.host_kernel(before, [&](std::span<const Tensor<float>> t) {
    const float *x = t[0].data(), *m = t[1].data();
    float* y = t[2].data();
    visit([&](std::size_t e, std::size_t at) { y[e] = m[at] > 0.5F ? x[e] : -1e9F; });
  });
  ctx.backend.softmax_forward(masked, output, axis_with_batch_);
  const Tensor<float> after[] = {inputs[1], output};
  ctx.backend.host_kernel(after, [&](std::span<const Tensor<float>> t) {
    const float* m = t[0].data();
    float* y = t[1].data();
    visit([&](std::size_t e, std::size_t at) {
      if (!(m[at] > 0.5F)) y[e] = 0.0F;
    });
  });
}

void Softmax::backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  // With a mask, the output is 0 at the masked positions (and there a softmax output that
  // underflowed to 0, or a uniform one the mask zeroed), so the softmax's gradient through the
  // output gives 0 there and the masked inputs' constant nothing: the same formula.
  static_cast<void>(inputs);
  if (input_gradients.size() > 1 && !input_gradients[1].empty())
    ctx.backend.fill(input_gradients[1], 0.0F);
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.softmax_backward(output, output_gradient, input_gradients[0], axis_with_batch_);
}

void Softmax::apply_call_kwargs(const nlohmann::json& kwargs, const std::string& where) {
  for (const auto& [key, value] : kwargs.items()) {
    // A null mask, or the mask tensor `tensor_arguments_given` saw; Keras records no other.
    if (key == "mask" && (value.is_null() || keras::detail::is_tensor_reference(value))) {
      masked_ = !value.is_null();
      continue;
    }
    throw ConfigError(where + ": unknown call argument '" + key +
                      "' of Softmax (its call takes "
                      "the inputs and a mask)");
  }
}

nlohmann::json Softmax::get_config() const {
  auto config = base_config();
  config["axis"] = axis_;
  return config;
}

std::shared_ptr<Layer> Softmax::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Softmax");
  return detail::finish_layer(
      read, std::make_shared<Softmax>(SoftmaxOptions{.axis = detail::config_axis(read, -1),
                                                     .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
