/// \file
/// Experiments: a searcher's trials run from an experiment configuration, in a folder that holds
/// everything (`experiment.json`, `trials/<id>/`, `checkpoints/<uuid>/`), resumable after the
/// experiment process is killed. What `experiment create`, `resume`, `list` and `describe` do.
///
/// The folder:
/// - `experiment.json`: the config (as JSON), the experiment's id, seed and state, the
///   searcher's state and every trial with its hyperparameters, seed, state and pending searcher
///   operations, rewritten atomically after every event;
/// - `trials/<id>/`: the runner's `trial.json` and `metrics.jsonl`, plus `output.log` (what a
///   trial run in its own process printed) and `result.json` (its last operation's outcome);
/// - `checkpoints/<uuid>/`, or `checkpoint_storage.host_path/storage_path/<uuid>/` when set;
/// - `plot.svg`: the training and validation curves, drawn at the end.
///
/// Over 800 lines as one feature: the declarations are short; the bodies below them, most of
/// the file, are compiled into loadstar_trial under LOADSTAR_SEPARATE_COMPILATION.
#pragma once

#include "loadstar/config.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/keras/callbacks/detail/files.hpp"
#include "loadstar/keras/sequential.hpp"
#include "loadstar/trial/detail/experiment_describe.hpp"
#include "loadstar/trial/detail/experiment_process.hpp"
#include "loadstar/trial/detail/experiment_record.hpp"
#include "loadstar/trial/detail/interruption.hpp"
#include "loadstar/trial/experiment_config.hpp"
#include "loadstar/trial/plot.hpp"
#include "loadstar/trial/registry.hpp"
#include "loadstar/trial/searcher.hpp"
#include "loadstar/trial/trial_runner.hpp"

namespace loadstar::trial {

/// How an experiment runs.
struct ExperimentOptions {
  /// Determined's `--test`: the config's test overrides (one batch, one validation batch, a
  /// checkpoint) and a `--test` folder of its own.
  bool test = false;
  /// Progress bars and workload lines of a trial run in this process; trial lines on `out`.
  bool verbose = true;
  /// The executable whose hidden `trial run` command runs a trial in a process of its own.
  /// Empty: this process's own executable (`/proc/self/exe`).
  std::filesystem::path executable;
  /// Run the trials of an experiment that runs one at a time in this process (the progress bar
  /// shows), instead of in child processes.
  bool in_process = true;
  /// Draw `plot.svg` at the end.
  bool plot = true;
  /// Where the experiment reports what it does.
  std::ostream* out = &std::cout;
};

/// What `run_experiment` did.
struct ExperimentSummary {
  std::filesystem::path dir;
  std::uint64_t id = 0;
  /// `COMPLETED`, or `ERROR` when no trial completed.
  std::string state;
  std::size_t trials = 0;
  std::size_t completed = 0;
  std::size_t errored = 0;
  /// Trials that threw `InvalidHP`.
  std::size_t invalid = 0;
  std::filesystem::path checkpoint_dir;
  /// Empty when the plot could not be drawn (`plot_error` says why).
  std::filesystem::path plot;
  std::string plot_error;
};

/// The folder `experiment create CONFIG` uses without `--dir`: `experiments/<config stem>`
/// (`experiments/<stem>-test` with `--test`).
inline std::filesystem::path default_experiment_dir(const std::filesystem::path& config_file,
                                                    bool test = false) {
  return std::filesystem::path("experiments") /
         (config_file.stem().string() + (test ? "-test" : ""));
}

namespace detail {

/// An exclusive lock on `dir/.lock` (which holds this process's id, for `experiment pause` and
/// `kill`), held while this process runs the experiment, so that two processes never drive the
/// same experiment. The file descriptor is close-on-exec: trials do not
/// inherit the lock.
class ExperimentLock {
 public:
  LOADSTAR_DECL explicit ExperimentLock(const std::filesystem::path& dir);
  ExperimentLock(const ExperimentLock&) = delete;
  ExperimentLock& operator=(const ExperimentLock&) = delete;
  ~ExperimentLock() { ::close(fd_); }

