/// \file
/// `run_sandboxed`: runs a parser in a forked child process, so that a crash inside a third-party
/// library fed a hostile file (libhdf5 dereferencing a corrupt address) becomes a `FormatError`
/// instead of taking the process down.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "loadstar/error.hpp"

namespace loadstar::detail {

/// Which `loadstar::Error` a sandboxed child threw, sent as the first byte of its report.
enum class SandboxOutcome : unsigned char {
  ok = 0,
  format_error,
  io_error,
  shape_error,
  config_error,
  other_error,
};

inline void rethrow_sandboxed_error(SandboxOutcome outcome, const std::string& message) {
  switch (outcome) {
    case SandboxOutcome::io_error:
      throw IoError(message);
    case SandboxOutcome::shape_error:
      throw ShapeError(message);
    case SandboxOutcome::config_error:
      throw ConfigError(message);
    case SandboxOutcome::format_error:
      throw FormatError(message);
    default:
      throw Error(message);
  }
}

/// The outcome a child reports for the exception in flight; running out of memory is named as
/// `object` running out while `doing`.
inline std::pair<SandboxOutcome, std::string> classify_sandboxed_exception(
    const std::string& object, const std::string& doing) {
  try {
    throw;
  } catch (const FormatError& e) {
    return {SandboxOutcome::format_error, e.what()};
  } catch (const IoError& e) {
    return {SandboxOutcome::io_error, e.what()};
  } catch (const ShapeError& e) {
    return {SandboxOutcome::shape_error, e.what()};
  } catch (const ConfigError& e) {
    return {SandboxOutcome::config_error, e.what()};
  } catch (const Error& e) {
    return {SandboxOutcome::other_error, e.what()};
  } catch (const std::bad_alloc&) {
    return {SandboxOutcome::format_error, object + ": out of memory " + doing};
  } catch (const std::exception& e) {
    return {SandboxOutcome::format_error, e.what()};
  } catch (...) {
    return {SandboxOutcome::format_error, "unknown exception"};
  }
}

/// `"SIGSEGV"`: a signal's name for messages.
inline std::string sandbox_signal_name(int signal) {
  const char* abbreviation = ::sigabbrev_np(signal);
  return abbreviation != nullptr ? std::string("SIG") + abbreviation
                                 : "signal " + std::to_string(signal);
}

/// `pidfd_open(2)`: a descriptor that becomes readable when the process exits, or -1 where the
/// kernel lacks it (before Linux 5.3).
inline int open_pidfd(pid_t pid) noexcept {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

/// Gives a forked child the signal state of a new process: every disposition the parent set (a
/// test framework's crash report, a fuzzer's or a server's `SIGALRM` handler, an ignored signal)
/// back to its default, nothing blocked, and `SIGKILL` when the parent dies.
inline void reset_child_signals() noexcept {
  for (int signal = 1; signal < NSIG; ++signal) {
    if (signal != SIGKILL && signal != SIGSTOP) ::signal(signal, SIG_DFL);
  }
  sigset_t none;
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
}

/// `"250 ms"`, `"2.5 s"`, `"120 s"`: a deadline for messages.
inline std::string sandbox_seconds(std::chrono::milliseconds deadline) {
  const auto ms = deadline.count();
  if (ms < 1000) return std::to_string(ms) + " ms";
  return std::to_string(ms / 1000) +
         (ms % 1000 >= 100 ? "." + std::to_string(ms % 1000 / 100) : "") + " s";
}

/// Runs `body` in a forked child and returns the string it returns. A `loadstar::Error` the
/// child throws is thrown again here with the same type and message; a child that dies (a
/// signal, an exit without a report) throws `FormatError` naming `object`, the signal or exit
/// status and `doing`.
///
/// `lock` makes forking safe: it is held across the fork, so that no other thread is inside the
/// library the child uses (the HDF5 readers pass `hdf5_mutex()`), then unlocked in the parent
/// while the child works, and merely forgotten by the child, which must not take it again (its
/// owner is a thread of the parent). The child starts with every signal at its default and
/// none blocked, and leaves through `_exit`, running no destructor or `atexit` handler of the
/// parent's objects.
///
/// `deadline` (zero: none; negative: `ConfigError`) is kept by this process, not the child: a child
/// still working when it passes (libhdf5 loops forever on some corrupt global heaps) is killed with
/// `SIGKILL` and a `FormatError` names the deadline; nothing the child or the caller does with
/// signals can defeat it.
template <class Mutex, class Body>
std::string run_sandboxed(const std::string& object, const std::string& doing, Mutex& mutex,
                          Body&& body,
                          std::chrono::milliseconds deadline = std::chrono::milliseconds::zero()) {
  if (deadline < std::chrono::milliseconds::zero()) {
    throw ConfigError(object + ": sandbox_deadline should be zero (none) or positive but is " +
                      std::to_string(deadline.count()) + " ms");
  }
  std::unique_lock<Mutex> lock(mutex);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    throw IoError(object + ": cannot create a pipe to a sandbox process (" + std::strerror(errno) +
                  ")");
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    throw IoError(object + ": cannot fork a sandbox process (" + std::strerror(error) + ")");
  }
  if (pid == 0) {
    lock.release();
    ::close(pipe_fds[0]);
    // Die of a signal itself, quietly: a handler the parent installed would report the parent's
    // state, not the file's.
    reset_child_signals();
    std::string report;
    try {
      std::string result = body();
      report.reserve(result.size() + 1);
      report.push_back(static_cast<char>(SandboxOutcome::ok));
      report += result;
    } catch (...) {
      auto [outcome, message] = classify_sandboxed_exception(object, doing);
      report.clear();
      report.push_back(static_cast<char>(outcome));
      report += message;
    }
    const char* cursor = report.data();
    std::size_t left = report.size();
    while (left > 0) {
      const ssize_t written = ::write(pipe_fds[1], cursor, left);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) ::_exit(3);
      cursor += written;
      left -= static_cast<std::size_t>(written);
    }
    ::_exit(0);
  }
  lock.unlock();
  ::close(pipe_fds[1]);
  // The report is read as it comes (it may be larger than the pipe holds) until the pipe ends or
  // the child exits (another thread's child may hold a copy of the pipe's write end), or until
  // the deadline.
  const int pidfd = open_pidfd(pid);
  ::fcntl(pipe_fds[0], F_SETFL, ::fcntl(pipe_fds[0], F_GETFL) | O_NONBLOCK);
  const auto started = std::chrono::steady_clock::now();
  std::string report;
  bool late = false;
  const auto drain = [&]() -> bool {  // false once the pipe has ended
    char buffer[4096];
    for (;;) {
      const ssize_t got = ::read(pipe_fds[0], buffer, sizeof buffer);
      if (got > 0) {
        report.append(buffer, static_cast<std::size_t>(got));
        continue;
      }
      if (got < 0 && errno == EINTR) continue;
      return got < 0 && errno == EAGAIN;
    }
  };
  for (;;) {
    int wait_ms = -1;
    if (deadline > std::chrono::milliseconds::zero()) {
      const auto left = deadline - std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::steady_clock::now() - started);
      if (left <= std::chrono::milliseconds::zero()) {
        late = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<std::chrono::milliseconds::rep>(left.count() + 1, 60000));
    }
    pollfd fds[2] = {{pipe_fds[0], POLLIN, 0}, {pidfd, POLLIN, 0}};  // -1 is ignored by poll
    const int ready = ::poll(fds, 2, wait_ms);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    if (!drain()) break;
    if ((fds[1].revents & POLLIN) != 0) {
      drain();
      break;
    }
  }
  ::close(pipe_fds[0]);
  if (late) ::kill(pid, SIGKILL);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      if (pidfd >= 0) ::close(pidfd);
      throw IoError(object + ": cannot wait for sandbox process " + std::to_string(pid) + " (" +
                    std::strerror(errno) + ")");
    }
  }
  if (pidfd >= 0) ::close(pidfd);
  if (late) {
    throw FormatError(object + ": corrupt or hostile file: the sandbox process " +
                      std::to_string(pid) + " " + doing + " did not finish within " +
                      sandbox_seconds(deadline) + " and was killed");
  }
  if (WIFSIGNALED(status)) {
    throw FormatError(object + ": corrupt or hostile file: the sandbox process " +
                      std::to_string(pid) + " " + doing + " was killed by " +
                      sandbox_signal_name(WTERMSIG(status)));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || report.empty()) {
    throw FormatError(object + ": corrupt or hostile file: the sandbox process " +
                      std::to_string(pid) + " " + doing + " exited with status " +
                      std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                      " without a result");
  }
  const auto outcome = static_cast<SandboxOutcome>(report[0]);
  if (outcome != SandboxOutcome::ok) rethrow_sandboxed_error(outcome, report.substr(1));
  return report.substr(1);
}

}  // namespace loadstar::detail
