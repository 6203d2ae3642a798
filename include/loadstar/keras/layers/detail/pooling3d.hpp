/// \file
/// The shared part of `MaxPooling3D` and `AveragePooling3D`: a 3-D pooling computed as two of the
/// backend's 2-D poolings, over height and width, then over depth. Both reductions are separable
/// over a box window (the maximum of maxima; the mean of means of equally many elements, padding
/// excluded), so the result is the 3-D pooling's; the gradient goes back through both.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// Three sizes (depth, height, width); `{2, 2, 2}` as Keras's `(2, 2, 2)`.
using Size3 = std::array<std::size_t, 3>;

/// The Keras arguments of `MaxPooling3D` and `AveragePooling3D`; `strides` defaults to
/// `pool_size` as in Keras.
struct Pooling3DOptions {
  Size3 pool_size = {2, 2, 2};
  std::optional<Size3> strides = std::nullopt;
  /// `"valid"` or `"same"` (TensorFlow's rule: the extra padding after; the mean counts only
  /// the elements inside the input).
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::string name = {};
};

namespace detail {

/// A config's three sizes at `key`: a positive integer or a list of three (`fallback` when
/// absent).
LOADSTAR_DECL Size3 config_size3(const ConfigReader& read, std::string_view key, Size3 fallback);

/// `MaxPooling3D` (`Max`) or `AveragePooling3D` over `(d, h, w, c)` (or `(c, d, h, w)`).
template <bool Max>
class Pooling3D : public LayerBase {
 public:
  explicit Pooling3D(Pooling3DOptions options)
      : LayerBase(options.name),
        pool_(options.pool_size),
        strides_(options.strides.value_or(options.pool_size)),
        options_(std::move(options)) {
    channels_first_ = parse_data_format(options_.data_format, label());
    same_ = parse_padding(options_.padding, label());
    const auto zero = [](std::size_t s) { return s == 0; };
    if (std::any_of(pool_.begin(), pool_.end(), zero) ||
        std::any_of(strides_.begin(), strides_.end(), zero))
      throw ConfigError(label() + ": pool_size and strides must be positive");
  }

  std::string class_name() const override { return Max ? "MaxPooling3D" : "AveragePooling3D"; }

  /// Depths, heights and widths of unknown length, settled per batch; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    Shape out_last;
    Pool2DGeometry plane, depth;
    geometry_for(channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0], plane,
                 depth, out_last);
    return channels_first_ ? move_channels(out_last, true) : out_last;
  }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    expect_inputs(input_shapes, 1);
    expect_rank(input_shapes[0], 4);
    in_last_ = channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0];
    if (in_last_[3] == 0) {
      throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                       batch_str(input_shapes[0]));
    }
    geometry_for(in_last_, plane_, depth_, out_last_);
    to_last_ = channel_axes(5, false);
    to_first_ = channel_axes(5, true);
    const Shape out = channels_first_ ? move_channels(out_last_, true) : out_last_;
    remember(input_shapes, out);
    return out;
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    settle(inputs[0]);
    Backend& backend = ctx.backend;
    const std::size_t batch = inputs[0].rows();
    const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_);
    const Tensor<float> y =
        channels_first_ ? y_last_.get(backend, out_last_.prepend(batch)) : output;
    const Tensor<float> middle = middle_.get(backend, middle_shape(batch));
    pool(backend, x, plane(batch), middle);
    pool(backend, middle, depth(batch), y);
    if (channels_first_) backend.permute(y, to_first_, output);
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    if (input_gradients.empty() || input_gradients[0].empty()) return;
    settle(inputs[0]);
    Backend& backend = ctx.backend;
    const std::size_t batch = inputs[0].rows();
    const Tensor<float> dy = to_channels_last(backend, output_gradient, y_last_, out_last_);
    const Tensor<float> dx =
        channels_first_ ? dx_last_.get(backend, in_last_.prepend(batch)) : input_gradients[0];
    const Tensor<float> middle_gradient = middle_gradient_.get(backend, middle_shape(batch));
    if constexpr (Max) {
      // The pooled slices are computed again rather than kept from forward, so that a shared
      // layer stays correct.
      const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_);
      const Tensor<float> middle = middle_.get(backend, middle_shape(batch));
      backend.max_pool_forward(x, plane(batch), middle);
      backend.max_pool_backward(middle, depth(batch), dy, middle_gradient);
      backend.max_pool_backward(x, plane(batch), middle_gradient, dx);
    } else {
      backend.avg_pool_backward(depth(batch), dy, middle_gradient);
      backend.avg_pool_backward(plane(batch), middle_gradient, dx);
    }
    if (channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["pool_size"] = pool_;
    config["strides"] = strides_;
    config["padding"] = same_ ? "same" : "valid";
    config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
    return config;
  }

 protected:
  static Pooling3DOptions options_from_config(const ConfigReader& read) {
    Pooling3DOptions options;
    options.pool_size = config_size3(read, "pool_size", {2, 2, 2});
    if (read.has("strides") && !read.find("strides")->is_null())
      options.strides = config_size3(read, "strides", options.pool_size);
    options.padding = read.get("padding", "valid");
    if (options.padding != "valid" && options.padding != "same")
      read.fail("padding", "\"valid\" or \"same\"");
    options.data_format = config_channels_first(read) ? "channels_first" : "channels_last";
    options.name = config_name(read);
    return options;
  }

 private:
  /// The slices' and the depth's geometries (batch 0) for samples of channels_last shape `in`
  /// (an unknown length giving one), and their channels_last output shape.
  void geometry_for(const Shape& in, Pool2DGeometry& plane, Pool2DGeometry& depth,
                    Shape& out_last) const {
    std::array<AxisGeometry, 3> axes;
    for (std::size_t i = 0; i < 3; ++i) {
      axes[i] =
          in[i] == 0 ? AxisGeometry{0, 0} : axis_geometry(in[i], pool_[i], strides_[i], 1, same_);
      if (in[i] != 0 && axes[i].out == 0) {
        throw ShapeError(
            label() + ": a " + std::to_string(pool_[0]) + "x" + std::to_string(pool_[1]) + "x" +
            std::to_string(pool_[2]) + " pool does not fit inputs of shape " +
            batch_str(channels_first_ ? move_channels(in, true) : in) + " with valid padding");
      }
    }
    const std::size_t channels = in[3];
    // Height and width of each depth slice (batch: batch * depth), then depth over the pooled
    // slices seen as rows of out_h * out_w pixels.
    plane = Pool2DGeometry{.in_h = in[1],
                           .in_w = in[2],
                           .channels = channels,
                           .out_h = axes[1].out,
                           .out_w = axes[2].out,
                           .pool_h = pool_[1],
                           .pool_w = pool_[2],
                           .stride_h = strides_[1],
                           .stride_w = strides_[2],
                           .pad_top = axes[1].pad_before,
                           .pad_left = axes[2].pad_before};
    depth = Pool2DGeometry{.in_h = in[0],
                           .in_w = axes[1].out * axes[2].out,
                           .channels = channels,
                           .out_h = axes[0].out,
                           .out_w = axes[1].out * axes[2].out,
                           .pool_h = pool_[0],
                           .pool_w = 1,
                           .stride_h = strides_[0],
                           .stride_w = 1,
                           .pad_top = axes[0].pad_before};
    out_last = Shape{axes[0].out, axes[1].out, axes[2].out, channels};
  }
  /// Settles the geometries for the lengths of the batch `x` when they differ from the last's.
  void settle(const Tensor<float>& x) {
    const Shape sample = x.shape().row_shape();
    const Shape in = channels_first_ ? move_channels(sample, false) : sample;
    if (in == in_last_) return;
    geometry_for(in, plane_, depth_, out_last_);
    in_last_ = in;
  }

  static void pool(Backend& backend, const Tensor<float>& x, const Pool2DGeometry& g,
                   const Tensor<float>& y) {
    if constexpr (Max) {
      backend.max_pool_forward(x, g, y);
    } else {
      backend.avg_pool_forward(x, g, y);
    }
  }

  Shape middle_shape(std::size_t batch) const {
    return Shape{batch, in_last_[0], plane_.out_h, plane_.out_w, in_last_[3]};
  }
  Pool2DGeometry plane(std::size_t batch) const {
    Pool2DGeometry g = plane_;
    g.batch = batch * in_last_[0];
    return g;
  }
  Pool2DGeometry depth(std::size_t batch) const {
    Pool2DGeometry g = depth_;
    g.batch = batch;
    return g;
  }

  Tensor<float> to_channels_last(Backend& backend, const Tensor<float>& x, Scratch& scratch,
                                 const Shape& last) const {
    if (!channels_first_) return x;
    const Tensor<float> moved = scratch.get(backend, last.prepend(x.rows()));
    backend.permute(x, to_last_, moved);
    return moved;
  }

  Size3 pool_;
  Size3 strides_;
  Pooling3DOptions options_;
  bool same_ = false;
  bool channels_first_ = false;
  Pool2DGeometry plane_;
  Pool2DGeometry depth_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dx_last_;
  Scratch middle_;
  Scratch middle_gradient_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

Size3 config_size3(const ConfigReader& read, std::string_view key, Size3 fallback) {
  if (!read.has(key)) return fallback;
  const nlohmann::json& v = *read.find(key);
  const auto positive = [](const nlohmann::json& d) {
    return d.is_number_integer() && d.get<std::int64_t>() > 0;
  };
  if (positive(v)) return {v.get<std::size_t>(), v.get<std::size_t>(), v.get<std::size_t>()};
  if (v.is_array() && v.size() == 3 && std::all_of(v.begin(), v.end(), positive))
    return {v[0].get<std::size_t>(), v[1].get<std::size_t>(), v[2].get<std::size_t>()};
  read.fail(key, "a positive integer or a list of three");
}

}  // namespace loadstar::keras::layers::detail
#endif
