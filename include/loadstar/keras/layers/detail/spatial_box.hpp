/// \file
/// What the cropping, zero padding and nearest up-sampling layers of 1, 2 and 3 spatial axes
/// share: the sample seen as `(planes, d1, d2, d3, inner)`, a box copied between a smaller and a
/// larger sample, and whole-factor repetition. Their axes may have unknown lengths (`none`),
/// settled from each batch's tensors.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <cstddef>
#include <string>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The elements removed or added before and after one axis: `{1, 2}` is Keras's `(1, 2)`.
using Edges = std::array<std::size_t, 2>;

/// The Keras arguments of the cropping, zero padding and up-sampling layers after their sizes.
struct SpatialOptions {
  /// `"channels_last"` (Keras's default) or `"channels_first"`.
  std::string data_format = "channels_last";
  std::string name = {};
};

namespace detail {

/// A sample of `spatial` axes (at most 3) as `(planes, d[0], d[1], d[2], inner)`: `(1, ..., c)`
/// channels_last, `(c, ..., 1)` channels_first; missing axes have size 1.
struct SpatialLayout {
  std::size_t planes = 1, inner = 1;
  std::array<std::size_t, 3> dims{1, 1, 1};
};

/// The layout of `sample` (rank `spatial + 1`, checked by the caller).
LOADSTAR_DECL SpatialLayout spatial_layout(const Shape& sample, std::size_t spatial,
                                           bool channels_first);

/// The sample shape of `layout` with spatial sizes `dims` (its first `spatial`).
LOADSTAR_DECL Shape spatial_shape(const SpatialLayout& layout, std::size_t spatial,
                                  bool channels_first, const std::array<std::size_t, 3>& dims);

/// Sets `box` to `count` samples-times-planes of `inner` floats per position, between grids of
/// sizes `small` and `large`.
LOADSTAR_DECL void spatial_box(keras::detail::SpatialBox& box, std::size_t count, std::size_t inner,
                               const std::array<std::size_t, 3>& small,
                               const std::array<std::size_t, 3>& large);

/// The base of `Cropping1D/2D/3D` (`crop`) and `ZeroPadding1D/3D`: `edges` removed from (or
/// added around) each of `spatial` axes.
class SpatialBoxLayer : public LayerBase {
 public:
  /// `class_name` is the layer's (the base answers `class_name()`, so that its constructor's
  /// messages name the layer).
  LOADSTAR_DECL SpatialBoxLayer(const char* class_name, std::size_t spatial, bool crop,
                                const std::array<Edges, 3>& edges, const SpatialOptions& options);

  std::string class_name() const override { return class_name_; }

  /// Any axis may have an unknown length; a cropped one must prove long enough per batch.
  bool takes_unknown_axes() const noexcept override { return true; }

  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  /// The edges as Keras writes them: `[b, e]` for one axis, `[[b, e], ...]` for more.
  LOADSTAR_DECL nlohmann::json edges_json() const;
  const char* data_format() const { return channels_first_ ? "channels_first" : "channels_last"; }

  const char* class_name_;
  std::size_t spatial_;
  bool crop_;
  std::array<Edges, 3> edges_;
  bool channels_first_ = false;

 private:
  /// The output sample shape for input samples `in`, with their layout and output sizes; an
  /// unknown input length gives an unknown output length.
  LOADSTAR_DECL Shape output_for(const Shape& in, SpatialLayout& layout,
                                 std::array<std::size_t, 3>& out) const;

  /// Sets the layout and the box for input samples of shape `sample`; returns the output's.
  LOADSTAR_DECL Shape set_box(const Shape& sample);

  /// Sets the box for the samples of `x` when they differ from the last ones.
  LOADSTAR_DECL void settle(const Tensor<float>& x);

  /// Copies between the smaller tensor (the cropped output, or the unpadded input) and the
  /// larger, `into_large` toward the larger; zero-fills the larger first when writing it.
  LOADSTAR_DECL void copy(const CallContext& ctx, const Tensor<float>& small,
                          const Tensor<float>& large, bool into_large) const;

  SpatialLayout layout_;
  Shape settled_;
  std::array<std::size_t, 3> small_dims_{1, 1, 1}, large_dims_{1, 1, 1};
};

/// A config's edges of `spatial` axes under `key`: an integer (every edge), for one axis a pair
/// `[b, e]`, for more a list of `spatial` integers (both edges of each axis) or of `spatial`
/// pairs.
LOADSTAR_DECL std::array<Edges, 3> config_edges(const ConfigReader& read, std::string_view key,
                                                std::size_t spatial,
                                                const std::array<Edges, 3>& fallback);

/// The base of `UpSampling1D` and `UpSampling3D`: nearest repetition by `factors`.
class SpatialRepeatLayer : public LayerBase {
 public:
  LOADSTAR_DECL SpatialRepeatLayer(const char* class_name, std::size_t spatial,
                                   const std::array<std::size_t, 3>& factors,
                                   const SpatialOptions& options);

  std::string class_name() const override { return class_name_; }

