// Runs the runner's helper process, killing it with SIGKILL after a number of reported batches
// and a delay, and reruns it until it finishes: shared by the kill test and its longer benchmark.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <loadstar/keras.hpp>
#include <loadstar/random.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace kill_harness {

/// The helper executable, from the environment meson sets.
inline std::string child_path() {
  const char* path = std::getenv("LOADSTAR_TRIAL_RUNNER_CHILD");
  return path ? path : "";
}

struct ChildResult {
  bool killed = false;
  bool exited_ok = false;
  std::size_t batches = 0;
};

/// Runs the helper on `dir` with `loader`; with `kill_after` batches reported, waits `delay` then
/// kills it with SIGKILL (if it is still running).
inline ChildResult run_child(const std::filesystem::path& dir, const std::string& loader,
                             std::size_t kill_after, std::chrono::microseconds delay) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const std::string exe = child_path();
  const std::string trial_dir = (dir / "trial").string();
  const std::string checkpoint_dir = (dir / "checkpoints").string();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    char* args[] = {const_cast<char*>(exe.c_str()), const_cast<char*>(trial_dir.c_str()),
                    const_cast<char*>(checkpoint_dir.c_str()), const_cast<char*>(loader.c_str()),
                    nullptr};
    ::execv(exe.c_str(), args);
    ::_exit(127);
  }
  ::close(fds[1]);
  ChildResult result;
  std::string pending;
  char buffer[4096];
  bool sent = false;
  while (!sent) {
    const ::ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<std::size_t>(n));
    for (std::size_t end; (end = pending.find('\n')) != std::string::npos;) {
      if (pending.compare(0, 5, "batch") == 0) ++result.batches;
      pending.erase(0, end + 1);
    }
    if (kill_after != 0 && result.batches >= kill_after) {
      std::this_thread::sleep_for(delay);
      ::kill(pid, SIGKILL);
      sent = true;  // stop reading: forked loader workers may hold the pipe open a moment
    }
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  result.exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return result;
}

inline std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// The final weights of the trial in `dir` (its latest checkpoint, read with `load_model`).
inline std::string final_weights(const std::filesystem::path& dir) {
  const auto record = nlohmann::json::parse(file_bytes(dir / "trial" / "trial.json"));
  const auto uuid = record.at("latest_checkpoint").get<std::string>();
  auto model =
      loadstar::keras::load_model(dir / "checkpoints" / uuid / "determined-keras-model.h5");
  std::string out;
  for (const auto& w : model->get_weights())
    out.append(reinterpret_cast<const char*>(w.data()), w.size() * sizeof(float));
  return out;
}

struct KillRun {
  std::size_t kills = 0;
  std::size_t runs = 0;
  bool finished = false;
};

/// Runs the helper in `dir` until it finishes, killing the first `max_kills` runs after 1 to
/// `spread` batches and up to 3 ms more (landing in a batch, a validation or a checkpoint write).
/// The runs after the first are killed within a third of `spread`: a resumed run has at least
/// the batches after the first kill's last checkpoint left, so the second kill lands however
/// late the first did (a loaded machine moves where a kill lands).
inline KillRun kill_until_done(const std::filesystem::path& dir, const std::string& loader,
                               loadstar::SplitMix64& rng, std::size_t max_kills,
                               std::size_t spread = 30) {
  KillRun run;
  while (run.runs < max_kills + 20) {
    ++run.runs;
    const bool kill = run.kills < max_kills;
    const std::size_t window = run.kills == 0 ? spread : std::max<std::size_t>(spread / 3, 1);
    const std::size_t after = kill ? 1 + rng.below(window) : 0;
    const auto delay = std::chrono::microseconds(rng.below(3000));
    const ChildResult r = run_child(dir, loader, after, delay);
    if (r.exited_ok) {
      run.finished = true;
      break;
    }
    if (!r.killed) break;
    ++run.kills;
  }
  return run;
}

}  // namespace kill_harness
