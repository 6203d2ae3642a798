/// \file
/// The shared part of `MaxPooling2D` and `AveragePooling2D`.
#pragma once

#include <optional>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of `MaxPooling2D` and `AveragePooling2D`; `strides` defaults to
/// `pool_size` as in Keras.
struct Pooling2DOptions {
  Size2 pool_size = 2;
  std::optional<Size2> strides = std::nullopt;
  std::string padding = "valid";
  std::string name = {};
};

namespace detail {

/// A 2-D pooling layer over channels-last inputs; `Max` selects max or average pooling.
template <bool Max>
class Pooling2D : public LayerBase {
 public:
  explicit Pooling2D(Pooling2DOptions options)
      : LayerBase(options.name),
        pool_(options.pool_size),
        strides_(options.strides.value_or(options.pool_size)),
        options_(std::move(options)) {}

  std::string class_name() const override { return Max ? "MaxPooling2D" : "AveragePooling2D"; }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    same_ = parse_padding(options_.padding, label());
    if (pool_.h == 0 || pool_.w == 0 || strides_.h == 0 || strides_.w == 0)
      throw ConfigError(label() + ": pool_size and strides must be positive");
    expect_inputs(input_shapes, 1);
    const Shape& in = input_shapes[0];
    expect_rank(in, 3);
    const auto h = axis_geometry(in[0], pool_.h, strides_.h, 1, same_);
    const auto w = axis_geometry(in[1], pool_.w, strides_.w, 1, same_);
    if (h.out == 0 || w.out == 0) {
      throw ShapeError(label() + ": a " + std::to_string(pool_.h) + "x" + std::to_string(pool_.w) +
                       " pool does not fit inputs of shape " + in.str() + " with valid padding");
    }
    geometry_ = Pool2DGeometry{.in_h = in[0],
                               .in_w = in[1],
                               .channels = in[2],
                               .out_h = h.out,
                               .out_w = w.out,
                               .pool_h = pool_.h,
                               .pool_w = pool_.w,
                               .stride_h = strides_.h,
                               .stride_w = strides_.w,
                               .pad_top = h.pad_before,
                               .pad_left = w.pad_before};
    const Shape out{h.out, w.out, in[2]};
    remember(input_shapes, out);
    return out;
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    if constexpr (Max) {
      ctx.backend.max_pool_forward(inputs[0], geometry(inputs[0].rows()), output);
    } else {
      ctx.backend.avg_pool_forward(inputs[0], geometry(inputs[0].rows()), output);
    }
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    if (input_gradients.empty() || input_gradients[0].empty()) return;
    if constexpr (Max) {
      ctx.backend.max_pool_backward(inputs[0], geometry(inputs[0].rows()), output_gradient,
                                    input_gradients[0]);
    } else {
      ctx.backend.avg_pool_backward(geometry(inputs[0].rows()), output_gradient,
                                    input_gradients[0]);
    }
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["pool_size"] = {pool_.h, pool_.w};
    config["padding"] = options_.padding;
    config["strides"] = {strides_.h, strides_.w};
    config["data_format"] = "channels_last";
    return config;
  }

 protected:
  static Pooling2DOptions options_from_config(const ConfigReader& read) {
    expect_channels_last(read);
    Pooling2DOptions options{
        .pool_size = config_size2(read, "pool_size", 2),
        .padding = read.get("padding", "valid"),
        .name = config_name(read),
    };
    if (options.padding != "valid" && options.padding != "same")
      read.fail("padding", "\"valid\" or \"same\"");
    if (read.has("strides")) options.strides = config_size2(read, "strides", options.pool_size);
    return options;
  }

 private:
  Pool2DGeometry geometry(std::size_t batch) const {
    Pool2DGeometry g = geometry_;
    g.batch = batch;
    return g;
  }

  Size2 pool_;
  Size2 strides_;
  Pooling2DOptions options_;
  bool same_ = false;
  Pool2DGeometry geometry_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers
