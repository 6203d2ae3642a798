/// \file
/// `Sampler`: which batch comes next, as a pure function of (seed, epoch, rank, size).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/random.hpp"

namespace loadstar {

/// Options of a `Sampler`, with the meaning of Determined's `_Sampler` and `_build_enqueuer`.
struct SamplerOptions {
  /// Reshuffle the batch indices every epoch (order = f(seed, epoch)).
  bool shuffle = false;
  /// The seed of the shuffle (Determined's `shuffle_seed`, the trial seed).
  std::uint64_t seed = 0;
  /// This process's rank among `size` ranks (Determined's `shard_rank`).
  std::size_t rank = 0;
  /// The number of ranks sharing the stream (Determined's `num_shards`).
  std::size_t size = 1;
  /// `true` for training: an infinite stream of epochs; `false` for validation: one pass in which
  /// every batch is seen exactly once across ranks.
  bool repeat = true;
  /// The batches this rank has already consumed (Determined's `prior_batches_trained`): the
  /// stream starts after them, at O(1) cost.
  std::uint64_t skip = 0;
};

/// Where a sampler stands, taken at the consumption boundary: the next batch this rank will
/// consume is at position `cursor` of epoch `epoch` of the global stream, and this rank is `rank`
/// of `size`. Serialisable as JSON (`{"epoch": 3, "cursor": 41, "seed": 777, "length": 100,
/// "rank": 1, "size": 2}`).
///
/// The global stream does not depend on the number of ranks, so a state restores on any number:
/// ranks that consume in step (one batch each per step, as data-parallel training does) stand at
/// the same step, whose first batch is at global position `epoch * length + cursor - rank`
/// (`step_start()`), and `M` ranks restored from any of their states read that step's batch and the
/// ones after it, `M` to a step. A state without `rank` and `size` (written before they were
/// recorded) belongs to the restoring sampler's own rank and number of ranks.
struct SamplerState {
  std::uint64_t epoch = 0;
  std::uint64_t cursor = 0;
  std::uint64_t seed = 0;
  /// The number of batches of the sequence, checked on restore.
  std::uint64_t length = 0;
  /// The rank that saved the state and the number of ranks.
  std::optional<std::uint64_t> rank = {};
  std::optional<std::uint64_t> size = {};

  /// The global position of the first batch of the step this state stands before: the position
  /// every rank's state of one step agrees on, whatever the number of ranks.
  std::uint64_t step_start() const noexcept { return epoch * length + cursor - rank.value_or(0); }

  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

/// Writes a `SamplerState` as a JSON object.
inline void to_json(nlohmann::json& out, const SamplerState& state) {
  out = nlohmann::json{{"epoch", state.epoch},
                       {"cursor", state.cursor},
                       {"seed", state.seed},
                       {"length", state.length}};
  if (state.rank) out["rank"] = *state.rank;
  if (state.size) out["size"] = *state.size;
}

/// Reads a `SamplerState` from a JSON object; throws `CheckpointError` naming a missing or
/// mistyped field (`rank` and `size` may be missing together).
inline void from_json(const nlohmann::json& in, SamplerState& state) {
  const auto field = [&](const char* name) -> std::uint64_t {
    if (!in.is_object() || !in.contains(name) || !in.at(name).is_number_unsigned()) {
      throw CheckpointError(std::string("sampler state: field '") + name +
                            "' must be a non-negative integer but the state is " +
                            loadstar::detail::shown(in));
    }
    return in.at(name).get<std::uint64_t>();
  };
  state.epoch = field("epoch");
  state.cursor = field("cursor");
  state.seed = field("seed");
  state.length = field("length");
  state.rank.reset();
  state.size.reset();
  if (in.contains("rank") || in.contains("size")) {
    state.rank = field("rank");
    state.size = field("size");
  }
}

/// One batch to build: the `position`-th batch of this rank's stream is batch `index` of the
/// sequence, in epoch `epoch`.
struct SamplerTicket {
  std::uint64_t position = 0;
  std::uint64_t epoch = 0;
  std::size_t index = 0;
  /// Whether this is the last batch of its epoch for this rank (`on_epoch_end` comes after it).
  bool last_in_epoch = false;
};

/// Decides which batch comes next, with the semantics of Determined's `_Sampler`
/// (`_enqueuer.py`): the global stream is the concatenation of one permutation per epoch, rank
/// `r` of `size` takes `stream[r::size]`, training repeats forever and validation makes one pass
/// in which each batch is seen exactly once across ranks. Unlike Determined, each epoch's order is
/// computed directly from `(seed, epoch)`, so skipping or restoring costs O(1) epochs; and a state
/// restores on any number of ranks (`SamplerState`): the ranks go on reading the same global
/// stream from the step they stopped at, whose batches are indexed, not sampled, so "exact" is at
/// the level of batches.
/// \code
/// Sampler sampler(100, {.shuffle = true, .seed = 777, .rank = 1, .size = 3});
/// while (auto ticket = sampler.next()) build(ticket->index);   // infinite for training
/// nlohmann::json saved = sampler.state();
/// Sampler resumed(100, {.shuffle = true, .seed = 777, .rank = 1, .size = 3},
///                 saved.get<SamplerState>());
/// \endcode
class Sampler {
 public:
  /// A sampler over a sequence of `length` batches; throws `ConfigError` when there are fewer
  /// batches than ranks or `rank >= size`.
  Sampler(std::size_t length, const SamplerOptions& options) : length_(length), options_(options) {
    validate();
    start_ = options_.skip;
    cursor_ = start_;
    check_skip();
  }

