/// \file
/// Determined's trial layer: `KerasTrial` and `TrialContext`, experiment configurations,
/// the workload sequencer, checkpoints with exact resume, searchers, experiments and the command
/// line that `LOADSTAR_TRIAL_MAIN()` gives a trainer. Needs yaml-cpp and CLI11 besides what
/// `<loadstar/keras.hpp>` needs (the `loadstar-trial` dependency and pkg-config module).
/// \code
/// #include <loadstar/trial.hpp>
/// class MyTrial : public loadstar::trial::KerasTrial { ... };
/// LOADSTAR_REGISTER_TRIAL(MyTrial, "model_def:MyTrial");
/// LOADSTAR_TRIAL_MAIN();  // my_trainer experiment create const.yaml
/// \endcode
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include "loadstar/trial/callback.hpp"
#include "loadstar/trial/callbacks.hpp"
#include "loadstar/trial/checkpoint.hpp"
#include "loadstar/trial/data_loader.hpp"
#include "loadstar/trial/experiment.hpp"
#include "loadstar/trial/experiment_config.hpp"
#include "loadstar/trial/hyperparameters.hpp"
#include "loadstar/trial/invalid_hp.hpp"
#include "loadstar/trial/keras_trial.hpp"
#include "loadstar/trial/main.hpp"
#include "loadstar/trial/native.hpp"
#include "loadstar/trial/operations.hpp"
#include "loadstar/trial/plot.hpp"
#include "loadstar/trial/registry.hpp"
#include "loadstar/trial/searcher.hpp"
#include "loadstar/trial/trial_context.hpp"
#include "loadstar/trial/trial_runner.hpp"
#include "loadstar/trial/trial_spec.hpp"
#include "loadstar/trial/workload_sequencer.hpp"
