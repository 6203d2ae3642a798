/// \file
/// `GroupNormalization`: normalises each sample over groups of channels.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `GroupNormalization`'s Keras arguments, with Keras's defaults.
struct GroupNormalizationOptions {
  std::size_t groups = 32;
  /// The channel axis, numbered as Keras does with the batch axis as 0 (`-1`: the last).
  int axis = -1;
  float epsilon = 1e-3F;
  bool center = true;
  bool scale = true;
  Initializer beta_initializer = Initializer::zeros();
  Initializer gamma_initializer = Initializer::ones();
  std::string name = {};
};

/// Keras's `GroupNormalization`: the channels of `axis` split into `groups` consecutive groups;
/// each sample's elements of a group (all other axes included) normalised by their mean and
/// biased variance, then `gamma * x_hat + beta` per channel (`gamma`, then `beta`, of the
/// channel count).
/// \code
/// GroupNormalization norm({.groups = 4});
/// \endcode
class GroupNormalization : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras's `supports_masking`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  LOADSTAR_DECL explicit GroupNormalization(GroupNormalizationOptions options = {});

  std::string class_name() const override { return "GroupNormalization"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Axes of unknown length but the channels (an image's height and width), settled per batch.
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
  /// Each sample's groups' mean and `1 / sqrt(variance + epsilon)` (in double), for `rows`
  /// samples of `x`.
  LOADSTAR_DECL void statistics(const float* x, std::size_t rows, std::vector<double>& mean,
                                std::vector<double>& inverse) const;
  /// The sizes before and after the channels axis for samples of shape `in` (a batch's).
  void settle(const Shape& in) {
    const auto view = keras::detail::axis_view(in, axis_);
    outer_ = view.outer;
    inner_ = view.inner;
  }

  GroupNormalizationOptions options_;
  std::size_t axis_ = 0;  // the channels axis of a sample
  /// The sample as (outer, channels, inner) around the channel axis.
  std::size_t outer_ = 1, channels_ = 1, inner_ = 1;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

GroupNormalization::GroupNormalization(GroupNormalizationOptions options)
    : LayerBase(options.name), options_(std::move(options)) {
  if (options_.groups == 0) throw ConfigError(label() + ": groups must be positive");
  if (!(options_.epsilon > 0.0F)) throw ConfigError(label() + ": epsilon must be positive");
}

Shape GroupNormalization::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  const auto rank = static_cast<int>(in.rank()) + 1;
  const int axis = options_.axis < 0 ? options_.axis + rank : options_.axis;
  if (axis < 1 || axis >= rank) {
    throw ShapeError(label() + ": axis " + std::to_string(options_.axis) +
                     " is not an axis of a sample of inputs of shape " + batch_str(in));
  }
  axis_ = std::size_t(axis - 1);
  const auto view = keras::detail::axis_view(in, axis_);
  outer_ = view.outer;
  channels_ = view.length;
  inner_ = view.inner;
  if (channels_ == 0) {
    throw ShapeError(label() + ": the channels axis must have a known length but the input is " +
                     batch_str(in));
  }
  if (channels_ < options_.groups || channels_ % options_.groups != 0) {
    throw ShapeError(label() + ": " + std::to_string(options_.groups) + " groups must divide the " +
                     std::to_string(channels_) + " channels of inputs of shape " + batch_str(in));
  }
  if (weights_.empty()) {
    if (options_.scale) {
      Tensor<float> gamma({channels_});
      options_.gamma_initializer.fill(gamma, seed);
      add_weight("gamma", gamma);
    }
    if (options_.center) {
      Tensor<float> beta({channels_});
      options_.beta_initializer.fill(beta, SplitMix64::mix(seed + 1));
      add_weight("beta", beta);
    }
  } else if (weights_[0].value.shape() != Shape{channels_}) {
    throw ShapeError(label() + ": " + weights_[0].name + " is " + weights_[0].value.shape().str() +
                     " but inputs of shape " + batch_str(in) + " have " +
                     std::to_string(channels_) + " channels");
  }
  remember(input_shapes, in);
  return in;
}

void GroupNormalization::statistics(const float* x, std::size_t rows, std::vector<double>& mean,
                                    std::vector<double>& inverse) const {
  const std::size_t groups = options_.groups, per_group = channels_ / groups;
  const std::size_t row = outer_ * channels_ * inner_;
  const double count = double(outer_ * per_group * inner_);
  mean.assign(rows * groups, 0.0);
  inverse.assign(rows * groups, 0.0);
  for (std::size_t r = 0; r < rows; ++r) {
    const float* sample = x + r * row;
    for (std::size_t e = 0; e < row; ++e)
      mean[r * groups + (e / inner_) % channels_ / per_group] += sample[e];
    for (std::size_t g = 0; g < groups; ++g)
      mean[r * groups + g] /= count;
    for (std::size_t e = 0; e < row; ++e) {
      const std::size_t g = r * groups + (e / inner_) % channels_ / per_group;
      const double d = sample[e] - mean[g];
      inverse[g] += d * d;
    }
    for (std::size_t g = 0; g < groups; ++g)
      inverse[r * groups + g] = 1.0 / std::sqrt(inverse[r * groups + g] / count + options_.epsilon);
  }
}

void GroupNormalization::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                 const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0].shape().row_shape());
  const Tensor<float> gamma = options_.scale ? weights_[0].value : Tensor<float>();
  const Tensor<float> beta = options_.center ? weights_.back().value : Tensor<float>();
  const Tensor<float> tensors[] = {inputs[0], gamma, beta, output};
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    std::vector<double> mean, inverse;
    const std::size_t rows = t[0].rows(), row = outer_ * channels_ * inner_;
    const std::size_t groups = options_.groups, per_group = channels_ / groups;
    statistics(t[0].data(), rows, mean, inverse);
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t c = (e / inner_) % channels_;
        const std::size_t g = r * groups + c / per_group;
        double y = (t[0].data()[r * row + e] - mean[g]) * inverse[g];
        if (!t[1].empty()) y *= t[1].data()[c];
        if (!t[2].empty()) y += t[2].data()[c];
        t[3].data()[r * row + e] = static_cast<float>(y);
      }
    }
  });
}

