// Whole mpirun jobs, started from this (non-MPI) test: elastic resume of the sample stream and of
// a trial across 2 -> 3 -> 1 ranks, exact resume of a trial, a rank that throws or dies ending the
// job on every rank; and the loader process that serves a rank's worker-process batches.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dist/sample_stream.hpp"
#include "loadstar/dist.hpp"
#include "loadstar/trial/detail/loader_process.hpp"
#include "temp_dir.hpp"

using namespace loadstar;
using test_support::TempDir;

namespace {

struct Job {
  int status = -1;
  std::string output;
  double seconds = 0.0;
};

/// Runs `mpirun -np N CHILD ARGS...` with a time limit, capturing both streams; the child program
/// is the one the environment variable `child_variable` names.
Job run_job(int ranks, const std::string& args,
            const char* child_variable = "LOADSTAR_DIST_CHILD") {
  const char* mpirun = std::getenv("LOADSTAR_MPIRUN");
  const char* child = std::getenv(child_variable);
  REQUIRE_MESSAGE(mpirun != nullptr, "LOADSTAR_MPIRUN names mpirun (set by meson test)");
  REQUIRE_MESSAGE(child != nullptr, child_variable << " names the child (set by meson test)");
  const std::string command = std::string("timeout 120 ") + mpirun +
                              " --bind-to none --oversubscribe -np " + std::to_string(ranks) + " " +
                              child + " " + args + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  Job job;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe))
    job.output += buffer;
  const int raw = ::pclose(pipe);
  job.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return job;
}

std::vector<std::string> lines_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

/// The stream one process reads at the global batch: one line per step.
std::vector<std::string> one_process_stream(std::size_t steps) {
  auto data = sample_stream::make();
  keras::Sequential model({keras::Input({1}), keras::layers::Dense(1)});
  auto it = model.make_data_iterator(
      data.x, data.y,
      {.batch_size = sample_stream::global_batch, .shuffle = true, .seed = sample_stream::seed});
  std::vector<std::string> out;
  std::size_t epoch = 0;
  it.start_epoch(epoch);
  while (out.size() < steps) {
    const auto* batch = it.next();
    if (batch == nullptr) {
      it.finish_epoch();
      it.start_epoch(++epoch);
      continue;
    }
    std::vector<double> seen(sample_stream::rows, 0.0);
    for (std::size_t i = 0; i < batch->count; ++i)
      seen[sample_stream::id_of(*batch, i)] += 1.0;
    out.push_back(sample_stream::line(epoch, seen));
  }
  return out;
}

}  // namespace

TEST_CASE("a position saved with 2 ranks resumes with 3, then 1, on the same global stream") {
  const TempDir dir;
  const auto state1 = (dir.path() / "after2.json").string();
  const auto state2 = (dir.path() / "after3.json").string();
  const auto state3 = (dir.path() / "after1.json").string();
  const auto log = (dir.path() / "ids.log").string();
  // 18 steps of 6 rows cross the first epoch's end (103 rows: 18 steps, the last of 1 row).
  const Job a = run_job(2, "stream 13 none " + state1 + " " + log);
  REQUIRE_MESSAGE(a.status == 0, a.output);
  const Job b = run_job(3, "stream 11 " + state1 + " " + state2 + " " + log);
  REQUIRE_MESSAGE(b.status == 0, b.output);
  const Job c = run_job(1, "stream 12 " + state2 + " " + state3 + " " + log);
  REQUIRE_MESSAGE(c.status == 0, c.output);

  const auto got = lines_of(log);
  const auto expected = one_process_stream(36);
  REQUIRE(got.size() == expected.size());
  for (std::size_t s = 0; s < got.size(); ++s) {
    CAPTURE(s);
    CHECK(got[s] == expected[s]);
  }
  // Within each epoch, every sample exactly once: the lines of epoch 0 hold ids 0..102 once.
  std::multiset<std::size_t> epoch0;
  for (const auto& line : got) {
    if (line.rfind("0:", 0) != 0) continue;
    std::istringstream in(line.substr(2));
    for (std::size_t id; in >> id;)
      epoch0.insert(id);
  }
  CHECK(epoch0.size() == sample_stream::rows);
  for (std::size_t id = 0; id < sample_stream::rows; ++id)
    CHECK(epoch0.count(id) == 1);
}

namespace {

/// The ids of every line of a `kinds` log, in order.
std::vector<std::size_t> ids_of(const std::vector<std::string>& lines) {
  std::vector<std::size_t> out;
  for (const auto& line : lines) {
    std::istringstream in(line.substr(line.find(':') + 1));
    for (std::size_t id; in >> id;)
      out.push_back(id);
  }
  return out;
}

}  // namespace

