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
#include <optional>
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
/// decay_steps)) + alpha)`. With a `warmup_target` (Keras 3, tf.keras 2.13+), the rate first
/// rises linearly from `initial_learning_rate` to `warmup_target` over `warmup_steps`, then decays
/// from `warmup_target` as above over the next `decay_steps`.
/// \code
/// CosineDecay schedule(0.1, 1000, /*alpha=*/0.01);
/// CosineDecay warm(0.0, 1000, 0.0, /*warmup_target=*/0.1, /*warmup_steps=*/100);
/// \endcode
class CosineDecay : public LearningRateSchedule {
 public:
  LOADSTAR_DECL CosineDecay(double initial_learning_rate, double decay_steps, double alpha = 0.0,
                            std::optional<double> warmup_target = std::nullopt,
                            double warmup_steps = 0.0);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "CosineDecay"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 private:
  double initial_, decay_steps_, alpha_;
  std::optional<double> warmup_target_;
  double warmup_steps_;
};

/// Cosine decay with warm restarts (SGDR, Keras's `CosineDecayRestarts`): the first period lasts
/// `first_decay_steps`, each next one `t_mul` times longer and starting from `m_mul` times the
/// previous peak; within a period the rate follows `CosineDecay`'s curve down to
/// `alpha * initial_learning_rate`.
/// \code
/// CosineDecayRestarts schedule(0.1, 1000, /*t_mul=*/2.0, /*m_mul=*/0.9);
/// \endcode
class CosineDecayRestarts : public LearningRateSchedule {
 public:
  LOADSTAR_DECL CosineDecayRestarts(double initial_learning_rate, double first_decay_steps,
                                    double t_mul = 2.0, double m_mul = 1.0, double alpha = 0.0);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "CosineDecayRestarts"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 private:
  double initial_, first_decay_steps_, t_mul_, m_mul_, alpha_;
};

/// `(initial_learning_rate - end_learning_rate) * (1 - step / decay_steps)^power +
/// end_learning_rate`, the step held at `decay_steps`; with `cycle`, `decay_steps` is instead
/// stretched to the first multiple of itself at or above the step.
/// \code
/// PolynomialDecay schedule(0.1, 1000, /*end_learning_rate=*/0.001, /*power=*/2.0);
/// \endcode
class PolynomialDecay : public LearningRateSchedule {
 public:
  LOADSTAR_DECL PolynomialDecay(double initial_learning_rate, double decay_steps,
                                double end_learning_rate = 0.0001, double power = 1.0,
                                bool cycle = false);
  LOADSTAR_DECL double operator()(std::int64_t step) const override;
  std::string class_name() const override { return "PolynomialDecay"; }
  LOADSTAR_DECL static std::shared_ptr<const LearningRateSchedule> from_config(
      const nlohmann::json& config);
  LOADSTAR_DECL nlohmann::json get_config() const override;

 private:
  double initial_, decay_steps_, end_, power_;
  bool cycle_;
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
/// `CosineDecay`, `InverseTimeDecay`, `CosineDecayRestarts` and `PolynomialDecay` by their Keras
/// class names.
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

CosineDecay::CosineDecay(double initial_learning_rate, double decay_steps, double alpha,
                         std::optional<double> warmup_target, double warmup_steps)
    : initial_(initial_learning_rate),
      decay_steps_(decay_steps),
      alpha_(alpha),
      warmup_target_(warmup_target),
      warmup_steps_(warmup_steps) {
  if (!(decay_steps > 0)) {
    throw ConfigError("CosineDecay: decay_steps must be positive but is " +
                      std::to_string(decay_steps));
  }
  if (!(warmup_steps >= 0)) {
    throw ConfigError("CosineDecay: warmup_steps must be positive or zero but is " +
                      std::to_string(warmup_steps));
  }
}

double CosineDecay::operator()(std::int64_t step) const {
  const auto decayed = [&](double s, double from) {
    const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * s / decay_steps_));
    return from * ((1.0 - alpha_) * cosine + alpha_);
  };
  if (!warmup_target_) return decayed(std::min(static_cast<double>(step), decay_steps_), initial_);
  // Keras 3: the step is held at the end of the decay, and the warmup is linear.
  const double s = std::min(static_cast<double>(step), decay_steps_ + warmup_steps_);
  if (s < warmup_steps_) return (*warmup_target_ - initial_) * (s / warmup_steps_) + initial_;
  return decayed(s - warmup_steps_, *warmup_target_);
}

