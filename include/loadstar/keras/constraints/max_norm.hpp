/// \file
/// `MaxNorm`: Keras's bound on the norm of a weight's slices.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <memory>
#include <string>

#include "loadstar/keras/constraints/constraint.hpp"

namespace loadstar::keras::constraints {

/// Keras's `MaxNorm(max_value=2, axis=0)`: `w * clip(norm, 0, max_value) / (epsilon + norm)`,
/// the norm taken along `axis` (`0`: each column of a `Dense` kernel; `[0, 1, 2]`: each filter of
/// a `Conv2D` kernel).
/// \code
/// constraints::MaxNorm max_norm(3.0);
/// \endcode
class MaxNorm : public Constraint {
 public:
  explicit MaxNorm(double max_value = 2.0, nlohmann::json axis = 0)
      : max_value_(max_value), axes_{std::move(axis)} {}

  std::string class_name() const override { return "MaxNorm"; }
  nlohmann::json get_config() const override {
    return {{"max_value", max_value_}, {"axis", axes_.json}};
  }
  void apply(const Tensor<float>& w) const override {
    const auto top = static_cast<float>(max_value_);
    axes_.rescale(
        w, [top](float norm) { return std::clamp(norm, 0.0F, top) / (detail::epsilon + norm); });
  }
  void check_shape(const Shape& shape, const std::string& owner) const override {
    axes_.check(shape, owner, class_name());
  }

  static std::shared_ptr<Constraint> from_config(const nlohmann::json& config) {
    const auto read = keras::detail::ConfigReader::of(config, "constraint", "MaxNorm");
    const double max_value = read.get<double>("max_value", 2.0);
    if (!(max_value >= 0.0)) read.fail("max_value", "a number at least 0");
    return std::make_shared<MaxNorm>(max_value, detail::NormAxes::read(read).json);
  }

 private:
  double max_value_;
  detail::NormAxes axes_;
};

}  // namespace loadstar::keras::constraints
