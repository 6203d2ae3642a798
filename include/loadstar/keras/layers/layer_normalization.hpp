/// \file
/// `LayerNormalization`: normalises each sample over some of its axes.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `LayerNormalization`'s Keras arguments, with Keras's defaults.
struct LayerNormalizationOptions {
  /// The axes normalised over, numbered as Keras does with the batch axis as 0 (`-1`: the last
  /// one; `{1, 2}`: the first two axes of a sample).
  std::vector<int> axis = {-1};
  float epsilon = 1e-3F;
  bool center = true;
  bool scale = true;
  Initializer beta_initializer = Initializer::zeros();
  Initializer gamma_initializer = Initializer::ones();
  std::string name = {};
};

/// Keras's `LayerNormalization`: `y = gamma * (x - mean) / sqrt(variance + epsilon) + beta`, the
/// mean and the (biased) variance taken per sample over `axis`; `gamma` and `beta` have the
/// shape of those axes (weights `gamma` then `beta`, each only when `scale` / `center`).
/// \code
/// LayerNormalization norm;                      // over the last axis
/// LayerNormalization image_norm({.axis = {1, 2, 3}});
/// \endcode
class LayerNormalization : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras's `supports_masking`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  LOADSTAR_DECL explicit LayerNormalization(LayerNormalizationOptions options = {});

  std::string class_name() const override { return "LayerNormalization"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Axes of unknown length among those not normalised (a text model's steps).
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
  }

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The mean and `1 / sqrt(variance + epsilon)` of every group of one sample (two passes).
  LOADSTAR_DECL void statistics(const float* in);
  /// Maps every element of a sample of shape `in` to its group and its parameter, and sizes the
  /// per-group statistics (again when a batch's lengths differ from the last one's).
  LOADSTAR_DECL void map_sample(const Shape& in);

  Tensor<float> gamma() const { return options_.scale ? weights_[0].value : Tensor<float>(); }
  Tensor<float> beta() const {
    return options_.center ? weights_[options_.scale ? 1 : 0].value : Tensor<float>();
  }
  LOADSTAR_DECL Tensor<float> gradient_of(const std::string& name) const;

  LayerNormalizationOptions options_;
  std::vector<bool> normalised_;
  bool trailing_ = false;
  Shape mapped_;
  std::vector<std::size_t> group_of_;
  std::vector<std::size_t> param_of_;
  std::size_t groups_ = 1;
  std::size_t group_size_ = 1;
  std::vector<double> mean_;
  std::vector<double> inverse_;
  std::vector<double> sum_dxhat_;
  std::vector<double> sum_dxhat_xhat_;
  std::vector<Tensor<float>> staged_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

LayerNormalization::LayerNormalization(LayerNormalizationOptions options)
    : LayerBase(options.name), options_(std::move(options)) {
  if (options_.axis.empty()) throw ConfigError(label() + ": axis must name at least one axis");
  if (!(options_.epsilon > 0.0F)) throw ConfigError(label() + ": epsilon must be positive");
}

Shape LayerNormalization::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  const auto rank = static_cast<int>(in.rank()) + 1;  // with the batch axis, as Keras counts
  std::vector<bool> normalised(in.rank(), false);
  for (int a : options_.axis) {
    const int axis = a < 0 ? a + rank : a;
    if (axis < 1 || axis >= rank || normalised[std::size_t(axis - 1)]) {
      throw ShapeError(label() + ": axis " + std::to_string(a) +
                       " is not a distinct axis of a sample of inputs of shape " + batch_str(in));
    }
    normalised[std::size_t(axis - 1)] = true;
  }
  std::vector<std::size_t> param_dims;
  for (std::size_t i = 0; i < in.rank(); ++i) {
    if (!normalised[i]) continue;
    if (in[i] == 0) {
      throw ShapeError(label() + ": the axes it normalises must have known lengths but the " +
                       "input is " + batch_str(in));
    }
    param_dims.push_back(in[i]);
  }
  const Shape param_shape(param_dims);
  // The normalised axes are the trailing ones (Keras's default, axis=-1): each group is a line of
  // contiguous values, which the backend's kernels normalise.
  trailing_ = true;
  for (std::size_t i = 0; i + 1 < normalised.size(); ++i)
    if (normalised[i] && !normalised[i + 1]) trailing_ = false;
  normalised_ = std::move(normalised);
  group_size_ = param_shape.elements();
  if (!keras::detail::has_unknown_axis(in)) map_sample(in);
  if (!weights_.empty()) {
    if (weights_[0].value.shape() != param_shape) {
      throw ShapeError(label() + ": " + weights_[0].name + " is " +
                       weights_[0].value.shape().str() + " but inputs of shape " + batch_str(in) +
                       " need " + param_shape.str());
    }
  } else {
    if (options_.scale) {
      Tensor<float> gamma(param_shape);
      options_.gamma_initializer.fill(gamma, seed);
      add_weight("gamma", gamma);
    }
    if (options_.center) {
      Tensor<float> beta(param_shape);
      options_.beta_initializer.fill(beta, SplitMix64::mix(seed + 1));
      add_weight("beta", beta);
    }
  }
  remember(input_shapes, in);
  return in;
}