 private:
  int fd_ = -1;
};

/// Asks the process that runs the experiment in `dir` (its lock names it) to pause (SIGTERM:
/// every trial checkpoints and exits, the experiment is recorded `PAUSED`) or to kill it
/// (SIGUSR2: the trials stop without a checkpoint, the experiment is recorded `KILLED`).
/// `ConfigError` when no process runs it.
LOADSTAR_DECL void signal_experiment(const std::filesystem::path& dir, Interruption what);

/// The folder of checkpoint `uuid` (`searcher.source_checkpoint_uuid`): looked for among the
/// checkpoints of the experiment in `dir` (whose checkpoint folder `record` names), then among
/// those of the experiments beside it (the other experiment folders in `dir`'s parent);
/// `ConfigError` naming the folders searched when none holds it.
LOADSTAR_DECL std::filesystem::path find_checkpoint(const std::filesystem::path& dir,
                                                    const ExperimentRecord& record,
                                                    const std::string& uuid);

/// The `TrialSpec` of trial `trial` of the experiment in `dir`.
LOADSTAR_DECL TrialSpec trial_spec(const std::filesystem::path& dir, const ExperimentRecord& record,
                                   const ExperimentConfig& config, const TrialRecord& trial);

/// `trial_dir/result.json`: the outcome of a trial's last operation.
LOADSTAR_DECL nlohmann::json result_to_json(const TrialResult& result);

/// How a trial's operation ended.
struct TrialOutcome {
  bool ok = false;
  TrialResult result;
  std::string error;
  /// The process died without reporting (a crash, a signal): worth another try.
  bool crashed = false;
  /// The trial threw `InvalidHP`: its hyperparameters cannot be trained.
  bool invalid_hp = false;
};

LOADSTAR_DECL TrialOutcome outcome_from_json(const nlohmann::json& json);

/// The last `count` lines of `file` (what a crashed trial printed last), on one line.
LOADSTAR_DECL std::string log_tail(const std::filesystem::path& file, std::size_t count = 3);

/// Drives one experiment: applies the searcher's operations to the record, runs trials (in this
/// process or in child processes), reports validations back, and saves the record after every
/// event.
class ExperimentLoop {
 public:
  ExperimentLoop(std::filesystem::path dir, ExperimentRecord record,
                 const ExperimentOptions& options)
      : dir_(std::move(dir)),
        record_(std::move(record)),
        options_(options),
        config_(experiment_config_from_json(record_.config, experiment_file(dir_).string())),
        searcher_(make_searcher(config_, record_.seed)) {}

  ExperimentSummary run() {
    if (record_.searcher_state.is_null()) {
      apply(searcher_->initial_operations());
      save();
    } else {
      searcher_->restore(record_.searcher_state);
      for (auto& trial : record_.trials) {
        if (trial.state == "ACTIVE" && !trial.pending.empty()) {
          say("trial " + std::to_string(trial.id) + ": resuming towards " +
              pending_length_json(trial.pending.front()).dump());
        }
      }
    }
    const std::uint64_t concurrency = trials_at_once(config_, searcher_->max_concurrent_trials(),
                                                     std::thread::hardware_concurrency());
    in_process_ = options_.in_process && concurrency == 1 && config_.slots_per_trial == 1;
#if !defined(LOADSTAR_WITH_MPI)
    if (config_.slots_per_trial > 1) {
      throw ConfigError("experiment '" + dir_.string() + "': resources.slots_per_trial is " +
                        std::to_string(config_.slots_per_trial) +
                        " but this trainer was built without MPI; build it with the "
                        "loadstar-mpi dependency (which defines LOADSTAR_WITH_MPI) to run a "
                        "trial on several ranks");
    }
#endif
    while (true) {
      if (interruption() == interruption_none) start_trials(concurrency);
      if (running_.empty() && finished_.empty()) break;
      const auto [trial_id, outcome] = wait_one();
      handle(trial_id, outcome);
      close_finished_trials();
      save();
    }
    const bool unfinished =
        std::any_of(record_.trials.begin(), record_.trials.end(),
                    [](const TrialRecord& t) { return t.state == "ACTIVE" && !t.pending.empty(); });
    if (const Interruption asked = interruption(); asked != interruption_none && unfinished) {
      // Every trial has checkpointed and exited (a pause) or was stopped (a kill); the trials
      // stay ACTIVE with their operations pending.
      record_.state = asked == interruption_pause ? "PAUSED" : "KILLED";
      say("experiment " + std::to_string(record_.id) + ": " +
          (asked == interruption_pause
               ? "paused; `experiment resume " + dir_.string() + "` continues it"
               : std::string("killed")));
      save();
      return summary();
    }
    // Nothing runs and nothing can start: trials still open wait for operations that will not
    // come (the searcher is done with them).
    for (auto& trial : record_.trials) {
      if (trial.state == "ACTIVE") {
        trial.state = "COMPLETED";
        apply(searcher_->trial_closed(trial.request_id));
      }
    }
    finish();
    save();
    return summary();
  }

 private:
  void say(const std::string& line) {
    if (options_.out != nullptr) *options_.out << line << std::endl;
  }

  LOADSTAR_DECL void save();

  LOADSTAR_DECL void apply(const std::vector<Operation>& operations);

  LOADSTAR_DECL bool is_running(std::uint64_t trial_id) const;

  LOADSTAR_DECL void start_trials(std::uint64_t concurrency);

  LOADSTAR_DECL void start(const TrialRecord& trial);

  /// `mpirun -np N ...` before the trial's command when `slots_per_trial` is N > 1 (one rank per
  /// slot, on this machine; `LOADSTAR_MPIRUN` names another launcher), else nothing.
  LOADSTAR_DECL std::vector<std::string> mpirun_prefix() const;

  /// The next trial to end: waits for a trial process, polling for an interruption, which it
  /// passes on to the running trials (SIGTERM: pause; SIGKILL: kill).
  LOADSTAR_DECL std::pair<std::uint64_t, TrialOutcome> wait_one();

  LOADSTAR_DECL void handle(std::uint64_t trial_id, const TrialOutcome& outcome);

  LOADSTAR_DECL void close_finished_trials();

  /// `save_experiment_best`: the best checkpoints over all trials, by the searcher metric.
  LOADSTAR_DECL void finish();

  LOADSTAR_DECL ExperimentSummary summary() const;

