/// \file
/// The shared part of the element-wise merge layers `Multiply`, `Subtract`, `Average`, `Maximum`
/// and `Minimum` (`Add` has its own header).
#pragma once

#include <algorithm>
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

/// A merge layer: two or more inputs (`Subtract`: exactly two) to one output. As Keras's
/// `_Merge`, the sample shapes broadcast as NumPy's do, aligned on the right (a lower-rank input
/// gains axes after the batch axis) with axes of 1 stretched: `(3, 4)` and `(3, 1)` give
/// `(3, 4)`, `(5, 3, 4)` and `(4,)` give `(5, 3, 4)`.
template <MergeOp Op>
class Merge : public LayerBase {
 public:
  /// The output's mask is the OR of the inputs' masks (Keras 3's merge layers).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::any_of; }
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
    std::size_t rank = 0;
    for (const Shape& s : input_shapes)
      rank = std::max(rank, s.rank());
    std::vector<std::size_t> out(rank, 1);
    for (const Shape& s : input_shapes) {
      for (std::size_t i = 0; i < s.rank(); ++i) {
        std::size_t& d = out[rank - s.rank() + i];
        if (s[i] != d && s[i] != 1 && d != 1) {
          throw ShapeError(label() + ": inputs must have the same shape or broadcast but got " +
                           batch_str(input_shapes[0]) + " and " + batch_str(s));
        }
        if (s[i] != 1) d = s[i];
      }
    }
    const Shape out_shape(out);
    same_shapes_ = true;
    for (const Shape& s : input_shapes)
      same_shapes_ = same_shapes_ && s == out_shape;
    if (!same_shapes_ &&
        std::any_of(input_shapes.begin(), input_shapes.end(), keras::detail::has_unknown_axis)) {
      throw ShapeError(label() + ": broadcasts inputs of known lengths only but got " +
                       batch_str(input_shapes[0]) + " and " + batch_str(input_shapes[1]));
    }
    // Where each output element of a sample reads each input (within the input's sample).
    maps_.assign(input_shapes.size(), {});
    if (!same_shapes_) {
      for (std::size_t k = 0; k < input_shapes.size(); ++k) {
        const Shape& s = input_shapes[k];
        maps_[k].resize(out_shape.elements());
        for (std::size_t e = 0; e < out_shape.elements(); ++e) {
          std::size_t rest = e, index = 0, stride = 1;
          for (std::size_t i = rank; i-- > 0;) {
            const std::size_t coordinate = rest % out[i];
            rest /= out[i];
            if (i + s.rank() < rank) continue;
            const std::size_t axis = i + s.rank() - rank;
            if (s[axis] != 1) index += coordinate * stride;
            stride *= s[axis];
          }
          maps_[k][e] = index;
        }
      }
    }
    remember(input_shapes, out_shape);
    return out_shape;
  }

  /// Inputs of one shape with the same axes of unknown length.
  bool takes_unknown_axes() const noexcept override { return true; }
  Shape output_shape_for(std::span<const Shape> input_shapes) const override {
    for (const Shape& s : input_shapes) {
      if (s != input_shapes[0]) {
        throw ShapeError(label() + ": inputs must have the same shape but got " +
                         batch_str(input_shapes[0]) + " and " + batch_str(s));
      }
    }
    return input_shapes[0];
  }

  void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
               const CallContext& ctx) override {
    check_inputs(inputs);
    Backend& backend = ctx.backend;
    if (same_shapes_ && Op == MergeOp::subtract) {
      backend.copy(inputs[0], output);
      backend.axpy(-1.0F, inputs[1], output);
      return;
    }
    if (same_shapes_ && Op == MergeOp::average) {
      backend.add(inputs[0], inputs[1], output);
      for (std::size_t i = 2; i < inputs.size(); ++i)
        backend.add(output, inputs[i], output);
      backend.scale(output, 1.0F / static_cast<float>(inputs.size()));
      return;
    }
    staged_.assign(inputs.begin(), inputs.end());
    staged_.push_back(output);
    backend.host_kernel(staged_, [this](std::span<const Tensor<float>> t) {
      const std::size_t n = t.size() - 1;
      const Tensor<float>& y = t[n];
      const std::size_t row = y.row_size();
      for (std::size_t b = 0; b < y.rows(); ++b) {
        for (std::size_t e = 0; e < row; ++e) {
          float acc = value(t, 0, b, e);
          for (std::size_t i = 1; i < n; ++i) {
            const float v = value(t, i, b, e);
            if constexpr (Op == MergeOp::multiply) acc *= v;
            if constexpr (Op == MergeOp::subtract) acc -= v;
            if constexpr (Op == MergeOp::average) acc += v;
            if constexpr (Op == MergeOp::maximum) acc = v > acc ? v : acc;
            if constexpr (Op == MergeOp::minimum) acc = v < acc ? v : acc;
          }
          if constexpr (Op == MergeOp::average) acc /= static_cast<float>(n);
          y.data()[b * row + e] = acc;
        }
      }
    });
  }

  void backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                const Tensor<float>& output_gradient,
                std::span<const Tensor<float>> input_gradients, const CallContext& ctx) override {
    Backend& backend = ctx.backend;
    if (same_shapes_ && (Op == MergeOp::subtract || Op == MergeOp::average)) {
      for (std::size_t i = 0; i < input_gradients.size(); ++i) {
        if (input_gradients[i].empty()) continue;
        backend.copy(output_gradient, input_gradients[i]);
        if (Op == MergeOp::subtract && i == 1) backend.scale(input_gradients[i], -1.0F);
        if (Op == MergeOp::average)
          backend.scale(input_gradients[i], 1.0F / static_cast<float>(inputs.size()));
      }
      return;
    }
    // inputs..., dy, gradients... (empty gradients are passed and skipped). A broadcast input's
    // gradient sums over the output elements that read it.
    staged_.assign(inputs.begin(), inputs.end());
    staged_.push_back(output_gradient);
    staged_.insert(staged_.end(), input_gradients.begin(), input_gradients.end());
    backend.host_kernel(staged_, [this](std::span<const Tensor<float>> t) {
      const std::size_t n = (t.size() - 1) / 2;
      const Tensor<float>& dy = t[n];
      const std::size_t row = dy.row_size();
      for (std::size_t i = 0; i < n; ++i)
        std::fill(t[n + 1 + i].begin(), t[n + 1 + i].end(), 0.0F);
      const auto add = [&](std::size_t i, std::size_t b, std::size_t e, float v) {
        const Tensor<float>& gradient = t[n + 1 + i];
        if (!gradient.empty()) gradient.data()[b * t[i].row_size() + index(i, e)] += v;
      };
      for (std::size_t b = 0; b < dy.rows(); ++b) {
        for (std::size_t e = 0; e < row; ++e) {
          const float g = dy.data()[b * row + e];
          if constexpr (Op == MergeOp::multiply) {
            // d/dx_i of x_0 * ... * x_n: the product of the others (no division, zeros allowed).
            for (std::size_t i = 0; i < n; ++i) {
              float others = g;
              for (std::size_t j = 0; j < n; ++j)
                if (j != i) others *= value(t, j, b, e);
              add(i, b, e, others);
            }
          } else if constexpr (Op == MergeOp::subtract) {
            add(0, b, e, g);
            add(1, b, e, -g);
          } else if constexpr (Op == MergeOp::average) {
            for (std::size_t i = 0; i < n; ++i)
              add(i, b, e, g / static_cast<float>(n));
          } else {
            // Keras folds maximum(maximum(x_0, x_1), x_2) ...; TensorFlow's gradient of
            // maximum(a, b) goes to a where a >= b (minimum: a <= b), so a tie goes to the
            // first input holding the extreme.
            std::size_t winner = 0;
            float best = value(t, 0, b, e);
            for (std::size_t i = 1; i < n; ++i) {
              const float v = value(t, i, b, e);
              if (Op == MergeOp::maximum ? v > best : v < best) {
                winner = i;
                best = v;
              }
            }
            add(winner, b, e, g);
          }
        }
      }
    });
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
  /// Input `i`'s element of sample `b` that output element `e` of the sample reads.
  float value(std::span<const Tensor<float>> t, std::size_t i, std::size_t b, std::size_t e) const {
    return t[i].data()[b * t[i].row_size() + index(i, e)];
  }
  std::size_t index(std::size_t i, std::size_t e) const { return same_shapes_ ? e : maps_[i][e]; }

  bool same_shapes_ = true;
  std::vector<std::vector<std::size_t>> maps_;
  std::vector<Tensor<float>> staged_;
};

}  // namespace detail
}  // namespace loadstar::keras::layers
