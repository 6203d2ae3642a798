/// \file
/// The arguments of `compile`, `fit`, `evaluate`, `predict` and of one step, for designated
/// initializers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "loadstar/data/class_weight.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/detail/args.hpp"
#include "loadstar/keras/validation_data.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The arguments of `compile`, for designated initializers.
/// \code
/// model.compile({.optimizer = Adam(1e-3), .loss = "sparse_categorical_crossentropy",
///                .metrics = {"accuracy"}, .threads = 4});
/// \endcode
struct CompileOptions {
  /// An optimizer name (`"adam"`, `"sgd"`, `"rmsprop"`) or object.
  OptimizerArg optimizer = "rmsprop";
  /// One loss for every output, a list by output position or a map by output name.
  Losses loss = {};
  /// Metric names (`"accuracy"`) or objects, computed for every output without sample or class
  /// weights, as Keras's `metrics`.
  std::vector<MetricArg> metrics = {};
  /// The weight of each output's loss in the total loss (default 1 each).
  std::vector<double> loss_weights = {};
  /// Metrics computed with the sample weights (and those `class_weight` gives), as Keras's
  /// `weighted_metrics`; named `weighted_<name>` when `metrics` has the same name.
  std::vector<MetricArg> weighted_metrics = {};
  /// The threads the CPU backend computes with (the same thread count and seed give
  /// bitwise-identical weights); used when `backend` is not given.
  std::size_t threads = 1;
  /// The backend whose memory holds the weights, activations and batches and whose kernels
  /// compute the step; by default `cpu_backend(threads)`, made at `compile`. Weights move to its
  /// memory before the first step.
  std::shared_ptr<Backend> backend = nullptr;
  /// Keras 3's `auto_scale_loss`: a model whose dtype policy is `"mixed_float16"` wraps the
  /// optimizer in a `LossScaleOptimizer` (unless it already scales the loss).
  bool auto_scale_loss = true;
};

/// The arguments of `fit`, in Keras's order except that `epochs` comes before `batch_size`
/// (designated initializers must follow the declaration order).
/// \code
/// model.fit(x, y, {.epochs = 5, .batch_size = 32, .validation_split = 0.1});
/// \endcode
struct FitOptions {
  std::size_t epochs = 1;
  /// Rows per batch for arrays (a `Sequence` or `Dataset` makes its own batches).
  std::size_t batch_size = 32;
  /// 0: silent, 1: progress bar, 2: one line per epoch.
  int verbose = 1;
  std::vector<std::shared_ptr<callbacks::Callback>> callbacks = {};
  /// The last fraction of the arrays' rows, before shuffling, validates (arrays only).
  double validation_split = 0.0;
  ValidationData validation_data = {};
  /// Arrays: shuffle the rows every epoch; `Sequence`: shuffle the order of batches every epoch.
  /// Seeded by `seed`: the same seed gives the same order.
  bool shuffle = true;
  std::optional<ClassWeight> class_weight = {};
  /// One weight per row of the arrays (arrays only).
  std::optional<Tensor<float>> sample_weight = {};
  std::size_t initial_epoch = 0;
  /// Batches per epoch (default: one pass over the data).
  std::optional<std::size_t> steps_per_epoch = {};
  /// Validation batches per validation (default: one pass).
  std::optional<std::size_t> validation_steps = {};
  /// Rows per validation batch for arrays (default: `batch_size`).
  std::optional<std::size_t> validation_batch_size = {};
  /// Validate every `validation_freq` epochs.
  std::size_t validation_freq = 1;
  /// `Sequence` only: the prefetch queue of the `SequenceAdapter` that serves it.
  std::size_t max_queue_size = 10;
  /// `Sequence` only: the workers building batches ahead, exactly as many as asked for (a
  /// `SequenceAdapter<S, dynamic_workers>`; at most `AdapterOptions::max_workers`). 0 builds
  /// batches on the training thread.
  std::size_t workers = 1;
  /// `Sequence` only: build batches in forked processes (the batch type must be `Serializable`).
  bool use_multiprocessing = false;
  /// The seed of shuffling (default: the seed of `set_random_seed`).
  std::optional<std::uint64_t> seed = {};
  /// Where the progress bar and the callbacks write (default: `std::cout`).
  std::ostream* output = nullptr;
  /// Data-parallel training: this rank and the number of ranks (Determined's `shard_rank` and
  /// `num_shards`). Arrays are sharded by row: step `k` of every rank together covers the global
  /// batch of `batch_size * num_shards` rows that one process would take at that batch size, and
  /// every rank has the same steps per epoch. A `Sequence` is sharded by batch (rank `r` takes
  /// batches `r, r + num_shards, ...` of the stream).
  std::size_t shard_rank = 0;
  std::size_t num_shards = 1;
};

/// The arguments of `evaluate`.
struct EvaluateOptions {
  std::size_t batch_size = 32;
  int verbose = 1;
  std::optional<Tensor<float>> sample_weight = {};
  std::optional<std::size_t> steps = {};
  std::vector<std::shared_ptr<callbacks::Callback>> callbacks = {};
  /// Where the progress bar and the callbacks write (default: `std::cout`).
  std::ostream* output = nullptr;
  /// Arrays only: evaluate this rank's share of the rows (`stream[shard_rank::num_shards]`), so
  /// that the ranks together see every row once (merge their metrics for the global result).
  std::size_t shard_rank = 0;
  std::size_t num_shards = 1;
};

/// The arguments of `predict`.
struct PredictOptions {
  std::size_t batch_size = 32;
  int verbose = 0;
  std::optional<std::size_t> steps = {};
  std::vector<std::shared_ptr<callbacks::Callback>> callbacks = {};
  /// Where the progress bar and the callbacks write (default: `std::cout`).
  std::ostream* output = nullptr;
};

/// What a step needs besides its batch, as loop arguments: `fit` passes its `class_weight` and
/// seed; a runner that drives `train_step` itself passes its own.
struct StepOptions {
  /// Keras's `class_weight`, applied to batches that carry no sample weights.
  const ClassWeight* class_weight = nullptr;
  /// The seed of dropout masks (default: the seed of `set_random_seed`); masks also depend on the
  /// optimizer's iteration count, so a resumed run draws the same masks.
  std::optional<std::uint64_t> seed = {};
};

}  // namespace loadstar::keras
