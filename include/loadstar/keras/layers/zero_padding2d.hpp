/// \file
/// `ZeroPadding2D`: zero rows and columns around an image.
#pragma once

#include "loadstar/config.hpp"

#include <array>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The rows and columns `ZeroPadding2D` adds: `1` (everywhere), `{1, 2}` (1 row above and below, 2
/// columns left and right) or `{top, bottom, left, right}` (Keras's `((top, bottom), (left,
/// right))`).
struct Padding2D {
  std::size_t top = 1, bottom = 1, left = 1, right = 1;
  Padding2D(std::size_t all)  // NOLINT: `1` reads as Keras's `padding=1`
      : top(all), bottom(all), left(all), right(all) {}
  Padding2D(std::size_t rows, std::size_t columns)
      : top(rows), bottom(rows), left(columns), right(columns) {}
  Padding2D(std::size_t top_rows, std::size_t bottom_rows, std::size_t left_columns,
            std::size_t right_columns)
      : top(top_rows), bottom(bottom_rows), left(left_columns), right(right_columns) {}
  friend bool operator==(const Padding2D&, const Padding2D&) = default;
};

/// `ZeroPadding2D`'s Keras arguments after `padding`.
struct ZeroPadding2DOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::string name = {};
};

/// Keras's `ZeroPadding2D`: `(h, w, c)` to `(top + h + bottom, left + w + right, c)` (or the
/// channels_first equivalent) with zeros around the image.
/// \code
/// ZeroPadding2D pad(1);
/// ZeroPadding2D asymmetric({0, 1, 0, 1});  // one row below, one column right
/// \endcode
class ZeroPadding2D : public detail::LayerBase {
 public:
  explicit ZeroPadding2D(Padding2D padding = 1, ZeroPadding2DOptions options = {})
      : LayerBase(options.name), padding_(padding) {
    channels_first_ = detail::parse_data_format(options.data_format, label());
  }

  std::string class_name() const override { return "ZeroPadding2D"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Heights and widths of unknown length (keras.applications' models without their top),
  /// settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return output_for(input_shapes[0]);
  }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The output shape for inputs of sample shape `in` (an unknown length giving one).
  Shape output_for(const Shape& in) const {
    const auto grow = [](std::size_t n, std::size_t before, std::size_t after) {
      return n == 0 ? 0 : n + before + after;
    };
    return channels_first_ ? Shape{in[0], grow(in[1], padding_.top, padding_.bottom),
                                   grow(in[2], padding_.left, padding_.right)}
                           : Shape{grow(in[0], padding_.top, padding_.bottom),
                                   grow(in[1], padding_.left, padding_.right), in[2]};
  }
  /// The image's sizes for the samples of shape `in` (a batch's).
  void settle(const Shape& in) {
    planes_ = channels_first_ ? in[0] : 1;
    height_ = channels_first_ ? in[1] : in[0];
    width_ = channels_first_ ? in[2] : in[1];
    inner_ = channels_first_ ? 1 : in[2];
  }
  /// The kernel `op` (pad, or crop for the gradient) for a batch of `rows` images.
  LOADSTAR_DECL keras::detail::LayerKernel kernel(keras::detail::LayerOp op,
                                                  std::size_t rows) const;

  Padding2D padding_;
  bool channels_first_ = false;
  std::size_t planes_ = 1, height_ = 0, width_ = 0, inner_ = 1;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape ZeroPadding2D::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 3);
  // The image as (planes, h, w, inner): (1, h, w, c) channels_last, (c, h, w, 1) channels_first.
  settle(input_shapes[0]);
  const Shape out = output_for(input_shapes[0]);
  remember(input_shapes, out);
  return out;
}

void ZeroPadding2D::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                            const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0].shape().row_shape());
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::pad, inputs[0].rows()),
                           std::array{inputs[0], output}, output.size());
}

void ZeroPadding2D::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                             const Tensor<float>& output_gradient,
                             std::span<const Tensor<float>> input_gradients,
                             const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(input_gradients[0].shape().row_shape());
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::crop, input_gradients[0].rows()),
                           std::array{output_gradient, input_gradients[0]},
                           input_gradients[0].size());
}

nlohmann::json ZeroPadding2D::get_config() const {
  auto config = base_config();
  config["padding"] = {{padding_.top, padding_.bottom}, {padding_.left, padding_.right}};
  config["data_format"] = channels_first_ ? "channels_first" : "channels_last";
  return config;
}

std::shared_ptr<Layer> ZeroPadding2D::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ZeroPadding2D");
  Padding2D padding = 1;
  if (read.has("padding")) {
    const nlohmann::json& v = *read.find("padding");
    const auto size = [](const nlohmann::json& d) {
      return d.is_number_integer() && d.get<std::int64_t>() >= 0;
    };
    const auto pair = [&](const nlohmann::json& p) {
      return p.is_array() && p.size() == 2 && size(p[0]) && size(p[1]);
    };
    if (size(v)) {
      padding = Padding2D(v.get<std::size_t>());
    } else if (pair(v)) {
      padding = Padding2D(v[0].get<std::size_t>(), v[1].get<std::size_t>());
    } else if (v.is_array() && v.size() == 2 && pair(v[0]) && pair(v[1])) {
      padding = Padding2D(v[0][0].get<std::size_t>(), v[0][1].get<std::size_t>(),
                          v[1][0].get<std::size_t>(), v[1][1].get<std::size_t>());
    } else {
      read.fail("padding",
                "a non-negative integer, a pair of them or a pair of pairs ((top, bottom), "
                "(left, right))");
    }
  }
  return detail::finish_layer(
      read, std::make_shared<ZeroPadding2D>(
                padding, ZeroPadding2DOptions{.data_format = detail::config_channels_first(read)
                                                                 ? "channels_first"
                                                                 : "channels_last",
                                              .name = detail::config_name(read)}));
}

keras::detail::LayerKernel ZeroPadding2D::kernel(keras::detail::LayerOp op,
                                                 std::size_t rows) const {
  keras::detail::LayerKernel kernel{.op = op};
  kernel.box = {.count = rows * planes_,
                .inner = inner_,
                .small = {height_, width_, 1},
                .large = {height_ + padding_.top + padding_.bottom,
                          width_ + padding_.left + padding_.right, 1},
                .offset = {padding_.top, padding_.left, 0}};
  return kernel;
}

}  // namespace loadstar::keras::layers
#endif
