/// \file
/// Type-erased batches and batch sources: how `fit`, `evaluate` and `predict` take every loader
/// kind (arrays, `Sequence`, `Dataset`, `SequenceAdapter`) through one non-template executor.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/detail/graph.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras::detail {

/// One member of an array-like, viewed with its element type known at run time.
struct MemberView {
  DType dtype = DType::float32;
  const void* data = nullptr;
  Shape shape;
  /// The key of a map member (named inputs or outputs), else null.
  const std::string* key = nullptr;
  /// Where `data` lives: host memory, or a backend's device memory (a tensor the user placed
  /// there, such as `backend.from_host(x)`), whose rows the backend copies on the device.
  Device device;
};

/// How the members of `x` or `y` were given: by position or by name.
enum class MemberKind { tensor, list, map, tuple, none };

/// A batch whose members are views: rows `rows` (or `[offset, offset + count)` when `rows` is
/// empty) of `x`, `y` and `w`.
struct ErasedBatch {
  MemberKind x_kind = MemberKind::none;
  MemberKind y_kind = MemberKind::none;
  std::vector<MemberView> x, y;
  std::optional<MemberView> w;
  std::span<const std::size_t> rows;
  std::size_t offset = 0;
  std::size_t count = 0;
};

template <TensorElement T>
MemberView view_of(const Tensor<T>& t, const std::string* key = nullptr) {
  return {dtype_of<T>, t.data(), t.shape(), key, t.device()};
}

/// Views the members of an array-like into `out` (cleared first; no allocation once its
/// capacity suffices).
template <ArrayLike A>
void collect(const A& array, MemberKind& kind, std::vector<MemberView>& out) {
  out.clear();
  if constexpr (AnyTensor<A>) {
    kind = MemberKind::tensor;
    out.push_back(view_of(array));
  } else if constexpr (TensorList<A>) {
    kind = MemberKind::list;
    for (const auto& t : array)
      out.push_back(view_of(t));
  } else if constexpr (TensorMap<A>) {
    kind = MemberKind::map;
    for (const auto& [key, t] : array)
      out.push_back(view_of(t, &key));
  } else {
    kind = MemberKind::tuple;
    std::apply([&](const auto&... t) { (out.push_back(view_of(t)), ...); }, array);
  }
}

/// Where batches come from, one epoch (or one validation pass) at a time.
///
/// A source can say where it stands (`state()`, taken before the next batch) and start again
/// from there (`restore()`): the next `start_epoch` of the epoch the state was taken in then
/// continues mid-epoch instead of starting over, and `step()` tells how many batches of that
/// epoch came before. States are O(1) or proportional to the model, never to the data.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  BatchSource() = default;
  BatchSource(const BatchSource&) = delete;
  BatchSource& operator=(const BatchSource&) = delete;

  /// The number of batches of an epoch, when known before it runs.
  virtual std::optional<std::size_t> steps() const = 0;
  /// The largest batch, when known in advance (0: learnt from the first batch).
  virtual std::size_t max_batch() const { return 0; }
  /// Starts epoch (or pass) `epoch` (or, after `restore`, continues it).
  virtual void start_epoch(std::size_t epoch) = 0;
  /// The next batch of the epoch, or null at its end. The batch stays valid until the next call.
  virtual const ErasedBatch* next() = 0;
  /// Whether batches carry targets (`predict` needs none).
  virtual bool has_targets() const { return true; }
  /// The caller is done with the epoch: a sequence's epoch-end hooks run now if its last batch
  /// was taken (`SequenceAdapter::finish_epoch`), not at the next epoch's first batch.
  virtual void finish_epoch() {}

  /// The batches of the current epoch taken so far.
  std::size_t step() const noexcept { return step_; }
  /// Whether the next `start_epoch` continues a restored state.
  bool resuming() const noexcept { return resuming_; }
  /// Whether `start_epoch(epoch)` continues a restored state in the middle of `epoch` (a state
  /// saved at the end of an epoch starts the next one from its beginning).
  bool continues(std::size_t epoch) const noexcept { return resuming_ && epoch_ == epoch; }

  /// Where the source stands, as JSON: `{"epoch", "step", ...}` and what the kind of source needs
  /// (a sampler state, a dataset state).
  LOADSTAR_DECL nlohmann::json state() const;
  /// Continues from `state()`; throws `CheckpointError` for a state of another source.
  LOADSTAR_DECL void restore(const nlohmann::json& state);

 protected:
  /// The name of the kind of source, for messages (`"array source"`).
  virtual std::string kind() const = 0;
  virtual nlohmann::json own_state() const { return nlohmann::json::object(); }
  virtual void restore_own(const nlohmann::json&) {}

  /// For `start_epoch`: whether this epoch continues a restored state (then `step()` stays),
  /// else starts it at step 0.
  LOADSTAR_DECL bool begin_epoch(std::size_t epoch);

  std::uint64_t epoch_ = 0;
  std::size_t step_ = 0;

 private:
  bool resuming_ = false;
};

