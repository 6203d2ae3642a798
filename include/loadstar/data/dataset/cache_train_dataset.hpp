/// \file
/// Determined's data layer: `cache_train_dataset` and `cache_validation_dataset`.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "loadstar/data/dataset/batch.hpp"  // the records are batched after caching
#include "loadstar/data/dataset/detail/base.hpp"
#include "loadstar/data/dataset/detail/cache_file.hpp"
#include "loadstar/data/dataset/detail/state.hpp"
#include "loadstar/data/dataset/element_seed.hpp"
#include "loadstar/data/dataset/wrap_dataset.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// How a cached dataset is streamed: Determined's data-layer semantics (yogadl's
/// `stream_from_cache`).
struct CacheStreamOptions {
  /// Shuffle the records with a permutation drawn from `seed` (and the epoch, unless
  /// `skip_shuffle_at_epoch_end`).
  bool shuffle = false;
  bool skip_shuffle_at_epoch_end = false;
  std::uint64_t seed = 0;
  /// This rank's shard: records `rank, rank + size, ...` of the (shuffled) order.
  DistributedContext distributed{};
  /// Drop the last `records % size` records of every epoch so that every rank sees as many
  /// (training does; validation does not).
  bool drop_shard_remainder = false;
  /// Records of this rank's stream already consumed (`batches_trained * per_slot_batch_size`):
  /// the stream starts there, in whichever epoch that is.
  std::size_t start_offset = 0;
};

/// The records of a finished cache file, streamed with `CacheStreamOptions`. The order of epoch
/// `e` is a pure function of `(seed, e, rank, size)`, so the state is `{epoch, position}` and a
/// restore costs O(records) arithmetic, no I/O.
/// \code
/// DataLayer layer({.storage_path = "/tmp/caches", .seed = 7});
/// auto train = layer.cache_train_dataset("mnist", "1", true)(make_dataset).batch(32);
/// \endcode
template <Serializable E>
class CachedRecordsDataset : public DatasetBase<CachedRecordsDataset<E>> {
 public:
  using element_type = E;

  /// Throws `ConfigError` for a rank outside `[0, size)`.
  CachedRecordsDataset(std::shared_ptr<const detail::CacheReader> reader,
                       CacheStreamOptions options)
      : reader_(std::move(reader)), options_(options) {
    const auto& d = options_.distributed;
    if (d.size == 0 || d.rank >= d.size) {
      throw ConfigError("cached dataset: rank must be less than the distributed size " +
                        std::to_string(d.size) + " but is " + std::to_string(d.rank));
    }
    const std::size_t n = reader_->size();
    const std::size_t usable = options_.drop_shard_remainder ? n - n % d.size : n;
    per_rank_ = usable > d.rank ? (usable - d.rank + d.size - 1) / d.size : 0;
    if (per_rank_ > 0) {
      epoch_ = options_.start_offset / per_rank_;
      position_ = options_.start_offset % per_rank_;
    }
    build_order();
  }

  std::optional<element_type> next() {
    if (position_ >= per_rank_) return std::nullopt;
    return reader_->template read<E>(order_[position_++], buffer_);
  }
  void reset() {
    ++epoch_;
    position_ = 0;
    build_order();
  }
  nlohmann::json state() const {
    return {{"op", "cached_records"}, {"epoch", epoch_}, {"position", position_}};
  }
  void restore(const nlohmann::json& state) {
    const auto& s = detail::expect_state(state, "cached_records");
    epoch_ = s["epoch"];
    position_ = s["position"];
    build_order();
  }

  /// The number of records this rank reads per epoch.
  std::size_t size() const noexcept { return per_rank_; }
  /// The number of records in the cache.
  std::size_t records() const noexcept { return reader_->size(); }

 private:
  void build_order() {
    const std::size_t n = reader_->size();
    // The sampler's epoch permutation: the same order on every platform.
    const std::vector<std::size_t> keys = epoch_permutation(
        n, options_.seed, options_.skip_shuffle_at_epoch_end ? 0 : epoch_, options_.shuffle);
    order_.clear();
    order_.reserve(per_rank_);
    const auto& d = options_.distributed;
    for (std::size_t i = d.rank; order_.size() < per_rank_; i += d.size)
      order_.push_back(keys[i]);
  }

  std::shared_ptr<const detail::CacheReader> reader_;
  CacheStreamOptions options_;
  std::size_t per_rank_ = 0;
  std::uint64_t epoch_ = 0;
  std::size_t position_ = 0;
  std::vector<std::size_t> order_;
  std::vector<std::byte> buffer_;
};

