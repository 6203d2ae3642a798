/// \file
/// `L2`: Keras's L2 penalty.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/regularizers/l1_l2.hpp"

namespace loadstar::keras::regularizers {

/// Keras's `L2(l2=0.01)`: `l2 * sum(x^2)` (also the string `"l2"`).
/// \code
/// regularizers::L2 penalty(0.01);
/// \endcode
class L2 : public L1L2 {
 public:
  explicit L2(double l2 = 0.01) : L1L2(0.0, l2) {}

  std::string class_name() const override { return "L2"; }
  nlohmann::json get_config() const override { return {{"l2", l2()}}; }

  /// `L2` from Keras's config (`{"l2": 0.01}`; absent or null is 0.01, as Keras).
  static std::shared_ptr<Regularizer> from_config(const nlohmann::json& config) {
    const auto read = keras::detail::ConfigReader::of(config, "regularizer", "L2");
    return std::make_shared<L2>(read_factor(read, "l2", 0.01));
  }
};

}  // namespace loadstar::keras::regularizers
