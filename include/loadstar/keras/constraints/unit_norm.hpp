/// \file
/// `UnitNorm`: Keras's unit norm of a weight's slices.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/constraints/constraint.hpp"

namespace loadstar::keras::constraints {

/// Keras's `UnitNorm(axis=0)`: `w / (epsilon + norm)`, the norm taken along `axis`.
/// \code
/// constraints::UnitNorm unit;
/// \endcode
class UnitNorm : public Constraint {
 public:
  explicit UnitNorm(nlohmann::json axis = 0) : axes_{std::move(axis)} {}

  std::string class_name() const override { return "UnitNorm"; }
  nlohmann::json get_config() const override { return {{"axis", axes_.json}}; }
  void apply(const Tensor<float>& w) const override {
    axes_.rescale(w, [](float norm) { return 1.0F / (detail::epsilon + norm); });
  }
  void check_shape(const Shape& shape, const std::string& owner) const override {
    axes_.check(shape, owner, class_name());
  }

  static std::shared_ptr<Constraint> from_config(const nlohmann::json& config) {
    const auto read = keras::detail::ConfigReader::of(config, "constraint", "UnitNorm");
    return std::make_shared<UnitNorm>(detail::NormAxes::read(read).json);
  }

 private:
  detail::NormAxes axes_;
};

}  // namespace loadstar::keras::constraints
