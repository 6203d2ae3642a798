/// \file
/// `Model`: Keras's functional model, with `compile`, `fit`, `evaluate`, `predict`,
/// `train_on_batch`, `test_on_batch`, `summary`, `get_weights` and `set_weights`.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/array_sequence.hpp"
#include "loadstar/data/class_weight.hpp"
#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/data/validation_split.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/backend/cpu_backend.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/detail/args.hpp"
#include "loadstar/keras/detail/batch.hpp"
#include "loadstar/keras/detail/flush_denormal.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/params.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/losses.hpp"
#include "loadstar/keras/metrics.hpp"
#include "loadstar/keras/optimizers.hpp"
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
  /// Metric names (`"accuracy"`) or objects, computed for every output.
  std::vector<MetricArg> metrics = {};
  /// The weight of each output's loss in the total loss (default 1 each).
  std::vector<double> loss_weights = {};
  /// The threads the CPU backend computes with (the same thread count and seed give
  /// bitwise-identical weights); used when `backend` is not given.
  std::size_t threads = 1;
  /// The backend whose memory holds the weights, activations and batches and whose kernels
  /// compute the step; by default a `CpuBackend(threads)` made at `compile`. Weights move to its
  /// memory before the first step.
  std::shared_ptr<Backend> backend = nullptr;
};

/// The validation data of `fit`: arrays `(x, y[, sample_weight])`, a `Sequence` or a `Dataset`
/// (held by a shared pointer: pass `std::move(dataset)` or a copy). Empty by default.
/// \code
/// model.fit(x, y, {.epochs = 5, .validation_data = {x_test, y_test}});
/// \endcode
class ValidationData {
 public:
  ValidationData() = default;
  template <ArrayLike X, ArrayLike Y>
  ValidationData(X x, Y y)  // NOLINT: implicit, for `.validation_data = {x, y}`
      : make_([x = std::move(x), y = std::move(y)](std::size_t batch_size,
                                                   std::optional<std::size_t> steps) {
          return arrays(x, y, std::nullopt, batch_size, steps);
        }) {}
  template <ArrayLike X, ArrayLike Y>
  ValidationData(X x, Y y, Tensor<float> sample_weight)
      : make_([x = std::move(x), y = std::move(y), w = std::move(sample_weight)](
                  std::size_t batch_size, std::optional<std::size_t> steps) {
          return arrays(x, y, w, batch_size, steps);
        }) {}
  template <KerasSequence S>
  requires(!ArrayLike<S>) ValidationData(S sequence)  // NOLINT: implicit on purpose
      : make_([sequence = std::move(sequence)](std::size_t, std::optional<std::size_t> steps) {
          return std::shared_ptr<detail::BatchSource>(
              std::make_shared<detail::SequenceSource<S>>(sequence, steps));
        }) {}
  template <Dataset D>
  requires KerasBatch<element_t<D>> ValidationData(D dataset)  // NOLINT: implicit on purpose
      : make_([dataset = std::make_shared<D>(std::move(dataset))](std::size_t,
                                                                  std::optional<std::size_t>) {
          return std::shared_ptr<detail::BatchSource>(
              std::make_shared<detail::DatasetSource<D&>>(*dataset, std::nullopt));
        }) {}

  bool empty() const noexcept { return !make_; }

  /// The source of validation batches (for the model).
  std::shared_ptr<detail::BatchSource> source(std::size_t batch_size,
                                              std::optional<std::size_t> steps) const {
    return make_(batch_size, steps);
  }

 private:
  template <ArrayLike X, ArrayLike Y>
  static std::shared_ptr<detail::BatchSource> arrays(const X& x, const Y& y,
                                                     std::optional<Tensor<float>> w,
                                                     std::size_t batch_size,
                                                     std::optional<std::size_t> steps) {
    const std::size_t rows = rows_of(x, "x", "validation_data");
    const std::size_t y_rows = rows_of(y, "y", "validation_data");
    if (y_rows != rows) {
      throw ShapeError("validation_data: y has " + std::to_string(y_rows) + " rows but x has " +
                       std::to_string(rows));
    }
    return std::make_shared<detail::ArraySource<X, Y>>(x, y, std::move(w), rows,
                                                       std::min(batch_size, rows), false, 0, steps);
  }

  std::function<std::shared_ptr<detail::BatchSource>(std::size_t, std::optional<std::size_t>)>
      make_;
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
  std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks = {};
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
  /// `Sequence` only: the workers building batches ahead. The adapter's worker count is a
  /// template parameter; `fit` instantiates 0, 1, 2, 4 and 8 and uses the largest of those that
  /// is not more than `workers` (so 3 runs 2, and anything above 8 runs 8). 0 builds batches on
  /// the training thread.
  std::size_t workers = 1;
  /// `Sequence` only: build batches in forked processes (the batch type must be `Serializable`).
  bool use_multiprocessing = false;
  /// The seed of shuffling (default: the seed of `set_random_seed`).
  std::optional<std::uint64_t> seed = {};
};

/// The arguments of `evaluate`.
struct EvaluateOptions {
  std::size_t batch_size = 32;
  int verbose = 1;
  std::optional<Tensor<float>> sample_weight = {};
  std::optional<std::size_t> steps = {};
  std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks = {};
};

/// The arguments of `predict`.
struct PredictOptions {
  std::size_t batch_size = 32;
  int verbose = 0;
  std::optional<std::size_t> steps = {};
  std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks = {};
};

/// Keras's functional `Model`: a directed acyclic graph of layer calls from named `Input`s to
/// outputs, trained with `compile` and `fit`.
///
/// Layers are called on symbolic tensors with `call(layer, x)` (Keras's `layer(x)`), which
/// builds them; the model runs the calls in topological order. Unnamed layers get Keras's names,
/// unique in the model (`dense`, `dense_1`, ...), unnamed inputs `input_1`, `input_2`, ...
/// Inputs are fed by position (a tensor, a list or a tuple) or by name (a map); targets likewise,
/// by the names of the output layers.
///
/// On the first batch the model allocates the activations and gradients of every node for the
/// largest batch it will see (the batch size with arrays); smaller batches use views of the same
/// buffers (`slice_rows`), and data of any element type is converted to float into reused
/// buffers, so that after the first batch a training step allocates nothing.
/// \code
/// auto image = Input({28, 28}, "image");
/// auto x = call(Flatten(), image);
/// x = call(Dense(128, {.activation = "relu"}), x);
/// auto logits = call(Dense(10), x);
/// Model model(image, logits);
/// model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
/// keras::callbacks::History history = model.fit(x_train, y_train, {.epochs = 5, .validation_split
/// = 0.1}); Logs results = model.evaluate(x_test, y_test);  // results.get("accuracy") \endcode
class Model {
 public:
  /// A model from its inputs to its outputs; throws `ConfigError` when an output depends on an
  /// `Input` that is not among `inputs`, or two layers share a name.
  Model(std::vector<KerasTensor> inputs, std::vector<KerasTensor> outputs,
        std::string name = "model")
      : name_(std::move(name)) {
    set_graph(std::move(inputs), std::move(outputs));
  }
  Model(const KerasTensor& input, const KerasTensor& output, std::string name = "model")
      : Model(std::vector<KerasTensor>{input}, std::vector<KerasTensor>{output}, std::move(name)) {}

  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// Set by a callback to end `fit` (after the current batch, or at the end of the epoch when set
  /// in `on_epoch_end`), as Keras's `model.stop_training`.
  bool stop_training = false;

  const std::string& name() const noexcept { return name_; }

  /// The layers in the order Keras lists them (inputs excluded), each once.
  const std::vector<std::shared_ptr<Layer>>& layers() const noexcept { return layers_; }

