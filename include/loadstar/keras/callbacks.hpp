/// \file
/// Keras's callbacks: `History`, `ProgbarLogger`, `EarlyStopping`, `ReduceLROnPlateau`,
/// `CSVLogger`, `LearningRateScheduler`, `TerminateOnNaN` and `LambdaCallback`.
#pragma once

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/csv_logger.hpp"
#include "loadstar/keras/callbacks/early_stopping.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/lambda_callback.hpp"
#include "loadstar/keras/callbacks/learning_rate_scheduler.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/callbacks/reduce_lr_on_plateau.hpp"
#include "loadstar/keras/callbacks/terminate_on_nan.hpp"
