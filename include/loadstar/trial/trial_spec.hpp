/// \file
/// `TrialSpec`, `RunOptions` and `TrialResult`: where `run_trial` runs a trial, how far and how
/// loudly, and what the run ended with.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "loadstar/dist/collective.hpp"
#include "loadstar/trial/experiment_config.hpp"

namespace loadstar::trial {

namespace detail {
class LoaderProcess;
}  // namespace detail

/// Where a trial runs: its configuration, identity, hyperparameters, seed and folders.
struct TrialSpec {
  ExperimentConfig config = {};
  std::uint64_t experiment_id = 1;
  std::uint64_t trial_id = 1;
  nlohmann::json hparams = nlohmann::json::object();
  std::uint32_t trial_seed = 0;
  /// The runner owns it: `metrics.jsonl`, `trial.json`.
  std::filesystem::path trial_dir = {};
  /// Checkpoints go to `checkpoint_dir/<uuid>/`.
  std::filesystem::path checkpoint_dir = {};
  /// A warm start (Determined's `searcher.source_checkpoint_uuid`): a checkpoint folder whose
  /// model weights and optimizer state the trial starts from when it has no checkpoint of its
  /// own; its data, random state and callbacks start afresh, from batch 0. Empty: none.
  std::filesystem::path warm_start = {};
  /// The ranks of a data-parallel trial (`dist::mpi_world()` under `mpirun`); null: one process.
  /// Every rank runs the same spec; rank 0 writes the files.
  std::shared_ptr<dist::Collective> collective = nullptr;
  /// Under `mpirun`: the process forked before `MPI_Init` that serves the training batches when
  /// the training loader forks worker processes (`trial run` starts it); null otherwise.
  std::shared_ptr<detail::LoaderProcess> training_process = nullptr;
};

/// How far and how loudly to run.
struct RunOptions {
  /// The searcher operation (cumulative); unset: `searcher.max_length`.
  std::optional<Length> until = {};
  /// Determined's `--test`: train 1 batch, validate 1 batch, checkpoint.
  bool test = false;
  /// Keras's progress bar (one per epoch of `records_per_epoch`, else per training workload),
  /// and a line per validation, checkpoint and resume.
  bool verbose = true;
  /// Where the workload lines go (default: `std::cout`).
  std::ostream* output = nullptr;
};

/// What a run ended with.
struct TrialResult {
  std::uint64_t total_batches = 0;
  /// The searcher metric of the validation that ended the operation (none after a stop).
  std::optional<double> searcher_metric = {};
  bool stop_requested = false;
  /// A SIGTERM or SIGINT paused it: it checkpointed and exited before its operation's end.
  bool paused = false;
  std::string latest_checkpoint = {};
  std::string best_checkpoint = {};
  std::uint64_t restarts = 0;
};

}  // namespace loadstar::trial
