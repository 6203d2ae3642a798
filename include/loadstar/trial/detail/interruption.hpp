/// \file
/// What a scheduler's signal asks of an experiment or a trial in this process: SIGTERM and
/// SIGINT (Slurm, Kubernetes, Ctrl-C) ask to pause, SIGUSR2 (`experiment kill`) to stop without
/// a checkpoint. The handlers only set a flag; the experiment and the trial read it where they
/// can stop cleanly (a trial of one process between two batches, the ranks of a distributed trial
/// together at a workload boundary).
#pragma once

#include "loadstar/config.hpp"

#include <csignal>

namespace loadstar::trial::detail {

/// What was asked: nothing, a pause (checkpoint and exit, resumable) or a kill (exit now).
enum Interruption : int { interruption_none = 0, interruption_pause = 1, interruption_kill = 2 };

/// Set by the signal handlers, read by the experiment loop and the trial controller.
inline volatile std::sig_atomic_t interruption_flag = interruption_none;

inline void on_pause_signal(int /*signal*/) {
  if (interruption_flag != interruption_kill) interruption_flag = interruption_pause;
}

inline void on_kill_signal(int /*signal*/) {
  interruption_flag = interruption_kill;
}

/// The interruption asked so far.
inline Interruption interruption() {
  return static_cast<Interruption>(static_cast<int>(interruption_flag));
}

/// Installs the handlers: SIGTERM and SIGINT pause, SIGUSR2 kills. Without `SA_RESTART`, so that
/// a wait returns (`EINTR`) and its caller reads the flag.
inline void install_interruption_handlers() {
  struct sigaction pause_action {};
  pause_action.sa_handler = on_pause_signal;
  sigemptyset(&pause_action.sa_mask);
  ::sigaction(SIGTERM, &pause_action, nullptr);
  ::sigaction(SIGINT, &pause_action, nullptr);
  struct sigaction kill_action {};
  kill_action.sa_handler = on_kill_signal;
  sigemptyset(&kill_action.sa_mask);
  ::sigaction(SIGUSR2, &kill_action, nullptr);
}

}  // namespace loadstar::trial::detail