  std::filesystem::path dir_;
  ExperimentRecord record_;
  ExperimentOptions options_;
  ExperimentConfig config_;
  std::unique_ptr<Searcher> searcher_;
  bool in_process_ = false;
  std::map<::pid_t, std::uint64_t> running_;
  std::deque<std::pair<std::uint64_t, TrialOutcome>> finished_;
  std::map<std::uint64_t, std::uint64_t> crashes_;
  /// The interruption already passed on to the trial processes.
  Interruption forwarded_ = interruption_none;
};

}  // namespace detail

/// Runs (or resumes) the experiment in `dir` until its searcher is done: trials whose
/// operations are pending continue from their latest checkpoints. Draws `dir/plot.svg` at the
/// end when `options.plot`. Throws `ConfigError` when `dir` holds no experiment or another
/// process runs it.
LOADSTAR_DECL ExperimentSummary run_experiment(const std::filesystem::path& dir,
                                               const ExperimentOptions& options = {});

/// Creates the experiment of `config_file` in `dir` (`default_experiment_dir` when empty) and
/// runs it. When `dir` already holds the experiment of the same configuration it resumes it;
/// another experiment there is a `ConfigError` that suggests `experiment resume` or `--dir`.
/// Throws `ConfigError` for a bad config or an entrypoint that no trial is registered under.
LOADSTAR_DECL ExperimentSummary create_experiment(const std::filesystem::path& config_file,
                                                  std::filesystem::path dir = {},
                                                  const ExperimentOptions& options = {});

/// Prints the experiment in `dir`: state, searcher, trials (hyperparameters, state, best
/// validation, checkpoints) and where its metrics are; with `plot`, also draws its curves there
/// (`.svg` or `.png`). Throws `ConfigError` when `dir` holds no experiment, `IoError` when the
/// plot cannot be drawn.
LOADSTAR_DECL void describe_experiment(
    const std::filesystem::path& dir, std::ostream& out,
    const std::optional<std::filesystem::path>& plot = std::nullopt);

/// One line per experiment folder under `root`: folder, id, state, searcher, trials.
LOADSTAR_DECL void list_experiments(const std::filesystem::path& root, std::ostream& out);

/// For `trial run` under `mpirun`, before `MPI_Init`: forks the process that builds trial
/// `trial_id`'s training loader as this rank's share and serves its batches, when that loader
/// forks worker processes (which must never be forked from a process that initialised MPI);
/// null when it does not, or outside an `mpirun` job.
LOADSTAR_DECL std::shared_ptr<detail::LoaderProcess> start_training_loader_process(
    const std::filesystem::path& dir, std::uint64_t trial_id, bool test);

/// The hidden `trial run DIR ID --until LENGTH` command: runs trial `trial_id` of the experiment
/// in `dir` until `until` and writes its outcome to `trials/<id>/result.json` (also when it
/// fails, with the error). Returns the process's exit status.
/// With `ranks` of several processes (under `mpirun`), every rank runs the trial's share and rank
/// 0 writes `result.json`.
LOADSTAR_DECL int run_trial_of_experiment(const std::filesystem::path& dir, std::uint64_t trial_id,
                                          const Length& until, bool test, bool verbose = true,
                                          std::shared_ptr<dist::Collective> ranks = nullptr,
                                          std::shared_ptr<detail::LoaderProcess> loader = nullptr);

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

ExperimentLock::ExperimentLock(const std::filesystem::path& dir) {
  const auto file = dir / ".lock";
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw IoError("experiment lock '" + file.string() + "': cannot open: " + std::strerror(errno));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    throw ConfigError("experiment folder '" + dir.string() +
                      "': expected no other process running it but the lock '" + file.string() +
                      "' is held");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    const int error = errno;
    ::close(fd_);
    throw IoError("experiment lock '" + file.string() +
                  "': cannot write the process id: " + std::strerror(error));
  }
}

void signal_experiment(const std::filesystem::path& dir, Interruption what) {
  const auto file = dir / ".lock";
  const std::string verb = what == interruption_kill ? "kill" : "pause";
  (void)read_experiment_record(dir);  // a folder without an experiment is refused by name
  const int fd = ::open(file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char text[32] = {};
    const ::ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
    ::close(fd);
    const long pid = n > 0 ? std::strtol(text, nullptr, 10) : 0;
    if (pid <= 0) {
      throw IoError("experiment lock '" + file.string() +
                    "': expected the running process's id but found '" +
                    std::string(text, n > 0 ? static_cast<std::size_t>(n) : 0) + "'");
    }
    if (::kill(static_cast<::pid_t>(pid), what == interruption_kill ? SIGUSR2 : SIGTERM) != 0) {
      throw IoError("experiment folder '" + dir.string() + "': cannot signal process " +
                    std::to_string(pid) + " to " + verb + " it: " + std::strerror(errno));
    }
    return;
  }
  if (fd >= 0) ::close(fd);
  throw ConfigError("experiment folder '" + dir.string() + "': expected a process running it to " +
                    verb + " but none holds its lock");
}