TEST_CASE("every loader kind resumes on 3 ranks, then 1, from a state saved on 2") {
  // (A rank forks no worker process after MPI_Init; a trial's loader process does, before it,
  // and reads the same sampler stream: test_sequence_adapter_processes.cpp resumes it elastically.)
  for (const std::string kind : {"sequence", "dataset"}) {
    CAPTURE(kind);
    const TempDir dir;
    const auto path = [&](const char* name) { return (dir.path() / name).string(); };
    const std::string args = "kinds " + kind + " ";
    // Steps of 2, 3 and 1 ranks: 13 * 2 + 11 * 3 + 12 = 71 batches of the Sequence (crossing
    // its epoch of 18), and 2 rows a batch of the Dataset: 142 rows (crossing its epoch of 103).
    const Job a = run_job(2, args + "13 none " + path("s2") + " " + path("elastic.log"));
    REQUIRE_MESSAGE(a.status == 0, a.output);
    const Job b =
        run_job(3, args + "11 " + path("s2") + " " + path("s3") + " " + path("elastic.log"));
    REQUIRE_MESSAGE(b.status == 0, b.output);
    const Job c =
        run_job(1, args + "12 " + path("s3") + " " + path("s1") + " " + path("elastic.log"));
    REQUIRE_MESSAGE(c.status == 0, c.output);
    // One process, uninterrupted, over as many batches.
    const std::size_t batches = kind == "dataset" ? 80 : 71;
    const Job one =
        run_job(1, args + std::to_string(batches) + " none " + path("one") + " " + path("one.log"));
    REQUIRE_MESSAGE(one.status == 0, one.output);
    const auto got = ids_of(lines_of(path("elastic.log")));
    auto expected = ids_of(lines_of(path("one.log")));
    CHECK(got.size() <= expected.size());
    expected.resize(std::min(expected.size(), got.size()));
    CHECK(got == expected);
    // Within the first epoch every sample once.
    std::set<std::size_t> first(
        got.begin(), got.begin() + static_cast<std::ptrdiff_t>(
                                       std::min<std::size_t>(got.size(), sample_stream::rows)));
    CHECK(first.size() == std::min<std::size_t>(got.size(), sample_stream::rows));
  }
}

TEST_CASE("a rank that throws ends the job on every rank, naming the rank and the error") {
  const Job job = run_job(2, "throw 1");
  CHECK(job.status != 0);
  CHECK_MESSAGE(job.output.find("rank 1 of 2: injected failure at step 3") != std::string::npos,
                job.output);
  CHECK(job.seconds < 60.0);
}

TEST_CASE("a rank that dies ends the job on every rank") {
  const Job job = run_job(3, "die 2");
  CHECK(job.status != 0);
  CHECK(job.seconds < 60.0);
  INFO(job.output);
  // Open MPI names the process that failed and its exit code.
  CHECK(job.output.find("Exit code:    7") != std::string::npos);
}

namespace {

/// The weights the trial child printed (the last line of its output) after `batches` batches.
/// The largest difference between two models' weights (of the same shapes).
double max_difference(const std::vector<std::vector<float>>& a,
                      const std::vector<std::vector<float>>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(a[i].size() == b[i].size());
    for (std::size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(a[i][j] - b[i][j])));
  }
  return worst;
}

std::vector<std::vector<float>> trial_weights(const Job& job, std::uint64_t batches) {
  REQUIRE_MESSAGE(job.status == 0, job.output);
  const auto start = job.output.rfind("{\"batches\"");
  REQUIRE_MESSAGE(start != std::string::npos, job.output);
  const auto line =
      nlohmann::json::parse(job.output.substr(start, job.output.find('\n', start) - start));
  CHECK(line.at("batches").get<std::uint64_t>() == batches);
  return line.at("weights").get<std::vector<std::vector<float>>>();
}

Job run_trial_job(int ranks, const std::filesystem::path& dir, std::uint64_t batches,
                  const std::string& kind = "blobs") {
  return run_job(ranks, dir.string() + " " + std::to_string(batches) + " " + kind,
                 "LOADSTAR_DIST_TRIAL_CHILD");
}

}  // namespace