  /// Any axis may have an unknown length.
  bool takes_unknown_axes() const noexcept override { return true; }

  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

 protected:
  const char* data_format() const { return channels_first_ ? "channels_first" : "channels_last"; }

  const char* class_name_;
  std::size_t spatial_;
  std::array<std::size_t, 3> factors_;
  bool channels_first_ = false;

 private:
  /// Sets the layout for the samples of `x` when they differ from the last ones.
  LOADSTAR_DECL void settle(const Tensor<float>& x);

  /// The kernel `op` (repeat or its adjoint) for a batch of `rows` samples.
  LOADSTAR_DECL keras::detail::LayerKernel kernel(keras::detail::LayerOp op,
                                                  std::size_t rows) const;

  SpatialLayout layout_;
  Shape settled_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers::detail {

SpatialLayout spatial_layout(const Shape& sample, std::size_t spatial, bool channels_first) {
  SpatialLayout layout;
  layout.planes = channels_first ? sample[0] : 1;
  layout.inner = channels_first ? 1 : sample[spatial];
  for (std::size_t i = 0; i < spatial; ++i)
    layout.dims[i] = sample[channels_first ? i + 1 : i];
  return layout;
}

Shape spatial_shape(const SpatialLayout& layout, std::size_t spatial, bool channels_first,
                    const std::array<std::size_t, 3>& dims) {
  std::vector<std::size_t> shape;
  if (channels_first) shape.push_back(layout.planes);
  for (std::size_t i = 0; i < spatial; ++i)
    shape.push_back(dims[i]);
  if (!channels_first) shape.push_back(layout.inner);
  return Shape(shape);
}

SpatialBoxLayer::SpatialBoxLayer(const char* class_name, std::size_t spatial, bool crop,
                                 const std::array<Edges, 3>& edges, const SpatialOptions& options)
    : LayerBase(options.name),
      class_name_(class_name),
      spatial_(spatial),
      crop_(crop),
      edges_(edges) {
  channels_first_ = parse_data_format(options.data_format, label());
  for (std::size_t i = spatial; i < 3; ++i)
    edges_[i] = {0, 0};
}

Shape SpatialBoxLayer::output_for(const Shape& in, SpatialLayout& layout,
                                  std::array<std::size_t, 3>& out) const {
  layout = spatial_layout(in, spatial_, channels_first_);
  out = layout.dims;
  for (std::size_t i = 0; i < spatial_; ++i) {
    if (layout.dims[i] == none) continue;
    const std::size_t edges = edges_[i][0] + edges_[i][1];
    if (crop_ && edges >= layout.dims[i]) {
      throw ShapeError(label() + ": cropping " + std::to_string(edges_[i][0]) + " and " +
                       std::to_string(edges_[i][1]) + " of spatial axis " + std::to_string(i) +
                       " leaves nothing of inputs of shape " + batch_str(in));
    }
    out[i] = crop_ ? layout.dims[i] - edges : layout.dims[i] + edges;
  }
  return spatial_shape(layout, spatial_, channels_first_, out);
}

Shape SpatialBoxLayer::output_shape_for(std::span<const Shape> input_shapes) const {
  SpatialLayout layout;
  std::array<std::size_t, 3> out{};
  return output_for(input_shapes[0], layout, out);
}

Shape SpatialBoxLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], spatial_ + 1);
  const Shape shape = set_box(input_shapes[0]);
  remember(input_shapes, shape);
  return shape;
}

Shape SpatialBoxLayer::set_box(const Shape& sample) {
  std::array<std::size_t, 3> out{};
  const Shape shape = output_for(sample, layout_, out);
  small_dims_ = crop_ ? out : layout_.dims;
  large_dims_ = crop_ ? layout_.dims : out;
  settled_ = sample;
  return shape;
}

void SpatialBoxLayer::settle(const Tensor<float>& x) {
  const Shape sample = x.shape().row_shape();
  if (sample != settled_) set_box(sample);
}

void SpatialBoxLayer::copy(const CallContext& ctx, const Tensor<float>& small,
                           const Tensor<float>& large, bool into_large) const {
  keras::detail::LayerKernel kernel{.op = into_large ? keras::detail::LayerOp::pad
                                                     : keras::detail::LayerOp::crop};
  spatial_box(kernel.box, small.rows() * layout_.planes, layout_.inner, small_dims_, large_dims_);
  for (std::size_t i = 0; i < 3; ++i)
    kernel.box.offset[i] = edges_[i][0];
  const Tensor<float> tensors[] = {into_large ? small : large, into_large ? large : small};
  ctx.backend.layer_kernel(kernel, tensors, tensors[1].size());
}

void SpatialBoxLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  if (crop_) {
    copy(ctx, output, inputs[0], false);
  } else {
    copy(ctx, inputs[0], output, true);
  }
}

void SpatialBoxLayer::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                               const Tensor<float>& output_gradient,
                               std::span<const Tensor<float>> input_gradients,
                               const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(inputs[0]);
  if (crop_) {
    copy(ctx, output_gradient, input_gradients[0], true);
  } else {
    copy(ctx, input_gradients[0], output_gradient, false);
  }
}

