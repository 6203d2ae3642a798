/// \file
/// `Collective`: what data-parallel training needs of the ranks it runs on (their number, this
/// one's place among them, and the sum, broadcast and gather of buffers), behind one interface so
/// that the trial layer and the optimizer do not depend on MPI. `LocalCollective` is one process;
/// `MpiCollective` (`<loadstar/dist/mpi.hpp>`, opt-in) is Open MPI.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"
#include "loadstar/tensor/shape.hpp"

namespace loadstar::dist {

/// The ranks of one data-parallel job and the collectives between them.
///
/// Every collective is called by every rank in the same order with the same counts (a rank that
/// calls with another count gets a `DistributedError` naming both). `allreduce_sum` is
/// deterministic: each element is summed over the ranks in rank order 0, 1, ..., N-1, whatever the
/// transport's own algorithm, so that the same job with the same number of ranks gives bitwise
/// identical results run after run.
class Collective {
 public:
  virtual ~Collective() = default;
  Collective() = default;
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  /// This process's rank, from 0 to `size() - 1`.
  virtual int rank() const noexcept = 0;
  /// The number of ranks.
  virtual int size() const noexcept = 0;
  /// This process's rank among the ranks on its machine (Horovod's `local_rank`).
  virtual int local_rank() const noexcept = 0;
  /// The number of ranks on this machine.
  virtual int local_size() const noexcept = 0;
  /// The index of this machine among the machines (Horovod's `cross_rank`).
  virtual int cross_rank() const noexcept = 0;

  /// Sums `values` element-wise over the ranks, in rank order, in place (every rank gets the sum).
  virtual void allreduce_sum(std::span<float> values) = 0;
  virtual void allreduce_sum(std::span<double> values) = 0;
  /// Copies `bytes` of rank `root` to every other rank (the same count everywhere).
  virtual void broadcast(std::span<std::byte> bytes, int root = 0) = 0;
  /// `broadcast` of a string's bytes (its size already the same everywhere).
  void broadcast_bytes(std::string& text, int root = 0) {
    broadcast({reinterpret_cast<std::byte*>(text.data()), text.size()}, root);
  }
  /// Every rank's `value`, in rank order.
  virtual std::vector<std::uint64_t> allgather(std::uint64_t value) = 0;
  /// Returns when every rank has called it.
  virtual void barrier() = 0;
  /// Ends the whole job at once after `message` (which names this rank) is on standard error:
  /// what a rank that threw does, so that no other rank waits in a collective for it.
  [[noreturn]] virtual void abort(std::string_view message, int code = 1) = 0;

  /// `rank R of N`, for messages.
  std::string describe() const {
    return "rank " + std::to_string(rank()) + " of " + std::to_string(size());
  }

  /// Every rank's `text`, in rank order (the sizes gathered, then each rank's bytes broadcast):
  /// for small things such as each rank's data position in a checkpoint.
  std::vector<std::string> allgather_strings(const std::string& text) {
    const auto sizes = allgather(text.size());
    std::vector<std::string> out(sizes.size());
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      out[r] = static_cast<int>(r) == rank() ? text : std::string(sizes[r], '\0');
      broadcast_bytes(out[r], static_cast<int>(r));
    }
    return out;
  }

  /// Throws `DistributedError` unless every rank passes the same `value`; `what` names it.
  void require_same(std::uint64_t value, std::string_view what) {
    const auto values = allgather(value);
    for (std::size_t r = 0; r < values.size(); ++r) {
      if (values[r] != value) {
        throw DistributedError(describe() + ": " + std::string(what) +
                               " differs between ranks: " + std::to_string(value) + " here but " +
                               std::to_string(values[r]) + " on rank " + std::to_string(r));
      }
    }
  }

 protected:
  /// Writes `message` to standard error and ends this process with `code` (no transport to tell).
  [[noreturn]] static void exit_after(std::string_view message, int code) {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    std::_Exit(code);
  }
};