  /// The layer named `name`; throws `ConfigError` when there is none.
  std::shared_ptr<Layer> get_layer(std::string_view name) const {
    for (const auto& layer : layers_) {
      if (layer->name() == name) return layer;
    }
    throw ConfigError("model '" + name_ + "': no layer named '" + std::string(name) + "'");
  }

  /// The symbolic inputs and outputs the model was built from (Keras's `model.inputs` and
  /// `model.outputs`); their nodes hold the layer calls (`inbound_nodes` in `get_config`).
  const std::vector<KerasTensor>& inputs() const noexcept { return graph_inputs_; }
  const std::vector<KerasTensor>& outputs() const noexcept { return graph_outputs_; }

  /// The names of the inputs, in order.
  const std::vector<std::string>& input_names() const noexcept { return input_names_; }
  /// The names of the outputs (their layers' names), in order.
  const std::vector<std::string>& output_names() const noexcept { return output_names_; }

  /// Prepares training: the optimizer, one loss per output, metrics and loss weights, and the
  /// thread count. Throws `ConfigError` for unknown names, for a number of losses or loss weights
  /// that is not the number of outputs, and for a map of losses naming no output.
  void compile(const CompileOptions& options) {
    options_ = options;
    std::shared_ptr<Backend> backend =
        options.backend ? options.backend : std::make_shared<CpuBackend>(options.threads);
    if (backend_ && backend_->device() != backend->device()) {
      // Weights in the previous backend's memory come back to the host, to move to the new
      // backend's memory before the next step; the activations are allocated again there.
      for (const auto& layer : layers_) {
        for (auto& w : layer->weights()) {
          if (!w.value.is_host()) w.value = backend_->to_host(w.value);
          if (!w.gradient.is_host()) w.gradient = Tensor<float>(w.gradient.shape());
        }
      }
      capacity_ = 0;
      rows_ = 0;
    }
    backend_ = std::move(backend);
    weights_placed_ = false;
    optimizer_ = options.optimizer.object();
    if (!optimizer_)
      optimizer_ = std::shared_ptr<Optimizer>(get_optimizer(options.optimizer.name()));
    optimizer_->set_backend(backend_);
    compiled_ = true;
    if (built()) resolve_losses();
  }

  /// `compile` with Keras's positional arguments.
  /// \code
  /// model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  /// \endcode
  void compile(OptimizerArg optimizer, Losses loss, std::vector<MetricArg> metrics = {},
               std::vector<double> loss_weights = {}) {
    compile(CompileOptions{std::move(optimizer), std::move(loss), std::move(metrics),
                           std::move(loss_weights), options_.threads});
  }

  /// The optimizer given to `compile`; throws `ConfigError` before `compile`.
  Optimizer& optimizer() const {
    require_compiled("optimizer");
    return *optimizer_;
  }

  /// The backend the layers compute with.
  Backend& backend() {
    if (!backend_) backend_ = std::make_shared<CpuBackend>(options_.threads);
    return *backend_;
  }

  /// The names `evaluate` and the logs use: `loss`, per-output losses, then the metrics.
  std::vector<std::string> metrics_names() const {
    std::vector<std::string> names{"loss"};
    if (outputs_.size() > 1) {
      for (const auto& output : output_names_)
        names.push_back(output + "_loss");
    }
    for (const auto& per_output : metrics_) {
      for (const auto& metric : per_output)
        names.push_back(metric->name());
    }
    return names;
  }

  // --- fit ------------------------------------------------------------------------------------

  /// Trains on arrays (`x` and `y` each a tensor of any element type, a list, a map by name or a
  /// tuple of tensors) for `options.epochs` epochs; returns the `keras::callbacks::History`. Throws
  /// `ShapeError` when the data do not fit the model's inputs or outputs (naming the input and both
  /// shapes), `ConfigError` before `compile` and for bad options, and `Error` for a loss that is
  /// NaN or infinite unless a callback (`TerminateOnNaN`) stops training.
  template <ArrayLike X, ArrayLike Y>
  keras::callbacks::History fit(const X& x, const Y& y, const FitOptions& options = {}) {
    require_compiled("fit");
    auto weights = resolve_sample_weight(y, options.sample_weight, options.class_weight);
    Arrays<X, Y> train{x, y, weights};
    std::shared_ptr<detail::BatchSource> validation;
    const std::size_t val_batch = options.validation_batch_size.value_or(options.batch_size);
    if (options.validation_split > 0.0) {
      if (!options.validation_data.empty()) {
        throw ConfigError("fit: validation_split and validation_data were both given");
      }
      auto [training, held_out] = validation_split(train, options.validation_split);
      train = std::move(training);
      const std::size_t rows = rows_of(held_out.x, "x", "fit");
      validation = std::make_shared<detail::ArraySource<X, Y>>(
          held_out.x, held_out.y, held_out.sample_weight, rows, std::min(val_batch, rows), false, 0,
          options.validation_steps);
    } else if (!options.validation_data.empty()) {
      validation = options.validation_data.source(val_batch, options.validation_steps);
    }
    // ArraySequence checks the arrays and the batch size as Determined's array adapter does,
    // except that a batch larger than the data is one batch of every row, as in Keras.
    const std::size_t batch_size = std::min(options.batch_size, rows_of(train.x, "x", "fit"));
    const std::size_t rows = [&] {
      if (train.sample_weight) {
        return ArraySequence(train.x, train.y, *train.sample_weight, batch_size).rows();
      }
      return ArraySequence(train.x, train.y, batch_size).rows();
    }();
    detail::ArraySource<X, Y> source(train.x, train.y, train.sample_weight, rows, batch_size,
                                     options.shuffle, shuffle_seed(options),
                                     options.steps_per_epoch);
    return run_fit(source, validation.get(), options, false);
  }

  /// Trains on a Keras `Sequence` of `(x, y)` or `(x, y, w)` batches, served by a
  /// `SequenceAdapter` with `options.workers` threads (or processes with
  /// `use_multiprocessing`), `max_queue_size` and, with `shuffle`, a seeded batch order.
  template <KerasSequence S>
  requires(!ArrayLike<std::remove_cvref_t<S>>) keras::callbacks::History
      fit(S sequence, const FitOptions& options = {}) {
    require_compiled("fit");
    check_loader_options(options, "a sequence");
    const AdapterOptions adapter{.max_queue_size = options.max_queue_size,
                                 .shuffle = options.shuffle,
                                 .seed = shuffle_seed(options)};
    auto validation = validation_source(options);
    keras::callbacks::History history;
    with_workers(options.workers, [&]<std::size_t Workers>() {
      if (options.use_multiprocessing) {
        if constexpr (Serializable<batch_t<S>> && Workers > 0) {
          detail::OwnedAdapterSource<S, Workers, true> source(std::move(sequence), adapter,
                                                              options.steps_per_epoch);
          history = run_fit(source, validation.get(), options, true);
          return;
        } else {
          throw ConfigError(
              "fit: use_multiprocessing needs workers > 0 and a batch type that can be "
              "serialized");
        }
      }
      detail::OwnedAdapterSource<S, Workers, false> source(std::move(sequence), adapter,
                                                           options.steps_per_epoch);
      history = run_fit(source, validation.get(), options, true);
    });
    return history;
  }

  /// Trains on a `Dataset` of `(x, y)` or `(x, y, w)` batches (the caller's, by reference):
  /// each epoch is one pass, `reset()` before every pass but the first; with `steps_per_epoch`,
  /// epochs take that many batches from the stream, resetting it when it runs out.
  template <Dataset D>
  requires KerasBatch<element_t<D>> keras::callbacks::History fit(D& dataset,
                                                                  const FitOptions& options = {}) {
    require_compiled("fit");
    check_loader_options(options, "a dataset");
    auto validation = validation_source(options);
    detail::DatasetSource<D&> source(dataset, options.steps_per_epoch);
    return run_fit(source, validation.get(), options, false);
  }