void LayerNormalization::map_sample(const Shape& in) {
  // Every element of a sample belongs to one group (its coordinates off the normalised axes)
  // and one parameter (its coordinates on them, row-major in axis order).
  const std::vector<bool>& normalised = normalised_;
  group_of_.assign(in.elements(), 0);
  param_of_.assign(in.elements(), 0);
  groups_ = 1;
  for (std::size_t i = 0; i < in.rank(); ++i)
    if (!normalised[i]) groups_ *= in[i];
  for (std::size_t e = 0; e < in.elements(); ++e) {
    std::size_t rest = e, group = 0, param = 0, group_stride = 1, param_stride = 1;
    for (std::size_t i = in.rank(); i-- > 0;) {
      const std::size_t coordinate = rest % in[i];
      rest /= in[i];
      if (normalised[i]) {
        param += coordinate * param_stride;
        param_stride *= in[i];
      } else {
        group += coordinate * group_stride;
        group_stride *= in[i];
      }
    }
    group_of_[e] = group;
    param_of_[e] = param;
  }
  mean_.assign(groups_, 0.0);
  inverse_.assign(groups_, 0.0);
  sum_dxhat_.assign(groups_, 0.0);
  sum_dxhat_xhat_.assign(groups_, 0.0);
  mapped_ = in;
}

void LayerNormalization::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                 const CallContext& ctx) {
  check_inputs(inputs);
  if (trailing_) {
    ctx.backend.layer_norm_forward(inputs[0], group_size_, gamma(), beta(), options_.epsilon,
                                   output);
    return;
  }
  if (inputs[0].shape().row_shape() != mapped_) map_sample(inputs[0].shape().row_shape());
  staged_ = {inputs[0], output, gamma(), beta()};
  ctx.backend.host_kernel(staged_, [this](std::span<const Tensor<float>> t) {
    const Tensor<float>& x = t[0];
    const std::size_t row = x.row_size();
    for (std::size_t b = 0; b < x.rows(); ++b) {
      const float* in = x.data() + b * row;
      float* out = t[1].data() + b * row;
      statistics(in);
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t g = group_of_[e], p = param_of_[e];
        const double xhat = (in[e] - mean_[g]) * inverse_[g];
        out[e] = static_cast<float>(xhat * (t[2].empty() ? 1.0 : t[2].data()[p]) +
                                    (t[3].empty() ? 0.0 : t[3].data()[p]));
      }
    }
  });
}