/// What the data layer needs from the trial: where caches live, the trial seed, the rank, and
/// how far training got (for the start offset).
struct DataLayerOptions {
  /// The directory of the caches (Determined's `data_layer.container_storage_path`).
  std::filesystem::path storage_path;
  /// The trial seed: the shuffle seed of the cached streams.
  std::uint64_t seed = 0;
  DistributedContext distributed{};
  std::size_t per_slot_batch_size = 1;
  /// Batches each rank already trained on (Determined's `total_batches_processed`).
  std::size_t batches_trained = 0;
};

/// Determined's `context.experimental`: datasets cached on disk once, keyed by `(id, version)`,
/// then streamed per rank. The decorated function returns an unbatched dataset and is called
/// only when the cache does not exist yet; batch after caching, and do not `repeat` before it.
/// \code
/// DataLayer layer({.storage_path = "/data/cache", .seed = trial_seed,
///                  .distributed = {rank, size}, .per_slot_batch_size = 32,
///                  .batches_trained = steps_completed});
/// auto train = layer.cache_train_dataset("mnist", "v1", true)([&] {
///   return from_tensor_slices(images, labels);
/// }).batch(32);
/// \endcode
class DataLayer {
 public:
  explicit DataLayer(DataLayerOptions options) : options_(std::move(options)) {}

  /// The decorator returned by `cache_train_dataset` and `cache_validation_dataset`: call it with
  /// a function that makes the dataset.
  class Decorator {
   public:
    Decorator(std::filesystem::path path, CacheStreamOptions stream)
        : path_(std::move(path)), stream_(stream) {}

    template <class Make>
    requires std::invocable<Make&> && Dataset<std::invoke_result_t<Make&>>
    auto operator()(Make&& make) const {
      using E = element_t<std::invoke_result_t<Make&>>;
      return CachedRecordsDataset<E>(build<E>(make), stream_);
    }

    /// The cache file.
    const std::filesystem::path& path() const noexcept { return path_; }

   private:
    template <class E, class Make>
    std::shared_ptr<const detail::CacheReader> build(Make& make) const {
      std::error_code error;
      std::filesystem::create_directories(path_.parent_path(), error);
      if (error) {
        throw IoError("cache '" + path_.string() + "': cannot write the directory '" +
                      path_.parent_path().string() + "': " + error.message());
      }
      // Two processes asking at once: the second waits on the lock, then finds the file.
      detail::CacheLock lock(path_, true);
      if (!std::filesystem::exists(path_, error)) {
        auto dataset = make();
        detail::CacheWriter writer(path_);
        while (auto element = dataset.next())
          writer.append(*element);
        writer.finish();
      }
      return std::make_shared<const detail::CacheReader>(path_);
    }

    std::filesystem::path path_;
    CacheStreamOptions stream_;
  };

  /// Caches the training dataset as `(id, version + "_train")`, then streams it from
  /// `batches_trained * per_slot_batch_size` records on, shuffled with the trial seed (again
  /// each epoch unless `skip_shuffle_at_epoch_end`), sharded by rank with the remainder dropped.
  /// Throws `ConfigError` for an id or version that is not a plain name.
  Decorator cache_train_dataset(const std::string& dataset_id, const std::string& dataset_version,
                                bool shuffle = false,
                                bool skip_shuffle_at_epoch_end = false) const {
    CacheStreamOptions stream{
        .shuffle = shuffle,
        .skip_shuffle_at_epoch_end = skip_shuffle_at_epoch_end,
        .seed = options_.seed,
        .distributed = options_.distributed,
        .drop_shard_remainder = true,
        .start_offset = options_.batches_trained * options_.per_slot_batch_size};
    return Decorator(cache_path(dataset_id, dataset_version, "_train"), stream);
  }

  /// Caches the validation dataset as `(id, version + "_val")` and streams all of it, sharded by
  /// rank without dropping records, in the same order every time.
  Decorator cache_validation_dataset(const std::string& dataset_id,
                                     const std::string& dataset_version,
                                     bool shuffle = false) const {
    CacheStreamOptions stream{.shuffle = shuffle,
                              .skip_shuffle_at_epoch_end = true,
                              .seed = options_.seed,
                              .distributed = options_.distributed,
                              .drop_shard_remainder = false,
                              .start_offset = 0};
    return Decorator(cache_path(dataset_id, dataset_version, "_val"), stream);
  }

  const DataLayerOptions& options() const noexcept { return options_; }

 private:
  std::filesystem::path cache_path(const std::string& id, const std::string& version,
                                   const char* suffix) const {
    auto plain = [](const std::string& name) {
      return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
             name.find('\0') == std::string::npos;
    };
    if (!plain(id)) {
      throw ConfigError("data layer: dataset_id must be a non-empty name without '/' but is '" +
                        id + "'");
    }
    if (!plain(version)) {
      throw ConfigError(
          "data layer: dataset_version must be a non-empty name without '/' but is '" + version +
          "'");
    }
    return options_.storage_path / id / (version + suffix + ".ldscache");
  }

  DataLayerOptions options_;
};

}  // namespace loadstar
