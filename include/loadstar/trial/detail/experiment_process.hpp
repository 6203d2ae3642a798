/// \file
/// Child processes for experiments: a trial run in its own process (so that a crash takes down
/// that trial only), and a helper program (gnuplot) fed a script on its standard input.
#pragma once

#include "loadstar/config.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar::trial::detail {

/// The full path of `program` found on `PATH` (or `program` itself when it holds a `/` and is
/// executable); empty when there is none.
LOADSTAR_DECL std::filesystem::path find_program(const std::string& program);

/// A description of how a child ended, from a `waitpid` status: `exit status 3`,
/// `killed by signal 9 (Killed)`.
LOADSTAR_DECL std::string describe_status(int status);

/// A `char*` argument vector over `arguments`, ended by a null pointer, for `execv`.
LOADSTAR_DECL std::vector<char*> argument_pointers(std::vector<std::string>& arguments);

/// Starts `arguments[0]` with `arguments` as a child whose standard output and error go to
/// `log` (appended) and that is killed when this process dies (`PR_SET_PDEATHSIG`), so that a
/// killed experiment leaves no trial running on behind it; returns its pid. Throws `IoError`.
LOADSTAR_DECL ::pid_t spawn_logged(std::vector<std::string> arguments,
                                   const std::filesystem::path& log);

/// The output of a helper program run to its end.
struct ProgramResult {
  int status = 0;
  std::string output;  ///< standard output and error together
};

/// Runs `arguments` (`arguments[0]` a full path) with `input` on its standard input and waits for
/// it; its standard output and error are collected. Throws `IoError` when it cannot be started.
LOADSTAR_DECL ProgramResult run_program(std::vector<std::string> arguments, std::string_view input);

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

std::filesystem::path find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return ::access(program.c_str(), X_OK) == 0 ? std::filesystem::path(program)
                                                : std::filesystem::path();
  }
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const auto colon = rest.find(':');
    const std::string folder(rest.substr(0, colon));
    const std::filesystem::path candidate =
        std::filesystem::path(folder.empty() ? "." : folder) / program;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
    if (colon == std::string_view::npos) return {};
    rest.remove_prefix(colon + 1);
  }
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    return "killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  }
  return "status " + std::to_string(status);
}

std::vector<char*> argument_pointers(std::vector<std::string>& arguments) {
  std::vector<char*> pointers;
  pointers.reserve(arguments.size() + 1);
  for (auto& argument : arguments)
    pointers.push_back(argument.data());
  pointers.push_back(nullptr);
  return pointers;
}

::pid_t spawn_logged(std::vector<std::string> arguments, const std::filesystem::path& log) {
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw IoError("trial log '" + log.string() + "': cannot open: " + std::strerror(errno));
  }
  const ::pid_t parent = ::getpid();
  auto pointers = argument_pointers(arguments);
  const ::pid_t pid = ::fork();
  if (pid < 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw IoError("trial process '" + arguments[0] + "': cannot fork: " + why);
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before the prctl
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(pointers[0], pointers.data());
    const char message[] = "cannot execute the trial process\n";
    [[maybe_unused]] const auto written = ::write(STDERR_FILENO, message, sizeof message - 1);
    ::_exit(127);
  }
  ::close(fd);
  return pid;
}

ProgramResult run_program(std::vector<std::string> arguments, std::string_view input) {
  int to_child[2];
  int from_child[2];
  if (::pipe2(to_child, O_CLOEXEC) != 0) {
    throw IoError("'" + arguments[0] + "': cannot create a pipe: " + std::strerror(errno));
  }
  if (::pipe2(from_child, O_CLOEXEC) != 0) {
    const std::string why = std::strerror(errno);
    ::close(to_child[0]);
    ::close(to_child[1]);
    throw IoError("'" + arguments[0] + "': cannot create a pipe: " + why);
  }
  auto pointers = argument_pointers(arguments);
  const ::pid_t pid = ::fork();
  if (pid < 0) {
    const std::string why = std::strerror(errno);
    for (const int fd : {to_child[0], to_child[1], from_child[0], from_child[1]})
      ::close(fd);
    throw IoError("'" + arguments[0] + "': cannot fork: " + why);
  }
  if (pid == 0) {
    ::dup2(to_child[0], STDIN_FILENO);
    ::dup2(from_child[1], STDOUT_FILENO);
    ::dup2(from_child[1], STDERR_FILENO);
    ::execv(pointers[0], pointers.data());
    ::_exit(127);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  // The script is small (a few hundred kilobytes at most) but gnuplot may answer before reading
  // it all, so a failed write (EPIPE) is not an error here: the exit status says what happened.
  const auto previous_handler = ::signal(SIGPIPE, SIG_IGN);
  std::size_t done = 0;
  while (done < input.size()) {
    const ::ssize_t n = ::write(to_child[1], input.data() + done, input.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::close(to_child[1]);
  ::signal(SIGPIPE, previous_handler);
  ProgramResult result;
  char buffer[4096];
  while (true) {
    const ::ssize_t n = ::read(from_child[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(from_child[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = status;
  return result;
}

}  // namespace loadstar::trial::detail
#endif
