/// \file
/// `RepeatVector`: repeats a vector `n` times.
#pragma once

#include "loadstar/config.hpp"

#include <cstring>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `RepeatVector`'s Keras arguments after `n`.
struct RepeatVectorOptions {
  std::string name = {};
};

/// Keras's `RepeatVector`: `(batch, features)` to `(batch, n, features)`; the gradient is the sum
/// over the `n` copies. The features may have an unknown length (`Input({none})`, giving `(n,
/// None)`); each batch's length settles the output's.
/// \code
/// RepeatVector repeat(4);
/// \endcode
class RepeatVector : public detail::LayerBase {
 public:
  LOADSTAR_DECL explicit RepeatVector(std::size_t n, RepeatVectorOptions options = {});

  std::string class_name() const override { return "RepeatVector"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    return Shape{n_, input_shapes[0][0]};
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
  std::size_t n_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

RepeatVector::RepeatVector(std::size_t n, RepeatVectorOptions options)
    : LayerBase(options.name), n_(n) {
  if (n == 0) throw ConfigError(label() + ": n must be positive");
}

Shape RepeatVector::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  expect_rank(input_shapes[0], 1);
  const Shape out{n_, input_shapes[0][0]};
  remember(input_shapes, out);
  return out;
}

void RepeatVector::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                           const CallContext& ctx) {
  check_inputs(inputs);
  const std::size_t n = n_;
  const Tensor<float> tensors[] = {inputs[0], output};
  ctx.backend.host_kernel(tensors, [n](std::span<const Tensor<float>> t) {
    const std::size_t width = t[0].row_size();
    for (std::size_t b = 0; b < t[0].rows(); ++b)
      for (std::size_t k = 0; k < n; ++k)
        std::memcpy(t[1].data() + (b * n + k) * width, t[0].data() + b * width,
                    width * sizeof(float));
  });
}

void RepeatVector::backward(std::span<const Tensor<float>>, const Tensor<float>&,
                            const Tensor<float>& output_gradient,
                            std::span<const Tensor<float>> input_gradients,
                            const CallContext& ctx) {
  if (input_gradients.empty() || input_gradients[0].empty()) return;
  const std::size_t n = n_;
  const Tensor<float> tensors[] = {output_gradient, input_gradients[0]};
  ctx.backend.host_kernel(tensors, [n](std::span<const Tensor<float>> t) {
    const std::size_t width = t[1].row_size();
    for (std::size_t b = 0; b < t[1].rows(); ++b) {
      float* dx = t[1].data() + b * width;
      std::memcpy(dx, t[0].data() + b * n * width, width * sizeof(float));
      for (std::size_t k = 1; k < n; ++k) {
        const float* dy = t[0].data() + (b * n + k) * width;
        for (std::size_t f = 0; f < width; ++f)
          dx[f] += dy[f];
      }
    }
  });
}

nlohmann::json RepeatVector::get_config() const {
  auto config = base_config();
  config["n"] = n_;
  return config;
}

std::shared_ptr<Layer> RepeatVector::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "RepeatVector");
  return detail::finish_layer(
      read, std::make_shared<RepeatVector>(read.positive("n"),
                                           RepeatVectorOptions{.name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
