// The experiment commands end to end: the tiny trial program (tiny_trial.cpp, whose main is
// LOADSTAR_TRIAL_MAIN) is run as a process, as a user runs their own trial binary.

#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <loadstar/keras.hpp>
#include <loadstar/keras/callbacks/detail/files.hpp>
#include <loadstar/random.hpp>
#include <loadstar/trial/detail/experiment_process.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.hpp"

namespace detail = loadstar::trial::detail;
using loadstar::keras::detail::read_bytes;

namespace {

std::string tiny_trial() {
  const char* path = std::getenv("LOADSTAR_TINY_TRIAL");
  REQUIRE_MESSAGE(path != nullptr, "LOADSTAR_TINY_TRIAL names the tiny trial program");
  return path;
}

struct Ran {
  int status = -1;
  std::string output;
  int exit_code() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

/// Runs the tiny trial program with `arguments` to its end.
Ran run(std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), tiny_trial());
  const auto result = detail::run_program(arguments, "");
  return {result.status, result.output};
}

void write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

nlohmann::json read_json(const std::filesystem::path& path) {
  return nlohmann::json::parse(read_bytes(path));
}

/// Whether a process whose command line mentions `text` is alive (a trial of a folder).
bool process_mentions(const std::string& text) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string command;
    try {
      command = read_bytes(entry.path() / "cmdline");
    } catch (...) {
      continue;
    }
    for (char& c : command) {
      if (c == '\0') c = ' ';
    }
    if (command.find(" trial run " + text) != std::string::npos) return true;
  }
  return false;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// One trial, 24 batches of 8 rows, validated every 8 batches.
const std::string single_config = R"(
description: tiny single
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  hidden: 8
  learning_rate: 0.01
records_per_epoch: 64
scheduling_unit: 4
min_validation_period:
  batches: 8
searcher:
  name: single
  metric: val_loss
  smaller_is_better: true
  max_length:
    batches: 24
checkpoint_storage:
  save_experiment_best: 1
reproducibility:
  experiment_seed: 3
)";

/// Three trials at once in their own processes; one crashes, one throws.
const std::string failing_grid_config = R"(
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  fail:
    type: categorical
    vals: [none, crash, throw]
records_per_epoch: 64
scheduling_unit: 4
max_restarts: 1
searcher:
  name: grid
  metric: val_loss
  max_length:
    batches: 8
  max_concurrent_trials: 3
reproducibility:
  experiment_seed: 5
)";

/// Two slow trials at once in their own processes, checkpointed every 4 batches.
const std::string slow_grid_config = R"(
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  sleep_ms: 40
  hidden:
    type: categorical
    vals: [4, 8]
records_per_epoch: 64
scheduling_unit: 2
min_validation_period:
  batches: 4
min_checkpoint_period:
  batches: 4
checkpoint_policy: all
searcher:
  name: grid
  metric: val_loss
  max_length:
    batches: 40
  max_concurrent_trials: 2
reproducibility:
  experiment_seed: 9
)";

