/// \file
/// `BatchNormalization`: normalises the last axis with batch or moving statistics.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `BatchNormalization`'s Keras arguments, with Keras's defaults (only `axis = -1`).
struct BatchNormalizationOptions {
  int axis = -1;
  double momentum = 0.99;
  double epsilon = 1e-3;
  bool center = true;
  bool scale = true;
  Initializer beta_initializer = Initializer::zeros();
  Initializer gamma_initializer = Initializer::ones();
  Initializer moving_mean_initializer = Initializer::zeros();
  Initializer moving_variance_initializer = Initializer::ones();
  std::string name = {};
};

/// Keras's `BatchNormalization` over the last axis: weights `gamma`, `beta` (trainable, present
/// with `scale` / `center`), `moving_mean`, `moving_variance` (non-trainable), in that order.
///
/// Training normalises with the batch mean and biased variance and updates
/// `moving = moving * momentum + batch * (1 - momentum)`. The variance fed to that update follows
/// tf.keras 2: rank-4 inputs take Keras's fused path (`tf.compat.v1.nn.fused_batch_norm`, whose
/// batch variance carries Bessel's correction `n / (n - 1)`), other ranks the non-fused path
/// (`tf.nn.moments`, biased). A frozen layer (`set_trainable(false)`) normalises with the moving
/// statistics in training too and does not update them, as Keras does for fine-tuning.
///
/// With a mask on its input (`Embedding(mask_zero=True)`, `Masking`), training takes Keras 3's
/// masked statistics (`BatchNormalization._moments`): the mean and the biased variance of the
/// unmasked steps, each sum divided by the number of unmasked values plus Keras's epsilon
/// (`1e-7`); every step is then normalised with them, the moving statistics take them as they are,
/// and the mask passes on. Any axis but the features may have an unknown length.
/// \code
/// BatchNormalization bn;
/// BatchNormalization light({.momentum = 0.9, .scale = false});
/// \endcode
class BatchNormalization : public detail::LayerBase {
 public:
  /// Keras's `backend.epsilon()`, which its masked statistics add to their counts.
  static constexpr double keras_epsilon = 1e-7;
  /// The output keeps the input's mask; training takes the statistics of the unmasked steps.
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  bool reads_masks() const noexcept override { return true; }
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return input_shapes[0];
  }
  explicit BatchNormalization(BatchNormalizationOptions options = {})
      : LayerBase(options.name), options_(std::move(options)) {}

  std::string class_name() const override { return "BatchNormalization"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  float epsilon() const noexcept { return static_cast<float>(options_.epsilon); }
  /// The size of the normalised axis (that of `moving_variance`, the last weight).
  std::size_t features() const noexcept { return weights_.back().value.size(); }
  Tensor<float> gamma() const { return options_.scale ? weights_[0].value : Tensor<float>(); }
  Tensor<float> beta() const {
    return options_.center ? weights_[options_.scale ? 1 : 0].value : Tensor<float>();
  }
  Variable& moving_mean() { return weights_[weights_.size() - 2]; }
  Variable& moving_variance() { return weights_[weights_.size() - 1]; }
  /// The mask of the input in `ctx` (an empty tensor without one).
  static Tensor<float> input_mask(const CallContext& ctx) {
    return ctx.input_masks.empty() ? Tensor<float>() : ctx.input_masks[0];
  }
  /// The batch's statistics of `x` into `mean` and `variance`: `moments`, or Keras 3's masked
  /// ones where `mask` (one value per row of `x`'s features) is not empty.
  LOADSTAR_DECL void batch_moments(Backend& backend, const Tensor<float>& x,
                                   const Tensor<float>& mask, const Tensor<float>& mean,
                                   const Tensor<float>& variance);
  /// Adds to `dx` the gradient that reaches `x` through the masked statistics `mean` and
  /// `variance` (what `batch_norm_backward` with constant statistics leaves out).
  LOADSTAR_DECL void masked_statistics_gradient(Backend& backend, const Tensor<float>& x,
                                                const Tensor<float>& mask,
                                                const Tensor<float>& mean,
                                                const Tensor<float>& variance,
                                                const Tensor<float>& dy, const Tensor<float>& dx);

  BatchNormalizationOptions options_;
  // The batch statistics, in the backend's memory.
  detail::Scratch mean_, variance_, corrected_;
  // The masked statistics' per-feature sums, sized on the first batch and reused.
  std::vector<double> sums_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape BatchNormalization::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() < 1)
    throw ShapeError(label() + ": expects inputs with a feature axis but got " + in.str());
  const auto rank_with_batch = static_cast<int>(in.rank()) + 1;
  if (options_.axis != -1 && options_.axis != rank_with_batch - 1) {
    throw ConfigError(label() + ": only the last axis is supported but axis is " +
                      std::to_string(options_.axis));
  }
  const std::size_t c = in[in.rank() - 1];
  if (c == none) {
    throw ShapeError(label() +
                     ": the features axis it normalises must have a known length but "
                     "the input is " +
                     batch_str(in));
  }
  if (weights_.empty()) {
    std::uint64_t s = seed;
    auto make = [&](const Initializer& init, const char* name, bool trainable) {
      Tensor<float> t({c});
      init.fill(t, s = SplitMix64::mix(s + 1));
      add_weight(name, t, trainable);
    };
    if (options_.scale) make(options_.gamma_initializer, "gamma", true);
    if (options_.center) make(options_.beta_initializer, "beta", true);
    make(options_.moving_mean_initializer, "moving_mean", false);
    make(options_.moving_variance_initializer, "moving_variance", false);
  } else if (features() != c) {
    throw ShapeError(label() + ": built for " + std::to_string(features()) +
                     " features but the input has shape " + in.str());
  }
  remember(input_shapes, in);
  return in;
}