  /// A sampler that continues from `state`, saved by any rank of any number of ranks: it yields
  /// this rank's share of the global stream from the step the state stands before
  /// (`SamplerState::step_start()`), at O(1) cost. Throws `CheckpointError` when the state belongs
  /// to another seed or sequence length, or lies beyond the single pass of validation.
  Sampler(std::size_t length, const SamplerOptions& options, const SamplerState& state)
      : length_(length), options_(options) {
    validate();
    start_ = restored_position(state);
    cursor_ = start_;
  }

  /// The number of batches of the sequence.
  std::size_t length() const noexcept { return length_; }
  const SamplerOptions& options() const noexcept { return options_; }

  /// The first position of this rank's stream that this sampler yields.
  std::uint64_t start() const noexcept { return start_; }

  /// One past the last position of this rank's stream: unbounded for training, the number of
  /// batches of this rank in the single pass of validation.
  std::uint64_t end() const noexcept {
    if (options_.repeat) return std::numeric_limits<std::uint64_t>::max();
    const std::uint64_t first = origin_ + options_.rank;
    return first >= length_ ? 0 : (length_ - first + options_.size - 1) / options_.size;
  }

  /// The number of batches this rank sees in one validation pass (Determined's
  /// `len // size + (1 if len % size > rank else 0)`).
  std::uint64_t pass_length() const noexcept {
    return (length_ - options_.rank + options_.size - 1) / options_.size;
  }

  /// The batches of one epoch on every rank alike: the most any rank has,
  /// `ceil(length / size)`. Ranks that train in step (each step a gradient sum) count their epochs
  /// in these, so that every rank ends an epoch at the same step.
  std::uint64_t steps_per_epoch() const noexcept {
    return (length_ + options_.size - 1) / options_.size;
  }

  /// The ticket at `position` of this rank's stream, or nothing beyond `end()`. Keeps the
  /// permutations of the few most recent epochs, so consecutive calls cost O(1) amortised.
  std::optional<SamplerTicket> ticket(std::uint64_t position) {
    if (position >= end()) return std::nullopt;
    const std::uint64_t global = global_of(position);
    SamplerTicket t;
    t.position = position;
    t.epoch = global / length_;
    t.index = order(t.epoch)[static_cast<std::size_t>(global % length_)];
    t.last_in_epoch = (global + options_.size) / length_ != t.epoch || position + 1 >= end();
    return t;
  }

  /// The next ticket of the stream (nothing after the end of a validation pass), advancing the
  /// cursor.
  std::optional<SamplerTicket> next() {
    auto t = ticket(cursor_);
    if (t) ++cursor_;
    return t;
  }

  /// The rest of the current epoch for this rank, as Determined's `yield_epoch()`.
  std::vector<std::size_t> yield_epoch() {
    std::vector<std::size_t> indices;
    while (auto t = next()) {
      indices.push_back(t->index);
      if (t->last_in_epoch) break;
    }
    return indices;
  }

  /// The position of the next batch `next()` yields.
  std::uint64_t position() const noexcept { return cursor_; }

  /// The epoch of `position` in the global stream.
  std::uint64_t epoch_of(std::uint64_t position) const noexcept {
    return global_of(position) / length_;
  }

  /// The first position of this rank's stream that falls in `epoch` or later.
  std::uint64_t first_position_of_epoch(std::uint64_t epoch) const noexcept {
    const std::uint64_t global = epoch * length_;
    const std::uint64_t first = origin_ + options_.rank;
    if (global <= first) return 0;
    return (global - first + options_.size - 1) / options_.size;
  }

  /// The state before the batch at `position` (the default: before the next one `next()`
  /// yields).
  SamplerState state_at(std::uint64_t position) const noexcept {
    const std::uint64_t global = global_of(position);
    return {global / length_, global % length_, options_.seed,
            length_,          options_.rank,    options_.size};
  }
  SamplerState state() const noexcept { return state_at(cursor_); }