/// One process: rank 0 of 1; the collectives leave the buffers as they are.
class LocalCollective final : public Collective {
 public:
  int rank() const noexcept override { return 0; }
  int size() const noexcept override { return 1; }
  int local_rank() const noexcept override { return 0; }
  int local_size() const noexcept override { return 1; }
  int cross_rank() const noexcept override { return 0; }
  void allreduce_sum(std::span<float>) override {}
  void allreduce_sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>, int root = 0) override { check_root(root); }
  std::vector<std::uint64_t> allgather(std::uint64_t value) override { return {value}; }
  void barrier() override {}
  [[noreturn]] void abort(std::string_view message, int code = 1) override {
    exit_after(message, code);
  }

 private:
  static void check_root(int root) {
    if (root != 0) {
      throw DistributedError("local collective: broadcast from rank " + std::to_string(root) +
                             " but the only rank is 0");
    }
  }
};

/// The place of this process in a job whose transport is not connected (yet): what the ranks'
/// environment says before `MPI_Init` (a loader process forked before it uses it to shard its
/// data). Every collective throws `DistributedError`.
class UnconnectedCollective final : public Collective {
 public:
  UnconnectedCollective(int rank, int size, int local_rank = 0, int local_size = 1)
      : rank_(rank), size_(size), local_rank_(local_rank), local_size_(local_size) {}
  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int local_rank() const noexcept override { return local_rank_; }
  int local_size() const noexcept override { return local_size_; }
  int cross_rank() const noexcept override { return 0; }
  void allreduce_sum(std::span<float>) override { refuse("allreduce_sum"); }
  void allreduce_sum(std::span<double>) override { refuse("allreduce_sum"); }
  void broadcast(std::span<std::byte>, int = 0) override { refuse("broadcast"); }
  std::vector<std::uint64_t> allgather(std::uint64_t) override { refuse("allgather"); }
  void barrier() override { refuse("barrier"); }
  [[noreturn]] void abort(std::string_view message, int code = 1) override {
    exit_after(message, code);
  }

 private:
  [[noreturn]] void refuse(const char* what) const {
    throw DistributedError(describe() + ": " + what +
                           " on a process that is not connected to the other ranks");
  }
  int rank_, size_, local_rank_, local_size_;
};

/// This process's rank, size, local rank and local size from the environment `mpirun` (Open MPI)
/// gives its processes, read without initialising MPI; nothing outside such a job.
inline std::optional<std::array<int, 4>> ranks_from_environment() {
  const auto read = [](const char* name) -> std::optional<int> {
    const char* text = std::getenv(name);
    if (text == nullptr || *text == '\0') return std::nullopt;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 0 || value > (1L << 30)) return std::nullopt;
    return static_cast<int>(value);
  };
  const auto rank = read("OMPI_COMM_WORLD_RANK");
  const auto size = read("OMPI_COMM_WORLD_SIZE");
  if (!rank || !size || *rank >= *size) return std::nullopt;
  const auto local_rank = read("OMPI_COMM_WORLD_LOCAL_RANK");
  const auto local_size = read("OMPI_COMM_WORLD_LOCAL_SIZE");
  return std::array<int, 4>{*rank, *size, local_rank.value_or(0), local_size.value_or(1)};
}

/// Runs `body`; if it throws, ends the whole job through `collective.abort` with the rank and
/// the error (`rank 1 of 2: fit: ...`), so that the other ranks do not wait in a collective for
/// this one. What every rank's `main` of a data-parallel program wraps its work in.
template <class F>
decltype(auto) run_or_abort(Collective& collective, F&& body) {
  try {
    return std::forward<F>(body)();
  } catch (const std::exception& e) {
    collective.abort(collective.describe() + ": " + e.what());
  } catch (...) {
    collective.abort(collective.describe() + ": an exception that is not a std::exception");
  }
  std::abort();  // not reached: Collective::abort does not return
}

namespace detail {

/// FNV-1a over a sequence of shapes, for `require_same` to check that every rank's tensors agree
/// in one collective.
class ShapeFingerprint {
 public:
  void add(const Shape& shape) noexcept {
    for (std::size_t d = 0; d < shape.rank(); ++d)
      mix(shape[d]);
    mix(0xffU);  // ends the shape: (2, 3) then (4) differs from (2) then (3, 4)
  }
  std::uint64_t value() const noexcept { return hash_; }

 private:
  void mix(std::uint64_t v) noexcept {
    hash_ ^= v;
    hash_ *= 1099511628211ULL;
  }
  std::uint64_t hash_ = 1469598103934665603ULL;
};

}  // namespace detail
}  // namespace loadstar::dist
