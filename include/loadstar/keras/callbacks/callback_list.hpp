/// \file
/// `CallbackList`: the callbacks of one `fit`, `evaluate` or `predict` call, with the progress
/// bar and `History` Keras adds itself (keras/callbacks/callback_list.py).
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/detail/params.hpp"

namespace loadstar::keras::callbacks {

/// A list of callbacks called as one, in order. A trial runner that drives the step API itself
/// uses it to call the user's callbacks exactly as `fit` does.
/// \code
/// CallbackList list(options.callbacks, model, {.verbose = 1, .epochs = 5, .steps = 100});
/// list.add_progbar(1);
/// list.on_train_begin();
/// \endcode
class CallbackList {
 public:
  CallbackList() = default;
  /// The user's callbacks, bound to `model` with `params`.
  LOADSTAR_DECL CallbackList(std::vector<std::shared_ptr<Callback>> callbacks, Model& model,
                             const CallbackParams& params);

  /// Appends `callback`, bound to the list's model and params.
  LOADSTAR_DECL void add(std::shared_ptr<Callback> callback);
  /// Appends the progress bar `verbose` asks for (none for 0), as Keras does.
  void add_progbar(int verbose) {
    if (verbose != 0) add(std::make_shared<ProgbarLogger>(verbose));
  }
  /// Appends a new `History` and returns it.
  LOADSTAR_DECL std::shared_ptr<History> add_history();

  /// Gives every callback `params` (Keras's `set_params`).
  LOADSTAR_DECL void set_params(const CallbackParams& params);
  const CallbackParams& params() const noexcept { return params_; }

  std::size_t size() const noexcept { return callbacks_.size(); }
  auto begin() const noexcept { return callbacks_.begin(); }
  auto end() const noexcept { return callbacks_.end(); }

  // Keras's hooks, each called on every callback in order.
  void on_train_begin(const Logs& logs = {}) { each(&Callback::on_train_begin, logs); }
  void on_train_end(const Logs& logs = {}) { each(&Callback::on_train_end, logs); }
  void on_epoch_begin(std::size_t epoch, const Logs& logs = {}) {
    each(&Callback::on_epoch_begin, epoch, logs);
  }
  void on_epoch_end(std::size_t epoch, const Logs& logs = {}) {
    each(&Callback::on_epoch_end, epoch, logs);
  }
  void on_train_batch_begin(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_train_batch_begin, batch, logs);
  }
  void on_train_batch_end(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_train_batch_end, batch, logs);
  }
  void on_test_begin(const Logs& logs = {}) { each(&Callback::on_test_begin, logs); }
  void on_test_end(const Logs& logs = {}) { each(&Callback::on_test_end, logs); }
  void on_test_batch_begin(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_test_batch_begin, batch, logs);
  }
  void on_test_batch_end(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_test_batch_end, batch, logs);
  }
  void on_predict_begin(const Logs& logs = {}) { each(&Callback::on_predict_begin, logs); }
  void on_predict_end(const Logs& logs = {}) { each(&Callback::on_predict_end, logs); }
  void on_predict_batch_begin(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_predict_batch_begin, batch, logs);
  }
  void on_predict_batch_end(std::size_t batch, const Logs& logs = {}) {
    each(&Callback::on_predict_batch_end, batch, logs);
  }
  // Loadstar's hooks for checkpointing callbacks (`Callback::on_fit_begin`).
  void on_fit_begin(FitLoop& loop) { each_loop(&Callback::on_fit_begin, loop); }
  void on_fit_batch_end(FitLoop& loop) { each_loop(&Callback::on_fit_batch_end, loop); }
  void on_fit_epoch_end(FitLoop& loop) { each_loop(&Callback::on_fit_epoch_end, loop); }

 private:
  template <class Hook, class... Args>
  void each(Hook hook, const Args&... args) {
    for (auto& cb : callbacks_)
      ((*cb).*hook)(args...);
  }
  void each_loop(void (Callback::*hook)(FitLoop&), FitLoop& loop) {
    for (auto& cb : callbacks_)
      ((*cb).*hook)(loop);
  }

  std::vector<std::shared_ptr<Callback>> callbacks_;
  Model* model_ = nullptr;
  CallbackParams params_{};
};

}  // namespace loadstar::keras::callbacks

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::callbacks {

CallbackList::CallbackList(std::vector<std::shared_ptr<Callback>> callbacks, Model& model,
                           const CallbackParams& params)
    : callbacks_(std::move(callbacks)), model_(&model) {
  for (auto& cb : callbacks_)
    cb->set_model(model);
  set_params(params);
}

void CallbackList::add(std::shared_ptr<Callback> callback) {
  if (model_) callback->set_model(*model_);
  callback->set_params(params_);
  callbacks_.push_back(std::move(callback));
}

std::shared_ptr<History> CallbackList::add_history() {
  auto history = std::make_shared<History>();
  add(history);
  return history;
}

void CallbackList::set_params(const CallbackParams& params) {
  params_ = params;
  for (auto& cb : callbacks_)
    cb->set_params(params);
}

}  // namespace loadstar::keras::callbacks
#endif