void GroupNormalization::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                  const Tensor<float>& output_gradient,
                                  std::span<const Tensor<float>> input_gradients,
                                  const CallContext& ctx) {
  const bool dx = !input_gradients.empty() && !input_gradients[0].empty();
  settle(inputs[0].shape().row_shape());
  const Tensor<float> gamma = options_.scale ? weights_[0].value : Tensor<float>();
  const Tensor<float> dgamma = options_.scale ? weights_[0].gradient : Tensor<float>();
  const Tensor<float> dbeta = options_.center ? weights_.back().gradient : Tensor<float>();
  const Tensor<float> tensors[] = {
      inputs[0], gamma, output_gradient, dx ? input_gradients[0] : Tensor<float>(), dgamma, dbeta};
  ctx.backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    std::vector<double> mean, inverse;
    const std::size_t rows = t[0].rows(), row = outer_ * channels_ * inner_;
    const std::size_t groups = options_.groups, per_group = channels_ / groups;
    const double count = double(outer_ * per_group * inner_);
    statistics(t[0].data(), rows, mean, inverse);
    std::vector<double> sum_dxhat(groups), sum_dxhat_xhat(groups), dgamma_sum(channels_),
        dbeta_sum(channels_);
    for (std::size_t r = 0; r < rows; ++r) {
      const float* x = t[0].data() + r * row;
      const float* dy = t[2].data() + r * row;
      std::fill(sum_dxhat.begin(), sum_dxhat.end(), 0.0);
      std::fill(sum_dxhat_xhat.begin(), sum_dxhat_xhat.end(), 0.0);
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t c = (e / inner_) % channels_, g = c / per_group;
        const double xhat = (x[e] - mean[r * groups + g]) * inverse[r * groups + g];
        const double dxhat = t[1].empty() ? dy[e] : double(dy[e]) * t[1].data()[c];
        sum_dxhat[g] += dxhat;
        sum_dxhat_xhat[g] += dxhat * xhat;
        dgamma_sum[c] += double(dy[e]) * xhat;
        dbeta_sum[c] += dy[e];
      }
      if (t[3].empty()) continue;
      // dx = inv * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)) over the group.
      for (std::size_t e = 0; e < row; ++e) {
        const std::size_t c = (e / inner_) % channels_, g = c / per_group;
        const double inv = inverse[r * groups + g];
        const double xhat = (x[e] - mean[r * groups + g]) * inv;
        const double dxhat = t[1].empty() ? dy[e] : double(dy[e]) * t[1].data()[c];
        t[3].data()[r * row + e] = static_cast<float>(
            inv * (dxhat - sum_dxhat[g] / count - xhat * sum_dxhat_xhat[g] / count));
      }
    }
    for (std::size_t c = 0; c < channels_; ++c) {
      if (!t[4].empty()) t[4].data()[c] += static_cast<float>(dgamma_sum[c]);
      if (!t[5].empty()) t[5].data()[c] += static_cast<float>(dbeta_sum[c]);
    }
  });
}

nlohmann::json GroupNormalization::get_config() const {
  auto config = base_config();
  config["groups"] = options_.groups;
  config["axis"] = options_.axis;
  config["epsilon"] = options_.epsilon;
  config["center"] = options_.center;
  config["scale"] = options_.scale;
  config["beta_initializer"] = options_.beta_initializer.to_json();
  config["gamma_initializer"] = options_.gamma_initializer.to_json();
  write_weight_options(config, {"beta", "gamma"});
  return config;
}

std::shared_ptr<Layer> GroupNormalization::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "GroupNormalization");
  const std::size_t groups = read.has("groups") ? read.positive("groups") : 32;
  const float epsilon = read.get("epsilon", 1e-3F);
  if (!(epsilon > 0.0F)) read.fail("epsilon", "a positive number");
  return detail::finish_layer(read, std::make_shared<GroupNormalization>(GroupNormalizationOptions{
                                        .groups = groups,
                                        .axis = detail::config_axis(read, -1),
                                        .epsilon = epsilon,
                                        .center = read.get("center", true),
                                        .scale = read.get("scale", true),
                                        .beta_initializer = detail::config_initializer(
                                            read, "beta_initializer", Initializer::zeros()),
                                        .gamma_initializer = detail::config_initializer(
                                            read, "gamma_initializer", Initializer::ones()),
                                        .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
