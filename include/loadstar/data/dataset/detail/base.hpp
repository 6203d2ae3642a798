/// \file
/// `DatasetBase`: the CRTP base that gives every dataset its fluent operators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/concepts.hpp"

namespace loadstar {

/// tf.data's `AUTOTUNE`: passed as `num_parallel_calls` of `map` and `interleave` or as the
/// `buffer_size` of `prefetch`, the operator chooses the value from measurements, within the
/// budget of its `AutotuneOptions` (see `loadstar/data/dataset/autotune.hpp`).
inline constexpr std::size_t AUTOTUNE = std::numeric_limits<std::size_t>::max();

class AutotuneBudget;

/// The budget of an autotuned operator, as `tf.data.Options().autotune`: its own (it never runs
/// more than `cpu_budget` threads nor buffers more than `ram_budget` bytes of elements), or the
/// pipeline's, shared by every autotuned operator given it (see `AutotuneBudget`):
/// \code
/// auto budget = std::make_shared<AutotuneBudget>(/*cpu_budget=*/4, /*ram_budget=*/64 << 20);
/// auto ds = range(1000).map(decode, {.num_parallel_calls = AUTOTUNE, .autotune = {.pipeline =
/// budget}})
///               .prefetch(AUTOTUNE, {.pipeline = budget});
/// \endcode
struct AutotuneOptions {
  /// Threads the operator may run; 0 means `std::thread::hardware_concurrency()`.
  std::size_t cpu_budget = 0;
  /// Bytes of buffered elements (tensors count their bytes, see `element_bytes`); 0 means
  /// 256 MiB.
  std::size_t ram_budget = 0;
  /// The pipeline's budget, shared with the other operators given it; the two numbers above stay
  /// 0 then.
  std::shared_ptr<AutotuneBudget> pipeline = nullptr;
};

/// Options of `map` and `map_with_seed`.
struct MapOptions {
  /// Threads that run the function (on a oneTBB arena of that size); 1 runs it on the consuming
  /// thread.
  std::size_t num_parallel_calls = 1;
  /// Yield elements in input order (the default, as tf.data); `false` yields each window of
  /// elements in completion order.
  bool deterministic = true;
  /// Elements handed to the threads at once; 0 means `64 * num_parallel_calls`.
  std::size_t window = 0;
  /// The budget when `num_parallel_calls` is `AUTOTUNE`.
  AutotuneOptions autotune = {};
};

/// Options of `interleave` after its cycle and block lengths, as tf.data's arguments.
struct InterleaveOptions {
  /// Threads that read the open datasets ahead of the consumer; 1 reads them on the consuming
  /// thread; `AUTOTUNE` chooses.
  std::size_t num_parallel_calls = 1;
  /// Yield in the round-robin order (the default); `false` lets the consumer take an element of
  /// another open dataset when the current one has none ready (with one thread, which reads on
  /// the consumer's turn, the order is the round-robin one either way).
  bool deterministic = true;
  /// The budget when `num_parallel_calls` is `AUTOTUNE`.
  AutotuneOptions autotune = {};
};

/// The element padded shapes of `padded_batch` (see `padded_batch.hpp`).
struct PaddedShape;
/// The options of `bucket_by_sequence_length` (see `padded_batch.hpp`).
struct BucketOptions;

template <Dataset D, class F, bool WithSeed>
class MapDataset;
template <Dataset D, class P>
class FilterDataset;
template <Dataset D>
class BatchDataset;
template <Dataset D>
class UnbatchDataset;
template <Dataset D>
class ShuffleDataset;
template <Dataset D>
class RepeatDataset;
template <Dataset D>
class TakeDataset;
template <Dataset D>
class SkipDataset;
template <Dataset D>
class ShardDataset;
template <Dataset D>
class PrefetchDataset;
template <Dataset D, class Store>
class CacheDataset;
template <Dataset D, class F>
class InterleaveDataset;
template <Dataset A, Dataset B>
class ConcatenateDataset;
template <Dataset D>
class EnumerateDataset;
template <Dataset D>
class WindowDataset;
template <Dataset D>
class PaddedBatchDataset;
template <Dataset D, class L>
class BucketBySequenceLengthDataset;

namespace detail {
template <class E>
class MemoryStore;
template <class E>
class FileStore;
}  // namespace detail

/// The fluent operators of every dataset, as tf.data spells them. Each returns a new dataset
/// that owns this one (moved from an rvalue, copied from an lvalue); the operator's header must
/// be included (`<loadstar/data/dataset.hpp>` includes them all).
/// \code
/// auto ds = from_tensor_slices(x, y).shuffle(1000, 42).map(augment).batch(32).prefetch(2);
/// while (auto batch = ds.next()) train_step(*batch);
/// \endcode
template <class Derived>
class DatasetBase {
 public:
  /// Applies `f` to every element (see `MapDataset`).
  template <class F>
  auto map(F f, MapOptions options = {}) && {
    return MapDataset<Derived, F, false>(std::move(self()), std::move(f), 0, options);
  }
  template <class F>
  auto map(F f, MapOptions options = {}) const& {
    return MapDataset<Derived, F, false>(self(), std::move(f), 0, options);
  }
  /// Applies `f(element, element_seed(seed, epoch, index))` to every element.
  template <class F>
  auto map_with_seed(F f, std::uint64_t seed, MapOptions options = {}) && {
    return MapDataset<Derived, F, true>(std::move(self()), std::move(f), seed, options);
  }
  template <class F>
  auto map_with_seed(F f, std::uint64_t seed, MapOptions options = {}) const& {
    return MapDataset<Derived, F, true>(self(), std::move(f), seed, options);
  }
  /// Keeps the elements for which `predicate` is true.
  template <class P>
  auto filter(P predicate) && {
    return FilterDataset<Derived, P>(std::move(self()), std::move(predicate));
  }
  template <class P>
  auto filter(P predicate) const& {
    return FilterDataset<Derived, P>(self(), std::move(predicate));
  }
  /// Stacks `batch_size` elements into one (the last batch may be partial).
  auto batch(std::size_t batch_size, bool drop_remainder = false) && {
    return BatchDataset<Derived>(std::move(self()), batch_size, drop_remainder);
  }
  auto batch(std::size_t batch_size, bool drop_remainder = false) const& {
    return BatchDataset<Derived>(self(), batch_size, drop_remainder);
  }
  /// Splits every element into its rows.
  auto unbatch() && { return UnbatchDataset<Derived>(std::move(self())); }
  auto unbatch() const& { return UnbatchDataset<Derived>(self()); }
  /// Shuffles through a buffer of `buffer_size` elements.
  auto shuffle(std::size_t buffer_size, std::uint64_t seed,
               bool reshuffle_each_iteration = true) && {
    return ShuffleDataset<Derived>(std::move(self()), buffer_size, seed, reshuffle_each_iteration);
  }
  auto shuffle(std::size_t buffer_size, std::uint64_t seed,
               bool reshuffle_each_iteration = true) const& {
    return ShuffleDataset<Derived>(self(), buffer_size, seed, reshuffle_each_iteration);
  }
  /// Repeats the dataset `count` times (forever when `count` is negative).
  auto repeat(std::int64_t count = -1) && {
    return RepeatDataset<Derived>(std::move(self()), count);
  }
  auto repeat(std::int64_t count = -1) const& { return RepeatDataset<Derived>(self(), count); }
  /// The first `count` elements of every epoch.
  auto take(std::size_t count) && { return TakeDataset<Derived>(std::move(self()), count); }
  auto take(std::size_t count) const& { return TakeDataset<Derived>(self(), count); }
  /// Every epoch without its first `count` elements.
  auto skip(std::size_t count) && { return SkipDataset<Derived>(std::move(self()), count); }
  auto skip(std::size_t count) const& { return SkipDataset<Derived>(self(), count); }
  /// Every `num_shards`-th element, starting at element `index`.
  auto shard(std::size_t num_shards, std::size_t index) && {
    return ShardDataset<Derived>(std::move(self()), num_shards, index);
  }
  auto shard(std::size_t num_shards, std::size_t index) const& {
    return ShardDataset<Derived>(self(), num_shards, index);
  }
  /// Produces up to `buffer_size` elements ahead on a background thread.
  auto prefetch(std::size_t buffer_size) && {
    return PrefetchDataset<Derived>(std::move(self()), buffer_size);
  }
  /// With `buffer_size` `AUTOTUNE`, the buffer grows while the consumer waits, within `budget`.
  auto prefetch(std::size_t buffer_size, AutotuneOptions budget) && {
    return PrefetchDataset<Derived>(std::move(self()), buffer_size, budget);
  }
  /// Keeps the elements of the first complete epoch in memory and serves later epochs from there.
  auto cache() && {
    using E = typename Derived::element_type;
    return CacheDataset<Derived, detail::MemoryStore<E>>(std::move(self()),
                                                         detail::MemoryStore<E>());
  }
  auto cache() const& {
    using E = typename Derived::element_type;
    return CacheDataset<Derived, detail::MemoryStore<E>>(self(), detail::MemoryStore<E>());
  }
  /// Writes the elements of the first complete epoch to the file `path` and serves later epochs,
  /// and later runs, from it.
  auto cache(std::filesystem::path path) && {
    using E = typename Derived::element_type;
    return CacheDataset<Derived, detail::FileStore<E>>(std::move(self()),
                                                       detail::FileStore<E>(std::move(path)));
  }
  auto cache(std::filesystem::path path) const& {
    using E = typename Derived::element_type;
    return CacheDataset<Derived, detail::FileStore<E>>(self(),
                                                       detail::FileStore<E>(std::move(path)));
  }
  /// Maps every element to a dataset with `f` and interleaves `cycle_length` of them.
  template <class F>
  auto interleave(F f, std::size_t cycle_length, std::size_t block_length = 1) && {
    return InterleaveDataset<Derived, F>(std::move(self()), std::move(f), cycle_length,
                                         block_length);
  }
  template <class F>
  auto interleave(F f, std::size_t cycle_length, std::size_t block_length = 1) const& {
    return InterleaveDataset<Derived, F>(self(), std::move(f), cycle_length, block_length);
  }
  /// `interleave` with tf.data's `num_parallel_calls` and `deterministic`: the open datasets are
  /// read ahead on that many threads (see `InterleaveDataset`).
  template <class F>
  auto interleave(F f, std::size_t cycle_length, std::size_t block_length,
                  InterleaveOptions options) && {
    return InterleaveDataset<Derived, F>(std::move(self()), std::move(f), cycle_length,
                                         block_length, options);
  }
  template <class F>
  auto interleave(F f, std::size_t cycle_length, std::size_t block_length,
                  InterleaveOptions options) const& {
    return InterleaveDataset<Derived, F>(self(), std::move(f), cycle_length, block_length, options);
  }
  /// Maps every element to a dataset with `f` and yields their elements one dataset after the
  /// other (`interleave` with a cycle length of 1, as tf.data defines it).
  template <class F>
  auto flat_map(F f) && {
    return InterleaveDataset<Derived, F>(std::move(self()), std::move(f), 1, 1);
  }
  template <class F>
  auto flat_map(F f) const& {
    return InterleaveDataset<Derived, F>(self(), std::move(f), 1, 1);
  }
  /// This dataset's elements followed by `other`'s (header `zip.hpp`).
  template <class Other>
  auto concatenate(Other other) && {
    return ConcatenateDataset<Derived, Other>(std::move(self()), std::move(other));
  }
  template <class Other>
  auto concatenate(Other other) const& {
    return ConcatenateDataset<Derived, Other>(self(), std::move(other));
  }
  /// `(start + i, element_i)` tuples (header `zip.hpp`).
  auto enumerate(std::int64_t start = 0) && {
    return EnumerateDataset<Derived>(std::move(self()), start);
  }
  auto enumerate(std::int64_t start = 0) const& { return EnumerateDataset<Derived>(self(), start); }
  /// Windows of `size` elements every `shift` (0: `size`) elements, `stride` apart, as
  /// `std::vector`s (header `window.hpp`).
  auto window(std::size_t size, std::size_t shift = 0, std::size_t stride = 1,
              bool drop_remainder = false) && {
    return WindowDataset<Derived>(std::move(self()), size, shift, stride, drop_remainder);
  }
  auto window(std::size_t size, std::size_t shift = 0, std::size_t stride = 1,
              bool drop_remainder = false) const& {
    return WindowDataset<Derived>(self(), size, shift, stride, drop_remainder);
  }
  /// Batches of tensors (or tuples of tensors) padded to `padded_shapes` (a `PaddedShape`, or
  /// a `std::vector<PaddedShape>` for tuples) with `padding_value` (header `padded_batch.hpp`).
  template <class P = PaddedShape, class V = int>
  auto padded_batch(std::size_t batch_size, P padded_shapes = {}, V padding_value = 0,
                    bool drop_remainder = false) && {
    return PaddedBatchDataset<Derived>(std::move(self()), batch_size, std::move(padded_shapes),
                                       static_cast<double>(padding_value), drop_remainder);
  }
  template <class P = PaddedShape, class V = int>
  auto padded_batch(std::size_t batch_size, P padded_shapes = {}, V padding_value = 0,
                    bool drop_remainder = false) const& {
    return PaddedBatchDataset<Derived>(self(), batch_size, std::move(padded_shapes),
                                       static_cast<double>(padding_value), drop_remainder);
  }
  /// Elements grouped into buckets by `element_length_func` and batched per bucket (header
  /// `padded_batch.hpp`).
  template <class L, class O = BucketOptions>
  auto bucket_by_sequence_length(L element_length_func, std::vector<std::int64_t> bucket_boundaries,
                                 std::vector<std::size_t> bucket_batch_sizes, O options = {}) && {
    return BucketBySequenceLengthDataset<Derived, L>(
        std::move(self()), std::move(element_length_func), std::move(bucket_boundaries),
        std::move(bucket_batch_sizes), std::move(options));
  }
  template <class L, class O = BucketOptions>
  auto bucket_by_sequence_length(L element_length_func, std::vector<std::int64_t> bucket_boundaries,
                                 std::vector<std::size_t> bucket_batch_sizes,
                                 O options = {}) const& {
    return BucketBySequenceLengthDataset<Derived, L>(
        self(), std::move(element_length_func), std::move(bucket_boundaries),
        std::move(bucket_batch_sizes), std::move(options));
  }

  /// Calls `f(element)` for every remaining element of the current epoch.
  template <class F>
  void for_each(F&& f) {
    while (auto element = self().next())
      f(std::move(*element));
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace loadstar