  /// The position of this rank's stream a state of this very rank stands before; throws
  /// `CheckpointError` when it does not belong to this sampler (another seed, length or stride).
  std::uint64_t position_of(const SamplerState& state) const {
    if (state.length != length_) {
      throw CheckpointError("sampler state: saved for a sequence of " +
                            std::to_string(state.length) + " batches but this one has " +
                            std::to_string(length_));
    }
    if (state.seed != options_.seed) {
      throw CheckpointError("sampler state: saved with seed " + std::to_string(state.seed) +
                            " but the sampler's seed is " + std::to_string(options_.seed));
    }
    if (state.cursor >= length_) {
      throw CheckpointError("sampler state: cursor " + std::to_string(state.cursor) +
                            " is beyond the " + std::to_string(length_) + " batches of an epoch");
    }
    const std::uint64_t global = state.epoch * length_ + state.cursor;
    const std::uint64_t first = origin_ + options_.rank;
    if (global < first || (global - first) % options_.size != 0) {
      throw CheckpointError("sampler state: epoch " + std::to_string(state.epoch) + " cursor " +
                            std::to_string(state.cursor) + " is not on the stride of rank " +
                            std::to_string(options_.rank) + " of " + std::to_string(options_.size));
    }
    const std::uint64_t position = (global - first) / options_.size;
    if (position > end()) {
      throw CheckpointError("sampler state: epoch " + std::to_string(state.epoch) + " cursor " +
                            std::to_string(state.cursor) + " is beyond the single validation pass");
    }
    return position;
  }

 private:
  /// Where rank `rank` of `size` reads at `position`: `origin + rank + position * size`.
  std::uint64_t global_of(std::uint64_t position) const noexcept {
    return origin_ + options_.rank + position * options_.size;
  }

  /// The position to start at from `state` (see the constructor); sets `origin_` when the step
  /// the state stands before is not on this number of ranks' steps from the stream's start.
  std::uint64_t restored_position(const SamplerState& state) {
    if (!state.rank || !state.size) return position_of(state);
    if (state.length != length_ || state.seed != options_.seed || state.cursor >= length_) {
      static_cast<void>(position_of(state));  // throws, naming what differs
    }
    const std::uint64_t global = state.epoch * length_ + state.cursor;
    if (*state.size == 0 || *state.rank >= *state.size || global < *state.rank) {
      throw CheckpointError("sampler state: epoch " + std::to_string(state.epoch) + " cursor " +
                            std::to_string(state.cursor) + " cannot be a position of rank " +
                            std::to_string(*state.rank) + " of " + std::to_string(*state.size));
    }
    const std::uint64_t step = global - *state.rank;
    if (!options_.repeat && step >= length_ + *state.size) {
      throw CheckpointError("sampler state: epoch " + std::to_string(state.epoch) + " cursor " +
                            std::to_string(state.cursor) + " is beyond the single validation pass");
    }
    if (step % options_.size == 0) return step / options_.size;
    origin_ = step;
    return 0;
  }

  void validate() const {
    if (options_.size == 0) throw ConfigError("sampler: size must be positive but is 0");
    if (options_.rank >= options_.size) {
      throw ConfigError("sampler: rank " + std::to_string(options_.rank) + " must be below size " +
                        std::to_string(options_.size));
    }
    // Determined: "please provide a Sequence that has at least as many batches as the number
    // of slots".
    if (length_ < options_.size) {
      throw ConfigError("sampler: the sequence needs at least as many batches as ranks (" +
                        std::to_string(options_.size) + ") but has " + std::to_string(length_));
    }
  }

  void check_skip() const {
    if (!options_.repeat && options_.skip > end()) {
      throw ConfigError("sampler: cannot skip " + std::to_string(options_.skip) +
                        " batches of a validation pass of " + std::to_string(end()) + " batches");
    }
  }

  const std::vector<std::size_t>& order(std::uint64_t epoch) {
    for (const auto& cached : cache_) {
      if (cached.epoch == epoch && cached.valid) return cached.order;
    }
    // Replace the least recently computed entry; a reorder window rarely spans more epochs.
    Cached& slot = cache_[next_cache_];
    next_cache_ = (next_cache_ + 1) % cache_.size();
    slot.order = epoch_permutation(length_, options_.seed, epoch, options_.shuffle);
    slot.epoch = epoch;
    slot.valid = true;
    return slot.order;
  }

  struct Cached {
    std::uint64_t epoch = 0;
    bool valid = false;
    std::vector<std::size_t> order;
  };

  std::size_t length_;
  SamplerOptions options_;
  /// The global position where position 0 of this rank's stride begins (before `rank`): 0, or the
  /// step a state saved on another number of ranks stands before.
  std::uint64_t origin_ = 0;
  std::uint64_t start_ = 0;
  std::uint64_t cursor_ = 0;
  std::array<Cached, 4> cache_{};
  std::size_t next_cache_ = 0;
};

}  // namespace loadstar