/// Runs the experiment of `dir/config` to its end in `dir/reference`; runs it again in
/// `dir/killed`, killing the experiment process with SIGKILL once its trials have checkpointed
/// `thresholds[k]` batches in all (then resuming it, with `create` for an in-process trial and
/// `resume` otherwise); then checks that it completes with the reference's metrics.
void kill_resume_and_compare(const test_support::TempDir& dir, const std::string& config,
                             const std::vector<std::uint64_t>& thresholds, int trials,
                             std::uint64_t batches_per_trial) {
  const Ran reference = run({"experiment", "create", (dir / config).string(), "--dir",
                             (dir / "reference").string(), "--no-plot"});
  INFO(reference.output);
  REQUIRE(reference.exit_code() == 0);

  const auto folder = dir / "killed";
  std::vector<std::string> arguments = {
      tiny_trial(), "experiment",    "create",   (dir / config).string(),
      "--dir",      folder.string(), "--no-plot"};
  std::size_t kills = 0;
  for (const std::uint64_t threshold : thresholds) {
    const ::pid_t pid = detail::spawn_logged(arguments, dir / "killed.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    bool killed = false;
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) break;  // it finished first
      std::uint64_t batches = 0;
      for (int id = 1; id <= trials; ++id) {
        try {
          batches +=
              read_json(folder / "trials" / std::to_string(id) / "trial.json")["total_batches"]
                  .get<std::uint64_t>();
        } catch (...) {
        }
      }
      if (batches >= threshold) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        killed = true;
        // Its trials die with it (PR_SET_PDEATHSIG), so a resume never races a stale trial.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (process_mentions(folder.string()) && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        CHECK_FALSE(process_mentions(folder.string()));
        ++kills;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (!killed) break;
    // Running `create` again on its folder resumes it, as `resume` does: both are used in turn.
    if (kills % 2 == 1) {
      arguments = {tiny_trial(), "experiment", "resume", folder.string(), "--no-plot"};
    } else {
      arguments = {tiny_trial(), "experiment",    "create",   (dir / config).string(),
                   "--dir",      folder.string(), "--no-plot"};
    }
  }
  MESSAGE("killed the experiment " << kills << " times");
  CHECK(kills >= 1);
  const Ran resumed = run({"experiment", "resume", folder.string(), "--no-plot"});
  INFO(read_bytes(dir / "killed.log"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code() == 0);
  CHECK(contains(resumed.output, "COMPLETED (" + std::to_string(trials) +
                                     (trials == 1 ? " trial: " : " trials: ") +
                                     std::to_string(trials) + " completed, 0 failed)"));
  for (int id = 1; id <= trials; ++id) {
    const std::string name = std::to_string(id);
    CAPTURE(name);
    CHECK(read_bytes(folder / "trials" / name / "metrics.jsonl") ==
          read_bytes(dir / "reference" / "trials" / name / "metrics.jsonl"));
    CHECK(read_json(folder / "trials" / name / "trial.json")["total_batches"] == batches_per_trial);
  }
}

/// The sum of `total_batches` over the `trials` trial records in `folder` (0 for a missing one).
std::uint64_t batches_recorded(const std::filesystem::path& folder, int trials) {
  std::uint64_t batches = 0;
  for (int id = 1; id <= trials; ++id) {
    try {
      batches += read_json(folder / "trials" / std::to_string(id) / "trial.json")["total_batches"]
                     .get<std::uint64_t>();
    } catch (...) {
    }
  }
  return batches;
}

/// The weights of the latest checkpoint of trial `id` of the experiment in `folder`.
std::string latest_weights(const std::filesystem::path& folder, int id) {
  const auto record = read_json(folder / "trials" / std::to_string(id) / "trial.json");
  auto model = loadstar::keras::load_model(folder / "checkpoints" /
                                           record.at("latest_checkpoint").get<std::string>() /
                                           "determined-keras-model.h5");
  std::string out;
  for (const auto& w : model->get_weights())
    out.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  return out;
}

/// Runs the experiment of `dir/config` to its end in `dir/reference`; runs it again in
/// `dir/paused`, pausing it (SIGTERM to the experiment process, or `experiment pause`, in turn)
/// once its trials have recorded `thresholds[k]` batches in all plus a random 0 to 60 ms, then
/// resuming it; each pause must end the process with status 3, every trial process gone, the
/// experiment PAUSED and no batch trained since the last record lost. The resumed experiment
/// must complete with the reference's metrics and weights, bitwise.
void pause_resume_and_compare(const test_support::TempDir& dir, const std::string& config,
                              const std::vector<std::uint64_t>& thresholds, int trials,
                              std::uint64_t batches_per_trial, std::uint64_t seed) {
  const Ran reference = run({"experiment", "create", (dir / config).string(), "--dir",
                             (dir / "reference").string(), "--no-plot"});
  INFO(reference.output);
  REQUIRE(reference.exit_code() == 0);

  loadstar::SplitMix64 rng(seed);
  const auto folder = dir / "paused";
  std::vector<std::string> arguments = {
      tiny_trial(), "experiment",    "create",   (dir / config).string(),
      "--dir",      folder.string(), "--no-plot"};
  std::size_t pauses = 0;
  for (const std::uint64_t threshold : thresholds) {
    // Batches trained in this run, not only the ones recorded before it: the process has
    // started and installed its handlers.
    const std::uint64_t before = batches_recorded(folder, trials);
    const ::pid_t pid = detail::spawn_logged(arguments, dir / "paused.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    int status = 0;
    bool finished = false;
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        finished = true;
        break;
      }
      const std::uint64_t recorded = batches_recorded(folder, trials);
      if (recorded >= threshold && recorded > before) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (finished) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(rng.below(60)));
    if (pauses % 2 == 0) {
      ::kill(pid, SIGTERM);
    } else {
      const Ran asked = run({"experiment", "pause", folder.string()});
      CHECK(asked.exit_code() == 0);
      CHECK(contains(asked.output,
                     "asked the process running '" + folder.string() + "' to pause it"));
    }
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    INFO(read_bytes(dir / "paused.log"));
    REQUIRE(WIFEXITED(status));
    if (WEXITSTATUS(status) == 0) break;  // it completed before the pause reached a trial
    CHECK(WEXITSTATUS(status) == 3);
    CHECK(read_json(folder / "experiment.json")["state"] == "PAUSED");
    CHECK_FALSE(process_mentions(folder.string()));
    // Every trial checkpointed what it had trained: its record is at the last batch its
    // metrics show, or after it (a pause between two batches of a workload).
    for (int id = 1; id <= trials; ++id) {
      const auto trial = folder / "trials" / std::to_string(id);
      std::uint64_t trained = 0;
      std::ifstream lines(trial / "metrics.jsonl");
      for (std::string line; std::getline(lines, line);) {
        trained = std::max(trained, nlohmann::json::parse(line)["batches"].get<std::uint64_t>());
      }
      CAPTURE(id);
      const auto record = read_json(trial / "trial.json");
      std::uint64_t checkpointed = 0;
      for (const auto& checkpoint : record["checkpoints"]) {
        if (checkpoint["uuid"] == record["latest_checkpoint"]) {
          checkpointed = checkpoint["batches"].get<std::uint64_t>();
        }
      }
      if (trained > 0) CHECK(checkpointed >= trained);
    }
    ++pauses;
    arguments = {tiny_trial(), "experiment", "resume", folder.string(), "--no-plot"};
  }
  MESSAGE("paused the experiment " << pauses << " times");
  CHECK(pauses >= 2);
  const Ran resumed = run({"experiment", "resume", folder.string(), "--no-plot"});
  INFO(read_bytes(dir / "paused.log"));
  INFO(resumed.output);
  REQUIRE(resumed.exit_code() == 0);
  for (int id = 1; id <= trials; ++id) {
    const std::string name = std::to_string(id);
    CAPTURE(name);
    CHECK(read_bytes(folder / "trials" / name / "metrics.jsonl") ==
          read_bytes(dir / "reference" / "trials" / name / "metrics.jsonl"));
    CHECK(read_json(folder / "trials" / name / "trial.json")["total_batches"] == batches_per_trial);
    CHECK(latest_weights(folder, id) == latest_weights(dir / "reference", id));
  }
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("SIGTERM pauses an experiment of trial processes and resume continues it bitwise") {
    test_support::TempDir dir;
    write(dir / "slow.yaml", slow_grid_config);
    pause_resume_and_compare(dir, "slow.yaml", {6, 30, 54}, 2, 40, 11);
  }

  TEST_CASE("SIGTERM pauses an experiment whose trial runs in its process, bitwise on resume") {
    test_support::TempDir dir;
    std::string slow = single_config;
    slow.replace(slow.find("  hidden: 8\n"), 12, "  hidden: 8\n  sleep_ms: 40\n");
    slow += "min_checkpoint_period:\n  batches: 4\n";
    write(dir / "slow.yaml", slow);
    pause_resume_and_compare(dir, "slow.yaml", {2, 9, 17}, 1, 24, 12);
  }

  TEST_CASE("experiment kill stops without a checkpoint and pause and kill need a running one") {
    test_support::TempDir dir;
    std::string slow = single_config;
    slow.replace(slow.find("  hidden: 8\n"), 12, "  hidden: 8\n  sleep_ms: 40\n");
    write(dir / "slow.yaml", slow);
    const auto folder = dir / "killed";
    Ran ran = run({"experiment", "pause", folder.string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output, "killed': expected an experiment.json but found no such folder"));
    const ::pid_t pid =
        detail::spawn_logged({tiny_trial(), "experiment", "create", (dir / "slow.yaml").string(),
                              "--dir", folder.string(), "--no-plot"},
                             dir / "killed.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (batches_recorded(folder, 1) < 4 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ran = run({"experiment", "kill", folder.string()});
    CHECK(ran.exit_code() == 0);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    INFO(read_bytes(dir / "killed.log"));
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    CHECK(read_json(folder / "experiment.json")["state"] == "KILLED");
    CHECK(read_json(folder / "trials" / "1" / "trial.json")["total_batches"].get<std::uint64_t>() <
          24);
    // A killed experiment stays killed.
    ran = run({"experiment", "resume", folder.string(), "--no-plot"});
    CHECK(ran.exit_code() == 3);
    CHECK(contains(ran.output, "KILLED"));
    ran = run({"experiment", "kill", folder.string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output, "experiment folder '" + folder.string() +
                                   "': expected a process running it to kill but none holds "
                                   "its lock"));
  }

  TEST_CASE("A grid of four trials at once builds the data layer's cache once") {
    test_support::TempDir dir;
    const auto config = [&](const std::string& version) {
      return R"(
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  loader: cached
  hidden:
    type: categorical
    vals: [4, 6, 8, 10]
records_per_epoch: 64
scheduling_unit: 4
searcher:
  name: grid
  metric: val_loss
  max_length:
    batches: 12
  max_concurrent_trials: 4
reproducibility:
  experiment_seed: 5
data_layer:
  host_storage_path: )" +
             (dir / "caches").string() + R"(
data:
  version: )" +
             version +
             R"(
  maker_calls: )" +
             (dir / "maker_calls").string() + "\n";
    };
    const auto made = [&] {
      const std::string calls = read_bytes(dir / "maker_calls");
      return std::count(calls.begin(), calls.end(), '\n');
    };
    write(dir / "v1.yaml", config("v1"));
    const Ran first = run(
        {"experiment", "create", (dir / "v1.yaml").string(), "--dir", (dir / "first").string()});
    INFO(first.output);
    REQUIRE(first.exit_code() == 0);
    CHECK(contains(first.output, "(4 trials: 4 completed, 0 failed)"));
    CHECK(made() == 1);
    CHECK(std::filesystem::exists(dir / "caches/tiny/v1_train.ldscache"));
    // Another experiment naming the same id and version reads the same cache.
    const Ran second = run(
        {"experiment", "create", (dir / "v1.yaml").string(), "--dir", (dir / "second").string()});
    REQUIRE(second.exit_code() == 0);
    CHECK(made() == 1);
    // The trials of both read the same records in the same order: equal metrics.
    CHECK(read_bytes(dir / "first/trials/1/metrics.jsonl") ==
          read_bytes(dir / "second/trials/1/metrics.jsonl"));
    // A new version is a new cache.
    write(dir / "v2.yaml", config("v2"));
    const Ran third = run(
        {"experiment", "create", (dir / "v2.yaml").string(), "--dir", (dir / "third").string()});
    REQUIRE(third.exit_code() == 0);
    CHECK(made() == 2);
  }

  TEST_CASE(
      "searcher.source_checkpoint_uuid starts every trial from another experiment's weights") {
    test_support::TempDir dir;
    write(dir / "single.yaml", single_config);
    const Ran source = run({"experiment", "create", (dir / "single.yaml").string(), "--dir",
                            (dir / "source").string()});
    REQUIRE_MESSAGE(source.exit_code() == 0, source.output);
    const auto trial = read_json(dir / "source/trials/1/trial.json");
    const std::string uuid = trial["latest_checkpoint"].get<std::string>();
    // The val_loss of each validation, by batch.
    const auto validations = [](const std::filesystem::path& metrics) {
      std::map<std::uint64_t, double> out;
      std::ifstream lines(metrics);
      for (std::string line; std::getline(lines, line);) {
        const auto entry = nlohmann::json::parse(line);
        if (entry["kind"] == "validation") {
          out[entry["batches"].get<std::uint64_t>()] = entry["metrics"]["val_loss"].get<double>();
        }
      }
      return out;
    };
    const auto before = validations(dir / "source/trials/1/metrics.jsonl");
    REQUIRE(before.count(24) == 1);
    // Two trials (another hidden size would not load the weights: the same one twice, with
    // other learning rates), each validated before its first batch.
    std::string warm = single_config;
    warm.replace(warm.find("  learning_rate: 0.01\n"), 22,
                 "  learning_rate: {type: categorical, vals: [0.01, 0.02]}\n");
    warm.replace(warm.find("  name: single\n"), 14, "  name: grid\n");
    warm += "perform_initial_validation: true\n";
    warm.replace(warm.find("searcher:\n"), 10,
                 "searcher:\n  source_checkpoint_uuid: " + uuid + "\n");
    write(dir / "warm.yaml", warm);
    const Ran started = run(
        {"experiment", "create", (dir / "warm.yaml").string(), "--dir", (dir / "warm").string()});
    INFO(started.output);
    REQUIRE(started.exit_code() == 0);
    for (const char* id : {"1", "2"}) {
      CAPTURE(id);
      CHECK(contains(read_bytes(dir / "warm/trials" / id / "output.log"),
                     "trial " + std::string(id) + ": starting from the weights of checkpoint " +
                         (dir / "source/checkpoints" / uuid).string()));
      const auto after = validations(dir / "warm/trials" / id / "metrics.jsonl");
      REQUIRE(after.count(0) == 1);
      // The initial validation sees the source's weights at its checkpoint, bit for bit.
      CHECK(after.at(0) == before.at(24));
    }
    // A uuid no experiment beside it holds is refused before any trial runs.
    std::string missing = single_config;
    missing.replace(missing.find("searcher:\n"), 10,
                    "searcher:\n  source_checkpoint_uuid: no-such-checkpoint\n");
    write(dir / "missing.yaml", missing);
    const Ran refused = run({"experiment", "create", (dir / "missing.yaml").string(), "--dir",
                             (dir / "missing").string()});
    CHECK(refused.exit_code() != 0);
    CHECK_MESSAGE(contains(refused.output,
                           "searcher.source_checkpoint_uuid: expected a checkpoint "
                           "'no-such-checkpoint' (a folder with "
                           "determined-keras-model.h5) but found none in " +
                               (dir / "missing" / "checkpoints").string() + ", " +
                               (dir / "source" / "checkpoints").string() + ", " +
                               (dir / "warm" / "checkpoints").string()),
                  refused.output);
  }

  TEST_CASE("adaptive_asha with stop_once stops trials at rungs and runs the others to the end") {
    test_support::TempDir dir;
    write(dir / "asha.yaml", R"(
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  learning_rate: {type: log, minval: -3, maxval: -1}
records_per_epoch: 64
scheduling_unit: 2
searcher:
  name: adaptive_asha
  metric: val_loss
  max_length: {batches: 32}
  max_trials: 6
  max_rungs: 3
  divisor: 2
  mode: aggressive
  stop_once: true
  max_concurrent_trials: 1
reproducibility: {experiment_seed: 7}
)");
    const Ran ran = run(
        {"experiment", "create", (dir / "asha.yaml").string(), "--dir", (dir / "asha").string()});
    INFO(ran.output);
    REQUIRE(ran.exit_code() == 0);
    CHECK(contains(ran.output, "COMPLETED (6 trials: 6 completed, 0 failed)"));
    // Rungs at 8, 16 and 32 batches: a trial that is not in the top half of a rung when it
    // reaches it stops there for good; the first at each rung goes on.
    const auto experiment = read_json(dir / "asha/experiment.json");
    REQUIRE(experiment["trials"].size() == 6);
    CHECK(experiment["trials"][0]["total_batches"] == 32);
    int stopped = 0;
    for (const auto& trial : experiment["trials"]) {
      const auto batches = trial["total_batches"].get<std::uint64_t>();
      CHECK((batches == 8 || batches == 16 || batches == 32));
      stopped += batches < 32 ? 1 : 0;
    }
    CHECK(stopped >= 1);
  }

  TEST_CASE("experiment create runs a single trial and prints where its files are") {
    test_support::TempDir dir;
    write(dir / "single.yaml", single_config);
    const auto folder = dir / "exp";
    const Ran created =
        run({"experiment", "create", (dir / "single.yaml").string(), "--dir", folder.string()});
    INFO(created.output);
    REQUIRE(created.exit_code() == 0);
    CHECK(contains(created.output, "': COMPLETED (1 trial: 1 completed, 0 failed)"));
    CHECK(contains(created.output, "checkpoints: " + (folder / "checkpoints").string()));
    CHECK(contains(created.output, "metrics:     " + (folder / "trials/1/metrics.jsonl").string()));
    CHECK(contains(created.output, "plot:        " + (folder / "plot.svg").string()));

    const auto experiment = read_json(folder / "experiment.json");
    CHECK(experiment["state"] == "COMPLETED");
    CHECK(experiment["seed"] == 3);
    REQUIRE(experiment["trials"].size() == 1);
    CHECK(experiment["trials"][0]["state"] == "COMPLETED");
    CHECK(experiment["trials"][0]["total_batches"] == 24);
    CHECK(experiment["trials"][0]["best_validation"].is_number());
    // save_experiment_best 1: the best checkpoint over all trials, by val_loss.
    REQUIRE(experiment["best_checkpoints"].size() == 1);
    CHECK(experiment["best_checkpoints"][0]["trial_id"] == 1);
    CHECK(experiment["best_checkpoints"][0]["validation"] ==
          experiment["trials"][0]["best_validation"]);
    CHECK(std::filesystem::exists(folder / "checkpoints" /
                                  experiment["best_checkpoints"][0]["uuid"].get<std::string>()));
    const auto trial = read_json(folder / "trials/1/trial.json");
    CHECK(trial["state"] == "COMPLETED");
    CHECK(trial["total_batches"] == 24);
    const std::string latest = trial["latest_checkpoint"].get<std::string>();
    CHECK(std::filesystem::exists(folder / "checkpoints" / latest / "determined-keras-model.h5"));
    const std::string metrics = read_bytes(folder / "trials/1/metrics.jsonl");
    CHECK(contains(metrics, "\"kind\":\"validation\""));
    CHECK(contains(read_bytes(folder / "plot.svg"), "<svg"));

    SUBCASE("list shows it") {
      const Ran listed = run({"experiment", "list", dir.path().string()});
      INFO(listed.output);
      CHECK(listed.exit_code() == 0);
      CHECK(contains(listed.output, folder.string() + "  id "));
      CHECK(contains(listed.output, "COMPLETED  single  1 trial  tiny single"));
    }
    SUBCASE("describe prints the trial and plots its curves as PNG") {
      const Ran described =
          run({"experiment", "describe", folder.string(), "--plot", (dir / "curves.png").string()});
      INFO(described.output);
      CHECK(described.exit_code() == 0);
      CHECK(contains(described.output, "searcher:    single, metric val_loss (smaller is better)"));
      CHECK(contains(described.output, "1      COMPLETED  24"));
      CHECK(contains(described.output, latest));
      CHECK(contains(described.output, "plot: " + (dir / "curves.png").string()));
      CHECK(read_bytes(dir / "curves.png").substr(1, 3) == "PNG");
      const Ran bad =
          run({"experiment", "describe", folder.string(), "--plot", (dir / "curves.pdf").string()});
      CHECK(bad.exit_code() == 1);
      CHECK(contains(bad.output, "expected a file name ending in .svg or .png but found '.pdf'"));
    }
    SUBCASE("create again with the same config finds it done") {
      const Ran again =
          run({"experiment", "create", (dir / "single.yaml").string(), "--dir", folder.string()});
      INFO(again.output);
      CHECK(again.exit_code() == 0);
      CHECK(contains(again.output, "already exists for this configuration: it is COMPLETED"));
      CHECK(read_bytes(folder / "trials/1/metrics.jsonl") == metrics);
    }
    SUBCASE("create with another config on its folder is refused") {
      write(dir / "other.yaml", single_config + "description: another\n");
      std::string other = single_config;
      other.replace(other.find("hidden: 8"), 9, "hidden: 9");
      write(dir / "other.yaml", other);
      const Ran refused =
          run({"experiment", "create", (dir / "other.yaml").string(), "--dir", folder.string()});
      CHECK(refused.exit_code() == 1);
      CHECK(contains(refused.output,
                     "experiment folder '" + folder.string() + "': expected the experiment of '"));
      CHECK(contains(refused.output, "with another configuration (run 'experiment resume " +
                                         folder.string() +
                                         "' to continue it, or give this one another folder "
                                         "with --dir)"));
    }
  }

  TEST_CASE("experiment create --test trains one batch and checkpoints") {
    test_support::TempDir dir;
    write(dir / "single.yaml", single_config);
    const auto folder = dir / "exp-test";
    const Ran created = run({"experiment", "create", (dir / "single.yaml").string(), "--test",
                             "--dir", folder.string()});
    INFO(created.output);
    REQUIRE(created.exit_code() == 0);
    const auto experiment = read_json(folder / "experiment.json");
    CHECK(experiment["test"] == true);
    CHECK(experiment["trials"][0]["total_batches"] == 1);
    const auto trial = read_json(folder / "trials/1/trial.json");
    CHECK(std::filesystem::exists(folder / "checkpoints" /
                                  trial["latest_checkpoint"].get<std::string>() /
                                  "determined-keras-model.h5"));
  }

  TEST_CASE("experiment create puts checkpoints under checkpoint_storage host_path") {
    test_support::TempDir dir;
    std::string stored = single_config;
    const std::string storage = "checkpoint_storage:\n";
    stored.insert(stored.find(storage) + storage.size(),
                  "  host_path: " + dir.path().string() + "\n  storage_path: shared/ckpts\n");
    write(dir / "stored.yaml", stored);
    const auto folder = dir / "exp";
    const Ran created = run({"experiment", "create", (dir / "stored.yaml").string(), "--test",
                             "--dir", folder.string(), "--no-plot"});
    INFO(created.output);
    REQUIRE(created.exit_code() == 0);
    CHECK(contains(created.output, "checkpoints: " + (dir / "shared/ckpts").string()));
    const auto trial = read_json(folder / "trials/1/trial.json");
    CHECK(std::filesystem::exists(dir / "shared/ckpts" /
                                  trial["latest_checkpoint"].get<std::string>() /
                                  "determined-keras-model.h5"));
    CHECK_FALSE(std::filesystem::exists(folder / "checkpoints"));
  }

  TEST_CASE("experiment create keeps going when one trial crashes and another throws") {
    test_support::TempDir dir;
    write(dir / "grid.yaml", failing_grid_config);
    const auto folder = dir / "exp";
    const Ran created = run({"experiment", "create", (dir / "grid.yaml").string(), "--dir",
                             folder.string(), "--no-plot"});
    INFO(created.output);
    REQUIRE(created.exit_code() == 0);
    CHECK(contains(created.output, "COMPLETED (3 trials: 1 completed, 2 failed)"));
    const auto experiment = read_json(folder / "experiment.json");
    REQUIRE(experiment["trials"].size() == 3);
    for (const auto& trial : experiment["trials"]) {
      const std::string fail = trial["hparams"]["fail"];
      INFO(fail);
      if (fail == "none") {
        CHECK(trial["state"] == "COMPLETED");
        CHECK(trial["total_batches"] == 8);
      } else if (fail == "crash") {
        CHECK(trial["state"] == "ERROR");
        CHECK(contains(trial["error"], "the trial process ended with killed by signal 6"));
      } else {
        CHECK(trial["state"] == "ERROR");
        CHECK(contains(trial["error"], "tiny trial fails on purpose"));
      }
    }
    // The crashing trial was started again once (max_restarts 1) before it was given up.
    CHECK(contains(created.output, "restarting it from its latest checkpoint (restart 1 of 1)"));
  }

  TEST_CASE("experiment create replaces a trial that throws InvalidHP in its own process") {
    test_support::TempDir dir;
    write(dir / "random.yaml", R"(
entrypoint: tiny:TinyTrial
hyperparameters:
  global_batch_size: 8
  fail:
    type: categorical
    vals: [none, invalid]
records_per_epoch: 64
scheduling_unit: 4
max_restarts: 2
searcher:
  name: random
  metric: val_loss
  max_trials: 2
  max_length:
    batches: 4
  max_concurrent_trials: 2
reproducibility:
  experiment_seed: 11
)");
    const auto folder = dir / "exp";
    const Ran created = run({"experiment", "create", (dir / "random.yaml").string(), "--dir",
                             folder.string(), "--no-plot"});
    INFO(created.output);
    REQUIRE(created.exit_code() == 0);
    const auto experiment = read_json(folder / "experiment.json");
    std::size_t completed = 0;
    std::size_t invalid = 0;
    for (const auto& trial : experiment["trials"]) {
      const std::string fail = trial["hparams"]["fail"];
      INFO(trial.dump());
      if (fail == "invalid") {
        ++invalid;
        CHECK(trial["state"] == "INVALID");
        CHECK(trial["error"] == "tiny trial's hyperparameters cannot work");
        const auto record =
            read_json(folder / "trials" / std::to_string(trial["id"].get<int>()) / "trial.json");
        CHECK(record["state"] == "INVALID");
        CHECK(record["restarts"] == 0);
      } else {
        ++completed;
        CHECK(trial["state"] == "COMPLETED");
      }
    }
    // Each invalid trial was replaced: max_trials trials completed.
    CHECK(completed == 2);
    REQUIRE(invalid > 0);  // the seed draws at least one
    CHECK(contains(created.output,
                   "2 completed, 0 failed, " + std::to_string(invalid) + " invalid)"));
  }

  TEST_CASE("experiment resume continues a killed experiment of trials in their own processes") {
    test_support::TempDir dir;
    write(dir / "slow.yaml", slow_grid_config);
    // Thresholds of the 80 batches of both trials.
    kill_resume_and_compare(dir, "slow.yaml", {8, 28, 52}, 2, 40);
  }

  TEST_CASE("experiment create resumes a killed experiment whose one trial runs in its process") {
    test_support::TempDir dir;
    std::string slow = single_config;
    slow.replace(slow.find("  hidden: 8\n"), 12, "  hidden: 8\n  sleep_ms: 40\n");
    slow.replace(slow.find("  batches: 8\n"), 13, "  batches: 4\n");
    write(dir / "slow.yaml", slow);
    kill_resume_and_compare(dir, "slow.yaml", {4, 12}, 1, 24);
  }

  TEST_CASE("experiment commands refuse bad configs entrypoints and folders") {
    test_support::TempDir dir;
    std::string unknown = single_config;
    unknown.replace(unknown.find("tiny:TinyTrial"), 14, "nope:Nope");
    write(dir / "unknown.yaml", unknown);
    Ran ran = run(
        {"experiment", "create", (dir / "unknown.yaml").string(), "--dir", (dir / "a").string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output,
                   "unknown.yaml': entrypoint: expected the name of a registered "
                   "trial class but found 'nope:Nope' (registered: tiny:TinyTrial)"));
    CHECK_FALSE(std::filesystem::exists(dir / "a"));

    std::string misspelt = single_config;
    misspelt.replace(misspelt.find("scheduling_unit"), 15, "scheduling_unti");
    write(dir / "misspelt.yaml", misspelt);
    ran = run(
        {"experiment", "create", (dir / "misspelt.yaml").string(), "--dir", (dir / "b").string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output, "misspelt.yaml"));
    CHECK(contains(ran.output, "scheduling_unti"));
    CHECK(contains(ran.output, "did you mean 'scheduling_unit'"));

    ran = run({"experiment", "resume", (dir / "nowhere").string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output, "nowhere': expected an experiment.json but found no such folder"));

    write(dir / "single.yaml", single_config);
    std::filesystem::create_directories(dir / "full");
    write(dir / "full" / "notes.txt", "mine");
    ran = run(
        {"experiment", "create", (dir / "single.yaml").string(), "--dir", (dir / "full").string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output,
                   "full': expected a new or empty folder but found files and no "
                   "experiment.json"));

    ran = run({"experiment", "describe", (dir / "full").string()});
    CHECK(ran.exit_code() == 1);
    CHECK(contains(ran.output, "expected an experiment.json but found none in it"));

    ran = run({"experiment", "frobnicate"});
    CHECK(ran.exit_code() != 0);
  }
}
