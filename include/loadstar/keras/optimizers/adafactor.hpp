/// \file
/// `Adafactor`, as Keras 3's `keras.optimizers.Adafactor` (and tf.keras 2.11+'s).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loadstar/keras/optimizers/detail/optimizer_base.hpp"
#include "loadstar/keras/optimizers/detail/optimizer_config.hpp"

namespace loadstar::keras::optimizers {

/// `Adafactor`'s arguments, with Keras's defaults.
struct AdafactorOptions {
  LearningRate learning_rate = 0.001;
  double beta_2_decay = -0.8;
  double epsilon_1 = 1e-30;
  double epsilon_2 = 1e-3;
  double clip_threshold = 1.0;
  bool relative_step = true;
  std::optional<double> clipnorm = std::nullopt;
  std::optional<double> global_clipnorm = std::nullopt;
  std::optional<double> clipvalue = std::nullopt;
  std::optional<double> weight_decay = std::nullopt;
  bool use_ema = false;
  double ema_momentum = 0.99;
  std::optional<std::int64_t> ema_overwrite_frequency = std::nullopt;
  std::string name = "Adafactor";
};

/// Keras's Adafactor. With `t` the step, `rho = min(lr, 1 / sqrt(t))`,
/// `alpha = max(epsilon_2, rms(w)) * rho`, `beta = 1 - t^beta_2_decay` and
/// `s = g^2 + epsilon_1`: a variable of rank 2 or more keeps factored second moments, `r` (its
/// shape without the last axis) and `c` (without the second-last), averaged over the other axis,
/// `r = beta r + (1 - beta) mean_{-1}(s)`, `c = beta c + (1 - beta) mean_{-2}(s)`, and
/// `v = r / mean_{-1}(r) * c`; a smaller one `v = beta v + (1 - beta) s` (its `r` and `c` are
/// scalar placeholders, as in Keras). Then `u = g / sqrt(v)`,
/// `w -= alpha * u / max(1, rms(u) / clip_threshold)`. `relative_step` caps a constant learning
/// rate at `1 / sqrt(t)`, which `rho` does anyway. The step reads whole variables (its RMS and
/// means), so it runs on the host on every backend (through `Backend::host_kernel`).
/// \code
/// optimizers::Adafactor adafactor({.learning_rate = 1e-2});
/// \endcode
class Adafactor : public detail::OptimizerBase {
 public:
  explicit Adafactor(const AdafactorOptions& options = {})
      : OptimizerBase(options.name, options.learning_rate, detail::common_options(options)),
        settings_(options) {}
  std::string class_name() const override { return "Adafactor"; }
  /// The optimizer described by a Keras config (`Registry<Optimizer>`'s factory).
  LOADSTAR_DECL static std::unique_ptr<Optimizer> from_config(const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 protected:
  std::vector<std::string> slot_names() const override { return {"r", "c", "v"}; }
  LOADSTAR_DECL Shape slot_shape(std::size_t k, const Shape& variable) const override;
  LOADSTAR_DECL void update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                                 float lr) override;

 private:
  AdafactorOptions settings_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers {

std::unique_ptr<Optimizer> Adafactor::from_config(const nlohmann::json& config) {
  const auto read = detail::optimizer_config(config, "Adafactor");
  auto options = detail::read_optimizer_options(read, AdafactorOptions{});
  options.beta_2_decay = read.get("beta_2_decay", options.beta_2_decay);
  options.epsilon_1 = read.get("epsilon_1", options.epsilon_1);
  options.epsilon_2 = read.get("epsilon_2", options.epsilon_2);
  options.clip_threshold = read.get("clip_threshold", options.clip_threshold);
  options.relative_step = read.get("relative_step", options.relative_step);
  return std::make_unique<Adafactor>(options);
}

nlohmann::json Adafactor::get_config() const {
  auto config = OptimizerBase::get_config();
  config["beta_2_decay"] = settings_.beta_2_decay;
  config["epsilon_1"] = settings_.epsilon_1;
  config["epsilon_2"] = settings_.epsilon_2;
  config["clip_threshold"] = settings_.clip_threshold;
  config["relative_step"] = settings_.relative_step;
  return config;
}

Shape Adafactor::slot_shape(std::size_t k, const Shape& variable) const {
  const std::size_t rank = variable.rank();
  if (k == 2) return variable;
  if (rank < 2) return Shape();  // Keras's scalar placeholders
  std::vector<std::size_t> dims(variable.begin(), variable.end());
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(k == 0 ? rank - 1 : rank - 2));
  return Shape(dims);
}

void Adafactor::update_step(std::size_t index, detail::ArrayMap w, const detail::ArrayMap& g,
                            float lr) {
  const auto rms = [](const auto& x) {
    return static_cast<float>(
        std::sqrt(x.template cast<double>().square().sum() / static_cast<double>(x.size())));
  };
  const auto t = static_cast<double>(iterations_ + 1);
  const auto inverse_root = static_cast<float>(1.0 / std::sqrt(t));
  // `relative_step` caps a constant learning rate; `rho` caps every one the same way.
  if (settings_.relative_step && settings_.learning_rate.schedule() == nullptr)
    lr = std::min(lr, inverse_root);
  const float rho = std::min(lr, inverse_root);
  const float alpha =
      std::max(static_cast<float>(settings_.epsilon_2), w.size() == 0 ? 0.0F : rms(w)) * rho;
  const auto beta = static_cast<float>(1.0 - std::pow(t, settings_.beta_2_decay));
  const auto epsilon_1 = static_cast<float>(settings_.epsilon_1);
  detail::ArrayMap r = slot(index, 0);
  detail::ArrayMap c = slot(index, 1);
  detail::ArrayMap v = slot(index, 2);
  const bool factored = slot_tensor(index, 0).rank() >= 1;
  if (factored) {
    // The variable is (batch, rows, columns) in row-major order: r is (batch, rows) and c is
    // (batch, columns).
    const auto row_count =
        static_cast<Eigen::Index>(slot_tensor(index, 0).shape()[slot_tensor(index, 0).rank() - 1]);
    const auto column_count =
        static_cast<Eigen::Index>(slot_tensor(index, 1).shape()[slot_tensor(index, 1).rank() - 1]);
    const Eigen::Index batch = row_count == 0 ? 0 : r.size() / row_count;
    for (Eigen::Index b = 0; b < batch; ++b) {
      using Matrix = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      const Eigen::Map<const Matrix> gb(g.data() + b * row_count * column_count, row_count,
                                        column_count);
      Eigen::Map<Matrix> vb(v.data() + b * row_count * column_count, row_count, column_count);
      auto rb = r.segment(b * row_count, row_count);
      auto cb = c.segment(b * column_count, column_count);
      const Matrix s = gb.square() + epsilon_1;
      rb = beta * rb + (1.0F - beta) * s.rowwise().mean();
      cb = beta * cb + (1.0F - beta) * s.colwise().mean().transpose();
      const float r_mean = rb.mean();
      vb = (rb / r_mean).replicate(1, column_count) * cb.transpose().replicate(row_count, 1);
    }
  } else {
    v = beta * v + (1.0F - beta) * (g.square() + epsilon_1);
  }
  // u = g / sqrt(v), an expression: its RMS first, then the update.
  const auto u = g / v.sqrt();
  const float u_rms = w.size() == 0 ? 0.0F : rms(u);
  const float divisor = std::max(1.0F, u_rms / static_cast<float>(settings_.clip_threshold));
  w = w - alpha * (u / divisor);
}

}  // namespace loadstar::keras::optimizers
#endif
