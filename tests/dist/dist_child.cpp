// A data-parallel job that the driver (test_dist_jobs.cpp) starts under mpirun:
//   dist_child stream STEPS STATE_IN STATE_OUT LOG   trains STEPS global steps of the sample-id
//       stream from STATE_IN (if it exists), appends each global step's sample ids to LOG and
//       writes the position to STATE_OUT (rank 0);
//   dist_child kinds KIND STEPS STATE_IN STATE_OUT LOG   the same for a Sequence on threads
//       (sequence) or a Dataset sharded after its shuffle (dataset),
//       each step's ids in the order of the global stream;
//   dist_child throw|die FAILING_RANK                trains until step 3, where that rank throws
//       (and the job aborts naming it) or exits without a word.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <loadstar/data/dataset.hpp>
#include <loadstar/dist.hpp>
#include <loadstar/dist/mpi.hpp>
#include <loadstar/keras.hpp>
#include <nlohmann/json.hpp>

#include "dist/sample_stream.hpp"

using namespace loadstar;
using namespace loadstar::keras;

namespace {

/// Runs `steps` global steps of `it` from the position in `state_in` (if it exists), crossing
/// epochs, calling `step(batch, epoch)` for each; then rank 0 writes the position to `state_out`.
template <class Step>
void run_steps(dist::Collective& world, DataIterator& it, std::size_t steps,
               const std::string& state_in, const std::string& state_out, Step&& step) {
  std::size_t epoch = 0;
  if (std::filesystem::exists(state_in)) {
    std::ifstream in(state_in);
    const auto saved = nlohmann::json::parse(in);
    it.restore(saved.at("data"));
    epoch = saved.at("epoch").get<std::size_t>();
  }
  it.start_epoch(epoch);
  for (std::size_t s = 0; s < steps; ++s) {
    const auto* batch = it.next();
    if (batch == nullptr) {
      it.finish_epoch();
      it.start_epoch(++epoch);
      batch = it.next();
    }
    if (batch == nullptr) throw std::runtime_error("no batch at step " + std::to_string(s));
    step(*batch, epoch);
  }
  if (world.rank() == 0) {
    const nlohmann::json saved = {{"data", it.state()}, {"epoch", epoch}};
    std::ofstream(state_out + ".tmp") << saved.dump();
    std::filesystem::rename(state_out + ".tmp", state_out);
  }
}

int stream(dist::Collective& world, std::size_t steps, const std::string& state_in,
           const std::string& state_out, const std::string& log) {
  const auto ranks = static_cast<std::size_t>(world.size());
  const auto rank = static_cast<std::size_t>(world.rank());
  auto data = sample_stream::make();
  Sequential model({Input({1}), layers::Dense(1)});
  auto it = model.make_data_iterator(data.x, data.y,
                                     {.batch_size = sample_stream::global_batch / ranks,
                                      .shuffle = true,
                                      .seed = sample_stream::seed,
                                      .shard_rank = rank,
                                      .num_shards = ranks});
  std::ofstream out;
  if (rank == 0) out.open(log, std::ios::app);
  run_steps(world, it, steps, state_in, state_out, [&](const BatchView& batch, std::size_t epoch) {
    std::vector<double> seen(sample_stream::rows, 0.0);
    for (std::size_t i = 0; i < batch.count; ++i)
      seen[sample_stream::id_of(batch, i)] += 1.0;
    world.allreduce_sum(std::span<double>(seen));
    if (rank == 0) out << sample_stream::line(epoch, seen) << "\n";
  });
  return 0;
}

/// Batch `i` of the sample-id rows, 6 rows to a batch (the last of 1 row): a `Sequence` whose
/// stream is one of batches.
struct IdBatches {
  std::size_t size() const { return (sample_stream::rows + 5) / 6; }
  std::pair<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
    const std::size_t first = i * 6;
    const std::size_t count = std::min<std::size_t>(6, sample_stream::rows - first);
    Tensor<float> x({count, 1});
    for (std::size_t r = 0; r < count; ++r)
      x(r, 0) = static_cast<float>(first + r);
    return {x, Tensor<std::int64_t>({count}, std::int64_t{0})};
  }
};