void BatchNormalization::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                                 const CallContext& ctx) {
  check_inputs(inputs);
  Backend& backend = ctx.backend;
  const Tensor<float>& x = inputs[0];
  // A frozen layer normalizes with its moving statistics in training too (Keras 3's `training
  // and self.trainable`, tf.keras 2's since 2.1), and leaves them as they are.
  if (!ctx.training || !trainable()) {
    backend.batch_norm_forward(x, moving_mean().value, moving_variance().value, gamma(), beta(),
                               epsilon(), output);
    return;
  }
  const Tensor<float> mean = mean_.get(backend, {features()});
  const Tensor<float> variance = variance_.get(backend, {features()});
  const Tensor<float> mask = input_mask(ctx);
  batch_moments(backend, x, mask, mean, variance);
  backend.batch_norm_forward(x, mean, variance, gamma(), beta(), epsilon(), output);
  const auto momentum = static_cast<float>(options_.momentum);
  backend.moving_average(moving_mean().value, mean, momentum);
  const std::size_t n = x.size() / features();
  // Keras 3's masked variance goes to the moving average as it is.
  if (x.rank() == 4 && n > 1 && mask.empty()) {
    const Tensor<float> corrected = corrected_.get(backend, {features()});
    backend.copy(variance, corrected);
    backend.scale(corrected, static_cast<float>(double(n) / double(n - 1)));
    backend.moving_average(moving_variance().value, corrected, momentum);
  } else {
    backend.moving_average(moving_variance().value, variance, momentum);
  }
}

void BatchNormalization::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                                  const Tensor<float>& output_gradient,
                                  std::span<const Tensor<float>> input_gradients,
                                  const CallContext& ctx) {
  Backend& backend = ctx.backend;
  const Tensor<float>& x = inputs[0];
  const Tensor<float> dx = input_gradients.empty() ? Tensor<float>() : input_gradients[0];
  const Tensor<float> dgamma = options_.scale ? weights_[0].gradient : Tensor<float>();
  const Tensor<float> dbeta =
      options_.center ? weights_[options_.scale ? 1 : 0].gradient : Tensor<float>();
  if (ctx.training && trainable()) {
    // The batch statistics are recomputed rather than kept, so a shared layer stays correct.
    const Tensor<float> mean = mean_.get(backend, {features()});
    const Tensor<float> variance = variance_.get(backend, {features()});
    const Tensor<float> mask = input_mask(ctx);
    batch_moments(backend, x, mask, mean, variance);
    if (mask.empty()) {
      backend.batch_norm_backward(x, mean, variance, gamma(), epsilon(), true, output_gradient, dx,
                                  dgamma, dbeta);
      return;
    }
    // The statistics' own gradient is added to that of a normalisation by constants.
    backend.batch_norm_backward(x, mean, variance, gamma(), epsilon(), false, output_gradient, dx,
                                dgamma, dbeta);
    if (!dx.empty())
      masked_statistics_gradient(backend, x, mask, mean, variance, output_gradient, dx);
  } else {
    backend.batch_norm_backward(x, moving_mean().value, moving_variance().value, gamma(), epsilon(),
                                false, output_gradient, dx, dgamma, dbeta);
  }
}

void BatchNormalization::batch_moments(Backend& backend, const Tensor<float>& x,
                                       const Tensor<float>& mask, const Tensor<float>& mean,
                                       const Tensor<float>& variance) {
  if (mask.empty()) {
    backend.moments(x, mean, variance);
    return;
  }
  const std::size_t c = features(), n = x.size() / c;
  if (mask.size() != n) {
    throw ShapeError(label() + ": the mask of its input has shape " + mask.shape().str() +
                     " but the input " + x.shape().str() + " has " + std::to_string(n) +
                     " rows of features");
  }
  const Tensor<float> tensors[] = {x, mask, mean, variance};
  sums_.assign(2 * c, 0.0);
  backend.host_kernel(tensors, [this, c, n](std::span<const Tensor<float>> t) {
    const float* xs = t[0].data();
    const float* m = t[1].data();
    double* sum = sums_.data();
    double* squares = sums_.data() + c;
    double count = 0.0;
    for (std::size_t r = 0; r < n; ++r) {
      if (m[r] == 0.0F) continue;
      count += 1.0;
      for (std::size_t f = 0; f < c; ++f)
        sum[f] += xs[r * c + f];
    }
    const double total = count + keras_epsilon;
    for (std::size_t f = 0; f < c; ++f)
      sum[f] /= total;
    for (std::size_t r = 0; r < n; ++r) {
      if (m[r] == 0.0F) continue;
      for (std::size_t f = 0; f < c; ++f) {
        const double d = xs[r * c + f] - sum[f];
        squares[f] += d * d;
      }
    }
    for (std::size_t f = 0; f < c; ++f) {
      t[2].data()[f] = static_cast<float>(sum[f]);
      t[3].data()[f] = static_cast<float>(squares[f] / total);
    }
  });
}