  /// Trains on the caller's `SequenceAdapter` (an infinite training stream): an epoch is
  /// `steps_per_epoch` batches, by default one pass over the sequence.
  template <Sequence S, std::size_t Workers, bool Multiprocess>
  requires KerasBatch<batch_t<S>> keras::callbacks::History fit(
      SequenceAdapter<S, Workers, Multiprocess>& adapter, const FitOptions& options = {}) {
    require_compiled("fit");
    check_loader_options(options, "a sequence adapter");
    auto validation = validation_source(options);
    detail::AdapterSource<SequenceAdapter<S, Workers, Multiprocess>> source(
        adapter, options.steps_per_epoch);
    return run_fit(source, validation.get(), options, false);
  }

  // --- evaluate, predict -------------------------------------------------------------------------

  /// The loss and metrics over arrays, as Keras's `evaluate(return_dict=True)`.
  template <ArrayLike X, ArrayLike Y>
  Logs evaluate(const X& x, const Y& y, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    const std::size_t rows = rows_of(x, "x", "evaluate");
    detail::ArraySource<X, Y> source(x, y, options.sample_weight, rows,
                                     std::min(options.batch_size, rows), false, 0, options.steps);
    return evaluate_source(source, options);
  }

  /// The loss and metrics over a `Sequence`, read in order.
  template <KerasSequence S>
  requires(!ArrayLike<S>) Logs evaluate(S sequence, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    detail::SequenceSource<S> source(std::move(sequence), options.steps);
    return evaluate_source(source, options);
  }

  /// The loss and metrics over one pass of a `Dataset`.
  template <Dataset D>
  requires KerasBatch<element_t<D>> Logs evaluate(D& dataset, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    detail::DatasetSource<D&> source(dataset, options.steps);
    return evaluate_source(source, options);
  }

  /// The outputs for arrays, one tensor per output (batch axis first).
  template <ArrayLike X>
  std::vector<Tensor<float>> predict_outputs(const X& x, const PredictOptions& options = {}) {
    const std::size_t rows = rows_of(x, "x", "predict");
    detail::ArraySource<X, detail::NoTargets> source(x, detail::NoTargets{}, std::nullopt, rows,
                                                     std::min(options.batch_size, rows), false, 0,
                                                     options.steps);
    return predict_source(source, options);
  }

  /// The outputs for a `Sequence` (its targets, if any, are ignored).
  template <Sequence S>
  requires(!ArrayLike<S>) std::vector<Tensor<float>> predict_outputs(
      S sequence, const PredictOptions& options = {}) {
    detail::SequenceSource<S> source(std::move(sequence), options.steps);
    return predict_source(source, options);
  }

  /// The output of a single-output model for `x` (arrays or a `Sequence`); throws `ConfigError`
  /// for a model with several outputs (use `predict_outputs`).
  template <class X>
  Tensor<float> predict(const X& x, const PredictOptions& options = {}) {
    if (outputs_.size() != 1) {
      throw ConfigError("model '" + name_ + "': predict returns one output but the model has " +
                        std::to_string(outputs_.size()) + "; use predict_outputs");
    }
    return predict_outputs(x, options).front();
  }

  /// One training step on one batch; returns its loss and metrics (metrics reset first, as
  /// Keras's `train_on_batch(reset_metrics=True)`).
  template <ArrayLike X, ArrayLike Y>
  Logs train_on_batch(const X& x, const Y& y,
                      std::optional<Tensor<float>> sample_weight = std::nullopt) {
    require_compiled("train_on_batch");
    const std::size_t rows = rows_of(x, "x", "train_on_batch");
    detail::ArraySource<X, Y> source(x, y, std::move(sample_weight), rows, rows, false, 0);
    source.start_epoch(0);
    reset_metrics();
    const auto* batch = source.next();
    prepare(*batch, rows);
    const double loss = train_step(*batch);
    check_finite(loss, 0, 0, "train_on_batch");
    return current_logs("");
  }

  /// The loss and metrics of one batch without training.
  template <ArrayLike X, ArrayLike Y>
  Logs test_on_batch(const X& x, const Y& y,
                     std::optional<Tensor<float>> sample_weight = std::nullopt) {
    require_compiled("test_on_batch");
    const std::size_t rows = rows_of(x, "x", "test_on_batch");
    detail::ArraySource<X, Y> source(x, y, std::move(sample_weight), rows, rows, false, 0);
    source.start_epoch(0);
    reset_metrics();
    const auto* batch = source.next();
    prepare(*batch, rows);
    test_step(*batch);
    return current_logs("");
  }

  // --- weights ----------------------------------------------------------------------------------

  /// Copies of every weight, layer by layer in `layers()` order, each layer's in Keras's order.
  std::vector<Tensor<float>> get_weights() const {
    std::vector<Tensor<float>> out;
    for (const auto& layer : layers_) {
      for (const auto& w : layer->weights())
        out.push_back(w.value.is_host() ? w.value.clone() : backend_->to_host(w.value));
    }
    return out;
  }

  /// Sets every weight from `weights` (in `get_weights` order); throws `ShapeError` for a wrong
  /// number of weights or a weight of another shape, naming the layer and the weight.
  void set_weights(const std::vector<Tensor<float>>& weights) {
    std::size_t expected = 0;
    for (const auto& layer : layers_)
      expected += layer->weights().size();
    if (weights.size() != expected) {
      throw ShapeError("model '" + name_ + "': set_weights expects " + std::to_string(expected) +
                       " weights but got " + std::to_string(weights.size()));
    }
    std::size_t i = 0;
    for (const auto& layer : layers_) {
      for (const auto& w : layer->weights()) {
        if (weights[i].shape() != w.value.shape()) {
          throw ShapeError("model '" + name_ + "': layer '" + layer->name() + "' weight '" +
                           w.name + "' has shape " + w.value.shape().str() +
                           " but the given weight has shape " + weights[i].shape().str());
        }
        ++i;
      }
    }
    i = 0;
    for (const auto& layer : layers_) {
      for (auto& w : layer->weights()) {
        if (w.value.is_host()) {
          std::copy(weights[i].begin(), weights[i].end(), w.value.begin());
        } else {
          backend_->copy_from_host(weights[i], w.value);
        }
        ++i;
      }
    }
  }

  /// The number of scalars in the weights.
  std::size_t count_params() const {
    std::size_t n = 0;
    for (const auto& layer : layers_)
      n += layer->count_params();
    return n;
  }

