/// \file
/// `Dot`: the dot product of two samples along one axis of each.
#pragma once

#include "loadstar/config.hpp"

#include <array>
#include <cmath>
#include <vector>

#include "loadstar/keras/layers/detail/layer_base.hpp"

namespace loadstar::keras::layers {

/// `Dot`'s Keras arguments after `axes`.
struct DotOptions {
  /// Whether each input is first scaled to unit L2 norm along its axis (the result is then the
  /// cosine similarity).
  bool normalize = false;
  std::string name = {};
};

/// Keras's `Dot` (`batch_dot`): for each sample, `sum_k x[..., k, ...] * y[..., k, ...]` along
/// axis `axes[0]` of the first input and `axes[1]` of the second (numbered with the batch axis
/// as 0; negative from the end); the output holds the first input's other axes, then the
/// second's, or `(1,)` when none remain.
/// \code
/// Dot similarity({1, 1}, {.normalize = true});  // (None, n) . (None, n) -> (None, 1)
/// Dot attention({2, 2});                        // (None, a, k) . (None, b, k) -> (None, a, b)
/// \endcode
class Dot : public detail::LayerBase {
 public:
  /// The output has no mask (Keras's `Dot.compute_mask`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::ends; }
  LOADSTAR_DECL explicit Dot(std::array<int, 2> axes, DotOptions options = {});

  std::string class_name() const override { return "Dot"; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;

  LOADSTAR_DECL void forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                             const CallContext& ctx) override;

  LOADSTAR_DECL void backward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                              const Tensor<float>& output_gradient,
                              std::span<const Tensor<float>> input_gradients,
                              const CallContext& ctx) override;

  LOADSTAR_DECL nlohmann::json get_config() const override;

  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  /// One input of a sample seen as `(outer, length, inner)` around its dot axis.
  struct Side {
    std::size_t outer = 1, length = 1, inner = 1;
    std::size_t size() const { return outer * length * inner; }
    std::size_t rest() const { return outer * inner; }
    std::size_t at(std::size_t r, std::size_t k) const {
      return ((r / inner) * length + k) * inner + r % inner;
    }
  };

  /// `x` of one sample scaled to unit norm along its axis into `unit`, and `1 / norm` of each
  /// line into `scale` (with the floor 1e-12 on the squared norm, as `tf.math.l2_normalize`).
  LOADSTAR_DECL static void normalize(const float* x, const Side& side, std::vector<double>& unit,
                                      std::vector<double>& scale);

  std::array<int, 2> axes_;
  bool normalize_;
  std::array<Side, 2> sides_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

Dot::Dot(std::array<int, 2> axes, DotOptions options)
    : LayerBase(options.name), axes_(axes), normalize_(options.normalize) {
  if (axes[0] == 0 || axes[1] == 0)
    throw ConfigError(label() + ": axes cannot hold the batch axis 0");
}

Shape Dot::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 2);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < 2; ++i) {
    const Shape& in = input_shapes[i];
    const auto rank = static_cast<int>(in.rank()) + 1;
    const int axis = axes_[i] < 0 ? axes_[i] + rank : axes_[i];
    if (axis < 1 || axis >= rank) {
      throw ShapeError(label() + ": axis " + std::to_string(axes_[i]) +
                       " is not an axis of input " + std::to_string(i) + " of shape " +
                       batch_str(in));
    }
    const auto view = keras::detail::axis_view(in, std::size_t(axis - 1));
    sides_[i] = Side{view.outer, view.length, view.inner};
    for (std::size_t a = 0; a < in.rank(); ++a) {
      if (a != std::size_t(axis - 1)) out.push_back(in[a]);
    }
  }
  if (sides_[0].length != sides_[1].length) {
    throw ShapeError(label() + ": the dot axes have " + std::to_string(sides_[0].length) + " and " +
                     std::to_string(sides_[1].length) + " elements in inputs of shapes " +
                     batch_str(input_shapes[0]) + " and " + batch_str(input_shapes[1]));
  }
  if (out.empty()) out.push_back(1);
  const Shape shape(out);
  remember(input_shapes, shape);
  return shape;
}

void Dot::normalize(const float* x, const Side& side, std::vector<double>& unit,
                    std::vector<double>& scale) {
  unit.assign(side.size(), 0.0);
  scale.assign(side.rest(), 0.0);
  for (std::size_t r = 0; r < side.rest(); ++r) {
    double sum = 0.0;
    for (std::size_t k = 0; k < side.length; ++k)
      sum += double(x[side.at(r, k)]) * x[side.at(r, k)];
    scale[r] = 1.0 / std::sqrt(std::max(sum, 1e-12));
    for (std::size_t k = 0; k < side.length; ++k)
      unit[side.at(r, k)] = x[side.at(r, k)] * scale[r];
  }
}

