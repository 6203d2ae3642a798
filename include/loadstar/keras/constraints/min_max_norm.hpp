/// \file
/// `MinMaxNorm`: Keras's bounds on the norm of a weight's slices.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "loadstar/keras/constraints/constraint.hpp"

namespace loadstar::keras::constraints {

/// Keras's `MinMaxNorm(min_value=0.0, max_value=1.0, rate=1.0, axis=0)`:
/// `w * (rate * clip(norm, min_value, max_value) + (1 - rate) * norm) / (epsilon + norm)`.
/// \code
/// constraints::MinMaxNorm bounded(0.5, 1.0, 0.5);
/// \endcode
class MinMaxNorm : public Constraint {
 public:
  explicit MinMaxNorm(double min_value = 0.0, double max_value = 1.0, double rate = 1.0,
                      nlohmann::json axis = 0)
      : min_value_(min_value), max_value_(max_value), rate_(rate), axes_{std::move(axis)} {
    if (!(min_value <= max_value)) {
      throw ConfigError("constraint MinMaxNorm: min_value " + std::to_string(min_value) +
                        " must be at most max_value " + std::to_string(max_value));
    }
  }

  std::string class_name() const override { return "MinMaxNorm"; }
  nlohmann::json get_config() const override {
    return {{"min_value", min_value_},
            {"max_value", max_value_},
            {"rate", rate_},
            {"axis", axes_.json}};
  }
  void apply(const Tensor<float>& w) const override {
    const auto low = static_cast<float>(min_value_), high = static_cast<float>(max_value_);
    const auto rate = static_cast<float>(rate_);
    axes_.rescale(w, [=](float norm) {
      const float desired = rate * std::clamp(norm, low, high) + (1.0F - rate) * norm;
      return desired / (detail::epsilon + norm);
    });
  }
  void check_shape(const Shape& shape, const std::string& owner) const override {
    axes_.check(shape, owner, class_name());
  }

  static std::shared_ptr<Constraint> from_config(const nlohmann::json& config) {
    const auto read = keras::detail::ConfigReader::of(config, "constraint", "MinMaxNorm");
    const double low = read.get<double>("min_value", 0.0);
    const double high = read.get<double>("max_value", 1.0);
    if (!(low <= high)) read.fail("max_value", "a number at least min_value");
    return std::make_shared<MinMaxNorm>(low, high, read.get<double>("rate", 1.0),
                                        detail::NormAxes::read(read).json);
  }

 private:
  double min_value_, max_value_, rate_;
  detail::NormAxes axes_;
};

}  // namespace loadstar::keras::constraints
