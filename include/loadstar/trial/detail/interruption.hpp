/// \file
/// What a scheduler's signal asks of an experiment or a trial in this process: SIGTERM and
/// SIGINT (Slurm, Kubernetes, Ctrl-C) ask to pause, SIGUSR2 (`experiment kill`) to stop without
/// a checkpoint. The experiment and the trial read the request where they can stop cleanly (a
/// trial of one process between two batches, the ranks of a distributed trial together at a
/// workload boundary).
///
/// The signals are taken by one thread of their own, never by a thread that computes: the
/// process blocks them before it starts any other thread (which inherit the mask), and that
/// thread waits for them with `sigwait`. A signal delivered to a computing thread would be a
/// hazard: oneDNN's generated f32 GEMM kernels (Debian 12 ships oneDNN 2.6; the fix is in
/// oneDNN 3.11) point the stack pointer into a heap workspace while they run, so that the kernel
/// writes the signal's frame over the heap (uxlfoundation/oneDNN issue 4845). Children made by
/// `fork` unblock the signals again (`pthread_atfork`), so that loader workers and launched
/// trials receive them as before.
#pragma once

#include "loadstar/config.hpp"

#include <pthread.h>

#include <atomic>
#include <csignal>
#include <mutex>
#include <thread>

namespace loadstar::trial::detail {

/// What was asked: nothing, a pause (checkpoint and exit, resumable) or a kill (exit now).
enum Interruption : int { interruption_none = 0, interruption_pause = 1, interruption_kill = 2 };

/// Set where a signal is taken, read by the experiment loop and the trial controller.
inline std::atomic<int> interruption_flag{interruption_none};
static_assert(std::atomic<int>::is_always_lock_free, "the flag is written by signal handlers");

/// Records the request that `signal` makes (a pause never overrides a kill): the signal thread
/// calls it, and it is the handler of a signal that reaches a thread not blocking it (a thread
/// started before the installation, or a forked child).
inline void record_interruption(int signal) noexcept {
  if (signal == SIGUSR2) {
    interruption_flag.store(interruption_kill);
    return;
  }
  int none = interruption_none;
  interruption_flag.compare_exchange_strong(none, interruption_pause);
}

/// The interruption asked so far.
inline Interruption interruption() {
  return static_cast<Interruption>(interruption_flag.load());
}

/// SIGTERM, SIGINT and SIGUSR2.
inline sigset_t interruption_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  return set;
}

/// Runs in a child just made by `fork`: the signals reach it again.
inline void unblock_interruption_signals_in_child() {
  const sigset_t set = interruption_signals();
  ::pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

/// Installs the handlers and blocks the signals in the calling thread, then starts the thread
/// that takes them. Call it before the process starts other threads; it does its work once.
/// Without `SA_RESTART`, so that a wait in a thread that takes one by its handler returns
/// (`EINTR`) and its caller reads the flag.
inline void install_interruption_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_handler = record_interruption;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGTERM, &action, nullptr);
    ::sigaction(SIGINT, &action, nullptr);
    ::sigaction(SIGUSR2, &action, nullptr);
    const sigset_t set = interruption_signals();
    ::pthread_sigmask(SIG_BLOCK, &set, nullptr);
    ::pthread_atfork(nullptr, nullptr, unblock_interruption_signals_in_child);
    std::thread([set] {
      for (;;) {
        int signal = 0;
        if (::sigwait(&set, &signal) == 0) record_interruption(signal);
      }
    }).detach();
  });
}

}  // namespace loadstar::trial::detail
