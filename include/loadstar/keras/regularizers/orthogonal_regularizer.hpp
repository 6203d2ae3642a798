/// \file
/// `OrthogonalRegularizer`: Keras's penalty on the non-orthogonality of a matrix's rows or
/// columns.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/regularizers/regularizer.hpp"

namespace loadstar::keras::regularizers {

/// Keras's `OrthogonalRegularizer(factor=0.01, mode="rows")` of a matrix `x`: its rows (or
/// columns) `v` are normalised as Keras's `ops.normalize` does (`v * min(rsqrt(sum(v^2)), 1e7)`),
/// and the penalty is `factor * 0.5 * sum(|u_i . u_j|, i != j) / (n * (n - 1) / 2)` over the `n`
/// normalised vectors.
/// \code
/// regularizers::OrthogonalRegularizer orthogonal(0.1, "columns");
/// \endcode
class OrthogonalRegularizer : public Regularizer {
 public:
  /// `mode` is `"rows"` or `"columns"`; throws `ConfigError` otherwise, and for a factor that is
  /// negative or not finite.
  LOADSTAR_DECL explicit OrthogonalRegularizer(double factor = 0.01, std::string mode = "rows");

  std::string class_name() const override { return "OrthogonalRegularizer"; }
  nlohmann::json get_config() const override {
    return {{"factor", factor_}, {"mode", columns_ ? "columns" : "rows"}};
  }

  LOADSTAR_DECL double penalty(const Tensor<float>& x) const override;
  LOADSTAR_DECL void add_gradient(const Tensor<float>& x, double scale,
                                  const Tensor<float>& gradient) const override;
  /// Keras takes rank-2 tensors only; loadstar also needs two vectors at least (Keras divides
  /// by zero pairs).
  LOADSTAR_DECL void check_shape(const Shape& shape, const std::string& owner) const override;

  LOADSTAR_DECL static std::shared_ptr<Regularizer> from_config(const nlohmann::json& config);

 private:
  /// The normalised vectors (one per row of the result) and each one's scale.
  LOADSTAR_DECL void normalised(const Tensor<float>& x, std::vector<double>& u,
                                std::vector<double>& s, std::size_t& count,
                                std::size_t& length) const;

  double factor_;
  bool columns_;
};

}  // namespace loadstar::keras::regularizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::regularizers {

OrthogonalRegularizer::OrthogonalRegularizer(double factor, std::string mode)
    : factor_(factor), columns_(mode == "columns") {
  if (!(std::isfinite(factor) && factor >= 0.0)) {
    throw ConfigError(
        "regularizer OrthogonalRegularizer: factor must be a finite number at "
        "least 0 but is " +
        std::to_string(factor));
  }
  if (mode != "rows" && mode != "columns") {
    throw ConfigError(
        "regularizer OrthogonalRegularizer: mode must be 'rows' or 'columns' but is '" + mode +
        "'");
  }
}

void OrthogonalRegularizer::check_shape(const Shape& shape, const std::string& owner) const {
  if (shape.rank() != 2) {
    throw ConfigError(owner + ": OrthogonalRegularizer takes rank-2 tensors but the tensor is " +
                      shape.str());
  }
  if (shape[columns_ ? 1 : 0] < 2) {
    throw ConfigError(owner + ": OrthogonalRegularizer needs 2 " + (columns_ ? "columns" : "rows") +
                      " at least but the tensor is " + shape.str());
  }
}

void OrthogonalRegularizer::normalised(const Tensor<float>& x, std::vector<double>& u,
                                       std::vector<double>& s, std::size_t& count,
                                       std::size_t& length) const {
  const std::size_t rows = x.shape()[0], cols = x.size() / std::max<std::size_t>(rows, 1);
  count = columns_ ? cols : rows;
  length = columns_ ? rows : cols;
  u.assign(count * length, 0.0);
  s.assign(count, 0.0);
  for (std::size_t v = 0; v < count; ++v) {
    double squares = 0.0;
    for (std::size_t k = 0; k < length; ++k) {
      const double e = columns_ ? x.data()[k * cols + v] : x.data()[v * cols + k];
      u[v * length + k] = e;
      squares += e * e;
    }
    // Keras's ops.normalize: x * min(rsqrt(sum(x^2)), 1 / epsilon), epsilon = 1e-7.
    s[v] = squares > 0.0 ? std::min(1.0 / std::sqrt(squares), 1e7) : 1e7;
    for (std::size_t k = 0; k < length; ++k)
      u[v * length + k] *= s[v];
  }
}

double OrthogonalRegularizer::penalty(const Tensor<float>& x) const {
  std::vector<double> u, s;
  std::size_t n = 0, length = 0;
  normalised(x, u, s, n, length);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      double dot = 0.0;
      for (std::size_t k = 0; k < length; ++k)
        dot += u[i * length + k] * u[j * length + k];
      total += std::abs(dot);
    }
  const double pairs = static_cast<double>(n) * (static_cast<double>(n) - 1.0) / 2.0;
  return factor_ * 0.5 * total / pairs;
}

void OrthogonalRegularizer::add_gradient(const Tensor<float>& x, double scale,
                                         const Tensor<float>& gradient) const {
  std::vector<double> u, s;
  std::size_t n = 0, length = 0;
  normalised(x, u, s, n, length);
  const std::size_t cols = x.size() / std::max<std::size_t>(x.shape()[0], 1);
  const double pairs = static_cast<double>(n) * (static_cast<double>(n) - 1.0) / 2.0;
  const double c = scale * factor_ * 0.5 / pairs;
  std::vector<double> g(length);
  for (std::size_t i = 0; i < n; ++i) {
    // d/du_i of c * sum(|u_a . u_b|, a != b) = 2c * sum(sign(u_i . u_j) u_j, j != i).
    std::fill(g.begin(), g.end(), 0.0);
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      double dot = 0.0;
      for (std::size_t k = 0; k < length; ++k)
        dot += u[i * length + k] * u[j * length + k];
      const double sign = dot > 0.0 ? 1.0 : (dot < 0.0 ? -1.0 : 0.0);
      for (std::size_t k = 0; k < length; ++k)
        g[k] += 2.0 * c * sign * u[j * length + k];
    }
    // Through u = v * s(v): s * g - s^3 * v (v . g) where s = rsqrt(|v|^2), s * g where the
    // scale is clipped at 1e7 (a constant).
    const bool clipped = s[i] >= 1e7;
    double vg = 0.0;
    for (std::size_t k = 0; k < length; ++k)
      vg += (u[i * length + k] / s[i]) * g[k];
    for (std::size_t k = 0; k < length; ++k) {
      const double v = u[i * length + k] / s[i];
      const double d = clipped ? s[i] * g[k] : s[i] * g[k] - s[i] * s[i] * s[i] * v * vg;
      float& out = columns_ ? gradient.data()[k * cols + i] : gradient.data()[i * cols + k];
      out += static_cast<float>(d);
    }
  }
}

std::shared_ptr<Regularizer> OrthogonalRegularizer::from_config(const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "regularizer", "OrthogonalRegularizer");
  const double factor = read.get<double>("factor", 0.01);
  if (!(std::isfinite(factor) && factor >= 0.0)) read.fail("factor", "a finite number at least 0");
  const std::string mode = read.get<std::string>("mode", "rows");
  if (mode != "rows" && mode != "columns") read.fail("mode", "\"rows\" or \"columns\"");
  return std::make_shared<OrthogonalRegularizer>(factor, mode);
}

}  // namespace loadstar::keras::regularizers
#endif
