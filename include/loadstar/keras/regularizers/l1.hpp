/// \file
/// `L1`: Keras's L1 penalty.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>

#include "loadstar/keras/regularizers/l1_l2.hpp"

namespace loadstar::keras::regularizers {

/// Keras's `L1(l1=0.01)`: `l1 * sum(|x|)` (also the string `"l1"`).
/// \code
/// regularizers::L1 penalty(0.01);
/// \endcode
class L1 : public L1L2 {
 public:
  explicit L1(double l1 = 0.01) : L1L2(l1, 0.0) {}

  std::string class_name() const override { return "L1"; }
  nlohmann::json get_config() const override { return {{"l1", l1()}}; }

  /// `L1` from Keras's config (`{"l1": 0.01}`; absent or null is 0.01, as Keras).
  static std::shared_ptr<Regularizer> from_config(const nlohmann::json& config) {
    const auto read = keras::detail::ConfigReader::of(config, "regularizer", "L1");
    return std::make_shared<L1>(read_factor(read, "l1", 0.01));
  }
};

}  // namespace loadstar::keras::regularizers
