/// \file
/// `Embedding`: maps integer indices to dense vectors.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Embedding`'s Keras arguments after `input_dim` and `output_dim`, with Keras's defaults.
struct EmbeddingOptions {
  Initializer embeddings_initializer = Initializer::random_uniform(-0.05, 0.05);
  /// Index 0 is padding: the output has a mask, 0 where the index is 0 (Keras's `mask_zero`),
  /// which the layers after it follow (`MaskFlow`). `input_dim` then counts index 0 as well.
  bool mask_zero = false;
  std::string name = {};
};

/// Keras's `Embedding`: indices `(..., )` (given as floats, cast toward zero as `tf.cast` does) to
/// rows of `embeddings` `(input_dim, output_dim)`, giving `(..., output_dim)`.
/// \code
/// Embedding words(10000, 64);
/// \endcode
class Embedding : public detail::LayerBase {
 public:
  LOADSTAR_DECL Embedding(std::size_t input_dim, std::size_t output_dim,
                          EmbeddingOptions options = {});

  std::string class_name() const override { return "Embedding"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t seed) override;
  /// Sequences of unknown length (`Input(shape=(None,))`), settled per batch.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    std::vector<std::size_t> dims(input_shapes[0].begin(), input_shapes[0].end());
    dims.push_back(output_dim_);
    return Shape(dims);
  }

  /// Throws `ConfigError` naming the layer, the index and `input_dim` for an index outside
  /// `[0, input_dim)`.
  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient, std::span<const Tensor<float>>,
                const CallContext& ctx) override {
    ctx.backend.scatter_add(inputs[0], rows(output_gradient), weights_[0].gradient);
  }

  /// With `mask_zero`, the layer makes the output's mask; otherwise it has none (Keras's
  /// `compute_mask`, which ends a mask on its input without a warning).
  MaskFlow mask_flow() const noexcept override {
    return options_.mask_zero ? MaskFlow::computes : MaskFlow::ends;
  }
  /// `mask_zero`'s mask: 1 where the index is not 0.
  LOADSTAR_DECL void compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                                  const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// The error of an index outside the table of layer `label`.
  LOADSTAR_DECL static std::string bad_index_message(const std::string& label, const BadIndex& bad,
                                                     std::size_t input_dim);
  Tensor<float> rows(const Tensor<float>& t) const {
    return t.reshape({t.size() / output_dim_, output_dim_});
  }

  std::size_t input_dim_;
  std::size_t output_dim_;
  EmbeddingOptions options_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Embedding::Embedding(std::size_t input_dim, std::size_t output_dim, EmbeddingOptions options)
    : LayerBase(options.name),
      input_dim_(input_dim),
      output_dim_(output_dim),
      options_(std::move(options)) {
  if (input_dim == 0 || output_dim == 0)
    throw ConfigError(label() + ": input_dim and output_dim must be positive");
}

Shape Embedding::build(std::span<const Shape> input_shapes, std::uint64_t seed) {
  expect_inputs(input_shapes, 1);
  if (weights_.empty()) {
    Tensor<float> embeddings({input_dim_, output_dim_});
    options_.embeddings_initializer.fill(embeddings, seed);
    add_weight("embeddings", embeddings);
  }
  std::vector<std::size_t> dims(input_shapes[0].begin(), input_shapes[0].end());
  dims.push_back(output_dim_);
  const Shape out(dims);
  remember(input_shapes, out);
  return out;
}

void Embedding::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                        const CallContext& ctx) {
  check_inputs(inputs);
  const auto bad = ctx.backend.gather_deferred(inputs[0], weights_[0].value, rows(output));
  // A device still checking the indices: the model reads the check with the step's results.
  if (!bad.ready() && ctx.deferred_checks != nullptr) {
    ctx.deferred_checks->push_back(
        bad.then([label = label(), input_dim = input_dim_](const std::optional<BadIndex>& found) {
          if (found) throw ConfigError(bad_index_message(label, *found, input_dim));
          return true;
        }));
    return;
  }
  if (const auto& found = bad.get())
    throw ConfigError(bad_index_message(label(), *found, input_dim_));
}

std::string Embedding::bad_index_message(const std::string& label, const BadIndex& bad,
                                         std::size_t input_dim) {
  const float index = bad.value;
  const std::string shown = std::isfinite(index) && std::trunc(index) == index
                                ? std::to_string(static_cast<long long>(index))
                                : std::to_string(index);
  return label + ": index " + shown + " at position " + std::to_string(bad.position) +
         " is outside [0, input_dim) with input_dim " + std::to_string(input_dim);
}

void Embedding::compute_mask(std::span<const Tensor<float>> inputs, const Tensor<float>& mask,
                             const CallContext& ctx) {
  const Tensor<float> tensors[] = {inputs[0], mask};
  keras::detail::RecurrentKernel k;
  k.op = keras::detail::RecurrentOp::token_mask;
  k.width = mask.size();
  ctx.backend.recurrent_kernel(k, tensors, mask.size());
}

nlohmann::json Embedding::get_config() const {
  auto config = base_config();
  config["input_dim"] = input_dim_;
  config["output_dim"] = output_dim_;
  config["embeddings_initializer"] = options_.embeddings_initializer.to_json();
  write_weight_options(config, {"embeddings"});
  config["activity_regularizer"] = regularizer_json(nullptr);
  config["mask_zero"] = options_.mask_zero;
  config["input_length"] = nullptr;
  return config;
}

std::shared_ptr<Layer> Embedding::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Embedding");
  return detail::finish_layer(
      read, std::make_shared<Embedding>(
                read.positive("input_dim"), read.positive("output_dim"),
                EmbeddingOptions{
                    .embeddings_initializer = detail::config_initializer(
                        read, "embeddings_initializer", Initializer::random_uniform(-0.05, 0.05)),
                    .mask_zero = read.get("mask_zero", false),
                    .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