/// The ids of the sample-id rows shuffled by a buffer and sharded after it, in batches of 2.
auto id_dataset(std::size_t rank, std::size_t ranks) {
  auto data = sample_stream::make();
  return wrap_dataset(from_tensor_slices(data.x, data.y).shuffle(32, sample_stream::seed),
                      {rank, ranks})
      .batch(2);
}

/// `kinds KIND STEPS STATE_IN STATE_OUT LOG`: like `stream`, for a `Sequence` on worker threads
/// (`sequence`) or a `Dataset` (`dataset`), and each step's line is
/// its ids in the order of the global stream: rank r's j-th row of a step at place `j * ranks +
/// r` (each rank reads its share round by round).
int kinds(dist::Collective& world, const std::string& kind, std::size_t steps,
          const std::string& state_in, const std::string& state_out, const std::string& log) {
  const auto ranks = static_cast<std::size_t>(world.size());
  const auto rank = static_cast<std::size_t>(world.rank());
  Sequential model({Input({1}), layers::Dense(1)});
  auto dataset = id_dataset(rank, ranks);
  auto it = kind == "dataset" ? model.make_data_iterator(dataset)
                              : model.make_data_iterator(IdBatches{}, {.shuffle = true,
                                                                       .workers = 3,
                                                                       .seed = sample_stream::seed,
                                                                       .shard_rank = rank,
                                                                       .num_shards = ranks});
  std::ofstream out;
  if (rank == 0) out.open(log, std::ios::app);
  run_steps(world, it, steps, state_in, state_out, [&](const BatchView& batch, std::size_t) {
    // For a Sequence each rank's batch is one element of the global stream: its ids go at place
    // `rank`, in order; for the Dataset each row is one.
    const std::size_t per_rank = kind == "dataset" ? 2 : 6;
    std::vector<double> ids(per_rank * ranks, 0.0);  // id + 1; 0: none
    const auto* x = static_cast<const float*>(batch.x.at(0).data);
    for (std::size_t j = 0; j < batch.count; ++j) {
      const std::size_t row = batch.rows.empty() ? batch.offset + j : batch.rows[j];
      const std::size_t place = kind == "dataset" ? j * ranks + rank : rank * per_rank + j;
      ids[place] = static_cast<double>(x[row]) + 1.0;
    }
    world.allreduce_sum(std::span<double>(ids));
    if (rank == 0) {
      out << "step:";
      for (const double id : ids) {
        if (id > 0.0) out << " " << static_cast<std::size_t>(id - 1.0);
      }
      out << "\n";
    }
  });
  return 0;
}

int fail(dist::Collective& world, bool die, int failing_rank) {
  const auto ranks = static_cast<std::size_t>(world.size());
  auto data = sample_stream::make();
  set_random_seed(3);
  Sequential model({Input({1}), layers::Dense(1)});
  model.compile({.optimizer = std::make_shared<dist::DistributedOptimizer>(
                     std::make_shared<optimizers::SGD>(), dist::mpi_world()),
                 .loss = "mse"});
  auto it = model.make_data_iterator(data.x, data.x,
                                     {.batch_size = sample_stream::global_batch / ranks,
                                      .shard_rank = static_cast<std::size_t>(world.rank()),
                                      .num_shards = ranks});
  it.start_epoch(0);
  for (int step = 0; step < 10; ++step) {
    if (step == 3 && world.rank() == failing_rank) {
      if (die) ::_exit(7);
      throw std::runtime_error("injected failure at step 3");
    }
    model.train_step(*it.next());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = dist::mpi_world(&argc, &argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  return dist::run_or_abort(*world, [&] {
    if (args.size() == 5 && args[0] == "stream") {
      return stream(*world, std::stoul(args[1]), args[2], args[3], args[4]);
    }
    if (args.size() == 6 && args[0] == "kinds") {
      return kinds(*world, args[1], std::stoul(args[2]), args[3], args[4], args[5]);
    }
    if (args.size() == 2 && (args[0] == "throw" || args[0] == "die")) {
      return fail(*world, args[0] == "die", std::stoi(args[1]));
    }
    std::cerr << "usage: dist_child stream STEPS STATE_IN STATE_OUT LOG | kinds KIND STEPS "
                 "STATE_IN STATE_OUT LOG | throw|die RANK\n";
    return 2;
  });
}