void Dot::forward(std::span<const Tensor<float>> inputs, const Tensor<float>& output,
                  const CallContext& ctx) {
  check_inputs(inputs);
  const Tensor<float> tensors[] = {inputs[0], inputs[1], output};
  ctx.backend.host_kernel(tensors, [this](std::span<const Tensor<float>> t) {
    const Side &a = sides_[0], &b = sides_[1];
    std::vector<double> u, v, su, sv;
    for (std::size_t s = 0; s < t[0].rows(); ++s) {
      const float* x = t[0].data() + s * a.size();
      const float* y = t[1].data() + s * b.size();
      if (normalize_) {
        normalize(x, a, u, su);
        normalize(y, b, v, sv);
      } else {
        u.assign(x, x + a.size());
        v.assign(y, y + b.size());
      }
      float* out = t[2].data() + s * a.rest() * b.rest();
      for (std::size_t i = 0; i < a.rest(); ++i) {
        for (std::size_t j = 0; j < b.rest(); ++j) {
          double sum = 0.0;
          for (std::size_t k = 0; k < a.length; ++k)
            sum += u[a.at(i, k)] * v[b.at(j, k)];
          out[i * b.rest() + j] = static_cast<float>(sum);
        }
      }
    }
  });
}

void Dot::backward(std::span<const Tensor<float>> inputs, const Tensor<float>&,
                   const Tensor<float>& output_gradient,
                   std::span<const Tensor<float>> input_gradients, const CallContext& ctx) {
  const bool dx = input_gradients.size() > 0 && !input_gradients[0].empty();
  const bool dy = input_gradients.size() > 1 && !input_gradients[1].empty();
  if (!dx && !dy) return;
  const Tensor<float> tensors[] = {inputs[0], inputs[1], output_gradient,
                                   dx ? input_gradients[0] : Tensor<float>(),
                                   dy ? input_gradients[1] : Tensor<float>()};
  ctx.backend.host_kernel(tensors, [&](std::span<const Tensor<float>> t) {
    const std::array<const Side*, 2> sides{&sides_[0], &sides_[1]};
    std::array<std::vector<double>, 2> unit, scale, gradient;
    for (std::size_t s = 0; s < t[0].rows(); ++s) {
      std::array<const float*, 2> in{};
      for (std::size_t i = 0; i < 2; ++i) {
        in[i] = t[i].data() + s * sides[i]->size();
        if (normalize_) {
          normalize(in[i], *sides[i], unit[i], scale[i]);
        } else {
          unit[i].assign(in[i], in[i] + sides[i]->size());
        }
        gradient[i].assign(sides[i]->size(), 0.0);
      }
      const Side &a = *sides[0], &b = *sides[1];
      const float* g = t[2].data() + s * a.rest() * b.rest();
      for (std::size_t i = 0; i < a.rest(); ++i) {
        for (std::size_t j = 0; j < b.rest(); ++j) {
          const double d = g[i * b.rest() + j];
          for (std::size_t k = 0; k < a.length; ++k) {
            gradient[0][a.at(i, k)] += d * unit[1][b.at(j, k)];
            gradient[1][b.at(j, k)] += d * unit[0][a.at(i, k)];
          }
        }
      }
      for (std::size_t i = 0; i < 2; ++i) {
        if (t[3 + i].empty()) continue;
        const Side& side = *sides[i];
        float* out = t[3 + i].data() + s * side.size();
        for (std::size_t r = 0; r < side.rest(); ++r) {
          // Through u = x * c with c = 1 / |x|: dx = c * (du - u * sum(du * u)) (the scale a
          // constant below the floor).
          double along = 0.0;
          if (normalize_) {
            double sum = 0.0;
            for (std::size_t k = 0; k < side.length; ++k)
              sum += double(in[i][side.at(r, k)]) * in[i][side.at(r, k)];
            if (sum > 1e-12) {
              for (std::size_t k = 0; k < side.length; ++k)
                along += gradient[i][side.at(r, k)] * unit[i][side.at(r, k)];
            }
          }
          for (std::size_t k = 0; k < side.length; ++k) {
            const std::size_t e = side.at(r, k);
            out[e] = static_cast<float>(
                normalize_ ? scale[i][r] * (gradient[i][e] - unit[i][e] * along) : gradient[i][e]);
          }
        }
      }
    }
  });
}

nlohmann::json Dot::get_config() const {
  auto config = base_config();
  config["axes"] =
      axes_[0] == axes_[1] ? nlohmann::json(axes_[0]) : nlohmann::json({axes_[0], axes_[1]});
  config["normalize"] = normalize_;
  return config;
}

std::shared_ptr<Layer> Dot::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "Dot");
  const nlohmann::json* v = read.find("axes");
  const auto axis = [](const nlohmann::json& a) { return a.is_number_integer() && a != 0; };
  std::array<int, 2> axes{};
  if (v != nullptr && axis(*v)) {
    axes = {v->get<int>(), v->get<int>()};
  } else if (v != nullptr && v->is_array() && v->size() == 2 && axis((*v)[0]) && axis((*v)[1])) {
    axes = {(*v)[0].get<int>(), (*v)[1].get<int>()};
  } else {
    read.fail("axes", "a non-zero integer or a pair of them");
  }
  return detail::finish_layer(
      read, std::make_shared<Dot>(axes, DotOptions{.normalize = read.get("normalize", false),
                                                   .name = detail::config_name(read)}));
}

}  // namespace loadstar::keras::layers
#endif
