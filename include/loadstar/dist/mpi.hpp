/// \file
/// `MpiCollective`: the ranks of an `mpirun` job as a `Collective`, on Open MPI (Debian's
/// `libopenmpi-dev`). Opt-in: include it only in programs built with MPI (Meson's `mpi`
/// dependency, `-Dmpi=auto`); the rest of the library does not need it.
/// \code
/// auto world = loadstar::dist::mpi_world(&argc, &argv);   // MPI_Init once per process
/// model.compile({.optimizer = std::make_shared<loadstar::dist::DistributedOptimizer>(
///                    std::make_shared<Adam>(1e-3), world), ...});
/// \endcode
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

// The C API only: Open MPI's deprecated C++ bindings do not compile cleanly with -Wextra.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "loadstar/detail/fork_guard.hpp"
#include "loadstar/dist/collective.hpp"
#include "loadstar/error.hpp"

namespace loadstar::dist {

/// The ranks of `MPI_COMM_WORLD` (a duplicate of it, so that the library's messages never meet
/// the program's). Errors of MPI calls come back as `DistributedError` naming the call, this rank
/// and MPI's text (the communicator returns errors instead of aborting). Made by `mpi_world`,
/// which initialises MPI once per process and finalises it at exit; while it lives, worker
/// processes of a `SequenceAdapter` are not forked (Open MPI is not fork-safe after `MPI_Init`).
class MpiCollective final : public Collective {
 public:
  /// Joins the job: `MPI_Init_thread` (funneled: one thread makes MPI calls) unless the program
  /// initialised MPI itself.
  explicit MpiCollective(int* argc = nullptr, char*** argv = nullptr) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        throw DistributedError("MPI_Init_thread failed: is this program started by mpirun?");
      }
      owns_mpi_ = true;
    }
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Comm local = MPI_COMM_NULL;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
          "MPI_Comm_split_type");
    check(MPI_Comm_rank(local, &local_rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(local, &local_size_), "MPI_Comm_size");
    MPI_Comm_free(&local);
    // The machines, numbered by the lowest world rank on each: the ranks with local rank 0.
    MPI_Comm cross = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, local_rank_, rank_, &cross), "MPI_Comm_split");
    check(MPI_Comm_rank(cross, &cross_rank_), "MPI_Comm_rank");
    MPI_Comm_free(&cross);
    loadstar::detail::fork_forbidden_by().store("Open MPI (MPI_Init has run in this process)");
  }

  ~MpiCollective() override {
    if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
    loadstar::detail::fork_forbidden_by().store(nullptr);
  }

  int rank() const noexcept override { return rank_; }
  int size() const noexcept override { return size_; }
  int local_rank() const noexcept override { return local_rank_; }
  int local_size() const noexcept override { return local_size_; }
  int cross_rank() const noexcept override { return cross_rank_; }

  void allreduce_sum(std::span<float> values) override { reduce(values, MPI_FLOAT); }
  void allreduce_sum(std::span<double> values) override { reduce(values, MPI_DOUBLE); }

  void broadcast(std::span<std::byte> bytes, int root = 0) override {
    if (root < 0 || root >= size_) {
      throw DistributedError(describe() + ": broadcast from rank " + std::to_string(root) +
                             " but the ranks are 0 to " + std::to_string(size_ - 1));
    }
    require_same(bytes.size(), "the bytes of a broadcast");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const int n = count_of(bytes.size() - done);
      check(MPI_Bcast(bytes.data() + done, n, MPI_BYTE, root, comm_), "MPI_Bcast");
      done += static_cast<std::size_t>(n);
    }
  }

  std::vector<std::uint64_t> allgather(std::uint64_t value) override {
    std::vector<std::uint64_t> out(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&value, 1, MPI_UINT64_T, out.data(), 1, MPI_UINT64_T, comm_),
          "MPI_Allgather");
    return out;
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  [[noreturn]] void abort(std::string_view message, int code = 1) override {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this keeps the promise if it did
  }

 private:
  static int count_of(std::size_t n) {
    return static_cast<int>(std::min<std::size_t>(n, std::numeric_limits<int>::max()));
  }

  void check(int code, const char* call) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw DistributedError(describe() + ": " + call + " failed: " + std::string(text, length));
  }

  /// The sum in rank order: each rank sums one chunk of the elements over all ranks (the chunks
  /// exchanged with `MPI_Alltoallv`, added in rank order in double precision), then every rank
  /// gathers every chunk (`MPI_Allgatherv`). Each rank sends and receives 2(N-1)/N of the bytes,
  /// as a ring allreduce does, and the result never depends on MPI's choice of algorithm.
  template <class T>
  void reduce(std::span<T> values, MPI_Datatype type) {
    if (size_ == 1 || values.empty()) return;
    const std::size_t n = values.size();
    const auto ranks = static_cast<std::size_t>(size_);
    if (n > static_cast<std::size_t>(std::numeric_limits<int>::max())) {
      throw DistributedError(describe() + ": allreduce of " + std::to_string(n) +
                             " elements but one call takes at most " +
                             std::to_string(std::numeric_limits<int>::max()));
    }
    const auto lo = [&](std::size_t i) { return n * i / ranks; };
    const auto me = static_cast<std::size_t>(rank_);
    const std::size_t mine = lo(me + 1) - lo(me);
    counts_.resize(ranks);
    displs_.resize(ranks);
    recv_counts_.resize(ranks);
    recv_displs_.resize(ranks);
    for (std::size_t i = 0; i < ranks; ++i) {
      counts_[i] = static_cast<int>(lo(i + 1) - lo(i));
      displs_[i] = static_cast<int>(lo(i));
      recv_counts_[i] = static_cast<int>(mine);
      recv_displs_[i] = static_cast<int>(i * mine);
    }
    auto& gathered = scratch<T>();
    gathered.resize(ranks * mine);
    check(MPI_Alltoallv(values.data(), counts_.data(), displs_.data(), type, gathered.data(),
                        recv_counts_.data(), recv_displs_.data(), type, comm_),
          "MPI_Alltoallv");
    T* out = values.data() + lo(me);
    for (std::size_t j = 0; j < mine; ++j) {
      double sum = 0.0;
      for (std::size_t r = 0; r < ranks; ++r)
        sum += static_cast<double>(gathered[r * mine + j]);
      out[j] = static_cast<T>(sum);
    }
    check(MPI_Allgatherv(MPI_IN_PLACE, 0, type, values.data(), counts_.data(), displs_.data(), type,
                         comm_),
          "MPI_Allgatherv");
  }

  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::is_same_v<T, float>) {
      return scratch_float_;
    } else {
      return scratch_double_;
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  bool owns_mpi_ = false;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0;
  std::vector<int> counts_, displs_, recv_counts_, recv_displs_;
  std::vector<float> scratch_float_;
  std::vector<double> scratch_double_;
};

/// The job's ranks, joined on the first call (later calls return the same object; `argc` and
/// `argv` only matter on the first). MPI is finalised when the program exits, after every
/// `shared_ptr` to it is gone.
inline std::shared_ptr<MpiCollective> mpi_world(int* argc = nullptr, char*** argv = nullptr) {
  static std::mutex mutex;
  static std::shared_ptr<MpiCollective> world;
  const std::lock_guard lock(mutex);
  if (!world) world = std::make_shared<MpiCollective>(argc, argv);
  return world;
}

/// Whether this process was started by `mpirun` (Open MPI's or PMIx's rank variables are set),
/// read before MPI is initialised.
inline bool started_by_mpirun() noexcept {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

}  // namespace loadstar::dist
