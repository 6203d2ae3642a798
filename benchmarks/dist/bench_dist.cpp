// Data-parallel training throughput on Open MPI, for `benchmarks/run dist`: the small CNN of
// bench_keras (Conv2D 32, MaxPooling2D, Conv2D 64, MaxPooling2D, Flatten, Dense 128, Dense 10),
// Adam(1e-3) wrapped in a DistributedOptimizer, sparse categorical cross-entropy from logits, on
// synthetic 28x28 images sharded over the ranks, one compute thread per rank. Run under mpirun:
//
//   mpirun -np N bench_dist_train [--batch B] [--seconds S]
//
// B is the global batch (default 64; B / N rows per rank, so B must divide by N). After a
// broadcast of rank 0's state and a warm-up, every rank trains the same number of steps, chosen so
// that they take about S seconds (default 2), between two barriers; then an identical model
// trains half as many steps with its DistributedOptimizer over a one-process collective, so that
// the ranks compute exactly as before, at the same time, but sum nothing. Rank 0 prints one JSON
// object on stdout:
//
//   {"workload": "cnn", "ranks": N, "batch": B, "threads": 1, "value": samples/s, "unit":
//    "samples/s", "steps": ..., "step_ms": ..., "compute_ms": ..., "compute_cpu_ms": ...,
//    "allreduce_ms": ..., "sum_ms": ..., "gradient_floats": ...}
//
// value is global samples per second of the summing steps, step_ms their mean wall time, and
// compute_ms the mean wall time of the steps without the sum (compute_cpu_ms: the CPU time rank 0
// used in them, per step; below compute_ms when the ranks do not have a core each); allreduce_ms is
// the time rank 0 spends in the gradient sum per step (the wait for the slower rank included), and
// sum_ms the mean time of one sum of the gradients' size (gradient_floats floats) started by all
// ranks together after a barrier: the transport alone.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <loadstar/dist.hpp>
#include <loadstar/dist/mpi.hpp>
#include <loadstar/keras.hpp>
#include <nlohmann/json.hpp>

namespace {

using namespace loadstar;
using namespace loadstar::keras;
using namespace loadstar::keras::layers;
using Clock = std::chrono::steady_clock;

constexpr std::size_t steps_per_epoch = 20;
constexpr std::size_t warmup_steps = 5;
constexpr std::size_t min_steps = 10;
constexpr std::size_t sum_repeats = 20;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// The CPU seconds this process has used.
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

/// Another collective with the time spent in its sums counted.
class TimedCollective final : public dist::Collective {
 public:
  explicit TimedCollective(std::shared_ptr<dist::Collective> inner) : inner_(std::move(inner)) {}

  int rank() const noexcept override { return inner_->rank(); }
  int size() const noexcept override { return inner_->size(); }
  int local_rank() const noexcept override { return inner_->local_rank(); }
  int local_size() const noexcept override { return inner_->local_size(); }
  int cross_rank() const noexcept override { return inner_->cross_rank(); }
  void allreduce_sum(std::span<float> values) override {
    const auto start = Clock::now();
    inner_->allreduce_sum(values);
    seconds_ += seconds_since(start);
  }
  void allreduce_sum(std::span<double> values) override {
    const auto start = Clock::now();
    inner_->allreduce_sum(values);
    seconds_ += seconds_since(start);
  }
  void broadcast(std::span<std::byte> bytes, int root = 0) override {
    inner_->broadcast(bytes, root);
  }
  std::vector<std::uint64_t> allgather(std::uint64_t value) override {
    return inner_->allgather(value);
  }
  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(std::string_view message, int code = 1) override {
    inner_->abort(message, code);
    std::abort();  // not reached: Collective::abort does not return
  }

  /// The seconds spent in `allreduce_sum` since the last `reset`.
  double seconds() const noexcept { return seconds_; }
  void reset() noexcept { seconds_ = 0.0; }