void LayerNormalization::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                  const Tensor<float>& output_gradient,
                                  std::span<const Tensor<float>> input_gradients,
                                  const CallContext& ctx) {
  const Tensor<float> dx = input_gradients.empty() ? Tensor<float>() : input_gradients[0];
  if (trailing_) {
    ctx.backend.layer_norm_backward(inputs[0], group_size_, gamma(), options_.epsilon,
                                    output_gradient, dx, gradient_of("gamma"), gradient_of("beta"));
    return;
  }
  if (inputs[0].shape().row_shape() != mapped_) map_sample(inputs[0].shape().row_shape());
  staged_ = {inputs[0], output_gradient, dx, gamma(), gradient_of("gamma"), gradient_of("beta")};
  ctx.backend.host_kernel(staged_, [this](std::span<const Tensor<float>> t) {
    const Tensor<float>& x = t[0];
    const std::size_t row = x.row_size();
    const double n = static_cast<double>(group_size_);
    for (std::size_t b = 0; b < x.rows(); ++b) {
      const float* in = x.data() + b * row;
      const float* dy = t[1].data() + b * row;
      statistics(in);
      std::fill(sum_dxhat_.begin(), sum_dxhat_.end(), 0.0);
      std::fill(sum_dxhat_xhat_.begin(), sum_dxhat_xhat_.end(), 0.0);
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t g = group_of_[e], p = param_of_[e];
        const double xhat = (in[e] - mean_[g]) * inverse_[g];
        const double dxhat = dy[e] * (t[3].empty() ? 1.0 : t[3].data()[p]);
        sum_dxhat_[g] += dxhat;
        sum_dxhat_xhat_[g] += dxhat * xhat;
        if (!t[4].empty()) t[4].data()[p] += static_cast<float>(dy[e] * xhat);
        if (!t[5].empty()) t[5].data()[p] += dy[e];
      }
      if (t[2].empty()) continue;
      float* dxs = t[2].data() + b * row;
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t g = group_of_[e], p = param_of_[e];
        const double xhat = (in[e] - mean_[g]) * inverse_[g];
        const double dxhat = dy[e] * (t[3].empty() ? 1.0 : t[3].data()[p]);
        dxs[e] = static_cast<float>(inverse_[g] *
                                    (dxhat - sum_dxhat_[g] / n - xhat * sum_dxhat_xhat_[g] / n));
      }
    }
  });
}

nlohmann::json LayerNormalization::get_config() const {
  auto config = base_config();
  config["axis"] = options_.axis;
  config["epsilon"] = options_.epsilon;
  config["center"] = options_.center;
  config["scale"] = options_.scale;
  config["beta_initializer"] = options_.beta_initializer.to_json();
  config["gamma_initializer"] = options_.gamma_initializer.to_json();
  write_weight_options(config, {"beta", "gamma"});
  return config;
}

std::shared_ptr<Layer> LayerNormalization::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "LayerNormalization");
  std::vector<int> axis = {-1};
  if (read.has("axis")) {
    const nlohmann::json& v = *read.find("axis");
    if (keras::detail::ConfigValue<int>::fits(v)) {
      axis = {v.get<int>()};
    } else if (keras::detail::ConfigValue<std::vector<int>>::fits(v) && !v.empty()) {
      axis = v.get<std::vector<int>>();
    } else {
      read.fail("axis", "an integer or a list of integers");
    }
  }
  const double epsilon = read.get("epsilon", 1e-3);
  if (!(epsilon > 0.0)) read.fail("epsilon", "a positive number");
  return detail::finish_layer(read, std::make_shared<LayerNormalization>(LayerNormalizationOptions{
                                        .axis = axis,
                                        .epsilon = static_cast<float>(epsilon),
                                        .center = read.get("center", true),
                                        .scale = read.get("scale", true),
                                        .beta_initializer = detail::config_initializer(
                                            read, "beta_initializer", Initializer::zeros()),
                                        .gamma_initializer = detail::config_initializer(
                                            read, "gamma_initializer", Initializer::ones()),
                                        .name = detail::config_name(read),
                                    }));
}

void LayerNormalization::statistics(const float* in) {
  std::fill(mean_.begin(), mean_.end(), 0.0);
  std::fill(inverse_.begin(), inverse_.end(), 0.0);
  const std::size_t row = group_of_.size();
  const double n = static_cast<double>(group_size_);
  for (std::size_t e = 0; e < row; ++e)
    mean_[group_of_[e]] += in[e];
  for (double& m : mean_)
    m /= n;
  for (std::size_t e = 0; e < row; ++e) {
    const double d = in[e] - mean_[group_of_[e]];
    inverse_[group_of_[e]] += d * d;
  }
  for (double& v : inverse_)
    v = 1.0 / std::sqrt(v / n + static_cast<double>(options_.epsilon));
}

Tensor<float> LayerNormalization::gradient_of(const std::string& name) const {
  for (const auto& w : weights_)
    if (w.name == name && w.trainable) return w.gradient;
  return {};
}

}  // namespace loadstar::keras::layers
#endif