TEST_CASE("a data-parallel trial resumes exactly, and with another number of ranks closely") {
  const TempDir dir;
  const auto whole = trial_weights(run_trial_job(2, dir / "whole", 60), 60);

  // The same 2 ranks, stopped at 25 batches (a pre-close checkpoint) and resumed: bit for bit.
  trial_weights(run_trial_job(2, dir / "resumed", 25), 25);
  const auto resumed = trial_weights(run_trial_job(2, dir / "resumed", 60), 60);
  CHECK(resumed == whole);

  // 2 ranks, then 3, then 1, on the same global batch of 12: the same samples in every step,
  // summed in another order, so equal within rounding.
  trial_weights(run_trial_job(2, dir / "elastic", 20), 20);
  trial_weights(run_trial_job(3, dir / "elastic", 40), 40);
  const auto elastic = trial_weights(run_trial_job(1, dir / "elastic", 60), 60);
  CHECK(max_difference(elastic, whole) < 1e-4);
}

TEST_CASE("a data-parallel trial on a Sequence resumes exactly, and on other numbers of ranks") {
  const TempDir dir;
  const auto whole = trial_weights(run_trial_job(2, dir / "whole", 60, "sequence"), 60);
  trial_weights(run_trial_job(2, dir / "resumed", 25, "sequence"), 25);
  CHECK(trial_weights(run_trial_job(2, dir / "resumed", 60, "sequence"), 60) == whole);
  // A step of 3 ranks holds 3 batches of the global stream instead of 2, so the weights follow
  // another run; the batches read are checked by the 'kinds' jobs above.
  trial_weights(run_trial_job(2, dir / "elastic", 20, "sequence"), 20);
  trial_weights(run_trial_job(3, dir / "elastic", 40, "sequence"), 40);
  CHECK(trial_weights(run_trial_job(1, dir / "elastic", 60, "sequence"), 60).size() ==
        whole.size());
}

namespace {

/// Ten batches whose only value is their index.
struct Indexed {
  std::size_t size() const { return 10; }
  std::tuple<Tensor<float>, Tensor<std::int64_t>> operator[](std::size_t i) const {
    Tensor<float> x({2, 1});
    x(0, 0) = static_cast<float>(i);
    x(1, 0) = static_cast<float>(i) + 0.5F;
    Tensor<std::int64_t> y({2});
    y(0) = static_cast<std::int64_t>(i);
    y(1) = static_cast<std::int64_t>(i);
    return {x, y};
  }
};

keras::DataIterator indexed_iterator() {
  keras::Sequential reader;
  return reader.make_data_iterator(
      Indexed{}, {.shuffle = true, .workers = 2, .use_multiprocessing = true, .seed = 5});
}

/// The first value of each of the next `n` batches (crossing into the next epoch).
std::vector<float> take(keras::DataIterator& it, std::size_t& epoch, std::size_t n) {
  std::vector<float> out;
  while (out.size() < n) {
    const auto* b = it.next();
    if (b == nullptr) {
      it.finish_epoch();
      it.start_epoch(++epoch);
      continue;
    }
    REQUIRE(b->count == 2);
    out.push_back(static_cast<const float*>(b->x.at(0).data)[0]);
    CHECK(static_cast<const float*>(b->x.at(0).data)[1] == out.back() + 0.5F);
  }
  return out;
}

}  // namespace

TEST_CASE("a loader process serves a Sequence read by worker processes, and resumes from a state") {
  // Both loader processes are forked first, from this process while it runs no other thread.
  auto process = trial::detail::LoaderProcess::start([] { return indexed_iterator(); });
  auto second = trial::detail::LoaderProcess::start([] { return indexed_iterator(); });
  REQUIRE(process != nullptr);
  REQUIRE(second != nullptr);
  auto local = indexed_iterator();
  keras::DataIterator remote(std::make_unique<trial::detail::RemoteSource>(process));
  CHECK(remote.steps() == local.steps());
  std::size_t e_local = 0, e_remote = 0;
  local.start_epoch(0);
  remote.start_epoch(0);
  CHECK(take(remote, e_remote, 14) == take(local, e_local, 14));
  const nlohmann::json saved = remote.state();

  // Another loader process continues from the state.
  keras::DataIterator resumed(std::make_unique<trial::detail::RemoteSource>(second));
  resumed.restore(saved);
  std::size_t e_resumed = e_remote;
  resumed.start_epoch(e_resumed);
  CHECK(take(resumed, e_resumed, 9) == take(local, e_local, 9));

  // A loader that builds nothing (its loader forks no process) gives no process.
  CHECK(trial::detail::LoaderProcess::start([] { return std::optional<keras::DataIterator>(); }) ==
        nullptr);
  // A loader process that dies is a WorkerError naming it.
  ::kill(second->pid(), SIGKILL);
  CHECK_THROWS_WITH_AS(take(resumed, e_resumed, 1),
                       doctest::Contains("training data loader process"), WorkerError);
}