TrialSpec trial_spec(const std::filesystem::path& dir, const ExperimentRecord& record,
                     const ExperimentConfig& config, const TrialRecord& trial) {
  TrialSpec spec;
  spec.config = config;
  spec.experiment_id = record.id;
  spec.trial_id = trial.id;
  spec.hparams = trial.hparams;
  spec.trial_seed = trial.trial_seed;
  spec.trial_dir = trial_dir(dir, trial.id);
  spec.checkpoint_dir = checkpoint_root(dir, record);
  if (const auto& uuid = config.searcher.source_checkpoint_uuid) {
    spec.warm_start = find_checkpoint(dir, record, *uuid);
  }
  return spec;
}

std::filesystem::path find_checkpoint(const std::filesystem::path& dir,
                                      const ExperimentRecord& record, const std::string& uuid) {
  std::vector<std::filesystem::path> roots{checkpoint_root(dir, record)};
  const auto parent = std::filesystem::absolute(dir).lexically_normal().parent_path();
  std::error_code error;
  if (std::filesystem::is_directory(parent, error)) {
    for (const auto& listing : list_experiment_folders(parent)) {
      if (std::filesystem::equivalent(listing.dir, dir, error)) continue;
      try {
        roots.push_back(checkpoint_root(listing.dir, read_experiment_record(listing.dir)));
      } catch (const Error&) {
        // An unreadable experiment holds no checkpoint to start from.
      }
    }
  }
  std::string searched;
  for (const auto& root : roots) {
    if (std::filesystem::exists(root / uuid / checkpoint_model_file, error)) return root / uuid;
    searched += (searched.empty() ? "" : ", ") + root.string();
  }
  throw ConfigError("searcher.source_checkpoint_uuid: expected a checkpoint '" + uuid +
                    "' (a folder with " + std::string(checkpoint_model_file) +
                    ") but found none in " + searched);
}

nlohmann::json result_to_json(const TrialResult& result) {
  return {{"ok", true},
          {"total_batches", result.total_batches},
          {"searcher_metric", optional_number(result.searcher_metric)},
          {"stop_requested", result.stop_requested},
          {"paused", result.paused},
          {"latest_checkpoint", result.latest_checkpoint},
          {"best_checkpoint", result.best_checkpoint},
          {"restarts", result.restarts}};
}

TrialOutcome outcome_from_json(const nlohmann::json& json) {
  TrialOutcome outcome;
  outcome.ok = json.value("ok", false);
  if (!outcome.ok) {
    outcome.error = json.value("error", std::string("the trial failed"));
    outcome.invalid_hp = json.value("invalid_hp", false);
    return outcome;
  }
  outcome.result.total_batches = json.value("total_batches", std::uint64_t{0});
  outcome.result.searcher_metric = optional_member(json, "searcher_metric");
  outcome.result.stop_requested = json.value("stop_requested", false);
  outcome.result.paused = json.value("paused", false);
  outcome.result.latest_checkpoint = json.value("latest_checkpoint", std::string());
  outcome.result.best_checkpoint = json.value("best_checkpoint", std::string());
  outcome.result.restarts = json.value("restarts", std::uint64_t{0});
  return outcome;
}

std::string log_tail(const std::filesystem::path& file, std::size_t count) {
  std::string text;
  try {
    text = keras::detail::read_bytes(file);
  } catch (const IoError&) {
    return {};
  }
  std::vector<std::string> lines;
  std::size_t begin = 0;
  while (begin < text.size()) {
    auto end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(' ') != std::string::npos) lines.push_back(std::move(line));
    begin = end + 1;
  }
  std::string tail;
  for (std::size_t i = lines.size() > count ? lines.size() - count : 0; i < lines.size(); ++i) {
    tail += (tail.empty() ? "" : " | ") + lines[i];
  }
  return tail;
}

void ExperimentLoop::save() {
  record_.searcher_state = searcher_->state();
  record_.progress = searcher_->progress();
  write_experiment_record(dir_, record_);
}

void ExperimentLoop::apply(const std::vector<Operation>& operations) {
  for (const auto& operation : operations) {
    std::visit(
        [&](const auto& op) {
          using Op = std::decay_t<decltype(op)>;
          if constexpr (std::is_same_v<Op, Create>) {
            TrialRecord trial;
            trial.id = record_.next_trial_id++;
            trial.request_id = op.request_id;
            trial.hparams = op.hparams;
            trial.trial_seed = op.trial_seed;
            std::filesystem::create_directories(trial_dir(dir_, trial.id));
            say("trial " + std::to_string(trial.id) + ": created with " +
                loadstar::detail::shown(trial.hparams));
            record_.trials.push_back(std::move(trial));
          } else if constexpr (std::is_same_v<Op, ValidateAfter>) {
            if (auto* trial = record_.find_request(op.request_id)) {
              if (trial->state == "ACTIVE") trial->pending.push_back(op.length);
            }
          } else if constexpr (std::is_same_v<Op, Close>) {
            if (auto* trial = record_.find_request(op.request_id)) trial->closed = true;
          } else {
            record_.shutdown = true;
          }
        },
        operation);
  }
}

bool ExperimentLoop::is_running(std::uint64_t trial_id) const {
  for (const auto& [pid, id] : running_) {
    if (id == trial_id) return true;
  }
  return false;
}

