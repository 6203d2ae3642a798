/// \file
/// The declaration of `Model` and its public template members (the `fit`, `evaluate`, `predict`,
/// data-iterator and step overloads for every loader and batch kind, which must stay in the
/// class); this is why the header is longer than 600 lines. The non-template members live in
/// keras/model/*.hpp by concern, the loops in keras/detail/loops.hpp.
///
/// `Model`: Keras's functional model, with `compile`, `fit`, `evaluate`, `predict`,
/// `train_on_batch`, `test_on_batch`, `summary`, `get_weights` and `set_weights`.
#pragma once
// Read by sequential.hpp, whose saving headers wait for it when it comes first.
#define LOADSTAR_DETAIL_MODEL_HPP

#include "loadstar/config.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
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
#include "loadstar/detail/strings.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/callbacks/callback.hpp"
#include "loadstar/keras/callbacks/callback_list.hpp"
#include "loadstar/keras/callbacks/history.hpp"
#include "loadstar/keras/callbacks/logs.hpp"
#include "loadstar/keras/callbacks/progbar_logger.hpp"
#include "loadstar/keras/data_iterator.hpp"
#include "loadstar/keras/detail/args.hpp"
#include "loadstar/keras/detail/batch.hpp"
#include "loadstar/keras/detail/flush_denormal.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/keras/detail/graph_plan.hpp"
#include "loadstar/keras/detail/mask_plan.hpp"
#include "loadstar/keras/detail/params.hpp"
#include "loadstar/keras/detail/penalty_plan.hpp"
#include "loadstar/keras/detail/relu_fusion.hpp"
#include "loadstar/keras/detail/runtime.hpp"
#include "loadstar/keras/detail/shape_text.hpp"
#include "loadstar/keras/input.hpp"
#include "loadstar/keras/layer.hpp"
#include "loadstar/keras/layers/text_vectorization.hpp"
#include "loadstar/keras/losses.hpp"
#include "loadstar/keras/metrics.hpp"
#include "loadstar/keras/mixed_precision/detail/mixed_plan.hpp"
#include "loadstar/keras/mixed_precision/policy.hpp"
#include "loadstar/keras/optimizers.hpp"
#include "loadstar/keras/options.hpp"
#include "loadstar/keras/running_metrics.hpp"
#include "loadstar/keras/saving/options.hpp"
#include "loadstar/keras/validation_data.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

class Model;

