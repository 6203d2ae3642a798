/// \file
/// `L1L2`: Keras's sum of an L1 and an L2 penalty.
#pragma once

#include "loadstar/config.hpp"

#include <cmath>
#include <memory>
#include <string>

#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/regularizers/regularizer.hpp"

namespace loadstar::keras::regularizers {

/// Keras's `L1L2(l1=0.0, l2=0.0)`: `l1 * sum(|x|) + l2 * sum(x^2)`, whose gradient is
/// `l1 * sign(x) + 2 * l2 * x` (`sign(0) = 0`, as TensorFlow's and PyTorch's `abs`). The string
/// `"l1_l2"` makes `L1L2()` as Keras 3's `regularizers.get` does.
/// \code
/// regularizers::L1L2 both(0.01, 0.001);
/// \endcode
class L1L2 : public Regularizer {
 public:
  /// Throws `ConfigError` for a factor that is negative or not finite.
  LOADSTAR_DECL explicit L1L2(double l1 = 0.0, double l2 = 0.0);

  std::string class_name() const override { return "L1L2"; }
  nlohmann::json get_config() const override { return {{"l1", l1_}, {"l2", l2_}}; }
  double l1() const noexcept { return l1_; }
  double l2() const noexcept { return l2_; }

  LOADSTAR_DECL double penalty(const Tensor<float>& x) const override;
  LOADSTAR_DECL void add_gradient(const Tensor<float>& x, double scale,
                                  const Tensor<float>& gradient) const override;

  /// `L1L2` from Keras's config (`{"l1": 0.01, "l2": 0.01}`; absent or null factors are 0).
  LOADSTAR_DECL static std::shared_ptr<Regularizer> from_config(const nlohmann::json& config);

 protected:
  /// Reads a factor of a regularizer's config: a finite number at least 0.
  LOADSTAR_DECL static double read_factor(const keras::detail::ConfigReader& read,
                                          std::string_view key, double fallback);

 private:
  double l1_, l2_;
};

}  // namespace loadstar::keras::regularizers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::regularizers {

L1L2::L1L2(double l1, double l2) : l1_(l1), l2_(l2) {
  for (const auto& [name, value] : {std::pair{"l1", l1}, std::pair{"l2", l2}}) {
    if (!(std::isfinite(value) && value >= 0.0)) {
      throw ConfigError("regularizer " + class_name() + ": " + name +
                        " must be a finite number at least 0 but is " + std::to_string(value));
    }
  }
}

double L1L2::penalty(const Tensor<float>& x) const {
  double absolute = 0.0, squares = 0.0;
  for (const float v : x.span()) {
    absolute += std::abs(static_cast<double>(v));
    squares += static_cast<double>(v) * v;
  }
  return l1_ * absolute + l2_ * squares;
}

void L1L2::add_gradient(const Tensor<float>& x, double scale, const Tensor<float>& gradient) const {
  const float* in = x.data();
  float* out = gradient.data();
  const double l1 = scale * l1_, l2 = 2.0 * scale * l2_;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double v = in[i];
    const double sign = v > 0.0 ? 1.0 : (v < 0.0 ? -1.0 : 0.0);
    out[i] += static_cast<float>(l1 * sign + l2 * v);
  }
}

double L1L2::read_factor(const keras::detail::ConfigReader& read, std::string_view key,
                         double fallback) {
  const double value = read.get<double>(key, fallback);
  if (!(std::isfinite(value) && value >= 0.0)) read.fail(key, "a finite number at least 0");
  return value;
}

std::shared_ptr<Regularizer> L1L2::from_config(const nlohmann::json& config) {
  const auto read = keras::detail::ConfigReader::of(config, "regularizer", "L1L2");
  return std::make_shared<L1L2>(read_factor(read, "l1", 0.0), read_factor(read, "l2", 0.0));
}

}  // namespace loadstar::keras::regularizers
#endif