nlohmann::json SpatialBoxLayer::edges_json() const {
  if (spatial_ == 1) return {edges_[0][0], edges_[0][1]};
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t i = 0; i < spatial_; ++i)
    list.push_back({edges_[i][0], edges_[i][1]});
  return list;
}

std::array<Edges, 3> config_edges(const ConfigReader& read, std::string_view key,
                                  std::size_t spatial, const std::array<Edges, 3>& fallback) {
  if (!read.has(key)) return fallback;
  const nlohmann::json& v = *read.find(key);
  const auto size = [](const nlohmann::json& d) {
    return d.is_number_integer() && d.get<std::int64_t>() >= 0;
  };
  const auto pair = [&](const nlohmann::json& p) {
    return p.is_array() && p.size() == 2 && size(p[0]) && size(p[1]);
  };
  std::array<Edges, 3> edges{};
  if (size(v)) {
    for (std::size_t i = 0; i < spatial; ++i)
      edges[i] = {v.get<std::size_t>(), v.get<std::size_t>()};
    return edges;
  }
  if (spatial == 1 && pair(v)) {
    edges[0] = {v[0].get<std::size_t>(), v[1].get<std::size_t>()};
    return edges;
  }
  if (spatial > 1 && v.is_array() && v.size() == spatial) {
    const bool sizes = std::all_of(v.begin(), v.end(), size);
    const bool pairs = std::all_of(v.begin(), v.end(), pair);
    if (sizes || pairs) {
      for (std::size_t i = 0; i < spatial; ++i) {
        edges[i] = sizes ? Edges{v[i].get<std::size_t>(), v[i].get<std::size_t>()}
                         : Edges{v[i][0].get<std::size_t>(), v[i][1].get<std::size_t>()};
      }
      return edges;
    }
  }
  const std::string n = std::to_string(spatial);
  read.fail(key, spatial == 1
                     ? "a non-negative integer or a pair of them"
                     : "a non-negative integer, a list of " + n + " or a list of " + n + " pairs");
}

SpatialRepeatLayer::SpatialRepeatLayer(const char* class_name, std::size_t spatial,
                                       const std::array<std::size_t, 3>& factors,
                                       const SpatialOptions& options)
    : LayerBase(options.name), class_name_(class_name), spatial_(spatial), factors_(factors) {
  channels_first_ = parse_data_format(options.data_format, label());
  for (std::size_t i = 0; i < 3; ++i) {
    if (i >= spatial) factors_[i] = 1;
    if (factors_[i] == 0) throw ConfigError(label() + ": size must be positive but is 0");
  }
}

Shape SpatialRepeatLayer::output_shape_for(std::span<const Shape> input_shapes) const {
  const SpatialLayout layout = spatial_layout(input_shapes[0], spatial_, channels_first_);
  std::array<std::size_t, 3> out = layout.dims;
  for (std::size_t i = 0; i < spatial_; ++i)
    out[i] *= factors_[i];  // an unknown length (0) stays unknown
  return spatial_shape(layout, spatial_, channels_first_, out);
}

Shape SpatialRepeatLayer::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], spatial_ + 1);
  layout_ = spatial_layout(input_shapes[0], spatial_, channels_first_);
  settled_ = input_shapes[0];
  const Shape shape = output_shape_for(input_shapes);
  remember(input_shapes, shape);
  return shape;
}

void SpatialRepeatLayer::settle(const Tensor<float>& x) {
  const Shape sample = x.shape().row_shape();
  if (sample == settled_) return;
  layout_ = spatial_layout(sample, spatial_, channels_first_);
  settled_ = sample;
}

void SpatialRepeatLayer::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                 const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0]);
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::repeat, inputs[0].rows()),
                           std::array{inputs[0], output}, output.size());
}

void SpatialRepeatLayer::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                  const Tensor<float>& output_gradient,
                                  std::span<const Tensor<float>> input_gradients,
                                  const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(inputs[0]);
  ctx.backend.layer_kernel(kernel(keras::detail::LayerOp::repeat_backward, inputs[0].rows()),
                           std::array{output_gradient, input_gradients[0]},
                           input_gradients[0].size());
}

keras::detail::LayerKernel SpatialRepeatLayer::kernel(keras::detail::LayerOp op,
                                                      std::size_t rows) const {
  keras::detail::LayerKernel kernel{.op = op};
  const std::array<std::size_t, 3> large{
      layout_.dims[0] * factors_[0], layout_.dims[1] * factors_[1], layout_.dims[2] * factors_[2]};
  spatial_box(kernel.box, rows * layout_.planes, layout_.inner, layout_.dims, large);
  return kernel;
}

void spatial_box(keras::detail::SpatialBox& box, std::size_t count, std::size_t inner,
                 const std::array<std::size_t, 3>& small, const std::array<std::size_t, 3>& large) {
  box.count = count;
  box.inner = inner;
  for (std::size_t i = 0; i < 3; ++i) {
    box.small[i] = small[i];
    box.large[i] = large[i];
  }
}

}  // namespace loadstar::keras::layers::detail
#endif
