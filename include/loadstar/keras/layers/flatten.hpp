/// \file
/// `Flatten`: collapses every axis but the batch axis into one.
#pragma once

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Flatten`'s Keras arguments.
struct FlattenOptions {
  std::string name = {};
};

/// Keras's `Flatten` (channels_last): `(batch, d1, d2, ...)` to `(batch, d1 * d2 * ...)`.
/// \code
/// Flatten flatten;
/// \endcode
class Flatten : public detail::ShapeOnlyLayer {
 public:
  explicit Flatten(FlattenOptions options = {}) : ShapeOnlyLayer(options.name) {}

  std::string class_name() const override { return "Flatten"; }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    expect_inputs(input_shapes, 1);
    const Shape out{input_shapes[0].elements()};
    remember(input_shapes, out);
    return out;
  }

  nlohmann::json get_config() const override {
    auto config = base_config();
    config["data_format"] = "channels_last";
    return config;
  }

  static std::shared_ptr<Layer> from_config(const nlohmann::json& config) {
    const auto read = detail::layer_config(config, "Flatten");
    detail::expect_channels_last(read);
    return detail::finish_layer(
        read, std::make_shared<Flatten>(FlattenOptions{.name = detail::config_name(read)}));
  }
};

}  // namespace loadstar::keras::layers
