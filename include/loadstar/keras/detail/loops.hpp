/// \file
/// The loops of `fit`, `evaluate` and `predict`, written on `Model`'s public step API only
/// (`train_step`, `test_step`, `predict_step`, the running metrics and `stop_training`), as
/// ggml-opt writes its high-level functions: a trial runner can copy and adapt them, or drive the
/// same steps itself. Per-call state (class weights, seeds, verbosity, the output stream) is
/// passed as arguments, so calls nest: an `evaluate` from a callback during `fit` leaves the
/// training metrics and the loop alone.
#pragma once

#include <cmath>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/callback_list.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/detail/batch.hpp"
#include "loadstar/keras/model.hpp"
#include "loadstar/keras/options.hpp"

namespace loadstar::keras::detail {

/// The error of a loss that became NaN or infinite.
LOADSTAR_DECL Error non_finite_loss(const std::string& model, double loss, std::size_t epoch,
                                    std::size_t batch, std::string_view where) {
  return Error("model '" + model + "': " + std::string(where) + ": the loss is " +
               (std::isnan(loss) ? "nan" : "inf") + " at batch " + std::to_string(batch) +
               " of epoch " + std::to_string(epoch + 1) +
               "; lower the learning rate or check the data, or add TerminateOnNaN to stop "
               "training instead");
}

/// Runs `step` on batch `batch` (of epoch `epoch`, counted from 1 in the message), adding where
/// to a `ConfigError` or `ShapeError` from the data (a label out of range, a batch of the wrong
/// shape), so that the message names the epoch and the batch of the bad rows.
template <class Step>
const Logs& in_batch(std::string_view where, std::optional<std::size_t> epoch, std::size_t batch,
                     Step&& step) {
  const auto context = [&] {
    return std::string(where) + ": " +
           (epoch ? "epoch " + std::to_string(*epoch + 1) + ", " : std::string()) + "batch " +
           std::to_string(batch) + " (rows counted within the batch): ";
  };
  try {
    return step();
  } catch (const ShapeError& e) {
    throw ShapeError(context() + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(context() + e.what());
  }
}

/// One evaluation pass of `source` (pass `pass`) through `test_step`, with the evaluation metrics
/// reset first; returns the logs. `in_fit`: a validation inside `fit` (the callbacks' params stay
/// those of `fit`).
LOADSTAR_DECL Logs run_test(Model& model, BatchSource& source, callbacks::CallbackList& list,
                            std::size_t pass, bool in_fit) {
  model.evaluation_metrics().reset();
  source.start_epoch(pass);
  if (!in_fit) {
    auto params = list.params();
    params.epochs = 1;
    params.steps = source.steps();
    list.set_params(params);
  }
  list.on_test_begin();
  if (source.max_batch() > 0) model.reserve_batch(source.max_batch());
  const Logs* logs = nullptr;
  std::size_t step = 0;
  while (const auto* batch = source.next()) {
    list.on_test_batch_begin(step);
    logs = &in_batch(in_fit ? "fit: validation" : "evaluate", std::nullopt, step,
                     [&]() -> const Logs& { return model.test_step(*batch); });
    list.on_test_batch_end(step, *logs);
    ++step;
  }
  if (step == 0) {
    throw ShapeError("model '" + model.name() + "': the evaluation data has no batches");
  }
  list.on_test_end(*logs);
  return *logs;
}

/// `fit`'s loop over `data` (continuing mid-epoch when `data` was restored), validating on
/// `validation` every `validation_freq` epochs. A `FitLoop` carries what the loop depends on
/// between batches besides the model: callbacks' `on_fit_begin` may restore it (and move the
/// first epoch forward) before `on_train_begin`, and `on_fit_batch_end` and `on_fit_epoch_end`
/// see it once every other hook of the batch or epoch has run (`BackupAndRestore`).
LOADSTAR_DECL callbacks::History run_fit(Model& model, DataIterator& data, BatchSource* validation,
                                         const FitOptions& options,
                                         const ClassWeight* class_weight) {
  if (options.epochs <= options.initial_epoch) {
    throw ConfigError("fit: epochs (" + std::to_string(options.epochs) +
                      ") must be larger than initial_epoch (" +
                      std::to_string(options.initial_epoch) + ")");
  }
  if (options.validation_freq == 0) {
    throw ConfigError("fit: validation_freq must be positive but is 0");
  }
  const StepOptions step_options{.class_weight = class_weight, .seed = options.seed};
  callbacks::CallbackList list(options.callbacks, model,
                               {options.verbose, options.epochs, data.steps(), options.output});
  const auto history = list.add_history();
  list.add_progbar(options.verbose);
  model.stop_training = false;
  callbacks::FitLoop loop{.data = data,
                          .callbacks = list,
                          .initial_epoch = options.initial_epoch,
                          .epoch = options.initial_epoch,
                          .logs = {}};
  list.on_fit_begin(loop);
  list.on_train_begin();
  if (data.max_batch() > 0) model.reserve_batch(data.max_batch());
  for (std::size_t epoch = loop.initial_epoch; epoch < options.epochs; ++epoch) {
    loop.epoch = epoch;
    // A restored iterator continues its epoch, and the training metrics restored with it.
    if (!data.continues(epoch)) model.training_metrics().reset();
    data.start_epoch(epoch);
    list.on_epoch_begin(epoch);
    std::size_t step = data.step();
    while (const auto* batch = data.next()) {
      list.on_train_batch_begin(step);
      const Logs& logs = in_batch("fit", epoch, step, [&]() -> const Logs& {
        return model.train_step(*batch, step_options);
      });
      // Copied before the hooks (only the first batch's copy allocates); logs a device backend
      // is still computing are followed instead, and read only when a hook reads them.
      loop.logs.follow(logs);
      const bool known = logs.ready();
      list.on_train_batch_end(step, logs);
      if (known) {
        const auto loss = logs.get("loss");
        if (loss && !std::isfinite(*loss) && !model.stop_training) {
          throw non_finite_loss(model.name(), *loss, epoch, step, "fit");
        }
      }
      ++step;
      list.on_fit_batch_end(loop);
      if (model.stop_training) break;
    }
    if (const auto loss = loop.logs.get("loss");
        step > 0 && loss && !std::isfinite(*loss) && !model.stop_training) {
      // A loss read late (a device backend's): the running mean shows it by the epoch's end.
      throw non_finite_loss(model.name(), *loss, epoch, step - 1, "fit");
    }
    if (validation && (epoch + 1 - options.initial_epoch) % options.validation_freq == 0 &&
        !(model.stop_training && step == 0)) {
      const Logs val = run_test(model, *validation, list, epoch, true);
      for (const auto& [name, value] : val)
        loop.logs.set("val_" + name, value);
    }
    list.on_epoch_end(epoch, loop.logs);
    data.finish_epoch();  // a Sequence's on_epoch_end, after the epoch as in tf.keras's fit
    list.on_fit_epoch_end(loop);
    if (model.stop_training) break;
  }
  // Keras 3's fit: the optimizer's final values (the moving averages with use_ema), then
  // on_train_end.
  model.optimizer().finalize_variable_values(model.trainable_variables());
  list.on_train_end(loop.logs);
  return *history;
}

/// `evaluate`'s loop: one pass of `source` with its own callbacks.
LOADSTAR_DECL Logs run_evaluate(Model& model, BatchSource& source, const EvaluateOptions& options) {
  callbacks::CallbackList list(options.callbacks, model,
                               {options.verbose, 1, source.steps(), options.output});
  list.add_progbar(options.verbose);
  return run_test(model, source, list, 0, false);
}

/// `predict`'s loop: the outputs of every batch of `source`, concatenated on the host.
LOADSTAR_DECL std::vector<Tensor<float>> run_predict(Model& model, BatchSource& source,
                                                     const PredictOptions& options) {
  callbacks::CallbackList list(options.callbacks, model,
                               {options.verbose, 1, source.steps(), options.output});
  list.add_progbar(options.verbose);
  source.start_epoch(0);
  list.on_predict_begin();
  if (source.max_batch() > 0) model.reserve_batch(source.max_batch());
  std::vector<std::vector<float>> collected;
  std::vector<Shape> shapes;
  std::size_t rows = 0;
  std::size_t step = 0;
  while (const auto* batch = source.next()) {
    list.on_predict_batch_begin(step);
    const auto& outputs = model.predict_step(*batch);
    collected.resize(outputs.size());
    shapes.resize(outputs.size());
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      const Tensor<float> output =
          outputs[o].is_host() ? outputs[o] : model.backend().to_host(outputs[o]);
      if (step > 0 && outputs[o].shape().row_shape() != shapes[o].row_shape()) {
        throw ShapeError("predict: output '" + model.output_names()[o] + "' has samples of shape " +
                         outputs[o].shape().row_shape().str() + " in batch " +
                         std::to_string(step) + " but " + shapes[o].row_shape().str() +
                         " before, which one array cannot hold (an axis of unknown length); " +
                         "call predict_step on each batch instead");
      }
      collected[o].insert(collected[o].end(), output.begin(), output.end());
      shapes[o] = outputs[o].shape();
    }
    rows += batch->count;
    list.on_predict_batch_end(step);
    ++step;
  }
  list.on_predict_end();
  std::vector<Tensor<float>> out;
  if (collected.empty()) {  // no batches: one empty tensor per output
    for (const auto& output : model.outputs())
      out.emplace_back(output.shape().prepend(0));
  }
  for (std::size_t o = 0; o < collected.size(); ++o)
    out.emplace_back(shapes[o].with_rows(rows), std::span<const float>(collected[o]));
  return out;
}

}  // namespace loadstar::keras::detail
