/// \file
/// Reading the arguments every Keras optimizer config shares: the learning rate (a number, a
/// schedule, or Keras 2's legacy `lr` and `decay`), clipping and the name.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/optimizers/schedules.hpp"

namespace loadstar::keras::detail {

/// A reader of an optimizer's Keras config whose errors name the optimizer
/// (`optimizer 'Adam' (Adam)`).
inline ConfigReader optimizer_config(const nlohmann::json& config, std::string_view class_name) {
  return ConfigReader::of(config, "optimizer", class_name);
}

/// Fills the options every optimizer takes (`learning_rate`, `clipnorm`, `global_clipnorm`,
/// `clipvalue`, `name`) from a Keras config, leaving Keras's defaults (already in `options`) where
/// a key is absent or null.
///
/// Keras 2.0-2.3 write `lr` for `learning_rate`, and a legacy `decay`: the learning rate of step
/// `t` is `lr / (1 + decay * t)`, which is `InverseTimeDecay(lr, 1, decay)`. Keras 2.11+'s other
/// keys (`is_legacy_optimizer`, `jit_compile`, `ema_momentum`, `ema_overwrite_frequency`) are
/// ignored; `use_ema` must be false and `weight_decay` null or 0 (AdamW reads its own).
template <class Options>
Options read_optimizer_options(const ConfigReader& read, Options options) {
  const char* key = read.has("learning_rate") ? "learning_rate" : "lr";
  if (read.has(key)) {
    const nlohmann::json& value = *read.find(key);
    if (!value.is_number() && !value.is_object()) {
      read.fail(key, "a number or a schedule {\"class_name\": ..., \"config\": {...}}");
    }
    options.learning_rate =
        read.nested(key, [&] { return optimizers::LearningRate::from_config(value); });
  }
  if (const double decay = read.get("decay", 0.0); decay != 0) {
    if (decay < 0 || options.learning_rate.schedule() != nullptr) {
      read.fail("decay", "a non-negative number with a constant learning rate");
    }
    options.learning_rate =
        optimizers::schedules::InverseTimeDecay(options.learning_rate.at(0), 1.0, decay);
  }
  options.clipnorm = read.optional<double>("clipnorm");
  options.global_clipnorm = read.optional<double>("global_clipnorm");
  options.clipvalue = read.optional<double>("clipvalue");
  read.expect("use_ema", false, "loadstar keeps no moving average of the weights");
  options.name = read.get("name", options.name.c_str());
  return options;
}

/// Throws unless a config's `weight_decay` is absent, null or 0 (only AdamW decays weights).
inline void expect_no_weight_decay(const ConfigReader& read) {
  if (read.get("weight_decay", 0.0) != 0) {
    read.fail("weight_decay", "null or 0 (only AdamW decays weights in loadstar)");
  }
}

}  // namespace loadstar::keras::detail
