/// \file
/// `trial::Callback`: Determined's Keras callback (`det.keras.callbacks.Callback`), Keras's hooks
/// plus the workload and checkpoint hooks of the trial runner.
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/callback_list.hpp"
#include "loadstar/keras/callbacks/logs.hpp"

namespace loadstar::trial {

/// A Keras callback that also hears the trial runner's workloads, in Determined's order
/// (`keras/callbacks.py@0.15.6`): `on_train_begin` once per process; per training workload
/// `on_train_workload_begin` before its first batch, the batches (with `on_epoch_begin` and
/// `on_epoch_end` synthesized every `records_per_epoch / global_batch_size` batches), then
/// `on_train_workload_end` with the workload's averaged training metrics; per validation
/// `on_test_begin` and `on_test_end` with the `val_` metrics; after each checkpoint
/// `on_checkpoint_end` with its folder; `on_train_end` once at the end. `get_state` is saved in
/// every checkpoint and handed to `load_state` before `on_train_begin` on resume. Setting
/// `model().stop_training` requests a stop: the trial checkpoints and exits.
///
/// Unlike Determined, whose synthesized epoch ends carry empty logs, `on_epoch_end` gets the logs
/// a Keras user expects from `fit`: the latest training metrics (the running means of the
/// workload that ended the epoch) and the latest validation's `val_` metrics. An epoch that ends
/// on a workload's last batch waits for a validation at that batch, as `fit` validates before
/// `on_epoch_end`; so Keras's `EarlyStopping`, `ReduceLROnPlateau`, `ModelCheckpoint` and
/// `CSVLogger` work unchanged in a trial.
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

/// A trial's callbacks called as one: Keras's hooks on every callback, in order (as `fit` calls
/// them), and the workload and checkpoint hooks on those that are `trial::Callback`s.
class CallbackList : public keras::callbacks::CallbackList {
 public:
  CallbackList() = default;
  /// The trial's callbacks, bound to `model` with `params`.
  LOADSTAR_DECL CallbackList(std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks,
                             keras::Model& model, const keras::CallbackParams& params);

  void on_train_workload_begin(std::uint64_t total_batches_trained, std::uint64_t batches_requested,
                               const keras::Logs& logs = {}) {
    for (auto* cb : trial_)
      cb->on_train_workload_begin(total_batches_trained, batches_requested, logs);
  }
  void on_train_workload_end(std::uint64_t total_batches_trained, const keras::Logs& logs) {
    for (auto* cb : trial_)
      cb->on_train_workload_end(total_batches_trained, logs);
  }
  void on_checkpoint_end(const std::string& path) {
    for (auto* cb : trial_)
      cb->on_checkpoint_end(path);
  }

 private:
  std::vector<Callback*> trial_;  // the trial::Callbacks among the list's, in order
};

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial {

CallbackList::CallbackList(std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks,
                           keras::Model& model, const keras::CallbackParams& params)
    : keras::callbacks::CallbackList(std::move(callbacks), model, params) {
  for (const auto& cb : *this) {
    if (auto* t = dynamic_cast<Callback*>(cb.get())) trial_.push_back(t);
  }
}

}  // namespace loadstar::trial
#endif
