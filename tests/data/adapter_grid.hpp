// What the threaded and forked SequenceAdapter tests share: a sequence whose batch i is the
// number i, the stream the sampler orders, the stream an adapter delivers, and Determined's grid.
#pragma once

#include <doctest/doctest.h>
#include <sched.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <loadstar/data/sampler.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <type_traits>
#include <utility>
#include <vector>

namespace adapter_grid {

constexpr std::size_t length = 100;
constexpr std::uint64_t seed = 777;

// Batch i is the number i, so the stream of batches is the stream of indices.
struct IndexSequence {
  std::size_t n = length;
  std::size_t size() const { return n; }
  std::size_t operator[](std::size_t i) const { return i; }
};

// Runs the calling thread, and the threads and processes it starts, on the CPUs given (all it may
// use when empty) until destroyed: fewer CPUs than threads, whatever the machine.
class CpuAffinity {
 public:
  explicit CpuAffinity(int cpus) {
    REQUIRE(::sched_getaffinity(0, sizeof(before_), &before_) == 0);
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int cpu = 0, kept = 0; cpu < CPU_SETSIZE && kept < cpus; ++cpu) {
      if (CPU_ISSET(cpu, &before_)) {
        CPU_SET(cpu, &set);
        ++kept;
      }
    }
    REQUIRE(::sched_setaffinity(0, sizeof(set), &set) == 0);
  }
  CpuAffinity(const CpuAffinity&) = delete;
  CpuAffinity& operator=(const CpuAffinity&) = delete;
  ~CpuAffinity() { ::sched_setaffinity(0, sizeof(before_), &before_); }

 private:
  cpu_set_t before_{};
};

template <std::size_t Workers>
using workers = std::integral_constant<std::size_t, Workers>;

// The first `count` batch indices of the sampler's stream (itself checked against an independent
// expectation in test_sampler.cpp).
inline std::vector<std::size_t> sampler_stream(const loadstar::AdapterOptions& o,
                                               std::size_t count) {
  loadstar::Sampler sampler(length, o.sampler);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(sampler.next()->index);
  return out;
}

// The first `count` batches an adapter with these options delivers.
template <std::size_t Workers, bool Multiprocess = false>
std::vector<std::size_t> adapter_stream(const loadstar::AdapterOptions& o, std::size_t count) {
  loadstar::SequenceAdapter<IndexSequence, Workers, Multiprocess> adapter(IndexSequence{}, o);
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < count; ++i)
    out.push_back(*adapter.next());
  return out;
}

// Determined's test_sampler grid: shuffle x skip x (rank, size); calls `f(options, count)` with
// three epochs of the rank's share, the grid point captured for failure messages.
template <class F>
void for_each_grid_point(F&& f) {
  for (const bool shuffle : {false, true}) {
    for (const std::size_t skip : {0, 50, 350}) {
      for (const auto& shard :
           std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {0, 3}, {1, 3}, {2, 3}}) {
        // Named copies, not a structured binding: CAPTURE's lambda captures them (Clang 14
        // refuses to capture a structured binding).
        const std::size_t rank = shard.first;
        const std::size_t size = shard.second;
        CAPTURE(shuffle);
        CAPTURE(skip);
        CAPTURE(rank);
        CAPTURE(size);
        const loadstar::AdapterOptions o{
            .sampler = {.shuffle = shuffle, .seed = seed, .rank = rank, .size = size, .skip = skip},
            .timeout = std::chrono::seconds(20)};
        f(o, 3 * length / size);
      }
    }
  }
}

}  // namespace adapter_grid