void ExperimentLoop::start_trials(std::uint64_t concurrency) {
  for (auto& trial : record_.trials) {
    if (running_.size() + finished_.size() >= concurrency) return;
    if (trial.state != "ACTIVE" || trial.pending.empty() || is_running(trial.id)) continue;
    if (record_.shutdown && !trial.closed) {
      // Shutdown: the searcher wants no more training; the trial closes.
      trial.pending.clear();
      trial.closed = true;
      continue;
    }
    start(trial);
  }
}

void ExperimentLoop::start(const TrialRecord& trial) {
  const Length until = trial.pending.front();
  const auto folder = trial_dir(dir_, trial.id);
  std::filesystem::create_directories(folder);
  std::error_code ignored;
  std::filesystem::remove(folder / "result.json", ignored);
  say("trial " + std::to_string(trial.id) + ": training until " +
      pending_length_json(until).dump());
  if (in_process_) {
    TrialOutcome outcome;
    try {
      RunOptions run;
      run.until = until;
      run.test = record_.test;
      run.verbose = options_.verbose;
      outcome.result = run_trial(trial_spec(dir_, record_, config_, trial), run);
      outcome.ok = true;
    } catch (const InvalidHP& error) {
      outcome.error = error.what();
      outcome.invalid_hp = true;
    } catch (const std::exception& error) {
      outcome.error = error.what();
    }
    finished_.emplace_back(trial.id, std::move(outcome));
    return;
  }
  std::filesystem::path executable = options_.executable;
  if (executable.empty()) executable = std::filesystem::read_symlink("/proc/self/exe");
  std::vector<std::string> arguments = mpirun_prefix();
  arguments.insert(arguments.end(),
                   {executable.string(), "trial", "run", std::filesystem::absolute(dir_).string(),
                    std::to_string(trial.id), "--until", pending_length_json(until).dump()});
  if (record_.test) arguments.push_back("--test");
  const ::pid_t pid = spawn_logged(std::move(arguments), folder / "output.log");
  running_[pid] = trial.id;
}

std::vector<std::string> ExperimentLoop::mpirun_prefix() const {
  const std::uint64_t slots = config_.slots_per_trial;
  if (slots <= 1) return {};
  const char* named = std::getenv("LOADSTAR_MPIRUN");
  const std::string launcher = find_program(named && *named ? named : "mpirun").string();
  if (launcher.empty()) {
    throw ConfigError("experiment '" + dir_.string() + "': resources.slots_per_trial is " +
                      std::to_string(slots) +
                      " but no mpirun was found on PATH (install openmpi-bin, or name the "
                      "launcher in LOADSTAR_MPIRUN)");
  }
  std::vector<std::string> prefix = {launcher, "-np", std::to_string(slots), "--bind-to", "none"};
  if (::geteuid() == 0) prefix.emplace_back("--allow-run-as-root");
  if (slots > std::max(1U, std::thread::hardware_concurrency())) {
    prefix.emplace_back("--oversubscribe");
  }
  return prefix;
}

std::pair<std::uint64_t, TrialOutcome> ExperimentLoop::wait_one() {
  if (!finished_.empty()) {
    auto next = std::move(finished_.front());
    finished_.pop_front();
    return next;
  }
  while (true) {
    if (const Interruption asked = interruption(); asked != forwarded_) {
      for (const auto& [child, id] : running_)
        ::kill(child, asked == interruption_kill ? SIGKILL : SIGTERM);
      forwarded_ = asked;
    }
    int status = 0;
    const ::pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid < 0) {
      if (errno == EINTR) continue;
      throw IoError("experiment '" + dir_.string() +
                    "': cannot wait for its trials: " + std::strerror(errno));
    }
    if (pid == 0) {
      // A signal between the check above and a blocking wait would go unseen: poll instead.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    const auto found = running_.find(pid);
    if (found == running_.end()) continue;
    const std::uint64_t trial_id = found->second;
    running_.erase(found);
    const auto folder = trial_dir(dir_, trial_id);
    TrialOutcome outcome;
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(keras::detail::read_bytes(folder / "result.json"));
    } catch (const std::exception&) {
      json = nullptr;
    }
    const nlohmann::json trial = json.is_object() ? nlohmann::json() : read_trial_json(folder);
    if (json.is_object()) {
      outcome = outcome_from_json(json);
    } else if (trial.is_object() && trial.value("state", std::string()) == "INVALID") {
      // A trial of several ranks that threw InvalidHP ends the job on every rank
      // (Collective::abort) after recording the state: not a crash to retry.
      outcome.invalid_hp = true;
      outcome.error = trial.value("error", std::string("InvalidHP"));
    } else {
      outcome.crashed = true;
      const std::string tail = log_tail(folder / "output.log");
      outcome.error = "the trial process ended with " + describe_status(status) +
                      " without reporting" + (tail.empty() ? std::string() : ": " + tail);
    }
    return {trial_id, std::move(outcome)};
  }
}

