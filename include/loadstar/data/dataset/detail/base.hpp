/// \file
/// `DatasetBase`: the CRTP base that gives every dataset its fluent operators.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <utility>

#include "loadstar/data/dataset/concepts.hpp"

namespace loadstar {

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
};

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
