/// \file
/// Keras's callbacks: `History`, `ProgbarLogger`, `EarlyStopping`, `ReduceLROnPlateau`,
/// `CSVLogger`, `LearningRateScheduler`, `TerminateOnNaN`, `LambdaCallback`, `ModelCheckpoint` and
/// `BackupAndRestore`.
#pragma once

#include "loadstar/config.hpp"

#include <memory>

#include "loadstar/keras/callbacks/backup_and_restore.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/csv_logger.hpp"
#include "loadstar/keras/callbacks/early_stopping.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/lambda_callback.hpp"
#include "loadstar/keras/callbacks/learning_rate_scheduler.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/callbacks/model_checkpoint.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/callbacks/reduce_lr_on_plateau.hpp"
#include "loadstar/keras/callbacks/terminate_on_nan.hpp"
#include "loadstar/keras/registry.hpp"

namespace loadstar::keras {

/// The callback registry: `EarlyStopping`, `ReduceLROnPlateau`, `CSVLogger`, `TerminateOnNaN`,
/// `History`, `ProgbarLogger`, `ModelCheckpoint` and `BackupAndRestore` from their configs;
/// `LearningRateScheduler` and `LambdaCallback` hold functions, so theirs throw `ConfigError`
/// saying so.
template <>
struct RegistryTraits<callbacks::Callback> {
  using Object = std::shared_ptr<callbacks::Callback>;
  static constexpr const char* kind = "callback";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<callbacks::Callback>& registry);
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras {

void RegistryTraits<callbacks::Callback>::defaults(Registry<callbacks::Callback>& registry) {
  using namespace callbacks;
  registry.add("EarlyStopping", EarlyStopping::from_config);
  registry.add("ReduceLROnPlateau", ReduceLROnPlateau::from_config);
  registry.add("CSVLogger", CSVLogger::from_config);
  registry.add("TerminateOnNaN", TerminateOnNaN::from_config);
  registry.add("History", History::from_config);
  registry.add("ProgbarLogger", ProgbarLogger::from_config);
  registry.add("LearningRateScheduler", LearningRateScheduler::from_config);
  registry.add("LambdaCallback", LambdaCallback::from_config);
  registry.add("ModelCheckpoint", ModelCheckpoint::from_config);
  registry.add("BackupAndRestore", BackupAndRestore::from_config);
}

}  // namespace loadstar::keras
#endif
