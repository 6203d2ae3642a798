/// \file
/// `Softmax`: the softmax over an axis or several axes jointly, as a layer.
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
  /// The axis (counted with the batch axis; negative from the end).
  int axis = -1;
  /// Keras's `axis` given as a list (`axis=(1, 2)`, `axis=[-2, -1]`): the softmax normalises over
  /// these axes jointly, and the config writes the list. When not empty, `axis` is not used.
  std::vector<int> axes = {};
  std::string name = {};
};

/// Keras's `Softmax` layer over `axis`, or over the joint `axes` (Keras 3's `exp(x -
/// logsumexp(x, axes))`: the maximum and the sum are taken over every element of those axes).
///
/// The mask is Keras's call argument `mask`: the layer's second input, or else the mask attached
/// to the inputs by an earlier layer (`Embedding(mask_zero=True)`, `Masking`), which Keras 3
/// passes as the same argument. Either broadcasts against the inputs as NumPy does, from the last
/// axis (Keras 3's `Softmax.call` does not expand it): it has at most the inputs' rank, and each
/// of its axes is 1 or the length of the inputs' axis it meets. So a mask attached to inputs
/// `(batch, steps, features)`, of shape `(batch, steps)`, meets `(steps, features)` and fits only
/// where Keras's does; otherwise it is refused by name, as Keras raises. Where the mask is not
/// above 0.5 the input is replaced by -1e9 before the softmax and the output is 0, so a position
/// masked along the whole of the axes gives zeros. The mask gets no gradient; an attached mask
/// passes to the output (Keras's `supports_masking`).
/// \code
/// Softmax softmax;
/// auto probabilities = call(std::make_shared<Softmax>(), {scores, mask});
/// auto joint = call(Softmax({.axes = {1, 2}}), feature_map);  // over rows and columns together
/// \endcode
class Softmax : public detail::LayerBase, public keras::detail::CallArguments {
 public:
  /// An attached mask passes to the output; with a mask given as the second input (the output's
  /// mask would be that one in Keras, of the inputs' rank), a mask attached to the inputs as well
  /// is refused.
  MaskFlow mask_flow() const noexcept override {
    return masked_ ? MaskFlow::refused : MaskFlow::passes;
  }
  bool reads_masks() const noexcept override { return true; }
  explicit Softmax(SoftmaxOptions options = {})
      : LayerBase(options.name),
        axes_(options.axes.empty() ? std::vector<int>{options.axis} : options.axes),
        axis_list_(!options.axes.empty()) {}

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

  /// Keras's config: `axis` an integer, or the list it was given as.
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
  /// `(a, b)` of `axes_`, for messages.
  LOADSTAR_DECL std::string axes_text() const;
  /// `y = softmax(x)` over the joint axes: one axis of a view when they are adjacent, else over
  /// the last axis of a copy that moves them to the end.
  LOADSTAR_DECL void joint_forward(Backend& backend, const Tensor<float>& x,
                                   const Tensor<float>& y);
  /// Sets `mask_strides_` for `mask` against inputs of `shape` (both with the batch axis),
  /// throwing `ShapeError` where it does not broadcast; `given` says which mask it is.
  LOADSTAR_DECL void broadcast_mask(const Shape& shape, const Shape& mask, bool given);
  /// `(batch, ..., n, ...)` of `shape` with the joint axes, adjacent, as one axis of length n.
  LOADSTAR_DECL Shape merged(const Shape& shape) const;
  /// `shape` with its axes in the order `to_end_`.
  LOADSTAR_DECL Shape permuted(const Shape& shape) const;
  /// `permuted(shape)` with the joint axes, now last, as one axis.
  LOADSTAR_DECL Shape moved_view(const Shape& shape) const;