void ExperimentLoop::handle(std::uint64_t trial_id, const TrialOutcome& outcome) {
  TrialRecord* trial = record_.find_trial(trial_id);
  if (trial == nullptr) return;
  const std::string name = "trial " + std::to_string(trial_id);
  if (outcome.ok && outcome.result.paused) {
    trial->total_batches = outcome.result.total_batches;
    say(name + ": " + (interruption() == interruption_kill ? "killed" : "paused") + " after " +
        std::to_string(trial->total_batches) + " batches");
    return;  // still ACTIVE with its operation pending: a resume runs it again
  }
  if (outcome.crashed && interruption() != interruption_none) {
    say(name + ": stopped by the " +
        (interruption() == interruption_kill ? std::string("kill") : std::string("pause")));
    return;  // as above, from its latest checkpoint
  }
  if (outcome.invalid_hp) {
    // Determined's INVALID_HP: the searcher replaces the trial; no restart is used.
    trial->state = "INVALID";
    trial->error = outcome.error;
    trial->pending.clear();
    say(name + ": invalid hyperparameters: " + outcome.error);
    // The replacement the searcher creates may move the trials: the request id, not `trial`.
    const std::uint64_t request_id = trial->request_id;
    apply(searcher_->trial_exited_early(request_id, ExitedReason::invalid_hp));
    apply(searcher_->trial_closed(request_id));
    return;
  }
  if (outcome.crashed && crashes_[trial_id] < config_.max_restarts) {
    ++crashes_[trial_id];
    say(name + ": " + outcome.error + "; restarting it from its latest checkpoint (restart " +
        std::to_string(crashes_[trial_id]) + " of " + std::to_string(config_.max_restarts) + ")");
    return;  // still ACTIVE with its operation pending: start_trials runs it again
  }
  std::string error = outcome.error;
  if (outcome.ok && !outcome.result.searcher_metric && !outcome.result.stop_requested) {
    error = "its validation did not report the searcher metric '" + config_.searcher.metric + "'";
  }
  if (!outcome.ok || !error.empty()) {
    trial->state = "ERROR";
    trial->error = error;
    trial->pending.clear();
    say(name + ": failed: " + error);
    const std::uint64_t request_id = trial->request_id;
    apply(searcher_->trial_exited_early(request_id, ExitedReason::errored));
    apply(searcher_->trial_closed(request_id));
    return;
  }
  trial->total_batches = outcome.result.total_batches;
  const Length reached = trial->pending.front();
  trial->pending.pop_front();
  if (outcome.result.searcher_metric) {
    const double metric = *outcome.result.searcher_metric;
    trial->searcher_metric = metric;
    if (!trial->best_validation ||
        (config_.searcher.smaller_is_better ? metric < *trial->best_validation
                                            : metric > *trial->best_validation)) {
      trial->best_validation = metric;
    }
    say(name + ": " + config_.searcher.metric + " " + format_metric(metric) + " after " +
        std::to_string(trial->total_batches) + " batches");
    apply(searcher_->validation_completed(trial->request_id, metric,
                                          ValidateAfter{trial->request_id, reached}));
  }
  if (outcome.result.stop_requested) {
    // Determined: a trial that asks to stop exits early (USER_CANCELED) and completes.
    say(name + ": stopped at its own request after " + std::to_string(trial->total_batches) +
        " batches");
    trial->state = "COMPLETED";
    trial->pending.clear();
    apply(searcher_->trial_exited_early(trial->request_id, ExitedReason::user_canceled));
    apply(searcher_->trial_closed(trial->request_id));
  }
}

void ExperimentLoop::close_finished_trials() {
  bool changed = true;
  while (changed) {
    changed = false;
    for (auto& trial : record_.trials) {
      if (trial.state == "ACTIVE" && trial.closed && trial.pending.empty() &&
          !is_running(trial.id)) {
        trial.state = "COMPLETED";
        say("trial " + std::to_string(trial.id) + ": completed");
        apply(searcher_->trial_closed(trial.request_id));
        changed = true;
      }
    }
  }
}

void ExperimentLoop::finish() {
  std::size_t completed = 0;
  for (const auto& trial : record_.trials)
    completed += trial.state == "COMPLETED" ? 1 : 0;
  record_.state = completed > 0 || record_.trials.empty() ? "COMPLETED" : "ERROR";
  std::vector<std::pair<double, nlohmann::json>> candidates;
  for (const auto& trial : record_.trials) {
    const nlohmann::json json = read_trial_json(trial_dir(dir_, trial.id));
    if (!json.is_object() || !json.contains("checkpoints") || !json["checkpoints"].is_array()) {
      continue;
    }
    for (const auto& checkpoint : json["checkpoints"]) {
      if (!checkpoint.is_object() || !checkpoint.contains("validation")) continue;
      const auto value = validation_value(checkpoint["validation"], config_.searcher.metric);
      if (!value) continue;
      candidates.emplace_back(*value, nlohmann::json{{"trial_id", trial.id},
                                                     {"uuid", checkpoint.value("uuid", "")},
                                                     {"batches", checkpoint.value("batches", 0)},
                                                     {"validation", *value}});
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](const auto& a, const auto& b) {
    return config_.searcher.smaller_is_better ? a.first < b.first : a.first > b.first;
  });
  record_.best_checkpoints = nlohmann::json::array();
  for (std::size_t i = 0;
       i < candidates.size() && i < config_.checkpoint_storage.save_experiment_best; ++i) {
    record_.best_checkpoints.push_back(candidates[i].second);
  }
}

