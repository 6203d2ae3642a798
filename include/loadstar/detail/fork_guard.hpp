/// \file
/// The process-wide record of a library that forbids `fork()` in this process (Open MPI after
/// `MPI_Init`), read by the parts of loadstar that fork worker processes.
#pragma once

#include <atomic>
#include <string>

#include "loadstar/error.hpp"

namespace loadstar::detail {

/// Null, or what forbids forking (`"Open MPI (MPI_Init has run in this process)"`); set and
/// cleared by the transport that forbids it (`dist::MpiCollective`).
inline std::atomic<const char*>& fork_forbidden_by() noexcept {
  static std::atomic<const char*> reason{nullptr};
  return reason;
}

/// Throws `ConfigError` naming `what` would fork and why it may not, when forking is forbidden.
inline void require_fork_allowed(const std::string& what) {
  if (const char* reason = fork_forbidden_by().load()) {
    throw ConfigError(what + ": cannot fork worker processes here: " + reason +
                      " and a process that has initialised MPI must not fork (Open MPI is not "
                      "fork-safe); use worker threads (use_multiprocessing = false)");
  }
}

}  // namespace loadstar::detail
