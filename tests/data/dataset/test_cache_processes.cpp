// Cache builds across processes: a builder killed mid-build, and two builders at once. These
// fork, so they run in their own executable, outside the ThreadSanitizer suite.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <loadstar/data/dataset.hpp>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.hpp"
#include "test_helpers.hpp"

using test_support::TempDir;

namespace {

using test_support::drain;

std::vector<std::int64_t> iota64(std::int64_t n) {
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < n; ++i)
    out.push_back(i);
  return out;
}

// Elements that take a millisecond each, so that a build lasts long enough to be killed.
auto slow_range(std::int64_t n) {
  return loadstar::range(n).map([](std::int64_t i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return i;
  });
}

void touch(const std::filesystem::path& path) {
  std::ofstream(path) << "x";
}

bool wait_for_file(const std::filesystem::path& path, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Runs `body` in a child process; the child exits with 0 when it returns true.
template <class Body>
pid_t spawn(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 1;
    try {
      code = body() ? 0 : 2;
    } catch (...) {
      code = 3;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_exit_code(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void kill_and_reap(pid_t pid) {
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
}

}  // namespace

TEST_SUITE("dataset") {
  TEST_CASE("DataLayer cache_train_dataset survives a builder killed mid-build" *
            doctest::timeout(60)) {
    TempDir dir;
    const loadstar::DataLayer layer({.storage_path = dir.path()});
    const auto cache = dir / "slow/1_train.ldscache";
    const auto started = dir / "started";
    const pid_t child = spawn([&] {
      auto ds = layer.cache_train_dataset("slow", "1")([&] {
        touch(started);
        return slow_range(5000);
      });
      return ds.records() == 5000;
    });
    REQUIRE(wait_for_file(started, std::chrono::seconds(20)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill_and_reap(child);
    // The partial file was never renamed into place, and the dead builder's lock is gone.
    CHECK_FALSE(std::filesystem::exists(cache));
    CHECK(std::filesystem::exists(cache.string() + ".tmp." + std::to_string(child)));
    int builds = 0;
    auto ds = layer.cache_train_dataset("slow", "1")([&] {
      ++builds;
      return loadstar::range(300);
    });
    CHECK(builds == 1);
    CHECK(drain(ds) == iota64(300));
  }

  TEST_CASE("cache on disk survives a process killed while filling it" * doctest::timeout(60)) {
    TempDir dir;
    const auto path = dir / "rows.cache";
    const auto started = dir / "started";
    const pid_t child = spawn([&] {
      auto ds = slow_range(5000).cache(path);
      touch(started);
      return drain(ds).size() == 5000;
    });
    REQUIRE(wait_for_file(started, std::chrono::seconds(20)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    kill_and_reap(child);
    CHECK_FALSE(std::filesystem::exists(path));
    auto ds = loadstar::range(400).cache(path);
    CHECK(drain(ds) == iota64(400));
    CHECK(std::filesystem::exists(path));
    // A later run reads the finished file, not its upstream.
    auto later = loadstar::range(7).cache(path);
    CHECK(drain(later) == iota64(400));
  }

  TEST_CASE("DataLayer cache_train_dataset builds once for two processes at once" *
            doctest::timeout(60)) {
    TempDir dir;
    const loadstar::DataLayer layer({.storage_path = dir.path()});
    const auto log = dir / "builds.log";
    auto builder = [&] {
      auto ds = layer.cache_train_dataset("shared", "1")([&] {
        // One line per build, appended atomically.
        const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
        [[maybe_unused]] auto written = ::write(fd, "build\n", 6);
        ::close(fd);
        return slow_range(300);
      });
      return drain(ds) == iota64(300);
    };
    const pid_t first = spawn(builder);
    const pid_t second = spawn(builder);
    CHECK(wait_exit_code(first) == 0);
    CHECK(wait_exit_code(second) == 0);
    std::ifstream in(log);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);)
      lines.push_back(line);
    CHECK(lines.size() == 1);
  }
}
