/// \file
/// `NonNeg`: Keras's non-negative weights.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/constraints/constraint.hpp"

namespace loadstar::keras::constraints {

/// Keras's `NonNeg()`: `max(w, 0)`.
/// \code
/// constraints::NonNeg non_negative;
/// \endcode
class NonNeg : public Constraint {
 public:
  std::string class_name() const override { return "NonNeg"; }
  nlohmann::json get_config() const override { return nlohmann::json::object(); }
  void apply(const Tensor<float>& w) const override {
    for (float& v : w.span())
      v = v > 0.0F ? v : 0.0F;
  }

  static std::shared_ptr<Constraint> from_config(const nlohmann::json&) {
    return std::make_shared<NonNeg>();
  }
};

}  // namespace loadstar::keras::constraints
