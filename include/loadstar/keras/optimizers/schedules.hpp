/// \file
/// Learning-rate schedules, as `tf.keras.optimizers.schedules`, and `LearningRate`, a constant
/// or a schedule.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"

namespace loadstar::keras::optimizers::schedules {

/// The base of every schedule: the learning rate of a step (the optimizer's `iterations()`).
class LearningRateSchedule {
 public:
  LearningRateSchedule() = default;
  virtual ~LearningRateSchedule() = default;
  LearningRateSchedule(const LearningRateSchedule&) = default;
  LearningRateSchedule(LearningRateSchedule&&) noexcept = default;
  LearningRateSchedule& operator=(const LearningRateSchedule&) = default;
  LearningRateSchedule& operator=(LearningRateSchedule&&) noexcept = default;

  virtual double operator()(std::int64_t step) const = 0;
  virtual std::string class_name() const = 0;
  virtual nlohmann::json get_config() const = 0;
};

/// `initial_learning_rate * decay_rate ^ (step / decay_steps)`, the exponent floored with
/// `staircase`.
/// \code
/// ExponentialDecay schedule(0.1, 1000, 0.96, /*staircase=*/true);
/// \endcode
class ExponentialDecay : public LearningRateSchedule {
 public:
  ExponentialDecay(double initial_learning_rate, double decay_steps, double decay_rate,
                   bool staircase = false)
      : initial_(initial_learning_rate),
        decay_steps_(decay_steps),
        decay_rate_(decay_rate),
        staircase_(staircase) {
    if (!(decay_steps > 0)) {
      throw ConfigError("ExponentialDecay: decay_steps must be positive but is " +
                        std::to_string(decay_steps));
    }
  }
  double operator()(std::int64_t step) const override {
    double p = static_cast<double>(step) / decay_steps_;
    if (staircase_) p = std::floor(p);
    return initial_ * std::pow(decay_rate_, p);
  }
  std::string class_name() const override { return "ExponentialDecay"; }
  nlohmann::json get_config() const override {
    return {{"initial_learning_rate", initial_},
            {"decay_steps", decay_steps_},
            {"decay_rate", decay_rate_},
            {"staircase", staircase_}};
  }

 private:
  double initial_, decay_steps_, decay_rate_;
  bool staircase_;
};

/// `values[0]` up to and including `boundaries[0]`, `values[i]` in `(boundaries[i-1],
/// boundaries[i]]`, `values.back()` beyond the last boundary.
/// \code
/// PiecewiseConstantDecay schedule({100, 200}, {0.1, 0.01, 0.001});
/// \endcode
class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<std::int64_t> boundaries, std::vector<double> values)
      : boundaries_(std::move(boundaries)), values_(std::move(values)) {
    if (values_.size() != boundaries_.size() + 1) {
      throw ConfigError(
          "PiecewiseConstantDecay: values must have one more element than "
          "boundaries but there are " +
          std::to_string(values_.size()) + " values and " + std::to_string(boundaries_.size()) +
          " boundaries");
    }
  }
  double operator()(std::int64_t step) const override {
    const auto it = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
    return values_[static_cast<std::size_t>(it - boundaries_.begin())];
  }
  std::string class_name() const override { return "PiecewiseConstantDecay"; }
  nlohmann::json get_config() const override {
    return {{"boundaries", boundaries_}, {"values", values_}};
  }

 private:
  std::vector<std::int64_t> boundaries_;
  std::vector<double> values_;
};

/// `initial_learning_rate * ((1 - alpha) * 0.5 * (1 + cos(pi * min(step, decay_steps) /
/// decay_steps)) + alpha)`.
/// \code
/// CosineDecay schedule(0.1, 1000, /*alpha=*/0.01);
/// \endcode
class CosineDecay : public LearningRateSchedule {
 public:
  CosineDecay(double initial_learning_rate, double decay_steps, double alpha = 0.0)
      : initial_(initial_learning_rate), decay_steps_(decay_steps), alpha_(alpha) {
    if (!(decay_steps > 0)) {
      throw ConfigError("CosineDecay: decay_steps must be positive but is " +
                        std::to_string(decay_steps));
    }
  }
  double operator()(std::int64_t step) const override {
    const double s = std::min(static_cast<double>(step), decay_steps_);
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * s / decay_steps_));
    return initial_ * ((1.0 - alpha_) * cosine + alpha_);
  }
  std::string class_name() const override { return "CosineDecay"; }
  nlohmann::json get_config() const override {
    return {{"initial_learning_rate", initial_}, {"decay_steps", decay_steps_}, {"alpha", alpha_}};
  }

 private:
  double initial_, decay_steps_, alpha_;
};

}  // namespace loadstar::keras::optimizers::schedules

namespace loadstar::keras::optimizers {

/// An optimizer's learning rate: a constant or a schedule of the step.
/// \code
/// LearningRate constant = 0.01;
/// LearningRate decayed = schedules::ExponentialDecay(0.1, 100, 0.5);
/// \endcode
class LearningRate {
 public:
  LearningRate(double value) : value_(value) {}  // NOLINT: implicit, as Keras takes a float
  template <std::derived_from<schedules::LearningRateSchedule> S>
  LearningRate(S schedule)  // NOLINT: implicit, as Keras takes a schedule
      : schedule_(std::make_shared<const S>(std::move(schedule))) {}
  LearningRate(std::shared_ptr<const schedules::LearningRateSchedule> schedule)  // NOLINT
      : schedule_(std::move(schedule)) {}

  /// The learning rate at `step`.
  double at(std::int64_t step) const { return schedule_ ? (*schedule_)(step) : value_; }
  const schedules::LearningRateSchedule* schedule() const noexcept { return schedule_.get(); }

  nlohmann::json get_config() const {
    if (!schedule_) return value_;
    return {{"class_name", schedule_->class_name()}, {"config", schedule_->get_config()}};
  }

 private:
  double value_ = 0;
  std::shared_ptr<const schedules::LearningRateSchedule> schedule_;
};

}  // namespace loadstar::keras::optimizers
