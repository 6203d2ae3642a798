/// \file
/// Learning-rate schedules, as `tf.keras.optimizers.schedules`, and `LearningRate`, a constant
/// or a schedule.
#pragma once

#include "loadstar/config.hpp"

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
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/registry.hpp"

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
  /// Keras's class name (`"ExponentialDecay"`): the key of `Registry<LearningRateSchedule>`.
  virtual std::string class_name() const = 0;
  /// Keras's `get_config()`.
  virtual nlohmann::json get_config() const = 0;

 protected:
  /// A config's `decay_steps`, which must be positive.
  LOADSTAR_DECL static double positive_steps(const keras::detail::ConfigReader& read);
};

/// `initial_learning_rate * decay_rate ^ (step / decay_steps)`, the exponent floored with
/// `staircase`.
/// \code
/// ExponentialDecay schedule(0.1, 1000, 0.96, /*staircase=*/true);
/// \endcode
class ExponentialDecay : public LearningRateSchedule {
 public:
  LOADSTAR_DECL ExponentialDecay(double initial_learning_rate, double decay_steps,
                                 double decay_rate, bool staircase = false);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "ExponentialDecay"; }
  /// The schedule described by a Keras config (`Registry<LearningRateSchedule>`'s factory).
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

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
  LOADSTAR_DECL PiecewiseConstantDecay(std::vector<std::int64_t> boundaries,
                                       std::vector<double> values);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "PiecewiseConstantDecay"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
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
  LOADSTAR_DECL CosineDecay(double initial_learning_rate, double decay_steps, double alpha = 0.0);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "CosineDecay"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  nlohmann::json get_config() const override {
    return {{"initial_learning_rate", initial_}, {"decay_steps", decay_steps_}, {"alpha", alpha_}};
  }

 private:
  double initial_, decay_steps_, alpha_;
};

/// `initial_learning_rate / (1 + decay_rate * step / decay_steps)`, the quotient floored with
/// `staircase`; also what Keras's legacy optimizer argument `decay` means (`decay_steps` 1).
/// \code
/// InverseTimeDecay schedule(0.1, 1.0, 0.5);
/// \endcode
class InverseTimeDecay : public LearningRateSchedule {
 public:
  LOADSTAR_DECL InverseTimeDecay(double initial_learning_rate, double decay_steps,
                                 double decay_rate, bool staircase = false);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "InverseTimeDecay"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 private:
  double initial_, decay_steps_, decay_rate_;
  bool staircase_;
};

}  // namespace loadstar::keras::optimizers::schedules

namespace loadstar::keras {

/// The learning-rate schedule registry: `ExponentialDecay`, `PiecewiseConstantDecay`,
/// `CosineDecay` and `InverseTimeDecay` by their Keras class names.
template <>
struct RegistryTraits<optimizers::schedules::LearningRateSchedule> {
  using Object = std::shared_ptr<const optimizers::schedules::LearningRateSchedule>;
  static constexpr const char* kind = "learning-rate schedule";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(
      Registry<optimizers::schedules::LearningRateSchedule>& registry);
};

}  // namespace loadstar::keras

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

  /// Keras's serialisation: the number, or the schedule's `{"class_name", "config"}`.
  LOADSTAR_DECL nlohmann::json get_config() const;

  /// A number, or a schedule's `{"class_name", "config"}` resolved through
  /// `Registry<LearningRateSchedule>` (custom schedules included).
  LOADSTAR_DECL static LearningRate from_config(const nlohmann::json& config);

 private:
  double value_ = 0;
  std::shared_ptr<const schedules::LearningRateSchedule> schedule_;
};

}  // namespace loadstar::keras::optimizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::optimizers::schedules {

double LearningRateSchedule::positive_steps(const keras::detail::ConfigReader& read) {
  const auto steps = read.get<double>("decay_steps");
  if (!(steps > 0)) read.fail("decay_steps", "a positive number");
  return steps;
}

ExponentialDecay::ExponentialDecay(double initial_learning_rate, double decay_steps,
                                   double decay_rate, bool staircase)
    : initial_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  if (!(decay_steps > 0)) {
    throw ConfigError("ExponentialDecay: decay_steps must be positive but is " +
                      std::to_string(decay_steps));
  }
}

double ExponentialDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / decay_steps_;
  if (staircase_) p = std::floor(p);
  return initial_ * std::pow(decay_rate_, p);
}

std::shared_ptr<const LearningRateSchedule> ExponentialDecay::from_config(
    const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "ExponentialDecay");
  return std::make_shared<ExponentialDecay>(read.get<double>("initial_learning_rate"),
                                            positive_steps(read), read.get<double>("decay_rate"),
                                            read.get("staircase", false));
}

nlohmann::json ExponentialDecay::get_config() const {
  return {{"initial_learning_rate", initial_},
          {"decay_steps", decay_steps_},
          {"decay_rate", decay_rate_},
          {"staircase", staircase_}};
}

PiecewiseConstantDecay::PiecewiseConstantDecay(std::vector<std::int64_t> boundaries,
                                               std::vector<double> values)
    : boundaries_(std::move(boundaries)), values_(std::move(values)) {
  if (values_.size() != boundaries_.size() + 1) {
    throw ConfigError(
        "PiecewiseConstantDecay: values must have one more element than "
        "boundaries but there are " +
        std::to_string(values_.size()) + " values and " + std::to_string(boundaries_.size()) +
        " boundaries");
  }
}

double PiecewiseConstantDecay::operator()(std::int64_t step) const {
  const auto it = std::lower_bound(boundaries_.begin(), boundaries_.end(), step);
  return values_[static_cast<std::size_t>(it - boundaries_.begin())];
}

std::shared_ptr<const LearningRateSchedule> PiecewiseConstantDecay::from_config(
    const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "PiecewiseConstantDecay");
  auto boundaries = read.get<std::vector<std::int64_t>>("boundaries");
  auto values = read.get<std::vector<double>>("values");
  if (values.size() != boundaries.size() + 1) {
    read.fail("values",
              "one more value than the " + std::to_string(boundaries.size()) + " boundaries");
  }
  return std::make_shared<PiecewiseConstantDecay>(std::move(boundaries), std::move(values));
}

CosineDecay::CosineDecay(double initial_learning_rate, double decay_steps, double alpha)
    : initial_(initial_learning_rate), decay_steps_(decay_steps), alpha_(alpha) {
  if (!(decay_steps > 0)) {
    throw ConfigError("CosineDecay: decay_steps must be positive but is " +
                      std::to_string(decay_steps));
  }
}

double CosineDecay::operator()(std::int64_t step) const {
  const double s = std::min(static_cast<double>(step), decay_steps_);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * s / decay_steps_));
  return initial_ * ((1.0 - alpha_) * cosine + alpha_);
}

std::shared_ptr<const LearningRateSchedule> CosineDecay::from_config(const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "CosineDecay");
  // tf.keras 2.13 added a linear warmup; loadstar has none.
  read.expect("warmup_steps", 0, "loadstar's CosineDecay has no warmup");
  return std::make_shared<CosineDecay>(read.get<double>("initial_learning_rate"),
                                       positive_steps(read), read.get("alpha", 0.0));
}

InverseTimeDecay::InverseTimeDecay(double initial_learning_rate, double decay_steps,
                                   double decay_rate, bool staircase)
    : initial_(initial_learning_rate),
      decay_steps_(decay_steps),
      decay_rate_(decay_rate),
      staircase_(staircase) {
  if (!(decay_steps > 0)) {
    throw ConfigError("InverseTimeDecay: decay_steps must be positive but is " +
                      std::to_string(decay_steps));
  }
}

double InverseTimeDecay::operator()(std::int64_t step) const {
  double p = static_cast<double>(step) / decay_steps_;
  if (staircase_) p = std::floor(p);
  return initial_ / (1.0 + decay_rate_ * p);
}

std::shared_ptr<const LearningRateSchedule> InverseTimeDecay::from_config(
    const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "InverseTimeDecay");
  return std::make_shared<InverseTimeDecay>(read.get<double>("initial_learning_rate"),
                                            positive_steps(read), read.get<double>("decay_rate"),
                                            read.get("staircase", false));
}

nlohmann::json InverseTimeDecay::get_config() const {
  return {{"initial_learning_rate", initial_},
          {"decay_steps", decay_steps_},
          {"decay_rate", decay_rate_},
          {"staircase", staircase_}};
}

}  // namespace loadstar::keras::optimizers::schedules
namespace loadstar::keras {

void RegistryTraits<optimizers::schedules::LearningRateSchedule>::defaults(
    Registry<optimizers::schedules::LearningRateSchedule>& registry) {
  using namespace optimizers::schedules;
  registry.add("ExponentialDecay", ExponentialDecay::from_config);
  registry.add("PiecewiseConstantDecay", PiecewiseConstantDecay::from_config);
  registry.add("CosineDecay", CosineDecay::from_config);
  registry.add("InverseTimeDecay", InverseTimeDecay::from_config);
}

}  // namespace loadstar::keras
namespace loadstar::keras::optimizers {

nlohmann::json LearningRate::get_config() const {
  if (!schedule_) return value_;
  return {{"class_name", schedule_->class_name()}, {"config", schedule_->get_config()}};
}

LearningRate LearningRate::from_config(const nlohmann::json& config) {
  if (config.is_number()) return config.get<double>();
  return LearningRate(Registry<schedules::LearningRateSchedule>::instance().create(config));
}

}  // namespace loadstar::keras::optimizers
#endif
