// The MPI transport under `mpirun -np N`: rank bookkeeping, the rank-ordered sum (bitwise what a
// sum in rank order gives, for counts below, at and above the number of ranks), broadcast from
// any root, and the refusals of ranks that disagree.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/dist/mpi.hpp"

namespace dist = loadstar::dist;

namespace {

// A value that differs by rank and element, with a wide spread of magnitudes (so that the order
// of summation shows in the last bits). Integer arithmetic only: a vectorised sin or pow could
// round differently in the two loops that compute it.
template <class T>
T value_of(int rank, std::size_t i) {
  std::uint64_t h = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ULL + i;
  h ^= h >> 29U;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 32U;
  const double unit = static_cast<double>(h >> 11U) / 9007199254740992.0 - 0.5;
  return static_cast<T>(
      std::ldexp(unit, static_cast<int>((i + static_cast<std::size_t>(rank)) % 7) * 4 - 12));
}

template <class T>
std::vector<T> expected_sum(int ranks, std::size_t n) {
  std::vector<T> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    double sum = 0.0;
    for (int r = 0; r < ranks; ++r)
      sum += static_cast<double>(value_of<T>(r, i));
    out[i] = static_cast<T>(sum);
  }
  return out;
}

}  // namespace

TEST_CASE("the ranks of the job know their place") {
  auto world = dist::mpi_world();
  REQUIRE(world->size() >= 1);
  const auto ranks = world->allgather(static_cast<std::uint64_t>(world->rank()));
  REQUIRE(ranks.size() == static_cast<std::size_t>(world->size()));
  for (std::size_t r = 0; r < ranks.size(); ++r)
    CHECK(ranks[r] == r);
  // One machine: every rank is local, and there is one machine.
  CHECK(world->local_size() == world->size());
  CHECK(world->local_rank() == world->rank());
  CHECK(world->cross_rank() == 0);
  CHECK(world->describe() ==
        "rank " + std::to_string(world->rank()) + " of " + std::to_string(world->size()));
  CHECK(loadstar::detail::fork_forbidden_by().load() != nullptr);
}

TEST_CASE_TEMPLATE("allreduce_sum adds in rank order, bitwise", T, float, double) {
  auto world = dist::mpi_world();
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{3},
                              std::size_t{5}, std::size_t{1000}, std::size_t{65537}}) {
    CAPTURE(n);
    std::vector<T> values(n);
    for (std::size_t i = 0; i < n; ++i)
      values[i] = value_of<T>(world->rank(), i);
    world->allreduce_sum(std::span<T>(values));
    const auto expected = expected_sum<T>(world->size(), n);
    CHECK(std::memcmp(values.data(), expected.data(), n * sizeof(T)) == 0);
  }
}

TEST_CASE("broadcast copies the root's bytes to every rank") {
  auto world = dist::mpi_world();
  for (int root = 0; root < world->size(); ++root) {
    std::vector<std::byte> bytes(1000);
    for (std::size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(world->rank())) & 0xff);
    world->broadcast(bytes, root);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      if (bytes[i] != static_cast<std::byte>((i * 7 + static_cast<std::size_t>(root)) & 0xff)) {
        FAIL("byte " << i << " differs from the root's");
      }
    }
  }
  std::vector<std::byte> one(4);
  const std::string refusal =
      "broadcast from rank " + std::to_string(world->size()) + " but the ranks are 0 to";
  CHECK_THROWS_WITH_AS(world->broadcast(one, world->size()), doctest::Contains(refusal.c_str()),
                       loadstar::DistributedError);
}

TEST_CASE("ranks that disagree get a DistributedError naming both values") {
  auto world = dist::mpi_world();
  if (world->size() == 1) return;
  const auto mine = static_cast<std::uint64_t>(100 + world->rank());
  const std::string other = world->rank() == 0 ? "101 on rank 1" : "100 on rank 0";
  const std::string refusal =
      "the answer differs between ranks: " + std::to_string(mine) + " here but " + other;
  CHECK_THROWS_WITH_AS(world->require_same(mine, "the answer"), doctest::Contains(refusal.c_str()),
                       loadstar::DistributedError);
  // A broadcast whose sizes differ is refused before MPI sees it.
  std::vector<std::byte> bytes(10 + static_cast<std::size_t>(world->rank()));
  CHECK_THROWS_WITH_AS(world->broadcast(bytes), doctest::Contains("the bytes of a broadcast"),
                       loadstar::DistributedError);
  world->barrier();
}

TEST_CASE("worker processes are not forked once MPI is initialised") {
  auto world = dist::mpi_world();
  struct Numbers {
    std::size_t size() const { return 4; }
    std::vector<float> operator[](std::size_t i) const { return {static_cast<float>(i)}; }
  };
  CHECK_THROWS_WITH_AS((loadstar::SequenceAdapter<Numbers, 1, true>(Numbers{}, {})),
                       doctest::Contains("sequence adapter: cannot fork worker processes here: "
                                         "Open MPI (MPI_Init has run in this process)"),
                       loadstar::ConfigError);
  // Threads are fine.
  loadstar::SequenceAdapter<Numbers, 1, false> threads(Numbers{}, {});
  CHECK(threads.next().has_value());
}

TEST_CASE("the environment mpirun gives names the rank before MPI is joined") {
  auto world = dist::mpi_world();
  const auto place = dist::ranks_from_environment();
  REQUIRE(place.has_value());
  CHECK((*place)[0] == world->rank());
  CHECK((*place)[1] == world->size());
  CHECK((*place)[2] == world->local_rank());
  // A process that knows its place but is not connected refuses every collective.
  dist::UnconnectedCollective alone((*place)[0], (*place)[1]);
  CHECK(alone.size() == world->size());
  std::vector<float> values(3);
  CHECK_THROWS_WITH_AS(alone.allreduce_sum(std::span<float>(values)),
                       doctest::Contains("allreduce_sum on a process that is not connected"),
                       loadstar::DistributedError);
}
