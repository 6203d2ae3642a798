/// \file
/// Reading the arguments every Keras optimizer config shares: the learning rate (a number, a
/// schedule, or Keras 2's legacy `lr` and `decay`), clipping and the name.
#pragma once

#include <cstdint>
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
/// `clipvalue`, `weight_decay`, `use_ema`, `ema_momentum`, `ema_overwrite_frequency`, `name`) from
/// a Keras config, leaving the defaults already in `options` (Keras's, AdamW's `weight_decay`
/// 0.004 included) where a key is absent or null.
///
/// Keras 2.0-2.3 write `lr` for `learning_rate`, and a legacy `decay`: the learning rate of step
/// `t` is `lr / (1 + decay * t)`, which is `InverseTimeDecay(lr, 1, decay)`. tf.keras 2.11+'s
/// `is_legacy_optimizer` and `jit_compile` change nothing here and are ignored; Keras 3's
/// `loss_scale_factor` and `gradient_accumulation_steps` must be null.
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
  if (read.has("weight_decay")) options.weight_decay = read.get<double>("weight_decay");
  options.use_ema = read.get("use_ema", options.use_ema);
  options.ema_momentum = read.get("ema_momentum", options.ema_momentum);
  options.ema_overwrite_frequency = read.optional<std::int64_t>("ema_overwrite_frequency");
  read.expect("loss_scale_factor", nullptr,
              "loadstar trains in float32 and does not scale the loss");
  read.expect("gradient_accumulation_steps", nullptr,
              "loadstar applies the gradients of every batch");
  options.name = read.get("name", options.name.c_str());
  return options;
}

}  // namespace loadstar::keras::detail
