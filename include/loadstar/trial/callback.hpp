/// \file
/// `trial::Callback`: Determined's Keras callback (`det.keras.callbacks.Callback`), Keras's hooks
/// plus the workload and checkpoint hooks of the trial runner.
#pragma once

#include <cstdint>
#include <string>

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/logs.hpp"

namespace loadstar::trial {

/// A Keras callback that also hears the trial runner's workloads, in Determined's order
/// (`keras/callbacks.py@0.15.6`): `on_train_begin` once per process; per training workload
/// `on_train_workload_begin` before its first batch, the batches (with `on_epoch_begin` and
/// `on_epoch_end` synthesized every `records_per_epoch / global_batch_size` batches, with empty
/// logs), then `on_train_workload_end` with the workload's averaged training metrics; per
/// validation `on_test_begin` and `on_test_end` with the `val_` metrics; after each checkpoint
/// `on_checkpoint_end` with its folder; `on_train_end` once at the end. `get_state` is saved in
/// every checkpoint and handed to `load_state` before `on_train_begin` on resume. Setting
/// `model().stop_training` requests a stop: the trial checkpoints and exits.
/// \code
/// class Printer : public trial::Callback {
///   void on_train_workload_end(std::uint64_t batches, const keras::Logs& logs) override { ... }
/// };
/// \endcode
class Callback : public keras::callbacks::Callback {
 public:
  /// Before the first batch of a training workload: the batches trained so far and the batches
  /// the workload asks for.
  virtual void on_train_workload_begin(std::uint64_t /*total_batches_trained*/,
                                       std::uint64_t /*batches_requested*/,
                                       const keras::Logs& /*logs*/) {}
  /// After the last batch of a training workload, with its averaged training metrics.
  virtual void on_train_workload_end(std::uint64_t /*total_batches_trained*/,
                                     const keras::Logs& /*logs*/) {}
  /// After a checkpoint's files are in place (the callback may add files to `path`).
  virtual void on_checkpoint_end(const std::string& /*path*/) {}

  std::string class_name() const override { return "TrialCallback"; }
};

}  // namespace loadstar::trial
