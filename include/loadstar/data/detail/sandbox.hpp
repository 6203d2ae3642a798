/// \file
/// `run_sandboxed`: runs a parser in a forked child process, so that a crash inside a third-party
/// library fed a hostile file (libhdf5 dereferencing a corrupt address) becomes a `FormatError`
/// instead of taking the process down.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
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

/// The outcome a child reports for the exception in flight.
inline std::pair<SandboxOutcome, std::string> classify_sandboxed_exception() {
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
    return {SandboxOutcome::format_error, "out of memory"};
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

/// Runs `body` in a forked child and returns the string it returns. A `loadstar::Error` the
/// child throws is thrown again here with the same type and message; a child that dies (a
/// signal, an exit without a report) throws `FormatError` naming `object`, the signal or exit
/// status and `doing`.
///
/// `lock` makes forking safe: it is held across the fork, so that no other thread is inside the
/// library the child uses (the HDF5 readers pass `hdf5_mutex()`), then unlocked in the parent
/// while the child works, and merely forgotten by the child, which must not take it again (its
/// owner is a thread of the parent). The child leaves through `_exit`, running no destructor or
/// `atexit` handler of the parent's objects. A child that never ends keeps the caller waiting: HDF5
/// loops forever on no file we know of, and a deadline would make results depend on the machine's
/// load.
template <class Mutex, class Body>
std::string run_sandboxed(const std::string& object, const std::string& doing, Mutex& mutex,
                          Body&& body) {
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
    // Die of the signal itself, quietly: a handler the parent installed (a test framework's crash
    // report, a sanitizer's) would report the parent's state, not the file's.
    for (const int fatal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
      ::signal(fatal, SIG_DFL);
    std::string report;
    try {
      std::string result = body();
      report.reserve(result.size() + 1);
      report.push_back(static_cast<char>(SandboxOutcome::ok));
      report += result;
    } catch (...) {
      auto [outcome, message] = classify_sandboxed_exception();
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
  std::string report;
  char buffer[4096];
  for (;;) {
    const ssize_t got = ::read(pipe_fds[0], buffer, sizeof buffer);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    report.append(buffer, static_cast<std::size_t>(got));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      throw IoError(object + ": cannot wait for sandbox process " + std::to_string(pid) + " (" +
                    std::strerror(errno) + ")");
    }
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