  /// Prints Keras's summary table: layers, output shapes, parameter counts and totals (with a
  /// "Connected to" column when the graph is not a chain). Throws `ConfigError` for a
  /// `Sequential` model not built yet.
  void summary(std::ostream& out = std::cout) const {
    require_built("summary");
    const bool chain = is_chain();
    const std::size_t line = chain ? 65 : 98;
    const std::vector<std::size_t> positions =
        chain ? std::vector<std::size_t>{29, 55, 65} : std::vector<std::size_t>{32, 53, 65, 98};
    auto row = [&](std::vector<std::string> fields) {
      std::string text;
      for (std::size_t c = 0; c < fields.size(); ++c) {
        const std::size_t start = c == 0 ? 0 : positions[c - 1];
        const std::size_t space = c + 1 == positions.size() ? 0 : 2;
        std::string field = fields[c].substr(0, positions[c] - start - space);
        text += field + std::string(space, ' ');
        if (text.size() < positions[c]) text += std::string(positions[c] - text.size(), ' ');
      }
      out << text << "\n";
    };
    out << "Model: \"" << name_ << "\"\n" << std::string(line, '_') << "\n";
    std::vector<std::string> header{" Layer (type)", "Output Shape", "Param #"};
    if (!chain) header.emplace_back("Connected to");
    row(header);
    out << std::string(line, '=') << "\n";
    auto shape_of = [](const Shape& s) {
      std::string text = "(None";
      for (auto d : s)
        text += ", " + std::to_string(d);
      return text + ")";
    };
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      const auto& node = nodes_[k];
      if (!node.layer && !show_inputs_in_summary_) continue;
      std::vector<std::string> fields;
      if (!node.layer) {
        fields = {" " + node_names_[k] + " (InputLayer)", "[" + shape_of(node.shape) + "]", "0"};
      } else {
        fields = {" " + node.layer->name() + " (" + node.layer->class_name() + ")",
                  shape_of(node.shape), std::to_string(node.layer->count_params())};
      }
      if (!chain) {
        std::string connected = "[";
        for (std::size_t j = 0; j < node.inputs.size(); ++j) {
          connected += (j ? ", '" : "'") + node_names_[node.inputs[j]] + "[0][0]'";
        }
        fields.push_back(connected + "]");
      }
      row(fields);
      out << std::string(line, ' ') << "\n";  // tf.keras 2.9+ separates rows by a blank line
    }
    out << std::string(line, '=') << "\n";
    std::size_t trainable = 0, total = 0;
    for (const auto& layer : layers_) {
      for (const auto& w : layer->weights()) {
        total += w.value.size();
        if (w.trainable) trainable += w.value.size();
      }
    }
    out << "Total params: " << grouped(total) << "\nTrainable params: " << grouped(trainable)
        << "\nNon-trainable params: " << grouped(total - trainable) << "\n"
        << std::string(line, '_') << "\n";
  }

 protected:
  /// A model whose graph comes later (`Sequential`).
  explicit Model(std::string name, std::nullptr_t) : name_(std::move(name)) {}

  /// Replaces the graph (`Sequential` after each `add`).
  void set_graph(std::vector<KerasTensor> inputs, std::vector<KerasTensor> outputs) {
    plan(inputs, outputs);
    graph_inputs_ = std::move(inputs);
    graph_outputs_ = std::move(outputs);
    capacity_ = 0;
    rows_ = 0;
    metrics_.clear();
    if (compiled_) resolve_losses();
  }

  /// Whether the graph exists (a `Sequential` without an input shape has none until it sees data).
  bool built() const noexcept { return !nodes_.empty(); }

  /// Builds the graph from the first batch when it does not exist yet (`Sequential`).
  virtual void build_from_batch(const detail::ErasedBatch&) {}

  /// Whether `summary` lists the inputs as `InputLayer` rows (functional models do).
  bool show_inputs_in_summary_ = true;

 private:
  // --- graph ------------------------------------------------------------------------------------

  void plan(const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs) {
    if (inputs.empty()) throw ConfigError("model '" + name_ + "': has no inputs");
    if (outputs.empty()) throw ConfigError("model '" + name_ + "': has no outputs");
    // Every node the outputs depend on, in creation order (a topological order).
    std::map<std::uint64_t, std::shared_ptr<detail::GraphNode>> reached;
    std::vector<std::shared_ptr<detail::GraphNode>> stack;
    for (const auto& o : outputs)
      stack.push_back(o.node());
    for (const auto& i : inputs)
      stack.push_back(i.node());
    std::set<const detail::GraphNode*> declared;
    for (const auto& i : inputs) {
      if (!i.is_input()) {
        throw ConfigError("model '" + name_ + "': inputs must come from Input() but one is the " +
                          "output of layer '" + i.layer()->name() + "'");
      }
      declared.insert(i.node().get());
    }
    while (!stack.empty()) {
      auto node = stack.back();
      stack.pop_back();
      if (!reached.emplace(node->id, node).second) continue;
      if (!node->layer && !declared.contains(node.get())) {
        throw ConfigError("model '" + name_ + "': an output depends on an Input" +
                          (node->input_name.empty() ? "" : " '" + node->input_name + "'") +
                          " that is not among the model's inputs");
      }
      for (const auto& in : node->inputs)
        stack.push_back(in);
    }
    std::vector<detail::RuntimeNode> nodes;
    std::unordered_map<const detail::GraphNode*, std::size_t> index;
    // Inputs first, in the order given, then the layer calls in creation order.
    for (const auto& i : inputs) {
      if (index.contains(i.node().get())) {
        throw ConfigError("model '" + name_ + "': the same Input is listed twice");
      }
      index[i.node().get()] = nodes.size();
      detail::RuntimeNode node;
      node.shape = i.shape();
      nodes.push_back(std::move(node));
    }
    for (const auto& [id, graph_node] : reached) {
      if (!graph_node->layer) continue;
      index[graph_node.get()] = nodes.size();
      detail::RuntimeNode node;
      node.layer = graph_node->layer;
      node.shape = graph_node->shape;
      for (const auto& in : graph_node->inputs)
        node.inputs.push_back(index.at(in.get()));
      nodes.push_back(std::move(node));
    }
    // Layer names: Keras's snake_case class name, then _1, _2, ... unique in the model.
    std::vector<std::shared_ptr<Layer>> layers;
    std::set<const Layer*> seen;
    for (const auto& node : nodes) {
      if (node.layer && seen.insert(node.layer.get()).second) layers.push_back(node.layer);
    }
    std::set<std::string> used;
    for (const auto& layer : layers) {
      if (layer->name().empty()) continue;
      if (!used.insert(layer->name()).second) {
        throw ConfigError("model '" + name_ + "': the name '" + layer->name() +
                          "' is used by two layers; layer names must be unique");
      }
    }
    std::map<std::string, std::size_t> counts;
    for (const auto& layer : layers) {
      if (!layer->name().empty()) continue;
      const std::string base = detail::to_snake_case(layer->class_name());
      std::string candidate = base;
      std::size_t& n = counts[base];
      while (used.contains(candidate))
        candidate = base + "_" + std::to_string(++n);
      used.insert(candidate);
      layer->set_name(candidate);
    }
    std::vector<std::string> input_names;
    std::size_t unnamed = 0;
    for (const auto& i : inputs) {
      input_names.push_back(i.input_name().empty() ? "input_" + std::to_string(++unnamed)
                                                   : i.input_name());
    }
    std::vector<std::size_t> output_nodes;
    std::vector<std::string> output_names;
    for (const auto& o : outputs) {
      output_nodes.push_back(index.at(o.node().get()));
      output_names.push_back(o.is_input() ? input_names[index.at(o.node().get())]
                                          : o.layer()->name());
    }
    // A node's gradient is needed when its layer or a layer before it has trainable weights:
    // Dense right after Flatten after an input computes no gradient for its input.
    std::vector<bool> needed(nodes.size(), false);
    for (std::size_t k = 0; k < nodes.size(); ++k) {
      if (!nodes[k].layer) continue;
      for (const auto& w : nodes[k].layer->weights())
        needed[k] = needed[k] || w.trainable;
      for (const std::size_t p : nodes[k].inputs)
        needed[k] = needed[k] || needed[p];
    }
    // Gradient plan: contributions in backward order are the losses, then the consumers in
    // reverse topological order; the first writes the producer's gradient, later ones add.
    std::vector<bool> written(nodes.size(), false);
    output_direct_.assign(outputs.size(), false);
    for (std::size_t o = 0; o < output_nodes.size(); ++o) {
      if (!written[output_nodes[o]]) output_direct_[o] = true;
      written[output_nodes[o]] = true;
    }
    for (std::size_t k = nodes.size(); k-- > 0;) {
      auto& node = nodes[k];
      node.targets.resize(node.inputs.size());
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const std::size_t p = node.inputs[j];
        if (!nodes[p].layer || !needed[p]) {
          node.targets[j] = detail::GradientTarget::none;
        } else if (!written[p]) {
          node.targets[j] = detail::GradientTarget::direct;
          written[p] = true;
        } else {
          node.targets[j] = detail::GradientTarget::accumulate;
        }
      }
      node.input_values.resize(node.inputs.size());
      node.input_gradients.resize(node.inputs.size());
      node.scratch_full.resize(node.inputs.size());
    }
    std::vector<std::string> node_names(nodes.size());
    for (std::size_t k = 0; k < nodes.size(); ++k)
      node_names[k] = nodes[k].layer ? nodes[k].layer->name() : input_names[k];
    std::vector<Variable*> trainable;
    for (const auto& layer : layers) {
      for (auto& w : layer->weights()) {
        if (w.trainable) trainable.push_back(&w);
      }
    }
    needs_backward_ = std::move(needed);
    nodes_ = std::move(nodes);
    layers_ = std::move(layers);
    input_names_ = std::move(input_names);
    output_nodes_ = std::move(output_nodes);
    output_names_ = std::move(output_names);
    node_names_ = std::move(node_names);
    trainable_ = std::move(trainable);
    outputs_.assign(output_nodes_.size(), {});
    targets_.assign(output_nodes_.size(), {});
    targets_full_.assign(output_nodes_.size(), {});
    loss_scratch_full_.assign(output_nodes_.size(), {});
  }

  bool is_chain() const {
    for (std::size_t k = 0; k < nodes_.size(); ++k) {
      if (nodes_[k].inputs.size() > 1) return false;
      if (nodes_[k].layer && nodes_[k].inputs.front() + 1 != k) return false;
    }
    return input_names_.size() == 1 && output_nodes_.size() == 1 &&
           output_nodes_.front() + 1 == nodes_.size();
  }

  static std::string grouped(std::size_t n) {
    const std::string digits = std::to_string(n);
    std::string out;
    for (std::size_t i = 0; i < digits.size(); ++i) {
      if (i > 0 && (digits.size() - i) % 3 == 0) out.push_back(',');
      out.push_back(digits[i]);
    }
    return out;
  }

  void require_compiled(std::string_view what) const {
    if (!compiled_) {
      throw ConfigError("model '" + name_ + "': must be compiled before " + std::string(what) +
                        "; call compile(optimizer, loss) first");
    }
  }

  void require_built(std::string_view what) const {
    if (!built()) {
      throw ConfigError("model '" + name_ + "': has not been built yet, so " + std::string(what) +
                        " cannot run; give it an Input first or call fit with data");
    }
  }

  // --- compile ----------------------------------------------------------------------------------

  void resolve_losses() {
    const auto& spec = options_.loss;
    const std::size_t n = output_nodes_.size();
    if (spec.empty()) throw ConfigError("model '" + name_ + "': compile needs a loss");
    auto make = [&](const LossArg& arg) {
      if (arg.object()) return arg.object();
      return std::shared_ptr<Loss>(get_loss(arg.name()));
    };
    losses_.clear();
    if (!spec.map().empty()) {
      for (const auto& [key, arg] : spec.map()) {
        if (std::find(output_names_.begin(), output_names_.end(), key) == output_names_.end()) {
          throw ConfigError("model '" + name_ + "': the loss map names '" + key +
                            "', which is not an output (outputs: " + joined(output_names_) + ")");
        }
      }
      for (const auto& output : output_names_) {
        auto found = spec.map().find(output);
        if (found == spec.map().end()) {
          throw ConfigError("model '" + name_ + "': the loss map has no loss for output '" +
                            output + "'");
        }
        losses_.push_back(make(found->second));
      }
    } else if (spec.single()) {
      for (std::size_t o = 0; o < n; ++o)
        losses_.push_back(o == 0 || spec.list().front().object() ? make(spec.list().front())
                                                                 : make(spec.list().front()));
    } else {
      if (spec.list().size() != n) {
        throw ConfigError("model '" + name_ + "': has " + std::to_string(n) + " outputs but " +
                          std::to_string(spec.list().size()) + " losses were given");
      }
      for (const auto& arg : spec.list())
        losses_.push_back(make(arg));
    }
    loss_weights_ = options_.loss_weights;
    if (loss_weights_.empty()) loss_weights_.assign(n, 1.0);
    if (loss_weights_.size() != n) {
      throw ConfigError("model '" + name_ + "': has " + std::to_string(n) + " outputs but " +
                        std::to_string(loss_weights_.size()) + " loss weights were given");
    }
    for (const auto& metric : options_.metrics) {
      if (metric.object() && n > 1) {
        throw ConfigError("model '" + name_ + "': a metric object can measure one output but " +
                          "the model has " + std::to_string(n) + "; give metrics by name");
      }
    }
    metrics_.clear();
  }

  static std::string joined(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names)
      out += (out.empty() ? "'" : ", '") + n + "'";
    return out;
  }

  void create_metrics() {
    metrics_.assign(output_nodes_.size(), {});
    for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
      for (const auto& arg : options_.metrics) {
        std::shared_ptr<Metric> metric = arg.object();
        if (!metric) {
          metric = std::shared_ptr<Metric>(get_metric(arg.name(), losses_[o]->class_name(),
                                                      targets_[o].shape(), outputs_[o].shape()));
        }
        if (output_nodes_.size() > 1) metric->set_name(output_names_[o] + "_" + metric->name());
        metrics_[o].push_back(std::move(metric));
      }
    }
  }

  // --- batches ----------------------------------------------------------------------------------

  /// Allocates every buffer for `rows` rows when more than allocated so far.
  /// Allocates every buffer for `rows` rows when more than allocated so far, in the backend's
  /// memory (with host staging buffers for the batch when that memory is not the host's), and
  /// moves the weights there first.
  void reserve(std::size_t rows) {
    if (!weights_placed_) place_weights();
    if (rows <= capacity_) return;
    Backend& backend = this->backend();
    for (auto& node : nodes_) {
      node.value_full = backend.allocate(node.shape.prepend(rows));
      if (node.layer) node.gradient_full = backend.allocate(node.shape.prepend(rows));
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        if (node.targets[j] == detail::GradientTarget::accumulate) {
          node.scratch_full[j] = backend.allocate(nodes_[node.inputs[j]].shape.prepend(rows));
        }
      }
    }
    for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
      if (!output_direct_[o]) {
        loss_scratch_full_[o] = backend.allocate(nodes_[output_nodes_[o]].shape.prepend(rows));
      }
      if (targets_full_[o].rank() > 0 &&
          (targets_full_[o].rows() < rows || targets_full_[o].device() != backend.device())) {
        targets_full_[o] = backend.allocate(targets_full_[o].shape().with_rows(rows));
      }
    }
    weights_full_ = backend.allocate({rows});
    staging_full_.clear();
    if (!backend.is_host()) {
      for (std::size_t i = 0; i < input_names_.size(); ++i)
        staging_full_.emplace_back(nodes_[i].shape.prepend(rows));
      staging_weights_full_ = Tensor<float>({rows});
    }
    capacity_ = rows;
    rows_ = 0;
  }

  /// Moves the weights (made on the host by `build`) into the backend's memory, with zero
  /// gradients there; nothing moves for a host backend.
  void place_weights() {
    Backend& backend = this->backend();
    for (const auto& layer : layers_) {
      for (auto& w : layer->weights()) {
        if (w.value.device() != backend.device()) w.value = backend.from_host(w.value);
        if (!w.gradient.empty() && w.gradient.device() != backend.device())
          w.gradient = backend.allocate(w.gradient.shape());
      }
    }
    weights_placed_ = true;
  }

  /// Converts rows of a batch member into `target`: straight into it for a host backend, through
  /// the host buffer `staging` (at least `n` rows) otherwise.
  template <class Member>
  void upload(const Member& member, const detail::ErasedBatch& batch, std::size_t n,
              const Tensor<float>& staging, const Tensor<float>& target) {
    if (target.is_host()) {
      detail::convert_rows(member, batch.rows, batch.offset, n, target.data());
      return;
    }
    const Tensor<float> rows = staging.slice_rows(0, n).reshape(target.shape());
    detail::convert_rows(member, batch.rows, batch.offset, n, rows.data());
    backend().copy_from_host(rows, target);
  }

  /// Points every view at the first `rows` rows of the buffers.
  void set_rows(std::size_t rows) {
    if (rows == rows_) return;
    for (auto& node : nodes_) {
      node.value = node.value_full.slice_rows(0, rows);
      if (node.layer) node.gradient = node.gradient_full.slice_rows(0, rows);
    }
    for (auto& node : nodes_) {
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        const auto& producer = nodes_[node.inputs[j]];
        node.input_values[j] = producer.value;
        switch (node.targets[j]) {
          case detail::GradientTarget::none:
            node.input_gradients[j] = Tensor<float>();
            break;
          case detail::GradientTarget::direct:
            node.input_gradients[j] = producer.gradient;
            break;
          case detail::GradientTarget::accumulate:
            node.input_gradients[j] = node.scratch_full[j].slice_rows(0, rows);
            break;
        }
      }
    }
    for (std::size_t o = 0; o < output_nodes_.size(); ++o)
      outputs_[o] = nodes_[output_nodes_[o]].value;
    weights_ = weights_full_.slice_rows(0, rows);
    rows_ = rows;
  }

  /// Builds the graph if needed, allocates for `max_rows` and checks nothing else.
  void prepare(const detail::ErasedBatch& batch, std::size_t max_rows) {
    if (!built()) build_from_batch(batch);
    require_built("the model");
    reserve(std::max(max_rows, batch.count));
  }

  std::string member_label(const detail::ErasedBatch& batch, bool is_x, std::size_t i) const {
    const auto kind = is_x ? batch.x_kind : batch.y_kind;
    const auto& members = is_x ? batch.x : batch.y;
    const std::string name = is_x ? "x" : "y";
    if (kind == detail::MemberKind::tensor) return name;
    if (kind == detail::MemberKind::map) return name + "['" + *members[i].key + "']";
    return name + "[" + std::to_string(i) + "]";
  }

  /// For each input (or output), the member of the batch that feeds it.
  void match_members(const detail::ErasedBatch& batch, bool is_x,
                     std::vector<std::size_t>& order) const {
    const auto& members = is_x ? batch.x : batch.y;
    const auto kind = is_x ? batch.x_kind : batch.y_kind;
    const auto& names = is_x ? input_names_ : output_names_;
    const std::string what = is_x ? "input" : "output";
    const std::string name = is_x ? "x" : "y";
    order.resize(names.size());
    if (kind == detail::MemberKind::map) {
      for (const auto& member : members) {
        if (std::find(names.begin(), names.end(), *member.key) == names.end()) {
          throw ConfigError("model '" + name_ + "': " + name + " has the key '" + *member.key +
                            "', which names no " + what + " (" + what + "s: " + joined(names) +
                            ")");
        }
      }
      for (std::size_t i = 0; i < names.size(); ++i) {
        auto found = std::find_if(members.begin(), members.end(),
                                  [&](const auto& m) { return *m.key == names[i]; });
        if (found == members.end()) {
          throw ConfigError("model '" + name_ + "': no data for " + what + " '" + names[i] +
                            "' in the map " + name + " (" + what + "s: " + joined(names) + ")");
        }
        order[i] = static_cast<std::size_t>(found - members.begin());
      }
      return;
    }
    if (members.size() != names.size()) {
      throw ShapeError("model '" + name_ + "': has " + std::to_string(names.size()) + " " + what +
                       (names.size() == 1 ? "" : "s") + " but " + name + " has " +
                       std::to_string(members.size()) + " array" +
                       (members.size() == 1 ? "" : "s"));
    }
    for (std::size_t i = 0; i < names.size(); ++i)
      order[i] = i;
  }

  /// Converts the batch into the input (and target and weight) buffers.
  void load(const detail::ErasedBatch& batch, bool targets) {
    const std::size_t n = batch.count;
    if (n == 0) throw ShapeError("model '" + name_ + "': a batch has no rows");
    reserve(n);
    set_rows(n);
    match_members(batch, true, input_order_);
    for (std::size_t i = 0; i < input_order_.size(); ++i) {
      const auto& member = batch.x[input_order_[i]];
      const auto& node = nodes_[i];
      if (member.shape.rank() == 0 || member.shape.row_shape() != node.shape) {
        throw ShapeError(
            "model '" + name_ + "': input '" + input_names_[i] + "' expects samples of shape " +
            node.shape.str() + " but " + member_label(batch, true, input_order_[i]) +
            " has samples of shape " +
            (member.shape.rank() == 0 ? std::string("()") : member.shape.row_shape().str()));
      }
      if (batch.rows.empty() && member.shape[0] < batch.offset + n) {
        throw ShapeError("model '" + name_ + "': " + member_label(batch, true, input_order_[i]) +
                         " has " + std::to_string(member.shape[0]) + " rows but the batch has " +
                         std::to_string(n));
      }
      upload(member, batch, n, staging_full_.empty() ? Tensor<float>() : staging_full_[i],
             node.value);
    }
    has_weights_ = false;
    if (!targets) return;
    if (batch.y_kind == detail::MemberKind::none) {
      throw ShapeError("model '" + name_ + "': the batch has no targets y");
    }
    match_members(batch, false, target_order_);
    if (staging_targets_.size() != target_order_.size())
      staging_targets_.resize(target_order_.size());
    for (std::size_t o = 0; o < target_order_.size(); ++o) {
      const auto& member = batch.y[target_order_[o]];
      if (member.shape.rank() == 0) {
        throw ShapeError("model '" + name_ + "': " + member_label(batch, false, target_order_[o]) +
                         " is a scalar but targets need a batch axis");
      }
      if (batch.rows.empty() && member.shape[0] < batch.offset + n) {
        throw ShapeError("model '" + name_ + "': " + member_label(batch, false, target_order_[o]) +
                         " has " + std::to_string(member.shape[0]) + " rows but x has " +
                         std::to_string(n));
      }
      const Shape wanted = member.shape.with_rows(capacity_);
      if (targets_full_[o].shape() != wanted || targets_full_[o].device() != backend().device())
        targets_full_[o] = backend().allocate(wanted);
      targets_[o] = targets_full_[o].slice_rows(0, n);
      if (!targets_[o].is_host() && staging_targets_[o].shape() != wanted)
        staging_targets_[o] = Tensor<float>(wanted);
      upload(member, batch, n, staging_targets_[o], targets_[o]);
    }
    if (batch.w) {
      if (batch.w->shape.rank() != 1 || batch.w->dtype != DType::float32) {
        throw ShapeError("model '" + name_ +
                         "': sample_weight must be a rank-1 float32 tensor but " + "has shape " +
                         batch.w->shape.str());
      }
      upload(*batch.w, batch, n, staging_weights_full_, weights_);
      has_weights_ = true;
    } else if (class_weight_) {
      apply_class_weight(n);
      has_weights_ = true;
    }
  }

  /// Keras's `class_weight` for loaders other than arrays: the weight of each row's class.
  void apply_class_weight(std::size_t n) {
    if (targets_.size() != 1) {
      throw ConfigError(
          "fit: class_weight is supported for a single output only but the model "
          "has " +
          std::to_string(targets_.size()));
    }
    // Reads the targets and writes the weights on the host, as the backend's host kernel.
    backend().on_host({targets_.front(), weights_}, [&](std::span<const Tensor<float>> t) {
      const auto& y = t[0];
      const std::size_t width = y.row_size();
      for (std::size_t i = 0; i < n; ++i) {
        const float* row = y.data() + i * width;
        std::int64_t label = 0;
        if (width == 1) {
          label = static_cast<std::int64_t>(std::llround(row[0]));
        } else {
          label = static_cast<std::int64_t>(std::max_element(row, row + width) - row);
        }
        auto found = class_weight_->find(label);
        if (found == class_weight_->end()) {
          throw ConfigError("class_weight: no weight for class " + std::to_string(label));
        }
        t[1].data()[i] = found->second;
      }
    });
  }

  // --- steps ------------------------------------------------------------------------------------

  void forward(bool training) {
    const CallContext ctx{backend(), training, seed_,
                          optimizer_ ? static_cast<std::uint64_t>(optimizer_->iterations()) : 0};
    for (auto& node : nodes_) {
      if (node.layer) node.layer->forward(node.input_values, node.value, ctx);
    }
  }

  /// Losses of the current batch: the total, and per output into `output_losses_`; with
  /// `gradients`, also d(total)/d(outputs) into the output nodes' gradients.
  double compute_losses(bool gradients) {
    double total = 0.0;
    output_losses_.resize(output_nodes_.size());
    const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
    for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
      auto& node = nodes_[output_nodes_[o]];
      Tensor<float> gradient;
      if (gradients && node.layer) {
        gradient = output_direct_[o] ? node.gradient : loss_scratch_full_[o].slice_rows(0, rows_);
      }
      const double value =
          losses_[o]->compute(backend(), targets_[o], outputs_[o], weights, gradient);
      const auto weight = static_cast<float>(loss_weights_[o]);
      if (gradients && node.layer) {
        if (weight != 1.0F) backend().scale(gradient, weight);
        if (!output_direct_[o]) backend().axpy(1.0F, gradient, node.gradient);
      }
      output_losses_[o] = value;
      total += loss_weights_[o] * value;
    }
    return total;
  }

  void backward() {
    const CallContext ctx{backend(), true, seed_,
                          static_cast<std::uint64_t>(optimizer_->iterations())};
    for (std::size_t k = nodes_.size(); k-- > 0;) {
      auto& node = nodes_[k];
      if (!node.layer || !needs_backward_[k]) continue;
      node.layer->backward(node.input_values, node.value, node.gradient, node.input_gradients, ctx);
      for (std::size_t j = 0; j < node.inputs.size(); ++j) {
        if (node.targets[j] == detail::GradientTarget::accumulate) {
          backend().axpy(1.0F, node.input_gradients[j], nodes_[node.inputs[j]].gradient);
        }
      }
    }
  }

  void update_metrics(double total) {
    if (metrics_.size() != output_nodes_.size()) create_metrics();
    const auto n = static_cast<double>(rows_);
    // Keras's loss metrics are means weighted by the batch size (compile_utils.LossesContainer).
    loss_sum_ += total * n;
    for (std::size_t o = 0; o < output_losses_.size(); ++o) {
      output_loss_sums_.resize(output_losses_.size(), 0.0);
      output_loss_sums_[o] += output_losses_[o] * n;
    }
    seen_rows_ += n;
    const Tensor<float>* weights = has_weights_ ? &weights_ : nullptr;
    for (std::size_t o = 0; o < metrics_.size(); ++o) {
      for (auto& metric : metrics_[o])
        metric->update_state(backend(), targets_[o], outputs_[o], weights);
    }
  }

  double train_step(const detail::ErasedBatch& batch) {
    const detail::ScopedFlushDenormal flush_denormal;
    load(batch, true);
    for (auto* variable : trainable_)
      backend().fill(variable->gradient, 0.0F);
    forward(true);
    const double total = compute_losses(true);
    backward();
    optimizer_->apply_gradients(trainable_);
    update_metrics(total);
    return total;
  }

  double test_step(const detail::ErasedBatch& batch) {
    const detail::ScopedFlushDenormal flush_denormal;
    load(batch, true);
    forward(false);
    const double total = compute_losses(false);
    update_metrics(total);
    return total;
  }

  void reset_metrics() {
    loss_sum_ = 0.0;
    seen_rows_ = 0.0;
    std::fill(output_loss_sums_.begin(), output_loss_sums_.end(), 0.0);
    for (auto& per_output : metrics_) {
      for (auto& metric : per_output)
        metric->reset_state();
    }
  }

  /// The running loss and metrics into `logs_`, names prefixed with `prefix`.
  const Logs& fill_logs(Logs& logs, std::string_view prefix) {
    auto set = [&](std::string_view name, double value) {
      if (prefix.empty()) {
        logs.set(name, value);
      } else {
        prefixed_.assign(prefix);
        prefixed_.append(name);
        logs.set(prefixed_, value);
      }
    };
    const double rows = std::max(seen_rows_, 1.0);
    set("loss", loss_sum_ / rows);
    if (output_nodes_.size() > 1) {
      for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
        loss_names_.resize(output_nodes_.size());
        if (loss_names_[o].empty()) loss_names_[o] = output_names_[o] + "_loss";
        set(loss_names_[o], o < output_loss_sums_.size() ? output_loss_sums_[o] / rows : 0.0);
      }
    }
    for (const auto& per_output : metrics_) {
      for (const auto& metric : per_output)
        set(metric->name(), metric->result());
    }
    return logs;
  }

  Logs current_logs(std::string_view prefix) {
    Logs logs;
    fill_logs(logs, prefix);
    return logs;
  }

  void check_finite(double loss, std::size_t epoch, std::size_t batch, std::string_view where) {
    if (std::isfinite(loss)) return;
    throw Error("model '" + name_ + "': " + std::string(where) + ": the loss is " +
                (std::isnan(loss) ? "nan" : "inf") + " at batch " + std::to_string(batch) +
                " of epoch " + std::to_string(epoch + 1) +
                "; lower the learning rate or check the data, or add TerminateOnNaN to stop "
                "training instead");
  }

  // --- loops ------------------------------------------------------------------------------------

  struct CallbackList {
    std::vector<std::shared_ptr<keras::callbacks::Callback>> callbacks = {};
    void set(Model& model, const CallbackParams& params) {
      for (auto& cb : callbacks) {
        cb->set_model(model);
        if (auto* receiver = dynamic_cast<detail::ParamsReceiver*>(cb.get())) {
          receiver->set_params(params);
        }
      }
    }
    template <class F>
    void each(F&& f) {
      for (auto& cb : callbacks)
        f(*cb);
    }
  };

  std::uint64_t shuffle_seed(const FitOptions& options) const {
    return options.seed ? *options.seed : detail::global_seed();
  }

  static void check_loader_options(const FitOptions& options, const std::string& kind) {
    if (options.validation_split > 0.0) {
      throw ConfigError("fit: validation_split is supported for arrays only, not for " + kind +
                        "; give validation_data instead");
    }
    if (options.sample_weight) {
      throw ConfigError("fit: sample_weight is supported for arrays only, not for " + kind +
                        "; return (x, y, w) batches instead");
    }
  }

  std::shared_ptr<detail::BatchSource> validation_source(const FitOptions& options) const {
    if (options.validation_data.empty()) return nullptr;
    return options.validation_data.source(
        options.validation_batch_size.value_or(options.batch_size), options.validation_steps);
  }

  template <class F>
  static void with_workers(std::size_t workers, F&& f) {
    if (workers >= 8) {
      f.template operator()<8>();
    } else if (workers >= 4) {
      f.template operator()<4>();
    } else if (workers >= 2) {
      f.template operator()<2>();
    } else if (workers == 1) {
      f.template operator()<1>();
    } else {
      f.template operator()<0>();
    }
  }

  keras::callbacks::History run_fit(detail::BatchSource& source, detail::BatchSource* validation,
                                    const FitOptions& options, bool) {
    if (options.epochs <= options.initial_epoch) {
      throw ConfigError("fit: epochs (" + std::to_string(options.epochs) +
                        ") must be larger than initial_epoch (" +
                        std::to_string(options.initial_epoch) + ")");
    }
    if (options.validation_freq == 0) {
      throw ConfigError("fit: validation_freq must be positive but is 0");
    }
    class_weight_ = options.class_weight;
    seed_ = shuffle_seed(options);
    auto history = std::make_shared<keras::callbacks::History>();
    CallbackList list{options.callbacks};
    list.callbacks.push_back(history);
    if (options.verbose != 0) {
      list.callbacks.push_back(std::make_shared<keras::callbacks::ProgbarLogger>(options.verbose));
    }
    list.set(*this, {options.verbose, options.epochs, source.steps()});
    stop_training = false;
    const Logs empty;
    list.each([&](keras::callbacks::Callback& cb) { cb.on_train_begin(empty); });
    Logs logs, epoch_logs;
    for (std::size_t epoch = options.initial_epoch; epoch < options.epochs; ++epoch) {
      reset_metrics();
      source.start_epoch(epoch);
      list.each([&](keras::callbacks::Callback& cb) { cb.on_epoch_begin(epoch, empty); });
      std::size_t step = 0;
      while (const auto* batch = source.next()) {
        list.each([&](keras::callbacks::Callback& cb) { cb.on_train_batch_begin(step, empty); });
        prepare(*batch, source.max_batch());
        const double loss = train_step(*batch);
        fill_logs(logs, "");
        list.each([&](keras::callbacks::Callback& cb) { cb.on_train_batch_end(step, logs); });
        if (!std::isfinite(loss) && !stop_training) check_finite(loss, epoch, step, "fit");
        ++step;
        if (stop_training) break;
      }
      epoch_logs = logs;
      if (validation && (epoch + 1 - options.initial_epoch) % options.validation_freq == 0 &&
          !(stop_training && step == 0)) {
        const Logs val = run_test(*validation, list, epoch, true);
        for (const auto& [name, value] : val)
          epoch_logs.set("val_" + name, value);
      }
      list.each([&](keras::callbacks::Callback& cb) { cb.on_epoch_end(epoch, epoch_logs); });
      if (stop_training) break;
    }
    list.each([&](keras::callbacks::Callback& cb) { cb.on_train_end(epoch_logs); });
    return *history;
  }

  Logs run_test(detail::BatchSource& source, CallbackList& list, std::size_t pass, bool in_fit) {
    reset_metrics();
    source.start_epoch(pass);
    const Logs empty;
    if (!in_fit) list.set(*this, {list_verbose_, 1, source.steps()});
    list.each([&](keras::callbacks::Callback& cb) { cb.on_test_begin(empty); });
    Logs logs;
    std::size_t step = 0;
    while (const auto* batch = source.next()) {
      list.each([&](keras::callbacks::Callback& cb) { cb.on_test_batch_begin(step, empty); });
      prepare(*batch, source.max_batch());
      test_step(*batch);
      fill_logs(logs, "");
      list.each([&](keras::callbacks::Callback& cb) { cb.on_test_batch_end(step, logs); });
      ++step;
    }
    if (step == 0) throw ShapeError("model '" + name_ + "': the evaluation data has no batches");
    list.each([&](keras::callbacks::Callback& cb) { cb.on_test_end(logs); });
    return logs;
  }

  Logs evaluate_source(detail::BatchSource& source, const EvaluateOptions& options) {
    CallbackList list{options.callbacks};
    if (options.verbose != 0) {
      list.callbacks.push_back(std::make_shared<keras::callbacks::ProgbarLogger>(options.verbose));
    }
    class_weight_.reset();
    list_verbose_ = options.verbose;
    return run_test(source, list, 0, false);
  }

  std::vector<Tensor<float>> predict_source(detail::BatchSource& source,
                                            const PredictOptions& options) {
    CallbackList list{options.callbacks};
    if (options.verbose != 0) {
      list.callbacks.push_back(std::make_shared<keras::callbacks::ProgbarLogger>(options.verbose));
    }
    list.set(*this, {options.verbose, 1, source.steps()});
    source.start_epoch(0);
    const Logs empty;
    list.each([&](keras::callbacks::Callback& cb) { cb.on_predict_begin(empty); });
    std::vector<std::vector<float>> collected(output_nodes_.size());
    std::size_t rows = 0;
    std::size_t step = 0;
    while (const auto* batch = source.next()) {
      list.each([&](keras::callbacks::Callback& cb) { cb.on_predict_batch_begin(step, empty); });
      prepare(*batch, source.max_batch());
      {
        const detail::ScopedFlushDenormal flush_denormal;
        load(*batch, false);
        forward(false);
      }
      for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
        const Tensor<float> output =
            outputs_[o].is_host() ? outputs_[o] : backend().to_host(outputs_[o]);
        collected[o].insert(collected[o].end(), output.begin(), output.end());
      }
      rows += batch->count;
      list.each([&](keras::callbacks::Callback& cb) { cb.on_predict_batch_end(step, empty); });
      ++step;
    }
    list.each([&](keras::callbacks::Callback& cb) { cb.on_predict_end(empty); });
    std::vector<Tensor<float>> out;
    for (std::size_t o = 0; o < output_nodes_.size(); ++o) {
      out.emplace_back(nodes_[output_nodes_[o]].shape.prepend(rows),
                       std::span<const float>(collected[o]));
    }
    return out;
  }

  std::string name_;
  // Graph.
  std::vector<KerasTensor> graph_inputs_, graph_outputs_;
  std::vector<detail::RuntimeNode> nodes_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::string> input_names_, output_names_, node_names_;
  std::vector<std::size_t> output_nodes_;
  std::vector<bool> output_direct_, needs_backward_;
  std::vector<Variable*> trainable_;
  // Compilation.
  CompileOptions options_;
  bool compiled_ = false;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Optimizer> optimizer_;
  std::vector<std::shared_ptr<Loss>> losses_;
  std::vector<double> loss_weights_;
  std::vector<std::vector<std::shared_ptr<Metric>>> metrics_;
  std::optional<ClassWeight> class_weight_;
  std::uint64_t seed_ = 0;
  int list_verbose_ = 1;
  // Buffers.
  std::size_t capacity_ = 0, rows_ = 0;
  std::vector<Tensor<float>> outputs_, targets_, targets_full_, loss_scratch_full_;
  Tensor<float> weights_full_, weights_;
  // Host buffers the batch is converted into before it is copied to a device backend's memory
  // (empty for a host backend): per input, per target, and the sample weights.
  std::vector<Tensor<float>> staging_full_, staging_targets_;
  Tensor<float> staging_weights_full_;
  bool weights_placed_ = false;
  bool has_weights_ = false;
  std::vector<std::size_t> input_order_, target_order_;
  // Running metrics.
  double loss_sum_ = 0.0, seen_rows_ = 0.0;
  std::vector<double> output_losses_, output_loss_sums_;
  std::vector<std::string> loss_names_;
  std::string prefixed_;
};

}  // namespace loadstar::keras
