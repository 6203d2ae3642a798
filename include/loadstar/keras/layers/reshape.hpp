/// \file
/// `Reshape`: gives each sample another shape of the same size.
#pragma once

#include "loadstar/config.hpp"

#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Reshape`'s Keras arguments after `target_shape`.
struct ReshapeOptions {
  std::string name = {};
};

/// Keras's `Reshape`: each sample to `target_shape` (one entry may be `-1`, inferred).
/// \code
/// Reshape to_image({28, 28, 1});
/// \endcode
class Reshape : public detail::ShapeOnlyLayer {
 public:
  explicit Reshape(std::vector<std::ptrdiff_t> target_shape, ReshapeOptions options = {})
      : ShapeOnlyLayer(options.name), target_(std::move(target_shape)) {}

  std::string class_name() const override { return "Reshape"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  /// Inputs with axes of unknown length, where the target has a -1 to take them (its length
  /// settled per batch).
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return output_for(input_shapes[0]);
  }

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  LOADSTAR_DECL std::string target_str() const;
  /// The output shape for samples of shape `in`: the -1 unknown for an input of unknown length.
  LOADSTAR_DECL Shape output_for(const Shape& in) const;

  std::vector<std::ptrdiff_t> target_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Shape Reshape::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  const Shape out = output_for(input_shapes[0]);
  remember(input_shapes, out);
  return out;
}

Shape Reshape::output_for(const Shape& in) const {
  std::size_t known = 1;
  std::ptrdiff_t free_axis = -1;
  for (std::size_t i = 0; i < target_.size(); ++i) {
    if (target_[i] == -1 && free_axis < 0) {
      free_axis = static_cast<std::ptrdiff_t>(i);
    } else if (target_[i] <= 0) {
      throw ConfigError(label() + ": target_shape " + target_str() +
                        " may hold one -1 and otherwise positive sizes");
    } else {
      known *= static_cast<std::size_t>(target_[i]);
    }
  }
  std::vector<std::size_t> dims(target_.size());
  for (std::size_t i = 0; i < target_.size(); ++i)
    dims[i] = target_[i] > 0 ? static_cast<std::size_t>(target_[i]) : keras::none;
  if (keras::detail::has_unknown_axis(in)) {
    if (free_axis < 0) {
      throw ShapeError(label() + ": target_shape " + target_str() +
                       " has no -1 to take the unknown length of inputs of shape " + batch_str(in));
    }
    return Shape(dims);
  }
  const std::size_t total = in.elements();
  if (free_axis >= 0 && known > 0 && total % known == 0)
    dims[static_cast<std::size_t>(free_axis)] = total / known;
  const Shape out(dims);
  if (out.elements() != total) {
    throw ShapeError(label() + ": cannot reshape inputs of shape " + in.str() +
                     " to target_shape " + target_str());
  }
  return out;
}

nlohmann::json Reshape::get_config() const {
  auto config = base_config();
  config["target_shape"] = target_;
  return config;
}

std::shared_ptr<Layer> Reshape::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Reshape");
  const auto target = read.get<std::vector<std::int64_t>>("target_shape");
  return detail::finish_layer(
      read, std::make_shared<Reshape>(std::vector<std::ptrdiff_t>(target.begin(), target.end()),
                                      ReshapeOptions{.name = detail::config_name(read)}));
}

std::string Reshape::target_str() const {
  std::string s = "(";
  for (std::size_t i = 0; i < target_.size(); ++i)
    s += (i ? ", " : "") + std::to_string(target_[i]);
  return s + (target_.size() == 1 ? ",)" : ")");
}

}  // namespace loadstar::keras::layers
#endif