  std::vector<int> axes_;   // as given
  bool axis_list_ = false;  // given as a list (the config writes it so)
  bool masked_ = false;
  // The joint axes, with the batch axis, ascending; whether they are adjacent; otherwise the
  // order that moves them to the end, and its inverse.
  std::vector<std::size_t> joint_, to_end_, from_end_;
  bool adjacent_ = true;
  detail::Scratch masked_inputs_, moved_x_, moved_y_, moved_dy_, moved_dx_;
  // The mask's stride per axis of the inputs (0 where it broadcasts) and an element's index.
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
  joint_.clear();
  for (const int given : axes_) {
    const int axis = given < 0 ? given + rank : given;
    if (axis < 1 || axis >= rank) {
      throw ConfigError(label() + ": axis " + std::to_string(given) +
                        " is not a non-batch axis of inputs of shape " +
                        batch_str(input_shapes[0]));
    }
    if (std::find(joint_.begin(), joint_.end(), static_cast<std::size_t>(axis)) != joint_.end()) {
      throw ConfigError(label() + ": axes " + axes_text() + " name axis " + std::to_string(axis) +
                        " twice for inputs of shape " + batch_str(input_shapes[0]));
    }
    joint_.push_back(static_cast<std::size_t>(axis));
  }
  std::sort(joint_.begin(), joint_.end());
  adjacent_ = joint_.back() - joint_.front() + 1 == joint_.size();
  to_end_.clear();
  for (std::size_t i = 0; i < static_cast<std::size_t>(rank); ++i)
    if (!std::binary_search(joint_.begin(), joint_.end(), i)) to_end_.push_back(i);
  to_end_.insert(to_end_.end(), joint_.begin(), joint_.end());
  from_end_.assign(to_end_.size(), 0);
  for (std::size_t i = 0; i < to_end_.size(); ++i)
    from_end_[to_end_[i]] = i;
  masked_ = input_shapes.size() == 2;
  if (masked_) {
    // Keras 3 checks the axes it knows, from the last; the mask's batch axis, met by one of the
    // inputs' other axes when the mask has fewer, is checked when a batch comes.
    const Shape& in = input_shapes[0];
    const Shape& mask = input_shapes[1];
    bool fits = mask.rank() <= in.rank();
    for (std::size_t j = 0; fits && j < mask.rank(); ++j) {
      const std::size_t i = j + in.rank() - mask.rank();
      fits = mask[j] == 1 || mask[j] == in[i] || mask[j] == keras::none || in[i] == keras::none;
    }
    if (!fits) {
      throw ShapeError(label() +
                       ": expects a mask of at most the inputs' rank whose every axis is 1 or "
                       "the length of the inputs' axis it meets, counted from the last (inputs " +
                       batch_str(in) + ") but got a mask of shape " + batch_str(mask));
    }
  }
  mask_strides_.assign(static_cast<std::size_t>(rank), 0);
  index_.assign(static_cast<std::size_t>(rank), 0);
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

Shape Softmax::merged(const Shape& shape) const {
  std::vector<std::size_t> dims(shape.begin(), shape.begin() + joint_.front());
  std::size_t n = 1;
  for (const std::size_t axis : joint_)
    n *= shape[axis];
  dims.push_back(n);
  dims.insert(dims.end(), shape.begin() + joint_.back() + 1, shape.end());
  return Shape(dims);
}

Shape Softmax::permuted(const Shape& shape) const {
  std::vector<std::size_t> dims;
  for (const std::size_t axis : to_end_)
    dims.push_back(shape[axis]);
  return Shape(dims);
}

Shape Softmax::moved_view(const Shape& shape) const {
  const std::size_t kept = shape.rank() - joint_.size();
  std::vector<std::size_t> dims;
  for (std::size_t i = 0; i < kept; ++i)
    dims.push_back(shape[to_end_[i]]);
  std::size_t n = 1;
  for (const std::size_t axis : joint_)
    n *= shape[axis];
  dims.push_back(n);
  return Shape(dims);
}

void Softmax::joint_forward(Backend& backend, const Tensor<float>& x, const Tensor<float>& y) {
  if (adjacent_) {
    const Shape view = merged(x.shape());
    backend.softmax_forward(x.reshape(view), y.reshape(view), joint_.front());
    return;
  }
  const Shape moved = permuted(x.shape());
  const Shape view = moved_view(x.shape());
  const Tensor<float> moved_x = moved_x_.get(backend, moved);
  const Tensor<float> moved_y = moved_y_.get(backend, moved);
  backend.permute(x, to_end_, moved_x);
  backend.softmax_forward(moved_x.reshape(view), moved_y.reshape(view), view.rank() - 1);
  backend.permute(moved_y, from_end_, y);
}

void Softmax::broadcast_mask(const Shape& shape, const Shape& mask, bool given) {
  bool fits = mask.rank() <= shape.rank();
  for (std::size_t j = 0; fits && j < mask.rank(); ++j) {
    const std::size_t i = j + shape.rank() - mask.rank();
    fits = mask[j] == 1 || mask[j] == shape[i];
  }
  if (!fits) {
    // Keras 3 raises on the axes it knows when the layer is called, and NumPy's broadcasting
    // fails (or would change the output's shape) on the others.
    throw ShapeError(
        label() + ": " +
        (given ? std::string("expects a mask")
               : std::string("is given the mask attached to its inputs by an earlier layer, "
                             "which Keras 3 broadcasts against them from the last axis; "
                             "expects it")) +
        " of at most the inputs' rank whose every axis is 1 or the length of the inputs' axis it "
        "meets, counted from the last (inputs " +
        shape.str() + ") but got one of shape " + mask.str());
  }
  // For each axis of the inputs, the stride of the mask's axis it meets (0 where it broadcasts).
  std::fill(mask_strides_.begin(), mask_strides_.end(), 0);
  std::size_t stride = 1;
  for (std::size_t j = mask.rank(); j-- > 0;) {
    const std::size_t i = j + shape.rank() - mask.rank();
    mask_strides_[i] = mask[j] == 1 ? 0 : stride;
    stride *= mask[j];
  }
}

void Softmax::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  const Tensor<float> mask = masked_ ? inputs[1] : detail::input_mask(ctx, 0);
  if (mask.empty()) {
    joint_forward(ctx.backend, inputs[0], output);
    return;
  }
  // Keras 3: where(mask > 0.5, x, -1e9), the softmax, then where(mask > 0.5, y, 0).
  const Shape& shape = inputs[0].shape();
  broadcast_mask(shape, mask.shape(), masked_);
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
  const Tensor<float> before[] = {inputs[0], mask, masked};
  ctx.backend.host_kernel(before, [&](std::span<const Tensor<float>> t) {
    const float *x = t[0].data(), *m = t[1].data();
    float* y = t[2].data();
    visit([&](std::size_t e, std::size_t at) { y[e] = m[at] > 0.5F ? x[e] : -1e9F; });
  });
  joint_forward(ctx.backend, masked, output);
  const Tensor<float> after[] = {mask, output};
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
  const Tensor<float>& dx = input_gradients[0];
  Backend& backend = ctx.backend;
  if (adjacent_) {
    const Shape view = merged(output.shape());
    backend.softmax_backward(output.reshape(view), output_gradient.reshape(view), dx.reshape(view),
                             joint_.front());
    return;
  }
  const Shape moved = permuted(output.shape());
  const Shape view = moved_view(output.shape());
  const Tensor<float> moved_y = moved_y_.get(backend, moved);
  const Tensor<float> moved_dy = moved_dy_.get(backend, moved);
  const Tensor<float> moved_dx = moved_dx_.get(backend, moved);
  backend.permute(output, to_end_, moved_y);
  backend.permute(output_gradient, to_end_, moved_dy);
  backend.softmax_backward(moved_y.reshape(view), moved_dy.reshape(view), moved_dx.reshape(view),
                           view.rank() - 1);
  backend.permute(moved_dx, from_end_, dx);
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

std::string Softmax::axes_text() const {
  std::string text = "(";
  for (std::size_t i = 0; i < axes_.size(); ++i)
    text += (i == 0 ? "" : ", ") + std::to_string(axes_[i]);
  return text + ")";
}

nlohmann::json Softmax::get_config() const {
  auto config = base_config();
  // Keras writes `self.axis` as it was given: an integer, or a tuple or list as a JSON list.
  config["axis"] = axis_list_ ? nlohmann::json(axes_) : nlohmann::json(axes_.front());
  return config;
}

std::shared_ptr<Layer> Softmax::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Softmax");
  SoftmaxOptions options{.name = detail::config_name(read)};
  if (const nlohmann::json* axis = read.find("axis"); axis != nullptr && axis->is_array()) {
    if (axis->empty()) read.fail("axis", "an integer or a list of integers");
    for (const auto& value : *axis) {
      if (!keras::detail::ConfigValue<int>::fits(value))
        read.fail("axis", "an integer or a list of integers");
      options.axes.push_back(value.get<int>());
    }
  } else if (axis != nullptr && !axis->is_null()) {
    if (!keras::detail::ConfigValue<int>::fits(*axis))
      read.fail("axis", "an integer or a list of integers");
    options.axis = axis->get<int>();
  }
  return detail::finish_layer(read, std::make_shared<Softmax>(std::move(options)));
}

}  // namespace loadstar::keras::layers
#endif