 private:
  std::shared_ptr<dist::Collective> inner_;
  double seconds_ = 0.0;
};

std::unique_ptr<Model> make_cnn(std::shared_ptr<dist::Collective> collective) {
  set_random_seed(1);
  auto model = std::make_unique<Sequential>(std::initializer_list<SequentialItem>{
      Input({28, 28}), Reshape({28, 28, 1}), Conv2D(32, 3, {.activation = "relu"}), MaxPooling2D(),
      Conv2D(64, 3, {.activation = "relu"}), MaxPooling2D(), Flatten(),
      Dense(128, {.activation = "relu"}), Dense(10)});
  model->compile(
      {.optimizer = std::make_shared<dist::DistributedOptimizer>(
           std::make_shared<optimizers::Adam>(optimizers::AdamOptions{.learning_rate = 1e-3}),
           std::move(collective)),
       .loss = losses::SparseCategoricalCrossentropy(true),
       .threads = 1});
  return model;
}

/// Trains `steps` steps of this rank's shard, starting new epochs as they end.
void train(Model& model, DataIterator& data, std::size_t& epoch, std::size_t steps) {
  for (std::size_t s = 0; s < steps; ++s) {
    const auto* batch = data.next();
    if (batch == nullptr) {
      data.finish_epoch();
      data.start_epoch(++epoch);
      batch = data.next();
    }
    if (batch == nullptr) throw std::runtime_error("an epoch without a batch");
    model.train_step(*batch);
  }
}

struct Arguments {
  std::size_t batch = 64;
  double seconds = 2.0;
};

Arguments parse(const std::vector<std::string>& args) {
  Arguments out;
  for (std::size_t i = 0; i < args.size(); i += 2) {
    if (i + 1 >= args.size() || (args[i] != "--batch" && args[i] != "--seconds")) {
      throw std::invalid_argument("usage: bench_dist_train [--batch B] [--seconds S]");
    }
    std::size_t used = 0;
    try {
      if (args[i] == "--batch") {
        out.batch = std::stoul(args[i + 1], &used);
      } else {
        out.seconds = std::stod(args[i + 1], &used);
      }
    } catch (const std::logic_error&) {
      used = 0;
    }
    if (used != args[i + 1].size() || used == 0) {
      throw std::invalid_argument(args[i] + " takes a number, not '" + args[i + 1] + "'");
    }
  }
  if (out.batch == 0 || !(out.seconds > 0.0)) {
    throw std::invalid_argument("--batch and --seconds must be positive");
  }
  return out;
}

int run(const std::shared_ptr<dist::MpiCollective>& world, const Arguments& args) {
  const auto ranks = static_cast<std::size_t>(world->size());
  const auto rank = static_cast<std::size_t>(world->rank());
  if (args.batch % ranks != 0) {
    throw std::invalid_argument("the global batch " + std::to_string(args.batch) +
                                " does not divide by " + std::to_string(ranks) + " ranks");
  }
  const std::size_t per_rank = args.batch / ranks;
  const std::size_t rows = args.batch * steps_per_epoch;
  Tensor<float> x({rows, 28, 28});
  Tensor<std::int64_t> y({rows});
  std::uint64_t seed = 7;
  for (auto& v : x) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    v = static_cast<float>(seed >> 40) / static_cast<float>(1ULL << 24);  // [0, 1)
  }
  for (std::size_t i = 0; i < rows; ++i)
    y(i) = static_cast<std::int64_t>(i % 10);
  const FitOptions shard{
      .batch_size = per_rank, .shuffle = true, .seed = 7, .shard_rank = rank, .num_shards = ranks};

  // The summing steps: warm-up, then a step count every rank agrees on (the slowest rank's
  // warm-up decides), timed between barriers.
  auto timed = std::make_shared<TimedCollective>(world);
  auto model = make_cnn(timed);
  dist::broadcast_state(*model, *world);
  auto data = model->make_data_iterator(x, y, shard);
  std::size_t epoch = 0;
  data.start_epoch(epoch);
  train(*model, data, epoch, 1);  // buffers allocated, the fusion layout planned
  world->barrier();
  auto start = Clock::now();
  train(*model, data, epoch, warmup_steps);
  const auto warmup_us = static_cast<std::uint64_t>(seconds_since(start) * 1e6);
  std::uint64_t slowest_us = 1;
  for (const auto us : world->allgather(warmup_us))
    slowest_us = std::max(slowest_us, us);
  const double per_step = static_cast<double>(slowest_us) * 1e-6 / warmup_steps;
  const auto steps = std::max(min_steps, static_cast<std::size_t>(args.seconds / per_step));
  world->barrier();
  timed->reset();
  start = Clock::now();
  train(*model, data, epoch, steps);
  world->barrier();
  const double summing = seconds_since(start);
  const double in_sum = timed->seconds();

  // The same steps without the sum: each rank alone, all ranks at once.
  auto alone = make_cnn(std::make_shared<dist::LocalCollective>());
  auto alone_data = alone->make_data_iterator(x, y, shard);
  std::size_t alone_epoch = 0;
  alone_data.start_epoch(alone_epoch);
  train(*alone, alone_data, alone_epoch, 1 + warmup_steps);
  const std::size_t alone_steps = std::max(min_steps, steps / 2);
  world->barrier();
  start = Clock::now();
  const double cpu_start = cpu_seconds();
  train(*alone, alone_data, alone_epoch, alone_steps);
  const double computing_cpu = cpu_seconds() - cpu_start;
  world->barrier();
  const double computing = seconds_since(start);

  // The sum alone, of the gradients' size, with the ranks arriving together: what the transport
  // costs without the wait for a slower rank.
  std::size_t floats = 1;  // the rows ride with the gradients
  for (const auto* v : model->trainable_variables())
    floats += v->gradient.size();
  std::vector<float> gradients(floats, 1.0F);
  for (std::size_t k = 0; k < warmup_steps; ++k)
    world->allreduce_sum(std::span<float>(gradients));
  double in_step = 0.0;
  for (std::size_t k = 0; k < sum_repeats; ++k) {
    world->barrier();
    start = Clock::now();
    world->allreduce_sum(std::span<float>(gradients));
    in_step += seconds_since(start);
  }

  if (rank == 0) {
    const nlohmann::json record = {
        {"workload", "cnn"},
        {"ranks", ranks},
        {"batch", args.batch},
        {"threads", 1},
        {"value", static_cast<double>(steps * args.batch) / summing},
        {"unit", "samples/s"},
        {"steps", steps},
        {"step_ms", summing * 1e3 / static_cast<double>(steps)},
        {"compute_ms", computing * 1e3 / static_cast<double>(alone_steps)},
        {"compute_cpu_ms", computing_cpu * 1e3 / static_cast<double>(alone_steps)},
        {"allreduce_ms", in_sum * 1e3 / static_cast<double>(steps)},
        {"sum_ms", in_step * 1e3 / static_cast<double>(sum_repeats)},
        {"gradient_floats", floats - 1}};
    std::cout << record.dump() << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto world = dist::mpi_world(&argc, &argv);
  const std::vector<std::string> args(argv + 1, argv + argc);
  return dist::run_or_abort(*world, [&] { return run(world, parse(args)); });
}
