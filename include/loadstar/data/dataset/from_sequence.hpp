/// \file
/// `from_sequence`: the batches of a Keras `Sequence` as the elements of a dataset.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The batches `s[0], s[1], ...` of a `Sequence` as elements, in index order. `reset()` calls
/// the sequence's `on_epoch_end()` when it has one, as Keras does after every epoch; a restore
/// does not replay those calls (as Determined does not for the epochs it skips). The state is the
/// batch index: restoring costs O(1).
/// \code
/// auto ds = from_sequence(ArraySequence(x, y, 32)).prefetch(2);
/// \endcode
template <Sequence S>
class SequenceDataset : public DatasetBase<SequenceDataset<S>> {
 public:
  using element_type = batch_t<S>;

  explicit SequenceDataset(S sequence) : sequence_(std::move(sequence)) {}

  std::optional<element_type> next() {
    if (index_ >= sequence_.size()) return std::nullopt;
    return sequence_[index_++];
  }
  void reset() {
    if constexpr (SequenceWithEpochEnd<S>) sequence_.on_epoch_end();
    index_ = 0;
  }
  nlohmann::json state() const { return {{"op", "sequence"}, {"index", index_}}; }
  void restore(const nlohmann::json& state) {
    const std::size_t index = detail::expect_state(state, "sequence")["index"];
    if (index > sequence_.size()) {
      throw CheckpointError("sequence: state is at batch " + std::to_string(index) +
                            " but the sequence has " + std::to_string(sequence_.size()) +
                            " batches");
    }
    index_ = index;
  }

  const S& sequence() const noexcept { return sequence_; }

 private:
  S sequence_;
  std::size_t index_ = 0;
};

/// The batches of `sequence` as a dataset.
template <Sequence S>
SequenceDataset<S> from_sequence(S sequence) {
  return SequenceDataset<S>(std::move(sequence));
}

}  // namespace loadstar
