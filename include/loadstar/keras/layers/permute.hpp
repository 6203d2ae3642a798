/// \file
/// `Permute`: reorders the axes of its input (the batch axis stays first).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Permute`'s Keras arguments after `dims`.
struct PermuteOptions {
  std::string name = {};
};

/// Keras's `Permute`: `dims` numbers the axes from 1 (axis 0 is the batch), so `Permute({2, 1})`
/// turns `(batch, a, b)` into `(batch, b, a)`. Any axis may have an unknown length (`Input({none,
/// 8})` permuted by `(2, 1)` gives `(8, None)`); each batch's lengths settle the output's.
/// \code
/// Permute swap({2, 1});
/// \endcode
class Permute : public detail::LayerBase {
 public:
  LOADSTAR_DECL explicit Permute(std::vector<std::size_t> dims, PermuteOptions options = {});

  std::string class_name() const override { return "Permute"; }

  /// The permutation, from 1 as Keras numbers it.
  const std::vector<std::size_t>& dims() const noexcept { return dims_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  bool takes_unknown_axes() const noexcept override { return true; }
  LOADSTAR_DECL Shape output_shape_for(std::span<const Shape> input_shapes) const override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>>, const Tensor<float>&,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  LOADSTAR_DECL std::string dims_text() const;

  std::vector<std::size_t> dims_;
  std::vector<std::size_t> axes_;
  std::vector<std::size_t> inverse_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Permute::Permute(std::vector<std::size_t> dims, PermuteOptions options)
    : LayerBase(options.name), dims_(std::move(dims)) {
  std::vector<std::size_t> sorted = dims_;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != i + 1) {
      throw ConfigError(label() + ": dims must be a permutation of 1.." +
                        std::to_string(dims_.size()) + " but is " + dims_text());
    }
  }
  axes_.push_back(0);
  axes_.insert(axes_.end(), dims_.begin(), dims_.end());
  inverse_.assign(axes_.size(), 0);
  for (std::size_t i = 0; i < axes_.size(); ++i)
    inverse_[axes_[i]] = i;
}

Shape Permute::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape& in = input_shapes[0];
  if (in.rank() != dims_.size()) {
    throw ShapeError(label() + ": dims " + dims_text() + " permute rank-" +
                     std::to_string(dims_.size()) + " inputs but got " + in.str());
  }
  std::vector<std::size_t> out;
  for (std::size_t d : dims_)
    out.push_back(in[d - 1]);
  remember(input_shapes, Shape(out));
  return Shape(out);
}

Shape Permute::output_shape_for(std::span<const Shape> input_shapes) const {
  std::vector<std::size_t> out;
  for (std::size_t d : dims_)
    out.push_back(input_shapes[0][d - 1]);
  return Shape(out);
}

void Permute::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                      const CallContext& ctx) {
  check_inputs(inputs);
  ctx.backend.permute(inputs[0], axes_, output);
}

void Permute::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                       const Tensor<float>& output_gradient,
                       std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  ctx.backend.permute(output_gradient, inverse_, input_gradients[0]);
}

nlohmann::json Permute::get_config() const {
  auto config = base_config();
  config["dims"] = dims_;
  return config;
}

std::shared_ptr<Layer> Permute::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Permute");
  const nlohmann::json* dims = read.find("dims");
  if (dims == nullptr || !dims->is_array() || dims->empty())
    read.fail("dims", "a permutation of 1..rank");
  std::vector<std::size_t> values;
  for (const auto& d : *dims) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 1 ||
        d.get<std::int64_t>() > static_cast<std::int64_t>(dims->size()))
      read.fail("dims", "a permutation of 1..rank");
    values.push_back(d.get<std::size_t>());
  }
  std::vector<std::size_t> sorted = values;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    read.fail("dims", "a permutation of 1..rank");
  return detail::finish_layer(
      read, std::make_shared<Permute>(values, PermuteOptions{.name = detail::config_name(read)}));
}

std::string Permute::dims_text() const {
  std::string text = "(";
  for (std::size_t i = 0; i < dims_.size(); ++i)
    text += (i == 0 ? "" : ", ") + std::to_string(dims_[i]);
  return text + ")";
}

}  // namespace loadstar::keras::layers
#endif