/// Placeholder for arrays without targets (`predict`).
struct NoTargets {};

/// In-memory arrays cut into batches of `batch_size` rows (the last one partial), in order or
/// with the rows shuffled every epoch, as Keras's `fit(x, y, shuffle=True)` does for arrays. The
/// row order comes from a `Sampler` over the rows, as every other loader's order does, so arrays
/// are sharded by rank the same way (rank `r` of `size` takes rows `stream[r::size]`) and a
/// mid-epoch state is one sampler position.
///
/// Sharded (`size > 1`), step `k` of an epoch on every rank together covers rows `[kG, (k+1)G)`
/// of the epoch's order, `G = batch_size * size` (the global batch): the same rows one process
/// takes at batch `G`. With `aligned` (training), every rank has the same number of steps per
/// epoch, and a rank with no rows left in the epoch's last global batch gets an empty batch
/// (its step contributes nothing). The state is `(epoch, step)` and `G`, so a state saved with
/// any number of ranks resumes with any other that keeps `G`.
template <ArrayLike X, class Y>
class ArraySource final : public BatchSource {
 public:
  ArraySource(X x, Y y, std::optional<Tensor<float>> w, std::size_t rows, std::size_t batch_size,
              bool shuffle, std::uint64_t seed, std::optional<std::size_t> max_steps = {},
              std::size_t rank = 0, std::size_t size = 1, bool aligned = false)
      : x_(std::move(x)),
        y_(std::move(y)),
        w_(std::move(w)),
        batch_size_(batch_size),
        size_(size),
        aligned_(aligned && size > 1),
        contiguous_(!shuffle && size == 1),
        sampler_(rows, {.shuffle = shuffle, .seed = seed, .rank = rank, .size = size}),
        order_(contiguous_ ? 0 : batch_size) {
    collect(x_, batch_.x_kind, batch_.x);
    if constexpr (!std::is_same_v<Y, NoTargets>) collect(y_, batch_.y_kind, batch_.y);
    if (w_) batch_.w = view_of(*w_);
    // Rank 0 has the most rows of an epoch, ceil(rows / size): its steps are the global steps.
    const std::uint64_t rows_per_rank =
        aligned_ ? (rows + size - 1) / size : sampler_.pass_length();
    steps_ = static_cast<std::size_t>((rows_per_rank + batch_size_ - 1) / batch_size_);
    if (max_steps) steps_ = std::min(steps_, *max_steps);
  }

  std::optional<std::size_t> steps() const override { return steps_; }
  std::size_t max_batch() const override {
    return std::min<std::size_t>(batch_size_, sampler_.pass_length());
  }
  bool has_targets() const override { return !std::is_same_v<Y, NoTargets>; }

  void start_epoch(std::size_t epoch) override {
    if (!begin_epoch(epoch)) position_ = sampler_.first_position_of_epoch(epoch);
  }

  const ErasedBatch* next() override {
    if (step_ >= steps_) return nullptr;
    std::size_t count = 0;
    std::size_t first = 0;
    while (count < batch_size_) {
      const auto ticket = sampler_.ticket(position_);
      if (!ticket || ticket->epoch != epoch_) break;
      ++position_;
      if (count == 0) first = ticket->index;
      if (!contiguous_) order_[count] = ticket->index;
      ++count;
      if (ticket->last_in_epoch) break;
    }
    if (count == 0 && !aligned_) return nullptr;
    ++step_;
    batch_.count = count;
    if (contiguous_) {
      batch_.offset = first;
    } else {
      batch_.rows = std::span<const std::size_t>(order_).first(count);
    }
    return &batch_;
  }

