/// \file
/// `wrap_dataset`: a dataset sharded by rank when training is distributed, as Determined does.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/dataset/shard.hpp"
#include "loadstar/error.hpp"

namespace loadstar {

/// The place of this process in data-parallel training: `rank` in `[0, size)`. One process is
/// `{0, 1}`.
struct DistributedContext {
  std::size_t rank = 0;
  std::size_t size = 1;
};

/// Determined's `context.wrap_dataset(dataset, shard_dataset=True)`: with `size > 1` and
/// `shard_dataset`, the dataset sharded as `dataset.shard(size, rank)`, so the ranks partition
/// every epoch; otherwise the dataset itself (a shard of one, which passes every element
/// through). Throws `ConfigError` for a rank outside `[0, size)`.
///
/// Where it is applied decides what a checkpoint can resume on (`ShardDataset`): wrapped before a
/// `shuffle` (tf.data's advice: each rank shuffles its own share), the job resumes exactly on the
/// same number of ranks only; wrapped after the stages that hold elements (`shuffle`, a parallel
/// `map`, `interleave`, `cache`), on any number.
/// \code
/// // Any number of ranks on resume: the cheap shuffle of indices is global, the decoding is not.
/// auto train = wrap_dataset(from_tensor_slices(x, y).shuffle(1000, seed),
///                           DistributedContext{rank, size})
///                  .batch(32);
/// \endcode
template <Dataset D>
ShardDataset<D> wrap_dataset(D dataset, const DistributedContext& context,
                             bool shard_dataset = true) {
  if (context.size == 0)
    throw ConfigError("wrap_dataset: distributed size must be positive but is 0");
  if (context.rank >= context.size) {
    throw ConfigError("wrap_dataset: rank must be less than the distributed size " +
                      std::to_string(context.size) + " but is " + std::to_string(context.rank));
  }
  if (!shard_dataset || context.size == 1) return ShardDataset<D>(std::move(dataset), 1, 0);
  return ShardDataset<D>(std::move(dataset), context.size, context.rank);
}

}  // namespace loadstar