void BatchNormalization::masked_statistics_gradient(
    Backend& backend, const Tensor<float>& x, const Tensor<float>& mask, const Tensor<float>& mean,
    const Tensor<float>& variance, const Tensor<float>& dy, const Tensor<float>& dx) {
  // With w the mask, W = sum(w) + e, mean = sum(w x) / W, variance = sum(w (x - mean)^2) / W and
  // s = 1 / sqrt(variance + epsilon), every y = gamma (x - mean) s + beta depends on them:
  //   dvariance = -s^3 / 2 * sum(dy gamma (x - mean)),
  //   dmean = -s sum(dy gamma) + dvariance * dvariance/dmean, with dvariance/dmean =
  //   -2 sum(w (x - mean)) / W = -2 mean e / W,
  //   dx += dvariance * 2 w (x - mean) / W + dmean * w / W.
  const std::size_t c = features(), n = x.size() / c;
  const Tensor<float> g = gamma();
  const Tensor<float> tensors[] = {x, mask, mean, variance, dy, dx, g};
  const double bn_epsilon = options_.epsilon;
  sums_.assign(4 * c, 0.0);
  backend.host_kernel(tensors, [this, c, n, bn_epsilon](std::span<const Tensor<float>> t) {
    const float* xs = t[0].data();
    const float* m = t[1].data();
    const float* d = t[4].data();
    float* out = t[5].data();
    double count = 0.0;
    for (std::size_t r = 0; r < n; ++r)
      count += m[r] == 0.0F ? 0.0 : 1.0;
    const double total = count + keras_epsilon;
    double* centred = sums_.data();
    double* plain = sums_.data() + c;
    double* dmean = sums_.data() + 2 * c;
    double* dvariance = sums_.data() + 3 * c;
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t f = 0; f < c; ++f) {
        const double scaled = double(d[r * c + f]) * (t[6].empty() ? 1.0 : t[6].data()[f]);
        plain[f] += scaled;
        centred[f] += scaled * (double(xs[r * c + f]) - t[2].data()[f]);
      }
    }
    for (std::size_t f = 0; f < c; ++f) {
      const double s = 1.0 / std::sqrt(double(t[3].data()[f]) + bn_epsilon);
      dvariance[f] = -0.5 * s * s * s * centred[f];
      dmean[f] = -s * plain[f] + dvariance[f] * (-2.0 * t[2].data()[f] * keras_epsilon / total);
    }
    for (std::size_t r = 0; r < n; ++r) {
      if (m[r] == 0.0F) continue;
      for (std::size_t f = 0; f < c; ++f) {
        const double centred_x = double(xs[r * c + f]) - t[2].data()[f];
        out[r * c + f] += static_cast<float>((dvariance[f] * 2.0 * centred_x + dmean[f]) / total);
      }
    }
  });
}

nlohmann::json BatchNormalization::get_config() const {
  auto config = base_config();
  config["axis"] = options_.axis;
  config["momentum"] = options_.momentum;
  config["epsilon"] = options_.epsilon;
  config["center"] = options_.center;
  config["scale"] = options_.scale;
  config["beta_initializer"] = options_.beta_initializer.to_json();
  config["gamma_initializer"] = options_.gamma_initializer.to_json();
  config["moving_mean_initializer"] = options_.moving_mean_initializer.to_json();
  config["moving_variance_initializer"] = options_.moving_variance_initializer.to_json();
  write_weight_options(config, {"beta", "gamma"});
  return config;
}

std::shared_ptr<Layer> BatchNormalization::from_config(const nlohmann::json& config) {
  using detail::config_initializer;
  const auto read = detail::layer_config(config, "BatchNormalization");
  read.expect("renorm", false, "loadstar has no batch renormalization");
  read.expect("synchronized", false, "loadstar normalizes per replica");
  return detail::finish_layer(
      read,
      std::make_shared<BatchNormalization>(BatchNormalizationOptions{
          .axis = detail::config_axis(read, -1),
          .momentum = read.get("momentum", 0.99),
          .epsilon = read.get("epsilon", 1e-3),
          .center = read.get("center", true),
          .scale = read.get("scale", true),
          .beta_initializer = config_initializer(read, "beta_initializer", Initializer::zeros()),
          .gamma_initializer = config_initializer(read, "gamma_initializer", Initializer::ones()),
          .moving_mean_initializer =
              config_initializer(read, "moving_mean_initializer", Initializer::zeros()),
          .moving_variance_initializer =
              config_initializer(read, "moving_variance_initializer", Initializer::ones()),
          .name = detail::config_name(read),
      }));
}

}  // namespace loadstar::keras::layers
#endif