 protected:
  std::string kind() const override { return "array source"; }
  nlohmann::json own_state() const override {
    return {{"sampler", sampler_.state_at(position_)}, {"global_batch", batch_size_ * size_}};
  }
  void restore_own(const nlohmann::json& state) override {
    const loadstar::detail::StateReader read(kind(), state);
    const auto saved = read.get<SamplerState>("sampler");
    if (!state.contains("global_batch")) {
      position_ = sampler_.position_of(saved);
      return;
    }
    const auto global = read.get<std::uint64_t>("global_batch");
    if (global != batch_size_ * size_) {
      throw CheckpointError(
          "array source: the state was saved with a global batch of " + std::to_string(global) +
          " rows but this source has " + std::to_string(batch_size_ * size_) + " (" +
          std::to_string(batch_size_) + " rows on each of " + std::to_string(size_) +
          " ranks); a resume with another number of ranks needs the same global batch");
    }
    // The seed and length must match; the stride may differ (another number of ranks).
    if (saved.length != sampler_.length() || saved.seed != sampler_.options().seed) {
      static_cast<void>(sampler_.position_of(saved));  // throws, naming what differs
    }
    const auto epoch = read.get<std::uint64_t>("epoch");
    const auto step = read.get<std::uint64_t>("step");
    position_ = sampler_.first_position_of_epoch(epoch) + step * batch_size_;
  }

 private:
  X x_;
  Y y_;
  std::optional<Tensor<float>> w_;
  std::size_t batch_size_;
  std::size_t size_;
  bool aligned_;
  bool contiguous_;
  Sampler sampler_;
  std::vector<std::size_t> order_;
  std::uint64_t position_ = 0;
  std::size_t steps_ = 0;
  ErasedBatch batch_;
};

/// Views a Keras batch `(x, y)` or `(x, y, w)`, or inputs alone, into `out`.
template <class B>
void collect_batch(const B& batch, ErasedBatch& out) {
  out.rows = {};
  out.offset = 0;
  // A pair or triple of array-likes is (x, y[, w]), as Keras reads tuples, before inputs alone.
  if constexpr (!KerasBatch<B>) {
    collect(batch, out.x_kind, out.x);
    out.y.clear();
    out.y_kind = MemberKind::none;
    out.w.reset();
    out.count = out.x.empty() ? 0 : (out.x.front().shape.rank() == 0 ? 1 : out.x.front().shape[0]);
  } else {
    collect(std::get<0>(batch), out.x_kind, out.x);
    collect(std::get<1>(batch), out.y_kind, out.y);
    if constexpr (XYWBatch<B>) {
      out.w = view_of(std::get<2>(batch));
    } else {
      out.w.reset();
    }
    out.count = out.x.empty() ? 0 : (out.x.front().shape.rank() == 0 ? 1 : out.x.front().shape[0]);
  }
}

/// The batch type of a source element is a Keras batch or inputs alone.
template <class B>
concept SourceBatch = KerasBatch<B> || ArrayLike<B>;

/// A `Sequence` read in order on the calling thread (validation, evaluation, prediction). A
/// sequence with `set_epoch` is told the pass it serves before its first batch.
template <Sequence S>
class SequenceSource final : public BatchSource {
 public:
  explicit SequenceSource(S sequence, std::optional<std::size_t> max_steps = {})
      : sequence_(std::move(sequence)), steps_(sequence_.size()) {
    if (max_steps) steps_ = std::min(steps_, *max_steps);
  }
  std::optional<std::size_t> steps() const override { return steps_; }
  void start_epoch(std::size_t epoch) override {
    begin_epoch(epoch);
    if constexpr (SequenceWithSetEpoch<S>) sequence_.set_epoch(epoch);
  }
  const ErasedBatch* next() override {
    if (step_ >= steps_) return nullptr;
    current_.reset();
    current_.emplace(sequence_[step_++]);
    collect_batch(*current_, batch_);
    return &batch_;
  }
  bool has_targets() const override { return KerasBatch<batch_t<S>>; }

 protected:
  std::string kind() const override { return "sequence source"; }

 private:
  S sequence_;
  std::size_t steps_;
  std::optional<batch_t<S>> current_;
  ErasedBatch batch_;
};