std::shared_ptr<const LearningRateSchedule> CosineDecay::from_config(const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "CosineDecay");
  const auto warmup_steps = read.get("warmup_steps", 0.0);
  if (!(warmup_steps >= 0)) read.fail("warmup_steps", "a number at least 0");
  return std::make_shared<CosineDecay>(read.get<double>("initial_learning_rate"),
                                       positive_steps(read), read.get("alpha", 0.0),
                                       read.optional<double>("warmup_target"), warmup_steps);
}

nlohmann::json CosineDecay::get_config() const {
  return {{"initial_learning_rate", initial_},
          {"decay_steps", decay_steps_},
          {"alpha", alpha_},
          {"warmup_target", warmup_target_ ? nlohmann::json(*warmup_target_) : nullptr},
          {"warmup_steps", warmup_steps_}};
}

CosineDecayRestarts::CosineDecayRestarts(double initial_learning_rate, double first_decay_steps,
                                         double t_mul, double m_mul, double alpha)
    : initial_(initial_learning_rate),
      first_decay_steps_(first_decay_steps),
      t_mul_(t_mul),
      m_mul_(m_mul),
      alpha_(alpha) {
  if (!(first_decay_steps > 0)) {
    throw ConfigError("CosineDecayRestarts: first_decay_steps must be positive but is " +
                      std::to_string(first_decay_steps));
  }
}

double CosineDecayRestarts::operator()(std::int64_t step) const {
  double fraction = static_cast<double>(step) / first_decay_steps_;
  double restart = 0;
  if (t_mul_ == 1.0) {
    restart = std::floor(fraction);
    fraction -= restart;
  } else {
    // Periods 1, t_mul, t_mul^2, ...: the restart whose periods' sum is the last at or below.
    restart = std::floor(std::log(1.0 - fraction * (1.0 - t_mul_)) / std::log(t_mul_));
    const double sum = (1.0 - std::pow(t_mul_, restart)) / (1.0 - t_mul_);
    fraction = (fraction - sum) / std::pow(t_mul_, restart);
  }
  const double cosine =
      0.5 * std::pow(m_mul_, restart) * (1.0 + std::cos(std::numbers::pi * fraction));
  return initial_ * ((1.0 - alpha_) * cosine + alpha_);
}

std::shared_ptr<const LearningRateSchedule> CosineDecayRestarts::from_config(
    const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "CosineDecayRestarts");
  const auto first = read.get<double>("first_decay_steps");
  if (!(first > 0)) read.fail("first_decay_steps", "a positive number");
  return std::make_shared<CosineDecayRestarts>(read.get<double>("initial_learning_rate"), first,
                                               read.get("t_mul", 2.0), read.get("m_mul", 1.0),
                                               read.get("alpha", 0.0));
}

nlohmann::json CosineDecayRestarts::get_config() const {
  return {{"initial_learning_rate", initial_},
          {"first_decay_steps", first_decay_steps_},
          {"t_mul", t_mul_},
          {"m_mul", m_mul_},
          {"alpha", alpha_}};
}

PolynomialDecay::PolynomialDecay(double initial_learning_rate, double decay_steps,
                                 double end_learning_rate, double power, bool cycle)
    : initial_(initial_learning_rate),
      decay_steps_(decay_steps),
      end_(end_learning_rate),
      power_(power),
      cycle_(cycle) {
  if (!(decay_steps > 0)) {
    throw ConfigError("PolynomialDecay: decay_steps must be positive but is " +
                      std::to_string(decay_steps));
  }
}

double PolynomialDecay::operator()(std::int64_t step) const {
  auto s = static_cast<double>(step);
  double steps = decay_steps_;
  if (cycle_) {
    steps *= s == 0 ? 1.0 : std::ceil(s / decay_steps_);
  } else {
    s = std::min(s, steps);
  }
  return (initial_ - end_) * std::pow(1.0 - s / steps, power_) + end_;
}

std::shared_ptr<const LearningRateSchedule> PolynomialDecay::from_config(
    const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "schedule", "PolynomialDecay");
  return std::make_shared<PolynomialDecay>(
      read.get<double>("initial_learning_rate"), positive_steps(read),
      read.get("end_learning_rate", 0.0001), read.get("power", 1.0), read.get("cycle", false));
}

nlohmann::json PolynomialDecay::get_config() const {
  return {{"initial_learning_rate", initial_},
          {"decay_steps", decay_steps_},
          {"end_learning_rate", end_},
          {"power", power_},
          {"cycle", cycle_}};
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
  registry.add("CosineDecayRestarts", CosineDecayRestarts::from_config);
  registry.add("PolynomialDecay", PolynomialDecay::from_config);
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
