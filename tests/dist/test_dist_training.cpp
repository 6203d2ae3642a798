// Data-parallel training under `mpirun -np N`: N ranks at global batch G take the steps one
// process takes at batch G (within float tolerance), the weights stay bitwise equal on every rank
// and bitwise equal run to run, local aggregation matches a larger batch, and a validation
// sharded over the ranks gives the metrics of one process (exactly for counts; the loss up to the
// rounding of each batch's mean).
#include <doctest/doctest.h>

#include "keras/blobs.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <loadstar/dist.hpp>
#include <loadstar/dist/mpi.hpp>
#include <loadstar/keras.hpp>

using namespace loadstar;
using namespace loadstar::keras;

namespace {

constexpr std::size_t global_batch = 12;  // divisible by 1, 2 and 3 ranks

std::shared_ptr<Model> mlp(OptimizerArg optimizer) {
  set_random_seed(5);
  auto model = std::make_shared<Sequential>(std::initializer_list<SequentialItem>{
      Input({2}), layers::Dense(16, {.activation = "relu"}), layers::Dense(2)});
  model->compile({.optimizer = std::move(optimizer),
                  .loss = losses::SparseCategoricalCrossentropy(true),
                  .metrics = {"accuracy"}});
  return model;
}

/// Trains `steps` global steps on `data` (each rank its shard) and returns the weights.
std::vector<Tensor<float>> train(Model& model, const Blobs& data, std::size_t batch,
                                 std::size_t rank, std::size_t ranks, std::size_t steps) {
  auto stream = model.make_data_iterator(
      data.x, data.y,
      {.batch_size = batch, .shuffle = true, .seed = 42, .shard_rank = rank, .num_shards = ranks});
  std::size_t epoch = 0;
  stream.start_epoch(epoch);
  for (std::size_t s = 0; s < steps; ++s) {
    const auto* b = stream.next();
    if (!b) {
      stream.finish_epoch();
      stream.start_epoch(++epoch);
      b = stream.next();
    }
    REQUIRE(b != nullptr);
    model.train_step(*b);
  }
  return model.get_weights();
}

std::uint64_t hash_of(const std::vector<Tensor<float>>& weights) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const auto& w : weights) {
    const auto* bytes = reinterpret_cast<const unsigned char*>(w.data());
    for (std::size_t i = 0; i < w.size() * sizeof(float); ++i) {
      h ^= bytes[i];
      h *= 1099511628211ULL;
    }
  }
  return h;
}

void check_close(const std::vector<Tensor<float>>& a, const std::vector<Tensor<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j) {
      const double d = std::abs(static_cast<double>(a[i].data()[j]) - b[i].data()[j]);
      worst = std::max(worst, d / (1.0 + std::abs(static_cast<double>(b[i].data()[j]))));
    }
  }
  CHECK(worst < 2e-5);
}

}  // namespace

TEST_CASE("N ranks at global batch G train as one process at batch G") {
  auto world = dist::mpi_world();
  const auto rank = static_cast<std::size_t>(world->rank());
  const auto ranks = static_cast<std::size_t>(world->size());
  // 125 rows: the last global batch of an epoch has 5 rows; 121: it has 1, fewer than the ranks.
  for (const std::size_t rows : {std::size_t{125}, std::size_t{121}}) {
    CAPTURE(rows);
    const Blobs data = blobs(rows);
    const std::size_t steps = 3 * ((rows + global_batch - 1) / global_batch);  // three epochs

    auto single = mlp(optimizers::Adam({.learning_rate = 0.01}));
    const auto expected = train(*single, data, global_batch, 0, 1, steps);

    auto run = [&] {
      auto model = mlp(std::make_shared<dist::DistributedOptimizer>(
          std::make_shared<optimizers::Adam>(optimizers::AdamOptions{.learning_rate = 0.01}),
          world));
      dist::broadcast_state(*model, *world);
      return train(*model, data, global_batch / ranks, rank, ranks, steps);
    };
    const auto first = run();
    check_close(first, expected);
    // Every rank holds the same weights, bit for bit, and a second run gives the same bits.
    world->require_same(hash_of(first), "the weights' hash");
    CHECK(hash_of(run()) == hash_of(first));
  }
}

TEST_CASE("aggregation_frequency sums two batches per step as one batch of twice the rows") {
  auto world = dist::mpi_world();
  const auto rank = static_cast<std::size_t>(world->rank());
  const auto ranks = static_cast<std::size_t>(world->size());
  const Blobs data = blobs(120);  // 120 = 5 steps of 24: no partial batch
  auto single = mlp(optimizers::SGD({.learning_rate = 0.1}));
  const auto expected = train(*single, data, 2 * global_batch, 0, 1, 10);

  auto model = mlp(std::make_shared<dist::DistributedOptimizer>(
      std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = 0.1}), world,
      dist::DistributedOptions{.aggregation_frequency = 2}));
  dist::broadcast_state(*model, *world);
  const auto weights = train(*model, data, global_batch / ranks, rank, ranks, 20);
  check_close(weights, expected);
  CHECK(model->optimizer().iterations() == 20);
}

