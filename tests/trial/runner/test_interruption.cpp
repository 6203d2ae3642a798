// The scheduler's signals (SIGTERM, SIGINT, SIGUSR2) are taken by a thread of their own once a
// trial process installs its handlers: no computing thread runs a handler, so that none lands on
// the heap workspace oneDNN's generated GEMM kernels point the stack pointer at while they run.
// Each case runs in a child process, since the handlers and the mask are the process's.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <loadstar/keras/backend/cpu_backend.hpp>
#include <loadstar/trial/detail/interruption.hpp>
#include <thread>
#include <vector>

namespace interruption_test {

namespace td = loadstar::trial::detail;

/// Runs `body` in a child process and returns its exit status (-1 unless it exited).
template <class F>
int in_child(F body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status)
                           : -1 - (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

bool blocked_here(int signal) {
  sigset_t mask;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return sigismember(&mask, signal) == 1;
}

/// The first Dense layer of the Fashion-MNIST MLP, 32 x 784 times 784 x 128, on small integers
/// so that every sum is exact and each product is checked against a plain loop.
struct Product {
  static constexpr std::size_t m = 32, k = 784, n = 128;
  std::vector<float> a = std::vector<float>(m * k), b = std::vector<float>(k * n),
                     c = std::vector<float>(m * n), expected = std::vector<float>(m * n);
  Product() {
    for (std::size_t i = 0; i < a.size(); ++i)
      a[i] = static_cast<float>(static_cast<int>(i * 7 % 5) - 2);
    for (std::size_t i = 0; i < b.size(); ++i)
      b[i] = static_cast<float>(static_cast<int>(i * 3 % 5) - 2);
    for (std::size_t r = 0; r < m; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        float sum = 0;
        for (std::size_t p = 0; p < k; ++p)
          sum += a[r * k + p] * b[p * n + j];
        expected[r * n + j] = sum;
      }
  }
  bool run() {
    loadstar::keras::detail::sgemm(false, false, m, n, k, 1.0F, a.data(), k, b.data(), n, 0.0F,
                                   c.data(), n);
    return c == expected;
  }
};

}  // namespace interruption_test

TEST_SUITE("trial") {
  TEST_CASE("the interruption signals reach a thread of their own, not the computing threads") {
    using namespace interruption_test;
    const int status = in_child([] {
      td::install_interruption_handlers();
      if (!blocked_here(SIGTERM) || !blocked_here(SIGINT) || !blocked_here(SIGUSR2)) return 10;
      bool started_blocked = false;
      std::thread([&] { started_blocked = blocked_here(SIGTERM) && blocked_here(SIGUSR2); }).join();
      if (!started_blocked) return 11;
      // A burst of pauses while this thread multiplies in oneDNN's kernels: a handler run on it
      // would write its frame over the heap, and the products or the allocator would show it.
      std::atomic<bool> done{false};
      std::thread sender([&] {
        for (int i = 0; i < 3000 && !done.load(); ++i) {
          ::kill(::getpid(), SIGTERM);
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      });
      Product product;
      bool exact = true;
      for (int i = 0; i < 3000 && exact; ++i) {
        exact = product.run();
        std::vector<char> churn(64 + static_cast<std::size_t>(i % 512));  // the allocator's checks
        churn.back() = 1;
      }
      done.store(true);
      sender.join();
      if (!exact) return 12;
      const auto waited = std::chrono::steady_clock::now();
      while (td::interruption() != td::interruption_pause &&
             std::chrono::steady_clock::now() - waited < std::chrono::seconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (td::interruption() != td::interruption_pause) return 13;
      // A kill overrides the pause; a later pause does not override the kill.
      ::kill(::getpid(), SIGUSR2);
      while (td::interruption() != td::interruption_kill &&
             std::chrono::steady_clock::now() - waited < std::chrono::seconds(10))
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (td::interruption() != td::interruption_kill) return 14;
      ::kill(::getpid(), SIGINT);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (td::interruption() != td::interruption_kill) return 15;
      // A child made by fork takes the signals again (a loader worker, a launched trial).
      const pid_t child = ::fork();
      if (child == 0) ::_exit(blocked_here(SIGTERM) || blocked_here(SIGUSR2) ? 1 : 0);
      int child_status = 0;
      while (::waitpid(child, &child_status, 0) < 0 && errno == EINTR) {
      }
      if (!WIFEXITED(child_status) || WEXITSTATUS(child_status) != 0) return 16;
      return 0;
    });
    // 10-11: not blocked; 12: a product went wrong; 13-15: a request lost or overridden;
    // 16: a forked child still blocks them; below 0: the child died of a signal.
    CHECK(status == 0);
  }
}
