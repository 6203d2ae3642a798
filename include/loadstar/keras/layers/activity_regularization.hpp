/// \file
/// `ActivityRegularization`: the identity, with an L1 and L2 penalty on its output.
#pragma once

#include "loadstar/config.hpp"

#include "loadstar/keras/layers/detail/layer_base.hpp"
#include "loadstar/keras/regularizers/l1_l2.hpp"

namespace loadstar::keras::layers {

/// Keras's `ActivityRegularization(l1=0.0, l2=0.0)`: passes its input through and adds
/// `(l1 * sum(|y|) + l2 * sum(y^2)) / batch_size` to the loss (its activity regularizer is
/// `L1L2(l1, l2)`).
/// \code
/// ActivityRegularization penalty(0.0, 0.01);
/// \endcode
class ActivityRegularization : public detail::ShapeOnlyLayer {
 public:
  /// The output has the input's mask (Keras's `supports_masking`).
  MaskFlow mask_flow() const noexcept override { return MaskFlow::passes; }
  /// Throws `ConfigError` for a factor that is negative or not finite.
  LOADSTAR_DECL explicit ActivityRegularization(double l1 = 0.0, double l2 = 0.0,
                                                std::string name = {});

  std::string class_name() const override { return "ActivityRegularization"; }
  double l1() const noexcept { return l1_; }
  double l2() const noexcept { return l2_; }

  LOADSTAR_DECL Shape build(std::span<const Shape> input_shapes, std::uint64_t) override;
  LOADSTAR_DECL nlohmann::json get_config() const override;
  LOADSTAR_DECL static std::shared_ptr<Layer> from_config(const nlohmann::json& config);

 private:
  double l1_, l2_;
};

}  // namespace loadstar::keras::layers

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::layers {

ActivityRegularization::ActivityRegularization(double l1, double l2, std::string name)
    : ShapeOnlyLayer(std::move(name)), l1_(l1), l2_(l2) {
  set_activity_regularizer(std::make_shared<regularizers::L1L2>(l1, l2));
}

Shape ActivityRegularization::build(std::span<const Shape> input_shapes, std::uint64_t) {
  expect_inputs(input_shapes, 1);
  remember(input_shapes, input_shapes[0]);
  return input_shapes[0];
}

nlohmann::json ActivityRegularization::get_config() const {
  auto config = base_config();
  // Keras 3 leaves the activity regularizer out: l1 and l2 make it.
  config.erase("activity_regularizer");
  config["l1"] = l1_;
  config["l2"] = l2_;
  return config;
}

std::shared_ptr<Layer> ActivityRegularization::from_config(const nlohmann::json& config) {
  const auto read = detail::layer_config(config, "ActivityRegularization");
  const double l1 = read.get<double>("l1", 0.0), l2 = read.get<double>("l2", 0.0);
  for (const auto& [key, value] : {std::pair{"l1", l1}, std::pair{"l2", l2}})
    if (!(std::isfinite(value) && value >= 0.0)) read.fail(key, "a finite number at least 0");
  return detail::finish_layer(
      read, std::make_shared<ActivityRegularization>(l1, l2, detail::config_name(read)));
}

}  // namespace loadstar::keras::layers
#endif