TEST_CASE("average_aggregated_gradients false steps on the sum of the aggregated batches") {
  auto world = dist::mpi_world();
  const auto rank = static_cast<std::size_t>(world->rank());
  const auto ranks = static_cast<std::size_t>(world->size());
  const Blobs data = blobs(120);
  // The sum of two batches' mean gradients is twice the mean over both: the step of twice the
  // learning rate on one batch of twice the rows.
  auto single = mlp(optimizers::SGD({.learning_rate = 0.2}));
  const auto expected = train(*single, data, 2 * global_batch, 0, 1, 10);

  auto model = mlp(std::make_shared<dist::DistributedOptimizer>(
      std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = 0.1}), world,
      dist::DistributedOptions{.aggregation_frequency = 2, .average_aggregated_gradients = false}));
  dist::broadcast_state(*model, *world);
  const auto weights = train(*model, data, global_batch / ranks, rank, ranks, 20);
  check_close(weights, expected);
}

TEST_CASE("a fusion threshold below the gradients' size cuts them into several sums") {
  auto world = dist::mpi_world();
  const auto rank = static_cast<std::size_t>(world->rank());
  const auto ranks = static_cast<std::size_t>(world->size());
  const Blobs data = blobs(96);
  auto whole = mlp(std::make_shared<dist::DistributedOptimizer>(
      std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = 0.1}), world));
  auto pieces = mlp(std::make_shared<dist::DistributedOptimizer>(
      std::make_shared<optimizers::SGD>(optimizers::SGDOptions{.learning_rate = 0.1}), world,
      dist::DistributedOptions{.fusion_threshold_bytes = 40}));
  const auto a = train(*whole, data, global_batch / ranks, rank, ranks, 8);
  const auto b = train(*pieces, data, global_batch / ranks, rank, ranks, 8);
  CHECK(hash_of(a) == hash_of(b));
  const auto& optimizer = dynamic_cast<const dist::DistributedOptimizer&>(pieces->optimizer());
  CHECK(optimizer.collectives_per_step() > 1);
  CHECK(
      dynamic_cast<const dist::DistributedOptimizer&>(whole->optimizer()).collectives_per_step() ==
      1);
}

TEST_CASE("broadcast_state gives every rank rank 0's weights, slots and iterations") {
  auto world = dist::mpi_world();
  set_random_seed(static_cast<std::uint64_t>(100 + world->rank()));  // different on each rank
  auto model = std::make_shared<Sequential>(
      std::initializer_list<SequentialItem>{Input({2}), layers::Dense(4), layers::Dense(2)});
  model->compile({.optimizer = optimizers::Adam(), .loss = "mse"});
  model->optimizer().set_iterations(7 + world->rank());
  dist::broadcast_state(*model, *world);
  world->require_same(hash_of(model->get_weights()), "the weights' hash");
  CHECK(model->optimizer().iterations() == 7);
  CHECK(model->optimizer().built());
}

TEST_CASE("a validation sharded over the ranks merges into one process's exact metrics") {
  auto world = dist::mpi_world();
  const Blobs data = blobs(101);
  auto model = mlp(optimizers::Adam({.learning_rate = 0.01}));
  train(*model, data, 16, 0, 1, 5);  // the same on every rank: no collective involved
  const Logs expected = model->evaluate(data.x, data.y, {.batch_size = 7, .verbose = 0});
  model->evaluate(data.x, data.y,
                  {.batch_size = 7,
                   .verbose = 0,
                   .shard_rank = static_cast<std::size_t>(world->rank()),
                   .num_shards = static_cast<std::size_t>(world->size())});
  const Logs merged = dist::merged_logs(*model, model->evaluation_metrics(), *world);
  CHECK(merged.get("loss").value() == doctest::Approx(expected.get("loss").value()).epsilon(1e-6));
  CHECK(merged.get("accuracy").value() == expected.get("accuracy").value());
}

TEST_CASE("a distributed optimizer refuses what it cannot wrap") {
  auto world = dist::mpi_world();
  CHECK_THROWS_WITH_AS(dist::DistributedOptimizer(nullptr, world),
                       "distributed optimizer: the wrapped optimizer is null",
                       loadstar::ConfigError);
  auto inner =
      std::make_shared<dist::DistributedOptimizer>(std::make_shared<optimizers::SGD>(), world);
  CHECK_THROWS_WITH_AS(dist::DistributedOptimizer(inner, world),
                       doctest::Contains("is already distributed"), loadstar::ConfigError);
  CHECK_THROWS_WITH_AS(dist::DistributedOptimizer(std::make_shared<optimizers::SGD>(), world,
                                                  {.aggregation_frequency = 0}),
                       "distributed optimizer: aggregation_frequency must be at least 1 but is 0",
                       loadstar::ConfigError);
}