/// A `SequenceAdapter` (owned or the caller's): an infinite training stream cut into epochs of
/// `steps` batches, or one validation pass. Its state holds the adapter's; a caller's adapter
/// resumes by being constructed from that state before `restore` (which checks it).
template <class Adapter>
class AdapterSource final : public BatchSource {
 public:
  AdapterSource(Adapter& adapter, std::optional<std::size_t> steps)
      : adapter_(&adapter),
        steps_(steps ? *steps : static_cast<std::size_t>(adapter.steps_per_epoch())) {}
  std::optional<std::size_t> steps() const override { return steps_; }
  void start_epoch(std::size_t epoch) override { begin_epoch(epoch); }
  const ErasedBatch* next() override {
    if (step_ >= steps_) return nullptr;
    current_.reset();
    current_ = adapter_->next();
    if (!current_) return nullptr;
    ++step_;
    collect_batch(*current_, batch_);
    return &batch_;
  }
  bool has_targets() const override { return KerasBatch<typename Adapter::batch_type>; }

  void finish_epoch() override { adapter_->finish_epoch(); }
  /// Serves `adapter` from now on (an owner re-created it from a state).
  void rebind(Adapter& adapter) noexcept { adapter_ = &adapter; }

 protected:
  std::string kind() const override { return "sequence adapter source"; }
  nlohmann::json own_state() const override { return {{"adapter", adapter_->state()}}; }
  void restore_own(const nlohmann::json& state) override {
    const auto saved = loadstar::detail::StateReader(kind(), state).get<SamplerState>("adapter");
    // The same step of the global stream (saved on any number of ranks).
    const SamplerState now = adapter_->state();
    const bool same = saved.rank && saved.size
                          ? saved.seed == now.seed && saved.length == now.length &&
                                saved.step_start() == now.step_start()
                          : saved.epoch == now.epoch && saved.cursor == now.cursor &&
                                saved.seed == now.seed && saved.length == now.length;
    if (!same) {
      throw CheckpointError(
          "sequence adapter source: the state was saved at adapter state " +
          nlohmann::json(saved).dump() + " but the adapter stands at " +
          nlohmann::json(adapter_->state()).dump() +
          "; construct the adapter from the saved state (SequenceAdapter(sequence, options, "
          "state)) before restoring");
    }
  }

 private:
  Adapter* adapter_;
  std::size_t steps_;
  std::optional<typename Adapter::batch_type> current_;
  ErasedBatch batch_;
};

/// A `SequenceAdapter` owned by the source (what `fit(sequence)` makes); `restore` re-creates it
/// from the saved state.
template <Sequence S, std::size_t Workers, bool Multiprocess>
class OwnedAdapterSource final : public BatchSource {
  using Adapter = SequenceAdapter<S, Workers, Multiprocess>;

 public:
  OwnedAdapterSource(S sequence, const AdapterOptions& options, std::optional<std::size_t> steps)
      : sequence_(sequence),
        options_(options),
        adapter_(std::make_unique<Adapter>(std::move(sequence), options)),
        source_(*adapter_, steps) {}
  std::optional<std::size_t> steps() const override { return source_.steps(); }
  void start_epoch(std::size_t epoch) override {
    begin_epoch(epoch);
    source_.start_epoch(epoch);
  }
  const ErasedBatch* next() override {
    const auto* batch = source_.next();
    step_ = source_.step();
    return batch;
  }
  bool has_targets() const override { return source_.has_targets(); }
  void finish_epoch() override { source_.finish_epoch(); }

 protected:
  std::string kind() const override { return "sequence source"; }
  nlohmann::json own_state() const override { return source_.state(); }
  void restore_own(const nlohmann::json& state) override {
    const auto saved = loadstar::detail::StateReader(kind(), state).get<SamplerState>("adapter");
    adapter_.reset();
    adapter_ = std::make_unique<Adapter>(sequence_, options_, saved);
    source_.rebind(*adapter_);
    source_.restore(state);
  }

 private:
  S sequence_;  // a copy, for re-creating the adapter from a state
  AdapterOptions options_;
  std::unique_ptr<Adapter> adapter_;
  AdapterSource<Adapter> source_;
};