namespace detail {
// The loops, defined in keras/detail/loops.hpp on the public step API.
LOADSTAR_DECL callbacks::History run_fit(Model& model, DataIterator& data, BatchSource* validation,
                                         const FitOptions& options,
                                         const ClassWeight* class_weight);
LOADSTAR_DECL Logs run_evaluate(Model& model, BatchSource& source, const EvaluateOptions& options);
LOADSTAR_DECL std::vector<Tensor<float>> run_predict(Model& model, BatchSource& source,
                                                     const PredictOptions& options);
LOADSTAR_DECL Error non_finite_loss(const std::string& model, double loss, std::size_t epoch,
                                    std::size_t batch, std::string_view where);
}  // namespace detail

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
  /// Several inputs and one output, as Keras's `Model(inputs=[a, b], outputs=out)`:
  /// `Model({a, b}, out)`.
  Model(std::vector<KerasTensor> inputs, const KerasTensor& output, std::string name = "model")
      : Model(std::move(inputs), std::vector<KerasTensor>{output}, std::move(name)) {}
  /// One input and several outputs: `Model(a, {out1, out2})`.
  Model(const KerasTensor& input, std::vector<KerasTensor> outputs, std::string name = "model")
      : Model(std::vector<KerasTensor>{input}, std::move(outputs), std::move(name)) {}

  virtual ~Model() = default;
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  /// Set by a callback to end `fit` (after the current batch, or at the end of the epoch when set
  /// in `on_epoch_end`), as Keras's `model.stop_training`.
  bool stop_training = false;

  const std::string& name() const noexcept { return name_; }

  /// Keras's `model.dtype_policy`: the global policy when the model was made. `compile` wraps the
  /// optimizer in a `LossScaleOptimizer` when it is `"mixed_float16"`, as Keras 3 does.
  const mixed_precision::Policy& dtype_policy() const noexcept { return dtype_policy_; }
  void set_dtype_policy(const mixed_precision::Policy& policy) noexcept { dtype_policy_ = policy; }

  /// The layers in the order Keras lists them (inputs excluded), each once.
  const std::vector<std::shared_ptr<Layer>>& layers() const noexcept { return layers_; }

  /// The layer named `name`; throws `ConfigError` when there is none.
  LOADSTAR_DECL std::shared_ptr<Layer> get_layer(std::string_view name) const;

  /// The symbolic inputs and outputs the model was built from (Keras's `model.inputs` and
  /// `model.outputs`); their nodes hold the layer calls (`inbound_nodes` in `get_config`).
  const std::vector<KerasTensor>& inputs() const noexcept { return graph_inputs_; }
  const std::vector<KerasTensor>& outputs() const noexcept { return graph_outputs_; }

  /// The trainable weights in `layers()` order: what the optimizer updates (and `build`s slots
  /// for).
  std::span<Variable*> trainable_variables() noexcept { return trainable_; }

  /// Keras's `model.get_config()` (the `model_config` of a Keras 2 file: `Functional` with
  /// `inbound_nodes`, or `Sequential`) and `model.to_json()`; `model_from_json` rebuilds the model
  /// (keras/saving/model_config.hpp).
  LOADSTAR_DECL nlohmann::json get_config() const;
  LOADSTAR_DECL std::string to_json() const;

  /// The names of the inputs, in order.
  const std::vector<std::string>& input_names() const noexcept { return input_names_; }
  /// The names of the outputs (their layers' names), in order.
  const std::vector<std::string>& output_names() const noexcept { return output_names_; }

  // --- text inputs --------------------------------------------------------------------------

  /// An input that takes strings: Keras's `Input(shape=(1,), dtype="string")` read by a
  /// `TextVectorization`, whose output (token ids, as floats, or multi-hot, count or TF-IDF rows)
  /// is what the layers behind the input take.
  struct TextInput {
    /// The input's index among `inputs()`.
    std::size_t input = 0;
    /// The layer that turns the strings into the input's values.
    layers::TextVectorization layer;
    /// A sample's shape as the string input declares it: `(1)` (Keras's examples) or `()`.
    Shape string_shape = Shape{1};
  };

  /// Makes input `input` take strings, turned into its values by `layer`: Keras's end-to-end
  /// model `keras.Model(text, model(layer(text)))` with `text = keras.Input(shape=(1,),
  /// dtype="string")`. From then on the input is fed texts (`predict`, `evaluate` and `fit` on a
  /// `std::vector<std::string>`); arrays given for it are refused. `save`, `get_config` and
  /// `load_model` keep the string input and the layer (its vocabulary in the config of a `.h5`
  /// file, in the `vocabulary.txt` asset of a `.keras` file, as Keras). Throws `ConfigError` for
  /// an input index out of range, one that takes strings already and a model not built yet, and
  /// `ShapeError` when the layer's output (`output_sample_shape`) does not fit the input's shape.
  LOADSTAR_DECL void set_text_input(layers::TextVectorization layer, std::size_t input = 0,
                                    Shape string_shape = Shape{1});

  /// The inputs that take strings, in the order they were set (a loaded model's: the config's).
  const std::vector<TextInput>& text_inputs() const noexcept { return text_inputs_; }
  /// The layer of `text_inputs()[k]`, to adapt or give a vocabulary (Keras's
  /// `model.layers[1].adapt(...)`); throws `ConfigError` for `k` out of range.
  LOADSTAR_DECL layers::TextVectorization& text_vectorization(std::size_t k = 0);

  /// The outputs for texts, a model of one string input: `batch_size` texts at a time, each batch
  /// vectorized on its own (an `int` layer without `output_sequence_length` pads it to its
  /// longest text, as Keras's layer pads each batch). Throws `ConfigError` for a model whose
  /// inputs are not one string input, and for a layer without a vocabulary.
  LOADSTAR_DECL std::vector<Tensor<float>> predict_outputs(const std::vector<std::string>& texts,
                                                           const PredictOptions& options = {});
  // `predict(texts)`, for a single-output model, is `predict`'s template over these.

  /// The loss and metrics over texts and their targets, a model of one string input: batches of
  /// `batch_size` in order, each vectorized on its own, as Keras evaluates an end-to-end model.
  template <ArrayLike Y>
  Logs evaluate(const std::vector<std::string>& texts, const Y& y,
                const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    const TextInput& text = text_input_for("evaluate", texts.size());
    const std::size_t rows = rows_of(y, "y", "evaluate");
    if (rows != texts.size()) {
      throw ShapeError("model '" + name_ + "': evaluate got " + std::to_string(texts.size()) +
                       " texts but y has " + std::to_string(rows) + " rows");
    }
    if (options.sample_weight && options.sample_weight->rows() != rows) {
      throw ShapeError("model '" + name_ + "': evaluate got " + std::to_string(rows) +
                       " texts but sample_weight has " +
                       std::to_string(options.sample_weight->rows()) + " rows");
    }
    const FeedingText feeding(*this);
    const std::size_t batch = std::max<std::size_t>(1, std::min(options.batch_size, rows));
    EvaluateOptions rest = options;
    rest.sample_weight.reset();
    if (options.sample_weight) {
      return evaluate(TextBatches<Y, true>{&texts, &y, &*options.sample_weight, &text.layer, batch},
                      rest);
    }
    return evaluate(TextBatches<Y, false>{&texts, &y, nullptr, &text.layer, batch}, rest);
  }

  /// Trains a model of one string input on texts and targets, as `fit` on arrays (shuffling,
  /// `validation_split`, sample and class weights alike): the texts are vectorized once, which is
  /// Keras's batching exactly when every text gives a row of one length (`output_sequence_length`,
  /// or a mode other than `int`). Throws `ConfigError` for a layer of rows of unknown length (each
  /// shuffled batch would be padded to its own longest text) and for `validation_data` (give
  /// `validation_split`, or `evaluate` texts after).
  template <ArrayLike Y>
  callbacks::History fit(const std::vector<std::string>& texts, const Y& y,
                         const FitOptions& options = {}) {
    require_compiled("fit");
    const TextInput& text = text_input_for("fit", texts.size());
    if (detail::has_unknown_axis(text.layer.output_sample_shape())) {
      throw ConfigError("model '" + name_ + "': fit on texts needs TextVectorization '" +
                        text.layer.options().name +
                        "' to give rows of one length (output_sequence_length, or an output_mode "
                        "other than \"int\"); it pads each batch to its longest text");
    }
    if (!options.validation_data.empty()) {
      throw ConfigError("model '" + name_ +
                        "': fit on texts takes no validation_data (arrays for a string input); "
                        "give validation_split, or evaluate texts after");
    }
    const Tensor<float> x = text.layer(texts);
    const FeedingText feeding(*this);
    return fit(x, y, options);
  }

  /// Prepares training: the optimizer, one loss per output, metrics and loss weights, and the
  /// thread count. Throws `ConfigError` for unknown names, for a number of losses or loss weights
  /// that is not the number of outputs, and for a map of losses naming no output.
  LOADSTAR_DECL void compile(const CompileOptions& options);

  /// `compile` with Keras's positional arguments.
  /// \code
  /// model.compile("adam", "sparse_categorical_crossentropy", {"accuracy"});
  /// \endcode
  LOADSTAR_DECL void compile(OptimizerArg optimizer, Losses loss,
                             std::vector<MetricArg> metrics = {},
                             std::vector<double> loss_weights = {});

  /// Whether `compile` was called.
  bool compiled() const noexcept { return compiled_; }

  /// The options of the last `compile` (what `save_model` writes as `training_config`).
  const CompileOptions& compile_options() const noexcept { return options_; }

  /// The optimizer given to `compile`; throws `ConfigError` before `compile`.
  LOADSTAR_DECL Optimizer& optimizer() const;

  /// Replaces the optimizer `compile` set (with its iterations and slots, if any) by `optimizer`,
  /// moved to the model's backend: how a runner wraps the optimizer of a compiled model (the
  /// data-parallel `dist::DistributedOptimizer`). Throws `ConfigError` before `compile` or for a
  /// null optimizer.
  LOADSTAR_DECL void set_optimizer(std::shared_ptr<Optimizer> optimizer);
  /// The optimizer `compile` set, shared.
  LOADSTAR_DECL std::shared_ptr<Optimizer> optimizer_ptr() const;

  /// The backend the layers compute with.
  LOADSTAR_DECL Backend& backend();

  /// The names `evaluate` and the logs use: `loss`, per-output losses, then the metrics.
  LOADSTAR_DECL std::vector<std::string> metrics_names() const;

  // --- fit ------------------------------------------------------------------------------------

  /// Trains on arrays (`x` and `y` each a tensor of any element type, a list, a map by name or a
  /// tuple of tensors) for `options.epochs` epochs; returns the `History`. Throws `ShapeError`
  /// when the data do not fit the model's inputs or outputs (naming the input and both shapes),
  /// `ConfigError` before `compile` and for bad options, and `Error` for a loss that is NaN or
  /// infinite unless a callback (`TerminateOnNaN`) stops training.
  template <ArrayLike X, ArrayLike Y>
  callbacks::History fit(const X& x, const Y& y, const FitOptions& options = {}) {
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
    DataIterator data(
        detail::array_source(train.x, train.y, train.sample_weight, data_options(options)));
    return detail::run_fit(*this, data, validation.get(), options, /*class_weight=*/nullptr);
  }

  /// Trains on a Keras `Sequence` of `(x, y)` or `(x, y, w)` batches, served by a
  /// `SequenceAdapter` with `options.workers` threads (or processes with
  /// `use_multiprocessing`), `max_queue_size` and, with `shuffle`, a seeded batch order.
  template <KerasSequence S>
  requires(!ArrayLike<std::remove_cvref_t<S>>) callbacks::History
      fit(S sequence, const FitOptions& options = {}) {
    require_compiled("fit");
    DataIterator data = make_data_iterator(std::move(sequence), options);
    return fit(data, options);
  }

  /// Trains on a `Dataset` of `(x, y)` or `(x, y, w)` batches (the caller's, by reference):
  /// each epoch is one pass, `reset()` before every pass but the first; with `steps_per_epoch`,
  /// epochs take that many batches from the stream, resetting it when it runs out.
  template <Dataset D>
  requires KerasBatch<element_t<D>> callbacks::History fit(D& dataset,
                                                           const FitOptions& options = {}) {
    require_compiled("fit");
    DataIterator data = make_data_iterator(dataset, options);
    return fit(data, options);
  }

  /// Trains on the caller's `SequenceAdapter` (an infinite training stream): an epoch is
  /// `steps_per_epoch` batches, by default one pass over the sequence.
  template <Sequence S, std::size_t Workers, bool Multiprocess>
  requires KerasBatch<batch_t<S>> callbacks::History fit(
      SequenceAdapter<S, Workers, Multiprocess>& adapter, const FitOptions& options = {}) {
    require_compiled("fit");
    DataIterator data = make_data_iterator(adapter, options);
    return fit(data, options);
  }

  /// Trains on a `DataIterator` (from `make_data_iterator`), which keeps its position after `fit`
  /// returns: a run stopped mid-epoch (`stop_training` in a batch hook) and checkpointed with
  /// `data.state()` continues exactly where it stopped when a fresh iterator is restored and
  /// `fit` is called with `initial_epoch` set to the epoch it stopped in. The loader options of
  /// `options` (batch size, shuffling, workers, `validation_split`, `sample_weight`) belong to
  /// `make_data_iterator` and are ignored here; `class_weight` applies to batches without sample
  /// weights.
  LOADSTAR_DECL callbacks::History fit(DataIterator& data, const FitOptions& options = {});

  // --- data iterators ---------------------------------------------------------------------------

  /// The batches `fit(x, y, options)` trains on (without `validation_split`): `batch_size` rows,
  /// shuffled every epoch with `seed` when `shuffle`, `sample_weight` and `class_weight` as sample
  /// weights, at most `steps_per_epoch` batches an epoch. The iterators read no model state: each
  /// overload is the free `make_data_iterator` (keras/data_iterator.hpp) with `fit`'s options.
  template <ArrayLike X, ArrayLike Y>
  DataIterator make_data_iterator(const X& x, const Y& y, const FitOptions& options = {}) const {
    auto weights = resolve_sample_weight(y, options.sample_weight, options.class_weight);
    return DataIterator(detail::array_source(x, y, weights, data_options(options)));
  }

  /// The batches `fit(sequence, options)` trains on: a `SequenceAdapter` with the options' workers,
  /// processes, queue size and shuffling, owned by the iterator (a restore re-creates it).
  template <KerasSequence S>
  requires(!ArrayLike<std::remove_cvref_t<S>>) DataIterator
      make_data_iterator(S sequence, const FitOptions& options = {})
  const { return keras::make_data_iterator(std::move(sequence), data_options(options)); }

  /// The batches `fit(dataset, options)` trains on (the caller's dataset, by reference).
  template <Dataset D>
  requires KerasBatch<element_t<D>> DataIterator make_data_iterator(D& dataset,
                                                                    const FitOptions& options = {})
  const { return keras::make_data_iterator(dataset, data_options(options)); }

  /// The batches `fit(adapter, options)` trains on (the caller's adapter, by reference).
  template <Sequence S, std::size_t Workers, bool Multiprocess>
  requires KerasBatch<batch_t<S>> DataIterator make_data_iterator(
      SequenceAdapter<S, Workers, Multiprocess>& adapter, const FitOptions& options = {})
  const { return keras::make_data_iterator(adapter, data_options(options)); }

  /// The loader options of `options` (`fit`'s, with the seed of `set_random_seed` when it has
  /// none).
  LOADSTAR_DECL static DataIteratorOptions data_options(const FitOptions& options);

  // --- evaluate, predict -------------------------------------------------------------------------

  /// The loss and metrics over arrays, as Keras's `evaluate(return_dict=True)`.
  template <ArrayLike X, ArrayLike Y>
  Logs evaluate(const X& x, const Y& y, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    const std::size_t rows = rows_of(x, "x", "evaluate");
    detail::ArraySource<X, Y> source(x, y, options.sample_weight, rows,
                                     std::min(options.batch_size, rows), false, 0, options.steps,
                                     options.shard_rank, options.num_shards);
    return detail::run_evaluate(*this, source, options);
  }

  /// The loss and metrics over a `Sequence`, read in order.
  template <KerasSequence S>
  requires(!ArrayLike<S>) Logs evaluate(S sequence, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    detail::SequenceSource<S> source(std::move(sequence), options.steps);
    return detail::run_evaluate(*this, source, options);
  }

  /// The loss and metrics over one pass of a `Dataset`.
  template <Dataset D>
  requires KerasBatch<element_t<D>> Logs evaluate(D& dataset, const EvaluateOptions& options = {}) {
    require_compiled("evaluate");
    detail::DatasetSource<D&> source(dataset, options.steps);
    return detail::run_evaluate(*this, source, options);
  }

  /// The outputs for arrays, one tensor per output (batch axis first).
  template <ArrayLike X>
  std::vector<Tensor<float>> predict_outputs(const X& x, const PredictOptions& options = {}) {
    const std::size_t rows = rows_of(x, "x", "predict");
    detail::ArraySource<X, detail::NoTargets> source(x, detail::NoTargets{}, std::nullopt, rows,
                                                     std::min(options.batch_size, rows), false, 0,
                                                     options.steps);
    return detail::run_predict(*this, source, options);
  }

  /// The outputs for a `Sequence` (its targets, if any, are ignored).
  template <Sequence S>
  requires(!ArrayLike<S>) std::vector<Tensor<float>> predict_outputs(
      S sequence, const PredictOptions& options = {}) {
    detail::SequenceSource<S> source(std::move(sequence), options.steps);
    return detail::run_predict(*this, source, options);
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

  // --- steps ------------------------------------------------------------------------------------

  /// One training step on one batch of any kind `fit` takes (`(x, y)` or `(x, y, w)` of array-likes
  /// of any element type, or a `BatchView` from a `DataIterator`): forward, loss, backward, one
  /// optimizer update, and the training metrics accumulated. Returns the training logs so far
  /// (since the last `training_metrics().reset()`); they stay valid until the next step. After the
  /// first batch a step allocates nothing (unless a batch is larger than every one before).
  /// `fit` is written on this, so a runner can train N batches, validate, checkpoint and continue.
  /// \code
  /// model.training_metrics().reset();
  /// while (const auto* batch = data.next()) model.train_step(*batch);
  /// \endcode
  template <KerasBatch B>
  const Logs& train_step(const B& batch, const StepOptions& options = {}) {
    detail::collect_batch(batch, step_batch_);
    return train_step(step_batch_, options);
  }
  LOADSTAR_DECL const Logs& train_step(const BatchView& batch, const StepOptions& options = {});

  /// One evaluation step: forward and loss, accumulated into the evaluation metrics (separate
  /// from the training metrics, so a validation in the middle of an epoch leaves those alone).
  /// Returns the evaluation logs so far.
  template <KerasBatch B>
  const Logs& test_step(const B& batch, const StepOptions& options = {}) {
    detail::collect_batch(batch, step_batch_);
    return test_step(step_batch_, options);
  }
  LOADSTAR_DECL const Logs& test_step(const BatchView& batch, const StepOptions& options = {});

  /// The outputs for one batch of inputs (an array-like, or a batch whose targets are ignored):
  /// views of the model's output buffers, valid until the next step.
  template <class X>
  requires(ArrayLike<X> ||
           KerasBatch<X>) const std::vector<Tensor<float>>& predict_step(const X& x) {
    detail::collect_batch(x, step_batch_);
    return predict_step(step_batch_);
  }
  LOADSTAR_DECL const std::vector<Tensor<float>>& predict_step(const BatchView& batch);

  /// Allocates the buffers for batches of up to `rows` rows now, so that no later step allocates
  /// (the loops call it with the largest batch of their loader).
  /// Does nothing before the model is built (a `Sequential` without an input shape): its first
  /// step allocates.
  void reserve_batch(std::size_t rows) {
    if (built()) reserve(rows);
  }

  /// The running loss and metrics of training (`train_step`) and of evaluation (`test_step`):
  /// separate objects, reset by the loops at the start of every epoch and every evaluation, and
  /// checkpointable (`state()`, `restore()`).
  RunningMetrics& training_metrics() noexcept { return training_; }
  RunningMetrics& evaluation_metrics() noexcept { return evaluation_; }
  /// Resets both, as Keras's `model.reset_metrics()`.
  LOADSTAR_DECL void reset_metrics();
  /// Keras's `model.reset_states()`: every stateful layer (a recurrent layer with `stateful`)
  /// starts its next batch from zeros.
  void reset_states() {
    for (const auto& layer : layers_)
      layer->reset_states();
  }
  /// The states the stateful layers carry to the next batch, as JSON for a checkpoint:
  /// `{layer name: [{"shape": [...], "values": [...]}, ...]}` (host copies; float32 values are
  /// exact as JSON doubles), empty when none carries any.
  LOADSTAR_DECL nlohmann::json carried_states() const;
  /// Puts back what `carried_states()` returned; a stateful layer it does not name starts its
  /// next batch from zeros. Throws `ShapeError` naming the layer for states that do not fit, and
  /// `ConfigError` for a name no layer has.
  LOADSTAR_DECL void restore_carried_states(const nlohmann::json& states);

  /// One training step on one batch of any kind `fit` takes; returns its loss and metrics
  /// (training metrics reset first, as Keras's `train_on_batch(reset_metrics=True)`).
  template <ArrayLike X, ArrayLike Y>
  Logs train_on_batch(const X& x, const Y& y,
                      std::optional<Tensor<float>> sample_weight = std::nullopt) {
    if (sample_weight) return train_on_batch(std::tie(x, y, *sample_weight));
    return train_on_batch(std::tie(x, y));
  }
  template <KerasBatch B>
  Logs train_on_batch(const B& batch, const StepOptions& options = {}) {
    require_compiled("train_on_batch");
    training_.reset();
    const Logs logs = train_step(batch, options);
    if (const auto loss = logs.get("loss"); loss && !std::isfinite(*loss)) {
      throw detail::non_finite_loss(name_, *loss, 0, 0, "train_on_batch");
    }
    return logs;
  }

  /// The loss and metrics of one batch of any kind without training (evaluation metrics reset
  /// first).
  template <ArrayLike X, ArrayLike Y>
  Logs test_on_batch(const X& x, const Y& y,
                     std::optional<Tensor<float>> sample_weight = std::nullopt) {
    if (sample_weight) return test_on_batch(std::tie(x, y, *sample_weight));
    return test_on_batch(std::tie(x, y));
  }
  template <KerasBatch B>
  Logs test_on_batch(const B& batch, const StepOptions& options = {}) {
    require_compiled("test_on_batch");
    evaluation_.reset();
    return test_step(batch, options);
  }

  // --- weights ----------------------------------------------------------------------------------

  /// Copies of every weight, layer by layer in `layers()` order, each layer's in Keras's order.
  std::vector<Tensor<float>> get_weights() const;

  /// Sets every weight from `weights` (in `get_weights` order); throws `ShapeError` for a wrong
  /// number of weights or a weight of another shape, naming the layer and the weight.
  void set_weights(const std::vector<Tensor<float>>& weights);

  /// The number of scalars in the weights.
  std::size_t count_params() const;

  /// Keras's `model.save(path)`: `save_model(*this, path, options)` (keras/saving/saving.hpp).
  LOADSTAR_DECL void save(const std::filesystem::path& path, const SaveOptions& options = {}) const;
  /// Keras's `model.save_weights(path)`: `save_weights(*this, path)`.
  LOADSTAR_DECL void save_weights(const std::filesystem::path& path) const;
  /// Keras's `model.load_weights(path)`: `load_weights(*this, path, options)`.
  LOADSTAR_DECL void load_weights(const std::filesystem::path& path,
                                  const LoadWeightsOptions& options = {});

  /// Prints Keras's summary table: layers, output shapes, parameter counts and totals (with a
  /// "Connected to" column when the graph is not a chain). Throws `ConfigError` for a
  /// `Sequential` model not built yet.
  void summary(std::ostream& out = std::cout) const;

 protected:
  /// A model whose graph comes later (`Sequential`).
  explicit Model(std::string name, std::nullptr_t) : name_(std::move(name)) {}

  /// Replaces the graph (`Sequential` after each `add`).
  LOADSTAR_DECL void set_graph(std::vector<KerasTensor> inputs, std::vector<KerasTensor> outputs);

  /// Whether the graph exists (a `Sequential` without an input shape has none until it sees data).
  bool built() const noexcept { return !nodes_.empty(); }

  /// Builds the graph from the first batch when it does not exist yet (`Sequential`).
  virtual void build_from_batch(const detail::ErasedBatch&) {}

  /// Whether `summary` lists the inputs as `InputLayer` rows (functional models do).
  bool show_inputs_in_summary_ = true;

 private:
  // --- graph ------------------------------------------------------------------------------------

  void plan(const std::vector<KerasTensor>& inputs, const std::vector<KerasTensor>& outputs);
  bool is_chain() const;

  static std::string grouped(std::size_t n);

  void require_compiled(std::string_view what) const;

  void require_built(std::string_view what) const;

  // --- compile ----------------------------------------------------------------------------------

  void resolve_losses();

  static std::string joined(const std::vector<std::string>& names);

  /// The metric objects of training and of evaluation (separate objects; a metric object given
  /// to `compile` measures training and its clone evaluation), named as Keras's
  /// `MetricsContainer._set_metric_names` does.
  void create_metrics();

  // --- batches ----------------------------------------------------------------------------------

  /// Allocates every buffer for `rows` rows when more than allocated so far.
  /// Allocates every buffer for `rows` rows when more than allocated so far, in the backend's
  /// memory (with host staging buffers for the batch when that memory is not the host's), and
  /// moves the weights there first.
  void reserve(std::size_t rows);

  /// Moves the weights (made on the host by `build`) into the backend's memory, with zero
  /// gradients there; nothing moves for a host backend.
  void place_weights();

  /// Converts rows of a batch member into `target`: straight into it for a host backend, through
  /// the host buffer `staging` (at least `n` rows) otherwise; a member in the backend's memory is
  /// copied there (`Backend::copy_rows`).
  template <class Member>
  void upload(const Member& member, const detail::ErasedBatch& batch, std::size_t n,
              const Tensor<float>& staging, const Tensor<float>& target);

  /// Throws `DeviceError` when `member` (named `label`) lives in device memory other than the
  /// backend's, or holds another element type than float32 there.
  void check_placement(const detail::MemberView& member, const std::string& label) const;

  /// Points every view at the first `rows` rows of the buffers.
  void set_rows(std::size_t rows);

  /// In a model with axes of unknown length: settles every node's shape for the batch's inputs
  /// (each layer's `output_shape_for`), when they differ from the last batch's. Throws
  /// `ShapeError` naming the input whose samples do not fit its declared shape.
  void bind(const detail::ErasedBatch& batch);

  /// `reserve` in a model with axes of unknown length: buffers of as many elements as the
  /// largest batch so far needs, viewed in each batch's shapes.
  void reserve_elements(std::size_t rows);

  /// The first `rows` samples of shape `sample` in the buffer `full`.
  static Tensor<float> leading(const Tensor<float>& full, const Shape& sample, std::size_t rows) {
    return full.reshape({full.size()})
        .slice_rows(0, rows * sample.elements())
        .reshape(sample.prepend(rows));
  }

  /// Sets the gradients of `variables` to zero (one `fill_many`): before a step, those of the
  /// layers that do not write theirs (`zeroed_`).
  void zero_gradients(std::span<Variable* const> variables) {
    gradients_.clear();  // keeps its capacity
    for (auto* variable : variables)
      gradients_.push_back(variable->gradient);
    backend().fill_many(gradients_, 0.0F);
    gradients_.clear();  // holds no tensor between steps
  }

  /// The kinds of step a backend may record (`Backend::begin_step`).
  enum class StepKind : std::uint64_t { train = 1, test = 2, predict = 3 };
  /// The backend's step key of a step of the batch loaded last: this model (models that share
  /// a backend keep apart), the step's kind, its rows and whether it has weights.
  std::uint64_t step_key(StepKind kind) const noexcept {
    const std::uint64_t shape = (static_cast<std::uint64_t>(rows_) << 3U) |
                                (has_weights_ ? 4U : 0U) | static_cast<std::uint64_t>(kind);
    return (serial_ * 0x9E3779B97F4A7C15ULL) ^ shape ^ bound_key_;
  }

  /// A number no other model of the process has.
  static std::uint64_t next_serial() noexcept {
    static std::atomic<std::uint64_t> serial{0};
    return ++serial;
  }

  /// Builds the graph if needed, allocates for `max_rows` and checks nothing else.
  void prepare(const detail::ErasedBatch& batch, std::size_t max_rows);

  std::string member_label(const detail::ErasedBatch& batch, bool is_x, std::size_t i) const;

  /// For each input (or output), the member of the batch that feeds it.
  void match_members(const detail::ErasedBatch& batch, bool is_x,
                     std::vector<std::size_t>& order) const;

  /// Converts the batch into the input (and target and weight) buffers.
  void load(const detail::ErasedBatch& batch, bool targets, const ClassWeight* class_weight);

  /// Keras's `class_weight` for loaders other than arrays: the weight of each row's class.
  void apply_class_weight(std::size_t n, const ClassWeight& class_weight);

  // --- steps ------------------------------------------------------------------------------------

  void forward(bool training, std::uint64_t seed);

  /// For each output with a mask, its weights per value (`mask_loss_weights_`, ...) for the
  /// current batch.
  void weigh_masked_outputs();

  /// Losses of the current batch: the total, and per output into `output_losses_`; with
  /// `gradients`, also d(total)/d(outputs) into the output nodes' gradients.
  Deferred<double> compute_losses(bool gradients);

  /// With loss scaling (`Optimizer::loss_scale`), multiplies the gradients of the outputs by the
  /// scale before the backward pass, as Keras 3's `train_step` scales the loss.
  void scale_loss_gradients();

  void backward(std::uint64_t seed);

  /// Accumulates the current batch into `running` (its metric objects made on the first batch).
  void update_metrics(RunningMetrics& running, const Deferred<double>& total);

  /// Fills `logs` from `running` now, or at their first read when a device may still be
  /// computing a batch's loss or metrics (a step then does not wait for the device).
  void fill_logs(RunningMetrics& running, Logs& logs) {
    if (running.pending()) {
      logs.defer([this, &running](Logs& out) { running.fill(out, output_names_); });
    } else {
      running.fill(logs, output_names_);
    }
  }

  /// Refuses a metric name `get_metric` will not know at the first batch, at `compile` as Keras
  /// does (`"acuracy"` is a `ConfigError` naming the known metrics).
  LOADSTAR_DECL void check_metric_names(const std::vector<MetricArg>& metrics) const;

  // --- text inputs ----------------------------------------------------------------------------

  /// Marks the batches fed while it lives as a text input's values (made by its layer).
  struct FeedingText {
    explicit FeedingText(Model& model) : model_(model), was_(model.feeding_text_) {
      model.feeding_text_ = true;
    }
    FeedingText(const FeedingText&) = delete;
    FeedingText& operator=(const FeedingText&) = delete;
    ~FeedingText() { model_.feeding_text_ = was_; }

   private:
    Model& model_;
    bool was_;
  };

  /// The batches of texts (and targets unless `Y` is `void`, and sample weights when
  /// `Weighted`): batch `i` is texts `[i * batch, (i + 1) * batch)` through `layer`, with the
  /// same rows of `y` (and `w`).
  template <class Y, bool Weighted>
  struct TextBatches {
    const std::vector<std::string>* texts;
    const Y* y;
    const Tensor<float>* w;
    const layers::TextVectorization* layer;
    std::size_t batch;
    std::size_t size() const { return (texts->size() + batch - 1) / batch; }
    auto operator[](std::size_t i) const {
      const std::size_t begin = i * batch, end = std::min(texts->size(), begin + batch);
      Tensor<float> x = (*layer)(std::span<const std::string>(texts->data() + begin, end - begin));
      if constexpr (std::is_void_v<Y>) {
        return x;
      } else if constexpr (Weighted) {
        return std::tuple{std::move(x), loadstar::slice_rows(*y, begin, end),
                          w->slice_rows(begin, end)};
      } else {
        return std::pair{std::move(x), loadstar::slice_rows(*y, begin, end)};
      }
    }
  };

  /// The text input of a model of one string input fed `count` texts by `what`; throws
  /// `ConfigError` for another model and for a layer without a vocabulary.
  LOADSTAR_DECL const TextInput& text_input_for(std::string_view what, std::size_t count) const;
  /// Refuses arrays for a string input (`load`, outside `FeedingText`).
  LOADSTAR_DECL void refuse_arrays_for_text() const;

  std::vector<TextInput> text_inputs_;
  bool feeding_text_ = false;

  std::string name_;
  std::uint64_t serial_ = next_serial();
  // Graph.
  std::vector<KerasTensor> graph_inputs_, graph_outputs_;
  std::vector<detail::RuntimeNode> nodes_;
  std::vector<std::shared_ptr<Layer>> layers_;
  std::vector<std::string> input_names_, output_names_, node_names_;
  std::vector<std::size_t> output_nodes_;
  std::vector<bool> output_direct_, needs_backward_, writes_gradients_;
  std::vector<Variable*> trainable_;
  std::vector<Variable*> zeroed_;  // the trainable variables zeroed before a step
  /// The pairs of layers whose ReLU gradient a device backend may fuse.
  detail::ReluFusionPlan relu_fusions_;
  /// The regularization penalties and weight constraints.
  detail::PenaltyPlan penalties_;
  /// The masks (`Masking`, `Embedding(mask_zero=True)`) and the nodes that carry them.
  detail::MaskPlan masks_;
  /// Per output with a mask, the weights per value its loss and metrics take (Keras 3's
  /// `apply_mask`): the loss's, the mask's, and the mask times the sample weights (empty where
  /// an output has no mask).
  std::vector<Tensor<float>> mask_loss_weights_, mask_weights_, masked_sample_weights_;
  std::vector<Tensor<float>> mask_weights_full_;  // their buffers, three per output
  /// Where a step rounds to the layers' half-precision compute dtypes.
  detail::MixedPrecisionPlan mixed_;
  /// The global dtype policy when the model was made (Keras's `model.dtype_policy`).
  mixed_precision::Policy dtype_policy_ = mixed_precision::global_policy();
  // Compilation.
  CompileOptions options_;
  bool compiled_ = false;
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Optimizer> optimizer_;
  std::vector<std::shared_ptr<Loss>> losses_;
  std::vector<double> loss_weights_;
  // Axes of unknown length: whether the model has any, the input shapes of the batch the nodes'
  // shapes are settled for (empty: none yet), and a hash of them for `step_key`.
  bool unknown_axes_ = false;
  std::vector<Shape> bound_;
  std::uint64_t bound_key_ = 0;
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
  std::vector<Tensor<float>> gradients_;  // zero_gradients' list
  std::vector<Tensor<float>> scaled_;     // the gradients a loss scale multiplies or divides
  std::vector<std::size_t> input_order_, target_order_;
  // Running metrics, and the batch view of the templated steps.
  RunningMetrics training_, evaluation_;
  Logs training_logs_, evaluation_logs_;
  std::vector<Deferred<double>> output_losses_;
  /// The checks of the step's inputs a device still runs (`CallContext::deferred_checks`).
  std::vector<Deferred<bool>> deferred_checks_;
  detail::ErasedBatch step_batch_;
};

}  // namespace loadstar::keras

// The non-template members and the loops: in every translation unit when header-only, in the
// library alone when separately compiled (LOADSTAR_SEPARATE_COMPILATION, loadstar/config.hpp).
#if LOADSTAR_KERAS_BODIES
#include "loadstar/keras/detail/loops.hpp"
#include "loadstar/keras/model/buffers.hpp"
#include "loadstar/keras/model/compile.hpp"
#include "loadstar/keras/model/graph.hpp"
#include "loadstar/keras/model/steps.hpp"
#include "loadstar/keras/model/text_inputs.hpp"
#include "loadstar/keras/model/weights.hpp"
#endif
// The saving headers use `Sequential`; sequential.hpp includes them itself when it comes first.
#ifndef LOADSTAR_DETAIL_DEFER_SAVING
#include "loadstar/keras/saving/model_config.hpp"
#include "loadstar/keras/saving/saving.hpp"
#endif
