/// \file
/// `FitLoop`: what `fit`'s loop shares with a callback that checkpoints training and resumes it
/// at the exact batch (`BackupAndRestore`).
#pragma once

#include <cstddef>

#include "loadstar/keras/callbacks/logs.hpp"

namespace loadstar::keras {
class DataIterator;
}  // namespace loadstar::keras

namespace loadstar::keras::callbacks {

class CallbackList;

/// The loop state of one `fit` call, handed to `Callback::on_fit_begin`, `on_fit_batch_end` and
/// `on_fit_epoch_end` (loadstar's hooks; Keras's `BackupAndRestore` restarts an interrupted epoch
/// from its beginning instead). Together with the model's weights, its optimizer and its training
/// metrics, these members are everything the rest of the loop depends on, so a callback that saves
/// them at `on_fit_batch_end` and restores them at `on_fit_begin` makes a new process continue
/// exactly after the saved batch.
struct FitLoop {
  /// The batches `fit` trains on: at `on_fit_batch_end` its `state()` continues after the batch,
  /// at `on_fit_epoch_end` it starts the next epoch.
  DataIterator& data;
  /// Every callback of the call in hook order, `History` and the progress bar included.
  const CallbackList& callbacks;
  /// The epoch the loop starts with: `FitOptions::initial_epoch`, which `on_fit_begin` may move
  /// forward to resume (the epoch of a restored mid-epoch `data`, or the one after a finished
  /// epoch).
  std::size_t initial_epoch = 0;
  /// The epoch running.
  std::size_t epoch = 0;
  /// The logs of the epoch so far: the training logs after the last batch, then with the `val_`
  /// logs at `on_fit_epoch_end`; `on_train_end` receives them. Restored with `data` in the middle
  /// of an epoch, they are what `on_epoch_end` receives when no batch of the epoch remains.
  Logs logs;
};

}  // namespace loadstar::keras::callbacks
