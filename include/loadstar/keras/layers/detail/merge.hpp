/// \file
/// The shared part of the element-wise merge layers `Multiply`, `Subtract`, `Average`, `Maximum`
/// and `Minimum` (`Add` has its own header).
#pragma once

#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// The Keras arguments of the merge layers.
struct MergeOptions {
  std::string name = {};
};

namespace detail {

/// The element-wise operation of a merge layer.
enum class MergeOp { multiply, subtract, average, maximum, minimum };

/// A merge layer: two or more inputs of one shape (`Subtract`: exactly two) to one output of that
/// shape.
template <MergeOp Op>
class Merge : public LayerBase {
 public:
  explicit Merge(MergeOptions options = {}) : LayerBase(options.name) {}

  std::string class_name() const override {
    switch (Op) {
      case MergeOp::multiply:
        return "Multiply";
      case MergeOp::subtract:
        return "Subtract";
      case MergeOp::average:
        return "Average";
      case MergeOp::maximum:
        return "Maximum";
      case MergeOp::minimum:
        return "Minimum";
    }
    return "Merge";
  }

  Shape build(std::span<const Shape> input_shapes, std::uint64_t) override {
    if constexpr (Op == MergeOp::subtract) {
      if (input_shapes.size() != 2) {
        throw ShapeError(label() + ": expects exactly 2 inputs but got " +
                         std::to_string(input_shapes.size()));
      }
    } else if (input_shapes.size() < 2) {
      throw ShapeError(label() + ": expects at least 2 inputs but got " +
                       std::to_string(input_shapes.size()));
    }
    for (const Shape& s : input_shapes) {
      if (s != input_shapes[0]) {
        throw ShapeError(label() + ": inputs must have the same shape but got " +
                         batch_str(input_shapes[0]) + " and " + batch_str(s));
      }
    }
    remember(input_shapes, input_shapes[0]);
    return input_shapes[0];
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    Backend& backend = ctx.backend;
    if constexpr (Op == MergeOp::subtract) {
      backend.copy(inputs[0], output);
      backend.axpy(-1.0F, inputs[1], output);
    } else if constexpr (Op == MergeOp::average) {
      backend.add(inputs[0], inputs[1], output);
      for (std::size_t i = 2; i < inputs.size(); ++i)
        backend.add(output, inputs[i], output);
      backend.scale(output, 1.0F / static_cast<float>(inputs.size()));
    } else {
      staged_.assign(inputs.begin(), inputs.end());
      staged_.push_back(output);
      backend.host_kernel(staged_, [](std::span<const Tensor<float>> t) {
        const std::size_t n = t.size() - 1;
        const Tensor<float>& y = t[n];
        for (std::size_t e = 0; e < y.size(); ++e) {
          float acc = t[0].data()[e];
          for (std::size_t i = 1; i < n; ++i) {
            const float v = t[i].data()[e];
            if constexpr (Op == MergeOp::multiply) acc *= v;
            if constexpr (Op == MergeOp::maximum) acc = v > acc ? v : acc;
            if constexpr (Op == MergeOp::minimum) acc = v < acc ? v : acc;
          }
          y.data()[e] = acc;
        }
      });
    }
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    Backend& backend = ctx.backend;
    if constexpr (Op == MergeOp::subtract || Op == MergeOp::average) {
      for (std::size_t i = 0; i < input_gradients.size(); ++i) {
        if (input_gradients[i].empty()) continue;
        backend.copy(output_gradient, input_gradients[i]);
        if (Op == MergeOp::subtract && i == 1) backend.scale(input_gradients[i], -1.0F);
        if (Op == MergeOp::average)
          backend.scale(input_gradients[i], 1.0F / static_cast<float>(inputs.size()));
      }
    } else {
      // inputs..., dy, gradients... (empty gradients are passed and skipped).
      staged_.assign(inputs.begin(), inputs.end());
      staged_.push_back(output_gradient);
      staged_.insert(staged_.end(), input_gradients.begin(), input_gradients.end());
      backend.host_kernel(staged_, [](std::span<const Tensor<float>> t) {
        const std::size_t n = (t.size() - 1) / 2;
        const Tensor<float>& dy = t[n];
        const auto gradient = [&](std::size_t i) -> const Tensor<float>& { return t[n + 1 + i]; };
        for (std::size_t e = 0; e < dy.size(); ++e) {
          if constexpr (Op == MergeOp::multiply) {
            // d/dx_i of x_0 * ... * x_n: the product of the others (no division, zeros allowed).
            for (std::size_t i = 0; i < n; ++i) {
              if (gradient(i).empty()) continue;
              float others = dy.data()[e];
              for (std::size_t j = 0; j < n; ++j)
                if (j != i) others *= t[j].data()[e];
              gradient(i).data()[e] = others;
            }
          } else {
            // Keras folds maximum(maximum(x_0, x_1), x_2) ...; TensorFlow's gradient of
            // maximum(a, b) goes to a where a >= b (minimum: a <= b), so a tie goes to the
            // first input holding the extreme.
            std::size_t winner = 0;
            for (std::size_t i = 1; i < n; ++i) {
              const float v = t[i].data()[e];
              const float best = t[winner].data()[e];
              if (Op == MergeOp::maximum ? v > best : v < best) winner = i;
            }
            for (std::size_t i = 0; i < n; ++i)
              if (!gradient(i).empty()) gradient(i).data()[e] = i == winner ? dy.data()[e] : 0.0F;
          }
        }
      });
    }
  }

  nlohmann::json get_config() const override { return base_config(); }

 protected:
  template <class Derived>
  static std::shared_ptr<Layer> make_from_config(const nlohmann::json& config,
                                                 std::string_view class_name) {
    const auto read = layer_config(config, class_name);
    return finish_layer(read, std::make_shared<Derived>(MergeOptions{.name = config_name(read)}));
  }

 private:
  std::vector<Tensor<float>> staged_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers
