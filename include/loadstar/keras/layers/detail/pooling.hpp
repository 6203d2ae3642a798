/// \file
/// The shared part of `MaxPooling1D`, `AveragePooling1D`, `MaxPooling2D` and `AveragePooling2D`.
#pragma once

#include <optional>
#include <type_traits>

#include "loadstar/keras/detail/relu_fusion.hpp"
#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of `MaxPooling2D` and `AveragePooling2D`; `strides` defaults to
/// `pool_size` as in Keras.
struct Pooling2DOptions {
  Size2 pool_size = 2;
  std::optional<Size2> strides = std::nullopt;
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::string name = {};
};

/// The Keras arguments of `MaxPooling1D` and `AveragePooling1D`; `strides` defaults to
/// `pool_size` as in Keras.
struct Pooling1DOptions {
  std::size_t pool_size = 2;
  std::optional<std::size_t> strides = std::nullopt;
  std::string padding = "valid";
  /// `"channels_last"` (Keras's default: `(steps, channels)`) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::string name = {};
};

namespace detail {

/// A pooling layer over `Rank` spatial axes (1 or 2); `Max` selects max or average pooling. A 1-D
/// pooling is a 2-D one of height 1; channels_first inputs are transposed to channels_last and
/// the output back.
template <bool Max, std::size_t Rank>
class Pooling : public LayerBase {
  static_assert(Rank == 1 || Rank == 2, "pooling layers have one or two spatial axes");

 public:
  using Options = std::conditional_t<Rank == 1, Pooling1DOptions, Pooling2DOptions>;

  explicit Pooling(Options options)
      : LayerBase(options.name),
        pool_(size2(options.pool_size)),
        strides_(size2(options.strides.value_or(options.pool_size))),
        options_(std::move(options)) {
    channels_first_ = parse_data_format(options_.data_format, label());
  }

  std::string class_name() const override {
    if constexpr (Rank == 1) return Max ? "MaxPooling1D" : "AveragePooling1D";
    return Max ? "MaxPooling2D" : "AveragePooling2D";
  }

  /// Max pooling: its input gradient may go through the ReLU of the layer before it, read from
  /// its input, where the backend fuses them (`Backend::max_pool_backward_relu`).
  keras::detail::FusionRole fusion_role() const noexcept override {
    return Max ? keras::detail::FusionRole::through_relu_output : keras::detail::FusionRole::none;
  }