/// A `Dataset` (held by reference when `D` is an lvalue reference type, else owned). Without
/// `steps`, an epoch is one pass and the dataset is `reset()` before every pass but the first;
/// with `steps`, epochs take `steps` elements from the stream and a pass that runs out is reset
/// and continued. Its state holds the dataset's.
template <class D>
class DatasetSource final : public BatchSource {
  using Dataset = std::remove_cvref_t<D>;

 public:
  DatasetSource(D dataset, std::optional<std::size_t> steps)
      : dataset_(std::forward<D>(dataset)), steps_(steps) {}
  std::optional<std::size_t> steps() const override { return steps_; }
  void start_epoch(std::size_t epoch) override {
    if (begin_epoch(epoch)) return;
    if (!steps_ && used_) dataset_.reset();
    used_ = true;
  }
  const ErasedBatch* next() override {
    if (steps_ && step_ >= *steps_) return nullptr;
    current_.reset();
    current_ = dataset_.next();
    if (!current_ && steps_) {
      dataset_.reset();
      current_ = dataset_.next();
    }
    if (!current_) return nullptr;
    ++step_;
    collect_batch(*current_, batch_);
    return &batch_;
  }
  bool has_targets() const override { return KerasBatch<typename Dataset::element_type>; }

 protected:
  std::string kind() const override { return "dataset source"; }
  nlohmann::json own_state() const override {
    return {{"dataset", dataset_.state()}, {"used", used_}};
  }
  void restore_own(const nlohmann::json& state) override {
    const loadstar::detail::StateReader read(kind(), state);
    dataset_.restore(read.get<nlohmann::json>("dataset"));
    used_ = read.get<bool>("used");
  }

 private:
  D dataset_;
  std::optional<std::size_t> steps_;
  bool used_ = false;
  std::optional<typename Dataset::element_type> current_;
  ErasedBatch batch_;
};

/// Converts rows of a member of any element type to float into `out` (row-major, `row_size`
/// elements per row).
LOADSTAR_DECL void convert_rows(const MemberView& member, std::span<const std::size_t> rows,
                                std::size_t offset, std::size_t count, float* out);

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

nlohmann::json BatchSource::state() const {
  nlohmann::json out = own_state();
  out["epoch"] = epoch_;
  out["step"] = step_;
  return out;
}

void BatchSource::restore(const nlohmann::json& state) {
  const loadstar::detail::StateReader read(kind(), state);
  const auto epoch = read.get<std::uint64_t>("epoch");
  const auto step = read.get<std::size_t>("step");
  restore_own(state);
  epoch_ = epoch;
  step_ = step;
  resuming_ = true;
}

bool BatchSource::begin_epoch(std::size_t epoch) {
  const bool resumed = std::exchange(resuming_, false) && epoch_ == epoch;
  epoch_ = epoch;
  if (!resumed) step_ = 0;
  return resumed;
}

void convert_rows(const MemberView& member, std::span<const std::size_t> rows, std::size_t offset,
                  std::size_t count, float* out) {
  const std::size_t row_size = member.shape.row_elements();
  auto convert = [&]<class T>(const T* source) {
    if (rows.empty()) {
      const T* from = source + offset * row_size;
      if constexpr (std::is_same_v<T, float>) {
        std::copy_n(from, count * row_size, out);
      } else {
        std::transform(from, from + count * row_size, out,
                       [](T v) { return static_cast<float>(v); });
      }
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        const T* from = source + rows[i] * row_size;
        std::transform(from, from + row_size, out + i * row_size,
                       [](T v) { return static_cast<float>(v); });
      }
    }
  };
  switch (member.dtype) {
    case DType::float32:
      convert(static_cast<const float*>(member.data));
      break;
    case DType::float64:
      convert(static_cast<const double*>(member.data));
      break;
    case DType::int32:
      convert(static_cast<const std::int32_t*>(member.data));
      break;
    case DType::int64:
      convert(static_cast<const std::int64_t*>(member.data));
      break;
    case DType::uint8:
      convert(static_cast<const std::uint8_t*>(member.data));
      break;
    case DType::float16:
      convert(static_cast<const float16*>(member.data));
      break;
    case DType::bfloat16:
      convert(static_cast<const bfloat16*>(member.data));
      break;
  }
}

}  // namespace loadstar::keras::detail
#endif