TEST_CASE("a Dataset loader runs on several ranks once wrap_dataset shards it") {
  const TempDir dir;
  const auto whole = trial_weights(run_trial_job(2, dir / "wrapped", 40, "dataset"), 40);
  // Resumed on the same 2 ranks: bit for bit.
  trial_weights(run_trial_job(2, dir / "resumed", 15, "dataset"), 15);
  CHECK(trial_weights(run_trial_job(2, dir / "resumed", 40, "dataset"), 40) == whole);
  // Sharded after its repeat, the Dataset's global stream is the same on any number of ranks: 2
  // ranks, then 3, then 1 train on the same rows in every step.
  trial_weights(run_trial_job(2, dir / "elastic", 20, "dataset"), 20);
  trial_weights(run_trial_job(3, dir / "elastic", 30, "dataset"), 30);
  const auto elastic = trial_weights(run_trial_job(1, dir / "elastic", 40, "dataset"), 40);
  CHECK(max_difference(elastic, whole) < 1e-4);
  const Job unwrapped = run_trial_job(2, dir / "unwrapped", 20, "dataset-unwrapped");
  CHECK(unwrapped.status != 0);
  CHECK_MESSAGE(
      unwrapped.output.find("each Dataset loader in a trial of 2 ranks must be sharded, with "
                            "context.wrap_dataset(dataset) before batching or by "
                            "context.experimental's cache, but of its 2 Dataset loaders 0 "
                            "are") != std::string::npos,
      unwrapped.output);
}

TEST_CASE("a data-parallel trial on the data layer's cache builds it once and resumes exactly") {
  const TempDir dir;
  const auto whole = trial_weights(run_trial_job(2, dir / "whole", 40, "cached"), 40);
  // Both ranks asked for the cache at once: one of them built it.
  CHECK(lines_of(dir / "whole" / "maker_calls").size() == 1);
  trial_weights(run_trial_job(2, dir / "resumed", 15, "cached"), 15);
  CHECK(trial_weights(run_trial_job(2, dir / "resumed", 40, "cached"), 40) == whole);
  // The resumed job found the cache its first run built.
  CHECK(lines_of(dir / "resumed" / "maker_calls").size() == 1);
}

TEST_CASE("a data-parallel trial that throws InvalidHP ends the job, recorded invalid") {
  const TempDir dir;
  const Job job = run_trial_job(2, dir / "invalid", 20, "invalid");
  CHECK(job.status != 0);
  INFO(job.output);
  CHECK(job.output.find("the model does not fit these ranks") != std::string::npos);
  // The experiment reads the state: an invalid trial, not a crash to restart.
  std::ifstream file(dir / "invalid" / "trial" / "trial.json");
  const auto record = nlohmann::json::parse(file);
  CHECK(record["state"] == "INVALID");
  CHECK(record["restarts"] == 0);
  CHECK(record["error"].get<std::string>().find("the model does not fit these ranks") !=
        std::string::npos);
}

TEST_CASE("refusals of the data-parallel pieces that need no other rank") {
  // An array position saved at one global batch does not resume at another.
  auto data = sample_stream::make();
  keras::Sequential reader({keras::Input({1}), keras::layers::Dense(1)});
  auto three = reader.make_data_iterator(data.x, data.y,
                                         {.batch_size = 4, .shard_rank = 1, .num_shards = 3});
  three.start_epoch(0);
  static_cast<void>(three.next());
  auto two = reader.make_data_iterator(data.x, data.y,
                                       {.batch_size = 5, .shard_rank = 1, .num_shards = 2});
  CHECK_THROWS_WITH_AS(two.restore(three.state()),
                       doctest::Contains("array source: the state was saved with a global batch "
                                         "of 12 rows but this source has 10 (5 rows on each of 2 "
                                         "ranks)"),
                       CheckpointError);

  auto one = std::make_shared<dist::LocalCollective>();
  CHECK_THROWS_WITH_AS(
      dist::DistributedOptimizer(std::make_shared<keras::optimizers::SGD>(), nullptr),
      "distributed optimizer: the collective is null", ConfigError);
  CHECK_THROWS_WITH_AS(reader.set_optimizer(nullptr), doctest::Contains("set_optimizer"),
                       ConfigError);
  // A step in which no rank had a row.
  reader.compile({.optimizer = std::make_shared<dist::DistributedOptimizer>(
                      std::make_shared<keras::optimizers::SGD>(), one),
                  .loss = "mse"});
  CHECK_THROWS_WITH_AS(reader.optimizer().apply_batch_gradients(reader.trainable_variables(), 0),
                       doctest::Contains("rank 0 of 1: a training step of 0 rows on every rank"),
                       DistributedError);
  CHECK_THROWS_WITH_AS(reader.set_optimizer(nullptr),
                       "model 'sequential': set_optimizer: the optimizer is null", ConfigError);
}