  /// Steps, heights and widths of unknown length, settled per batch; the channels known.
  bool takes_unknown_axes() const noexcept override { return true; }

  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    Shape out_last;
    geometry_for(channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0],
                 out_last);
    return channels_first_ ? move_channels(out_last, true) : out_last;
  }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    same_ = parse_padding(options_.padding, label());
    if (pool_.h == 0 || pool_.w == 0 || strides_.h == 0 || strides_.w == 0)
      throw ConfigError(label() + ": pool_size and strides must be positive");
    expect_inputs(input_shapes, 1);
    expect_rank(input_shapes[0], Rank + 1);
    in_last_ = channels_first_ ? move_channels(input_shapes[0], false) : input_shapes[0];
    if (in_last_[Rank] == 0) {
      throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                       batch_str(input_shapes[0]));
    }
    geometry_ = geometry_for(in_last_, out_last_);
    to_last_ = channel_axes(Rank + 2, false);
    to_first_ = channel_axes(Rank + 2, true);
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
    if constexpr (Max) {
      backend.max_pool_forward(x, geometry(batch), y);
    } else {
      backend.avg_pool_forward(x, geometry(batch), y);
    }
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
    if constexpr (Max) {
      const Tensor<float> x = to_channels_last(backend, inputs[0], x_last_, in_last_);
      // Through the ReLU of the layer before, read from `x`
      // (`keras::detail::ReluGradientFusion::from_output`), where the backend fuses them.
      keras::detail::ReluGradientFusion* fused = keras::detail::fused_input(ctx);
      if (fused != nullptr && fused->from_output &&
          backend.max_pool_backward_relu(x, geometry(batch), dy, dx)) {
        fused->gradient_written = true;
      } else {
        backend.max_pool_backward(x, geometry(batch), dy, dx);
      }
    } else {
      backend.avg_pool_backward(geometry(batch), dy, dx);
    }
    if (channels_first_) backend.permute(dx, to_first_, input_gradients[0]);
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    if constexpr (Rank == 1) {
      config["pool_size"] = {pool_.w};
      config["strides"] = {strides_.w};
    } else {
      config["pool_size"] = {pool_.h, pool_.w};
      config["strides"] = {strides_.h, strides_.w};
    }
    config["padding"] = options_.padding;
    config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
    return config;
  }

 protected:
  static Options options_from_config(const ConfigReader& read) {
    Options options;
    if constexpr (Rank == 1) {
      options.pool_size = config_size1(read, "pool_size", 2);
      if (read.has("strides")) options.strides = config_size1(read, "strides", options.pool_size);
    } else {
      options.pool_size = config_size2(read, "pool_size", 2);
      if (read.has("strides")) options.strides = config_size2(read, "strides", options.pool_size);
    }
    options.padding = read.get("padding", "valid");
    if (options.padding != "valid" && options.padding != "same")
      read.fail("padding", "\"valid\" or \"same\"");
    options.data_format = config_channels_first(read) ? "channels_first" : "channels_last";
    options.name = config_name(read);
    return options;
  }

 private:
  static Size2 size2(std::size_t size) { return Size2(1, size); }
  static Size2 size2(Size2 size) { return size; }

  Tensor<float> to_channels_last(Backend& backend, const Tensor<float>& x, Scratch& scratch,
                                 const Shape& last) const {
    if (!channels_first_) return x;
    const Tensor<float> moved = scratch.get(backend, last.prepend(x.rows()));
    backend.permute(x, to_last_, moved);
    return moved;
  }

  Pool2DGeometry geometry(std::size_t batch) const {
    Pool2DGeometry g = geometry_;
    g.batch = batch;
    return g;
  }

  /// The geometry (batch 0) for samples of channels_last shape `in`, and their channels_last
  /// output shape in `out_last`; an unknown length (0, at build) gives an unknown output length.
  Pool2DGeometry geometry_for(const Shape& in, Shape& out_last) const {
    const std::size_t in_h = Rank == 1 ? 1 : in[0];
    const std::size_t in_w = in[Rank - 1];
    const std::size_t channels = in[Rank];
    // An axis of unknown length (0) gives one of unknown length.
    const AxisGeometry h = in_h == 0   ? AxisGeometry{0, 0}
                           : Rank == 1 ? AxisGeometry{1, 0}
                                       : axis_geometry(in_h, pool_.h, strides_.h, 1, same_);
    const AxisGeometry w =
        in_w == 0 ? AxisGeometry{0, 0} : axis_geometry(in_w, pool_.w, strides_.w, 1, same_);
    if ((in_h != 0 && h.out == 0) || (in_w != 0 && w.out == 0)) {
      const std::string pool =
          Rank == 1 ? "pool of size " + std::to_string(pool_.w)
                    : std::to_string(pool_.h) + "x" + std::to_string(pool_.w) + " pool";
      throw ShapeError(label() + ": a " + pool + " does not fit inputs of shape " +
                       (channels_first_ ? move_channels(in, true) : in).str() +
                       " with valid padding");
    }
    out_last = Rank == 1 ? Shape{w.out, channels} : Shape{h.out, w.out, channels};
    return Pool2DGeometry{.in_h = in_h,
                          .in_w = in_w,
                          .channels = channels,
                          .out_h = h.out,
                          .out_w = w.out,
                          .pool_h = pool_.h,
                          .pool_w = pool_.w,
                          .stride_h = strides_.h,
                          .stride_w = strides_.w,
                          .pad_top = h.pad_before,
                          .pad_left = w.pad_before};
  }

  /// Settles the geometry for the lengths of the batch `x` when they differ from the last's.
  void settle(const Tensor<float>& x) {
    const Shape sample = x.shape().row_shape();
    const Shape in = channels_first_ ? move_channels(sample, false) : sample;
    if (in == in_last_) return;
    geometry_ = geometry_for(in, out_last_);
    in_last_ = in;
  }

  Size2 pool_;
  Size2 strides_;
  Options options_;
  bool same_ = false;
  bool channels_first_ = false;
  Pool2DGeometry geometry_;
  Shape in_last_;
  Shape out_last_;
  std::vector<std::size_t> to_last_;
  std::vector<std::size_t> to_first_;
  Scratch x_last_;
  Scratch y_last_;
  Scratch dx_last_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers
