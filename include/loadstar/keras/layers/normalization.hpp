/// \file
/// `Normalization`: shifts and scales features by a stored mean and variance.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Normalization`'s Keras arguments, with Keras's defaults.
struct NormalizationOptions {
  /// The axes that keep their own mean and variance, numbered as Keras does with the batch axis as
  /// 0 (`-1`: the last); empty (Keras's `None`): one mean and variance for every element.
  std::vector<int> axis = {-1};
  /// Keras's `mean` and `variance`: null (the layer then holds them as the non-trainable weights
  /// `mean`, `variance` and `count` that `adapt` or a saved file sets), a number, or a (nested)
  /// list with one value per element of the kept axes.
  nlohmann::json mean = nullptr;
  nlohmann::json variance = nullptr;
  bool invert = false;
  std::string name = {};
};

/// Keras's `Normalization`: `(x - mean) / max(sqrt(variance), 1e-7)`, or with `invert`
/// `mean + x * max(sqrt(variance), 1e-7)`; the statistics broadcast over the axes not kept.
/// \code
/// Normalization norm;                                     // adapted or loaded from a file
/// Normalization fixed({.mean = {0.5, 1.0}, .variance = {4.0, 1.0}});
/// \endcode
class Normalization : public detail::LayerBase {
 public:
  /// The output has the input's mask (Keras's `supports_masking`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  LOADSTAR_DECL explicit Normalization(NormalizationOptions options = {});

  std::string class_name() const override { return "Normalization"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Axes of unknown length where the statistics broadcast (an image's height and width); the
  /// kept axes known.
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

  /// Keras's `adapt` from one array with the batch axis first: the mean and (biased) variance
  /// over every axis not kept, and the count of the values behind each. Builds the layer for
  /// `data`'s sample shape when it is not built; the weights must be in host memory.
  LOADSTAR_DECL void adapt(const Tensor<float>& data);

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The statistics' shape for a sample of shape `in` (the kept axes), filling `index_of_` when
  /// every length is known.
  LOADSTAR_DECL Shape kept_shape(const Shape& in);
  /// Fills `index_of_` for samples of shape `in` when it differs from the last's.
  LOADSTAR_DECL void settle(const Shape& in);
  /// `y = x * a + b` per element with `a`, `b` from the statistics (forward or inverse).
  LOADSTAR_DECL void apply(const float* mean, const float* variance, const float* x, float* y,
                           std::size_t rows) const;

  NormalizationOptions options_;
  /// The statistics' index of each element of a sample of shape `indexed_`, and which axes are
  /// kept.
  std::vector<std::size_t> index_of_;
  Shape indexed_;
  std::vector<bool> kept_;
  std::size_t statistics_ = 1;
  /// The mean and variance from the config, one value per statistic (empty: weights).
  std::vector<float> fixed_mean_, fixed_variance_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

namespace detail {

/// The numbers of a config's number or (nested) list of numbers, in row-major order; false when
/// it holds anything else.
inline bool flatten_numbers(const nlohmann::json& value, std::vector<float>& out) {
  if (value.is_number()) {
    out.push_back(value.get<float>());
    return true;
  }
  if (!value.is_array()) return false;
  for (const auto& v : value)
    if (!flatten_numbers(v, out)) return false;
  return true;
}

}  // namespace detail

Normalization::Normalization(NormalizationOptions options)
    : LayerBase(options.name), options_(std::move(options)) {
  if (options_.mean.is_null() != options_.variance.is_null()) {
    throw ConfigError(label() + ": mean and variance must be given together but " +
                      (options_.mean.is_null() ? "only variance" : "only mean") + " is set");
  }
  if (!options_.mean.is_null()) {
    if (!detail::flatten_numbers(options_.mean, fixed_mean_)) {
      throw ConfigError(label() + ": mean must be a number or a list of numbers but is " +
                        options_.mean.dump());
    }
    if (!detail::flatten_numbers(options_.variance, fixed_variance_)) {
      throw ConfigError(label() + ": variance must be a number or a list of numbers but is " +
                        options_.variance.dump());
    }
    if (fixed_mean_.size() != fixed_variance_.size()) {
      throw ConfigError(label() + ": mean and variance must have the same shape but mean is " +
                        options_.mean.dump() + " and variance is " + options_.variance.dump());
    }
  }
}

Shape Normalization::kept_shape(const Shape& in) {
  const auto rank = static_cast<int>(in.rank()) + 1;
  std::vector<bool> kept(in.rank(), false);
  for (const int a : options_.axis) {
    const int axis = a < 0 ? a + rank : a;
    if (axis < 1 || axis >= rank || kept[std::size_t(axis - 1)]) {
      throw ShapeError(label() + ": axis " + std::to_string(a) +
                       " is not a distinct non-batch axis of inputs of shape " + batch_str(in));
    }
    kept[std::size_t(axis - 1)] = true;
  }
  std::vector<std::size_t> dims;
  for (std::size_t i = 0; i < in.rank(); ++i) {
    if (!kept[i]) continue;
    if (in[i] == 0) {
      throw ShapeError(label() + ": the kept axes must have known lengths but the input is " +
                       batch_str(in));
    }
    dims.push_back(in[i]);
  }
  kept_ = std::move(kept);
  statistics_ = 1;
  for (const std::size_t d : dims)
    statistics_ *= d;
  index_of_.clear();
  indexed_ = Shape();
  if (!keras::detail::has_unknown_axis(in)) settle(in);
  return Shape(dims);
}

Shape Normalization::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  const Shape kept = kept_shape(in);
  if (!options_.mean.is_null()) {
    if (fixed_mean_.size() == 1) {
      fixed_mean_.assign(statistics_, fixed_mean_[0]);
      fixed_variance_.assign(statistics_, fixed_variance_[0]);
    } else if (fixed_mean_.size() != statistics_) {
      throw ShapeError(label() + ": mean and variance must hold 1 or " +
                       std::to_string(statistics_) +
                       " values for the kept axes of inputs of shape " + batch_str(in) +
                       " but hold " + std::to_string(fixed_mean_.size()));
    }
  } else if (weights_.empty()) {
    add_weight("mean", Tensor<float>(kept, 0.0F), false);
    add_weight("variance", Tensor<float>(kept, 1.0F), false);
    add_weight("count", Tensor<float>(Shape{}, 0.0F), false);
  } else if (weights_[0].value.shape() != kept) {
    throw ShapeError(label() + ": built for statistics of shape " +
                     weights_[0].value.shape().str() + " but the input has shape " + batch_str(in));
  }
  remember(input_shapes, in);
  return in;
}

void Normalization::settle(const Shape& in) {
  if (in == indexed_ && !index_of_.empty()) return;
  detail::indices_on_axes(in, kept_, index_of_);
  indexed_ = in;
}

void Normalization::apply(const float* mean, const float* variance, const float* x, float* y,
                          std::size_t rows) const {
  const std::size_t row = index_of_.size();
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t e = 0; e < row; ++e) {
      const std::size_t s = index_of_[e];
      const float scale = std::max(std::sqrt(variance[s]), 1e-7F);
      const float v = x[r * row + e];
      y[r * row + e] = options_.invert ? mean[s] + v * scale : (v - mean[s]) / scale;
    }
  }
}

void Normalization::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                            const CallContext& ctx) {
  check_inputs(inputs);
  settle(inputs[0].shape().row_shape());
  if (fixed_mean_.empty()) {
    const Tensor<float> tensors[] = {inputs[0], output, weights_[0].value, weights_[1].value};
    ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
      apply(t[2].data(), t[3].data(), t[0].data(), t[1].data(), t[0].rows());
    });
  } else {
    const Tensor<float> tensors[] = {inputs[0], output};
    ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
      apply(fixed_mean_.data(), fixed_variance_.data(), t[0].data(), t[1].data(), t[0].rows());
    });
  }
}

void Normalization::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                             const Tensor<float>& output_gradient,
                             std::span<const Tensor<float>> input_gradients,
                             const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  settle(input_gradients[0].shape().row_shape());
  // dy/dx is the scale (invert) or its reciprocal: the kernel runs with a zero mean.
  auto run = [this](const float* variance, const float* dy, float* dx, std::size_t rows) {
    const std::size_t row = index_of_.size();
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t e = 0; e < row; ++e) {
        const float scale = std::max(std::sqrt(variance[index_of_[e]]), 1e-7F);
        dx[r * row + e] = options_.invert ? dy[r * row + e] * scale : dy[r * row + e] / scale;
      }
    }
  };
  if (fixed_mean_.empty()) {
    const Tensor<float> tensors[] = {output_gradient, input_gradients[0], weights_[1].value};
    ctx.backend.host_kernel(tensors, [&run](std::span<const Tensor<float>> t) {
      run(t[2].data(), t[0].data(), t[1].data(), t[0].rows());
    });
  } else {
    const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
    ctx.backend.host_kernel(tensors, [this, &run](std::span<const Tensor<float>> t) {
      run(fixed_variance_.data(), t[0].data(), t[1].data(), t[0].rows());
    });
  }
}

void Normalization::adapt(const Tensor<float>& data) {
  if (!fixed_mean_.empty()) {
    throw ConfigError(label() + ": adapt needs a layer without a mean and variance in its config");
  }
  if (data.rank() < 1 || data.shape()[0] == 0) {
    throw ShapeError(label() + ": adapt expects a batch of at least one sample but got shape " +
                     data.shape().str());
  }
  const Shape sample = data.shape().row_shape();
  if (weights_.empty()) {
    // Built for samples of any length on the axes the statistics broadcast over (Keras keeps
    // no other trace of the data's shape): adapted on images of one size, used on any.
    kept_shape(sample);
    std::vector<std::size_t> dims(sample.begin(), sample.end());
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (!kept_[i]) dims[i] = keras::none;
    const Shape shapes[] = {Shape(dims)};
    build(shapes, 0);
  } else if (!built_input_shapes().empty() &&
             !keras::detail::fits_declared(built_input_shapes()[0], sample)) {
    throw ShapeError(label() + ": built for inputs of shape " + batch_str(built_input_shapes()[0]) +
                     " but adapt got data of shape " + data.shape().str());
  }
  settle(sample);
  std::vector<double> sums(statistics_, 0.0), squares(statistics_, 0.0), counts(statistics_, 0.0);
  const std::size_t row = index_of_.size();
  for (std::size_t r = 0; r < data.shape()[0]; ++r) {
    for (std::size_t e = 0; e < row; ++e) {
      const double v = data.data()[r * row + e];
      sums[index_of_[e]] += v;
      counts[index_of_[e]] += 1.0;
    }
  }
  for (std::size_t s = 0; s < statistics_; ++s)
    sums[s] /= counts[s];
  for (std::size_t r = 0; r < data.shape()[0]; ++r) {
    for (std::size_t e = 0; e < row; ++e) {
      const double d = data.data()[r * row + e] - sums[index_of_[e]];
      squares[index_of_[e]] += d * d;
    }
  }
  for (std::size_t s = 0; s < statistics_; ++s) {
    weights_[0].value.data()[s] = static_cast<float>(sums[s]);
    weights_[1].value.data()[s] = static_cast<float>(squares[s] / counts[s]);
  }
  weights_[2].value.data()[0] = static_cast<float>(counts[0]);
}

nlohmann::json Normalization::get_config() const {
  auto config = base_config();
  config["axis"] = options_.axis;
  config["invert"] = options_.invert;
  config["mean"] = options_.mean;
  config["variance"] = options_.variance;
  return config;
}

std::shared_ptr<Layer> Normalization::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Normalization");
  std::vector<int> axis = {-1};
  if (read.has("axis")) {
    const nlohmann::json& v = *read.find("axis");
    if (v.is_null()) {
      axis = {};
    } else if (v.is_number_integer()) {
      axis = {v.get<int>()};
    } else if (v.is_array() && std::all_of(v.begin(), v.end(),
                                           [](const auto& a) { return a.is_number_integer(); })) {
      axis = v.get<std::vector<int>>();
    } else {
      read.fail("axis", "null, an integer or a list of integers");
    }
  }
  auto statistic = [&read](const char* key) {
    const nlohmann::json* v = read.find(key);
    if (v == nullptr || v->is_null()) return nlohmann::json(nullptr);
    std::vector<float> numbers;
    if (!detail::flatten_numbers(*v, numbers))
      read.fail(key, "null, a number or a list of numbers");
    return *v;
  };
  return detail::finish_layer(read, std::make_shared<Normalization>(
                                        NormalizationOptions{.axis = axis,
                                                             .mean = statistic("mean"),
                                                             .variance = statistic("variance"),
                                                             .invert = read.get("invert", false),
                                                             .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