ExperimentSummary ExperimentLoop::summary() const {
  ExperimentSummary summary;
  summary.dir = dir_;
  summary.id = record_.id;
  summary.state = record_.state;
  summary.trials = record_.trials.size();
  for (const auto& trial : record_.trials) {
    summary.completed += trial.state == "COMPLETED" ? 1 : 0;
    summary.errored += trial.state == "ERROR" ? 1 : 0;
    summary.invalid += trial.state == "INVALID" ? 1 : 0;
  }
  summary.checkpoint_dir = checkpoint_root(dir_, record_);
  return summary;
}

}  // namespace loadstar::trial::detail
namespace loadstar::trial {

ExperimentSummary run_experiment(const std::filesystem::path& dir,
                                 const ExperimentOptions& options) {
  detail::ExperimentLock lock(dir);
  detail::ExperimentRecord record = detail::read_experiment_record(dir);
  ExperimentSummary summary;
  detail::interruption_flag = detail::interruption_none;
  if (record.state == "PAUSED") record.state = "ACTIVE";
  if (record.state == "ACTIVE") {
    summary = detail::ExperimentLoop(dir, std::move(record), options).run();
  } else {
    summary.dir = dir;
    summary.id = record.id;
    summary.state = record.state;
    summary.trials = record.trials.size();
    for (const auto& trial : record.trials) {
      summary.completed += trial.state == "COMPLETED" ? 1 : 0;
      summary.errored += trial.state == "ERROR" ? 1 : 0;
      summary.invalid += trial.state == "INVALID" ? 1 : 0;
    }
    summary.checkpoint_dir = detail::checkpoint_root(dir, record);
  }
  if (options.plot) {
    try {
      const auto reread = detail::read_experiment_record(dir);
      plot_metrics(
          detail::experiment_curves(dir, reread), dir / "plot.svg",
          {.title = "experiment " + std::to_string(reread.id) + ": " + reread.config_file});
      summary.plot = dir / "plot.svg";
    } catch (const Error& error) {
      summary.plot_error = error.what();
    }
  }
  return summary;
}

ExperimentSummary create_experiment(const std::filesystem::path& config_file,
                                    std::filesystem::path dir, const ExperimentOptions& options) {
  ExperimentConfig config = load_experiment_config(config_file);
  if (options.test) config = make_test_config(std::move(config));
  if (!has_trial(config.entrypoint)) {
    std::string known;
    for (const auto& name : registered_trials())
      known += (known.empty() ? "" : ", ") + name;
    throw ConfigError("experiment config '" + config_file.string() +
                      "': entrypoint: expected "
                      "the name of a registered trial class but found '" +
                      config.entrypoint +
                      "' (registered: " + (known.empty() ? std::string("none") : known) + ")");
  }
  // A searcher the config cannot make (a grid without counts) is refused before any folder is.
  (void)make_searcher(config, config.experiment_seed.value_or(0));
  if (dir.empty()) dir = default_experiment_dir(config_file, options.test);
  const auto file = detail::experiment_file(dir);
  if (std::filesystem::exists(file)) {
    const auto existing = detail::read_experiment_record(dir);
    // The stored config read again, so that one written before a key gained a default compares
    // equal.
    const nlohmann::json stored =
        experiment_config_from_json(existing.raw, detail::experiment_file(dir).string()).raw;
    if (stored != config.raw || existing.test != options.test) {
      throw ConfigError("experiment folder '" + dir.string() + "': expected the experiment of '" +
                        config_file.string() + "'" + (options.test ? " (--test)" : "") +
                        " but found the experiment of '" + existing.config_file + "'" +
                        (existing.test ? " (--test)" : "") +
                        " with another configuration (run 'experiment resume " + dir.string() +
                        "' to continue it, or give this one another folder with --dir)");
    }
    if (options.out != nullptr) {
      *options.out << "experiment " << existing.id << " in '" << dir.string()
                   << "' already exists for this configuration: "
                   << (existing.state == "ACTIVE" || existing.state == "PAUSED"
                           ? "resuming it"
                           : "it is " + existing.state)
                   << std::endl;
    }
    return run_experiment(dir, options);
  }
  if (std::filesystem::exists(dir) && !std::filesystem::is_directory(dir)) {
    throw ConfigError("experiment folder '" + dir.string() +
                      "': expected a folder but found a file");
  }
  if (std::filesystem::exists(dir) && !std::filesystem::is_empty(dir)) {
    throw ConfigError("experiment folder '" + dir.string() +
                      "': expected a new or empty folder but found files and no experiment.json "
                      "(give the experiment another folder with --dir)");
  }
  std::filesystem::create_directories(dir);
  detail::ExperimentRecord record;
  std::random_device entropy;
  record.id = 1 + (static_cast<std::uint64_t>(entropy()) % 999999);
  // Determined: an unset experiment_seed is chosen when the experiment is created (the time);
  // here from the system's entropy source, once, and stored.
  record.seed = config.experiment_seed ? *config.experiment_seed
                                       : static_cast<std::uint32_t>(entropy() & 0x7fffffffU);
  config.experiment_seed = record.seed;
  record.test = options.test;
  record.config_file = std::filesystem::absolute(config_file).lexically_normal().string();
  record.raw = config.raw;
  record.config = to_json(config);
  record.name = config.name;
  record.description = config.description;
  record.searcher_name = config.searcher.name;
  record.metric = config.searcher.metric;
  record.smaller_is_better = config.searcher.smaller_is_better;
  const auto& storage = config.checkpoint_storage;
  record.checkpoint_dir = storage.host_path.empty()
                              ? std::string("checkpoints")
                              : (std::filesystem::path(storage.host_path) / storage.storage_path)
                                    .lexically_normal()
                                    .string();
  // A warm start's checkpoint must exist before the first trial starts.
  if (const auto& uuid = config.searcher.source_checkpoint_uuid) {
    (void)detail::find_checkpoint(dir, record, *uuid);
  }
  detail::write_experiment_record(dir, record);
  if (options.out != nullptr) {
    *options.out << "experiment " << record.id << " created in '" << dir.string() << "' from '"
                 << config_file.string() << "' (searcher " << record.searcher_name << ", seed "
                 << record.seed << ")" << std::endl;
  }
  return run_experiment(dir, options);
}

void describe_experiment(const std::filesystem::path& dir, std::ostream& out,
                         const std::optional<std::filesystem::path>& plot) {
  detail::describe_experiment_to(dir, out);
  if (plot) {
    const auto record = detail::read_experiment_record(dir);
    plot_metrics(detail::experiment_curves(dir, record), *plot,
                 {.title = "experiment " + std::to_string(record.id) + ": " + record.config_file});
    out << "plot: " << plot->string() << "\n";
  }
}

void list_experiments(const std::filesystem::path& root, std::ostream& out) {
  if (!std::filesystem::exists(root)) {
    out << "no experiments in '" << root.string() << "' (no such folder)\n";
    return;
  }
  const auto listings = detail::list_experiment_folders(root);
  if (listings.empty()) {
    out << "no experiments in '" << root.string() << "'\n";
    return;
  }
  for (const auto& listing : listings) {
    out << listing.dir.string() << "  id " << listing.id << "  " << listing.state << "  "
        << listing.searcher << "  " << listing.trials
        << (listing.trials == 1 ? " trial" : " trials");
    if (!listing.name.empty()) out << "  " << listing.name;
    if (!listing.description.empty()) out << "  " << listing.description;
    out << "\n";
  }
}

std::shared_ptr<detail::LoaderProcess> start_training_loader_process(
    const std::filesystem::path& dir, std::uint64_t trial_id, bool test) {
  const auto place = dist::ranks_from_environment();
  if (!place || (*place)[1] <= 1) return nullptr;
  return detail::LoaderProcess::start([&]() -> std::optional<keras::DataIterator> {
    auto record = detail::read_experiment_record(dir);
    const detail::TrialRecord* trial = record.find_trial(trial_id);
    if (trial == nullptr) return std::nullopt;
    const ExperimentConfig config =
        experiment_config_from_json(record.config, detail::experiment_file(dir).string());
    TrialSpec spec = detail::trial_spec(dir, record, config, *trial);
    if (test) spec.config = detail::test_overrides(std::move(spec.config));
    const auto& [rank, size, local_rank, local_size] = *place;
    TrialContext context(
        spec.config, spec.hparams, spec.trial_id, spec.trial_seed, spec.experiment_id,
        std::make_shared<dist::UnconnectedCollective>(rank, size, local_rank, local_size));
    keras::set_random_seed(spec.trial_seed);
    auto made = make_trial(spec.config.entrypoint, context);
    const DataLoader training = made->build_training_data_loader();
    const keras::DataIteratorOptions options = context.data_options();
    if (!training.forks_processes(options)) return std::nullopt;
    return training.training(options);
  });
}

int run_trial_of_experiment(const std::filesystem::path& dir, std::uint64_t trial_id,
                            const Length& until, bool test, bool verbose,
                            std::shared_ptr<dist::Collective> ranks,
                            std::shared_ptr<detail::LoaderProcess> loader) {
  const auto folder = detail::trial_dir(dir, trial_id);
  nlohmann::json result;
  int status = 0;
  try {
    const auto record = detail::read_experiment_record(dir);
    auto copy = record;
    const detail::TrialRecord* trial = copy.find_trial(trial_id);
    if (trial == nullptr) {
      throw ConfigError("experiment '" + dir.string() + "': expected a trial " +
                        std::to_string(trial_id) + " but found none");
    }
    const ExperimentConfig config =
        experiment_config_from_json(record.config, detail::experiment_file(dir).string());
    RunOptions run;
    run.until = until;
    run.test = test;
    run.verbose = verbose;
    TrialSpec spec = detail::trial_spec(dir, record, config, *trial);
    spec.collective = ranks;
    spec.training_process = loader;
    result = detail::result_to_json(run_trial(spec, run));
  } catch (const InvalidHP& error) {
    result = {{"ok", false}, {"invalid_hp", true}, {"error", error.what()}};
    std::cerr << "trial " << trial_id << ": invalid hyperparameters: " << error.what() << std::endl;
    status = 1;
  } catch (const std::exception& error) {
    result = {{"ok", false}, {"error", error.what()}};
    std::cerr << "trial " << trial_id << ": " << error.what() << std::endl;
    status = 1;
  }
  if (ranks && ranks->rank() != 0) return status;
  std::filesystem::create_directories(folder);
  keras::detail::write_atomically(folder / "result.json", result.dump(2) + "\n");
  return status;
}

}  // namespace loadstar::trial
#endif
