/// \file
/// `loadstar::trial::main`: Determined's experiment commands for a user's own binary, the way
/// `BENCHMARK_MAIN` gives Google Benchmark's command line to a benchmark.
/// \code
/// // model_def.cpp
/// class FashionMNISTTrial : public loadstar::trial::KerasTrial { ... };
/// LOADSTAR_REGISTER_TRIAL(FashionMNISTTrial, "model_def:FashionMNISTTrial");
/// LOADSTAR_TRIAL_MAIN();
/// \endcode
/// \code{.sh}
/// ./fashion_mnist_trial experiment create const.yaml          # runs it, prints where it wrote
/// ./fashion_mnist_trial experiment create const.yaml --test   # one batch, one validation batch
/// ./fashion_mnist_trial experiment resume experiments/const   # after an interruption
/// ./fashion_mnist_trial experiment pause experiments/const    # checkpoint, exit; resume later
/// ./fashion_mnist_trial experiment kill experiments/const     # stop without a checkpoint
/// ./fashion_mnist_trial experiment list
/// ./fashion_mnist_trial experiment describe experiments/const --plot curves.png
/// \endcode
#pragma once

#include "loadstar/config.hpp"

#include <cstdint>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#if defined(LOADSTAR_WITH_MPI)
#include "loadstar/dist/mpi.hpp"
#endif
#include "loadstar/trial/detail/experiment_record.hpp"
#include "loadstar/trial/experiment.hpp"

namespace loadstar::trial {

namespace detail {

/// `{"batches": 10}` (what the experiment passes to `trial run --until`) as a `Length`.
LOADSTAR_DECL Length parse_length_argument(const std::string& text);

/// The lines `experiment create` and `resume` end with: the state and where the checkpoints,
/// the metrics and the plot are.
LOADSTAR_DECL void print_summary(const ExperimentSummary& summary, std::ostream& out);

}  // namespace detail

/// Determined's commands (`experiment create CONFIG [--dir DIR] [--test]`, `experiment resume
/// DIR`, `experiment pause DIR`, `experiment kill DIR`, `experiment list [ROOT]`, `experiment
/// describe DIR [--plot FILE]`) over the trial classes registered in this binary. SIGTERM or
/// SIGINT during `create` or `resume` pauses the experiment (`experiment pause` sends it):
/// every trial checkpoints at its next workload boundary and exits, and `resume` continues it.
/// Returns the exit status: 0, 1 for a failure (the message on standard error), 2 for a mistake
/// in the command line, 3 for an experiment paused or killed.
inline int main(int argc, char** argv) {
  const std::string program =
      argc > 0 ? std::filesystem::path(argv[0]).filename().string() : "trial";
  CLI::App app{"Run Determined-style experiments of the trial classes built into this program.",
               program};
  app.require_subcommand(1);
  auto* experiment =
      app.add_subcommand("experiment", "Create, resume, list and describe experiments");
  experiment->require_subcommand(1);

  std::filesystem::path config_file;
  std::filesystem::path dir;
  bool test = false;
  bool no_plot = false;
  auto* create = experiment->add_subcommand(
      "create", "Create the experiment of CONFIG and run it (resumes it when DIR holds it)");
  create->add_option("CONFIG", config_file, "Experiment configuration (.yaml)")->required();
  create->add_option("--dir", dir, "Experiment folder (default: experiments/<CONFIG's stem>)");
  create->add_flag("--test", test,
                   "Determined's test mode: train one batch, validate one batch, checkpoint");
  create->add_flag("--no-plot", no_plot, "Do not draw plot.svg at the end");

  std::filesystem::path resume_dir;
  auto* resume = experiment->add_subcommand("resume", "Resume the experiment in DIR where it was");
  resume->add_option("DIR", resume_dir, "Experiment folder")->required();
  resume->add_flag("--no-plot", no_plot, "Do not draw plot.svg at the end");

  std::filesystem::path pause_dir;
  auto* pause = experiment->add_subcommand(
      "pause", "Ask the process running the experiment in DIR to checkpoint its trials and stop");
  pause->add_option("DIR", pause_dir, "Experiment folder")->required();

  std::filesystem::path kill_dir;
  auto* kill = experiment->add_subcommand(
      "kill", "Ask the process running the experiment in DIR to stop it without checkpoints");
  kill->add_option("DIR", kill_dir, "Experiment folder")->required();

  std::filesystem::path root = "experiments";
  auto* list = experiment->add_subcommand("list", "List the experiments under ROOT");
  list->add_option("ROOT", root, "Folder holding experiment folders (default: experiments)");

  std::filesystem::path describe_dir;
  std::filesystem::path plot;
  auto* describe = experiment->add_subcommand(
      "describe", "Print the trials of the experiment in DIR and optionally plot its curves");
  describe->add_option("DIR", describe_dir, "Experiment folder")->required();
  describe->add_option("--plot", plot, "Draw the training and validation curves (.svg or .png)");

  // Hidden: how an experiment runs one trial in a process of its own.
  auto* trial_cmd = app.add_subcommand("trial", "Run one trial of an experiment")->group("");
  trial_cmd->require_subcommand(1);
  std::filesystem::path run_dir;
  std::uint64_t trial_id = 0;
  std::string until;
  bool run_test = false;
  auto* run = trial_cmd->add_subcommand("run", "Run a trial until a length");
  run->add_option("DIR", run_dir, "Experiment folder")->required();
  run->add_option("ID", trial_id, "Trial id")->required();
  run->add_option("--until", until, "Length, as JSON: {\"batches\": 10}")->required();
  run->add_flag("--test", run_test, "Determined's test mode");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }

  const auto status_of = [](const ExperimentSummary& summary) {
    if (summary.state == "COMPLETED") return 0;
    return summary.state == "PAUSED" || summary.state == "KILLED" ? 3 : 1;
  };
  try {
    if (create->parsed() || resume->parsed() || run->parsed()) {
      detail::install_interruption_handlers();
    }
    if (pause->parsed() || kill->parsed()) {
      const auto& target = pause->parsed() ? pause_dir : kill_dir;
      signal_experiment(target,
                        pause->parsed() ? detail::interruption_pause : detail::interruption_kill);
      std::cout << "asked the process running '" << target.string() << "' to "
                << (pause->parsed() ? "pause" : "kill") << " it\n";
      return 0;
    }
    if (create->parsed()) {
      ExperimentOptions options;
      options.test = test;
      options.plot = !no_plot;
      const auto summary = create_experiment(config_file, dir, options);
      detail::print_summary(summary, std::cout);
      return status_of(summary);
    }
    if (resume->parsed()) {
      ExperimentOptions options;
      options.plot = !no_plot;
      options.test = detail::read_experiment_record(resume_dir).test;
      const auto summary = run_experiment(resume_dir, options);
      detail::print_summary(summary, std::cout);
      return status_of(summary);
    }
    if (list->parsed()) {
      list_experiments(root, std::cout);
      return 0;
    }
    if (describe->parsed()) {
      describe_experiment(describe_dir, std::cout,
                          plot.empty() ? std::nullopt : std::optional<std::filesystem::path>(plot));
      return 0;
    }
    if (run->parsed()) {
      std::shared_ptr<dist::Collective> ranks;
      std::shared_ptr<detail::LoaderProcess> loader;
#if defined(LOADSTAR_WITH_MPI)
      // Started by mpirun (a trial of several slots): fork the loader process while no MPI is
      // initialised, then join the job.
      if (dist::started_by_mpirun()) {
        loader = start_training_loader_process(run_dir, trial_id, run_test);
        ranks = dist::mpi_world(&argc, &argv);
      }
#endif
      return run_trial_of_experiment(run_dir, trial_id, detail::parse_length_argument(until),
                                     run_test, true, ranks, loader);
    }
  } catch (const std::exception& error) {
    std::cout.flush();
    std::cerr << program << ": error: " << error.what() << std::endl;
    return 1;
  }
  return 2;
}

}  // namespace loadstar::trial

/// Defines `main` as `loadstar::trial::main`, for a binary of trial classes:
/// `LOADSTAR_TRIAL_MAIN();` after their `LOADSTAR_REGISTER_TRIAL`s.
#define LOADSTAR_TRIAL_MAIN()                   \
  int main(int argc, char** argv) {             \
    return ::loadstar::trial::main(argc, argv); \
  }                                             \
  static_assert(true, "LOADSTAR_TRIAL_MAIN() is used with a semicolon")

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

Length parse_length_argument(const std::string& text) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    json = nullptr;
  }
  if (!json.is_object() || json.size() != 1 || !length_unit_from_name(json.begin().key()) ||
      !json.begin()->is_number_unsigned()) {
    throw ConfigError("--until: expected a length like {\"batches\": 10} but found '" + text + "'");
  }
  return {*length_unit_from_name(json.begin().key()), json.begin()->get<std::uint64_t>()};
}

void print_summary(const ExperimentSummary& summary, std::ostream& out) {
  out << "\nexperiment " << summary.id << " in '" << summary.dir.string() << "': " << summary.state
      << " (" << summary.trials << (summary.trials == 1 ? " trial: " : " trials: ")
      << summary.completed << " completed, " << summary.errored << " failed"
      << (summary.invalid != 0 ? ", " + std::to_string(summary.invalid) + " invalid" : "") << ")\n";
  out << "  checkpoints: " << summary.checkpoint_dir.string() << "\n";
  const auto record = read_experiment_record(summary.dir);
  if (record.trials.size() == 1) {
    out << "  metrics:     "
        << (trial_dir(summary.dir, record.trials.front().id) / "metrics.jsonl").string() << "\n";
  } else {
    out << "  metrics:     " << (summary.dir / "trials" / "<id>" / "metrics.jsonl").string()
        << "\n";
  }
  if (!summary.plot.empty()) {
    out << "  plot:        " << summary.plot.string() << "\n";
  } else if (!summary.plot_error.empty()) {
    out << "  plot:        not drawn (" << summary.plot_error << ")\n";
  }
  out << "  describe:    experiment describe " << summary.dir.string() << "\n";
  if (summary.state == "PAUSED") {
    out << "  resume:      experiment resume " << summary.dir.string() << "\n";
  }
}

}  // namespace loadstar::trial::detail
#endif
