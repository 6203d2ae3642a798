#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <loadstar/data/sampler.hpp>
#include <loadstar/error.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

using loadstar::CheckpointError;
using loadstar::ConfigError;
using loadstar::epoch_permutation;
using loadstar::Sampler;
using loadstar::SamplerOptions;
using loadstar::SamplerState;

namespace {

constexpr std::size_t length = 100;
constexpr std::uint64_t seed = 777;

// Determined's test_sampler: the global stream is the concatenation of 15 epoch permutations;
// rank r of size expects stream[r::size][skip:].
std::vector<std::size_t> expected_stream(bool shuffle, std::size_t rank, std::size_t size,
                                         std::size_t skip, std::size_t epochs = 15) {
  std::vector<std::size_t> global;
  for (std::size_t e = 0; e < epochs; ++e) {
    const auto order = epoch_permutation(length, seed, e, shuffle);
    global.insert(global.end(), order.begin(), order.end());
  }
  std::vector<std::size_t> strided;
  for (std::size_t i = rank; i < global.size(); i += size)
    strided.push_back(global[i]);
  return {strided.begin() + static_cast<std::ptrdiff_t>(skip), strided.end()};
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("epoch_permutation is a permutation that depends on the seed and the epoch") {
    const auto a = epoch_permutation(length, seed, 0, true);
    std::vector<std::size_t> sorted = a;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < length; ++i)
      CHECK(sorted[i] == i);
    CHECK(a == epoch_permutation(length, seed, 0, true));
    CHECK(a != epoch_permutation(length, seed, 1, true));
    CHECK(a != epoch_permutation(length, seed + 1, 0, true));
    const auto identity = epoch_permutation(length, seed, 5, false);
    for (std::size_t i = 0; i < length; ++i)
      CHECK(identity[i] == i);
    CHECK(epoch_permutation(1, seed, 3, true) == std::vector<std::size_t>{0});
    CHECK(epoch_permutation(0, seed, 3, true).empty());
  }

  TEST_CASE("epoch_permutation puts every index everywhere with about equal frequency") {
    // 4 elements, 24000 epochs: each (position, value) pair should occur about 6000 times.
    std::vector<std::vector<int>> counts(4, std::vector<int>(4, 0));
    for (std::uint64_t e = 0; e < 24000; ++e) {
      const auto p = epoch_permutation(4, seed, e, true);
      for (std::size_t i = 0; i < 4; ++i)
        ++counts[i][p[i]];
    }
    for (const auto& row : counts) {
      for (int c : row) {
        CHECK(c > 5600);
        CHECK(c < 6400);
      }
    }
  }

  TEST_CASE("Sampler yields the strided global stream over several epochs as Determined does") {
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
          Sampler sampler(
              length, {.shuffle = shuffle, .seed = seed, .rank = rank, .size = size, .skip = skip});
          std::vector<std::size_t> got;
          for (int e = 0; e < 3; ++e) {
            const auto epoch = sampler.yield_epoch();
            CHECK(!epoch.empty());
            got.insert(got.end(), epoch.begin(), epoch.end());
          }
          const auto expected = expected_stream(shuffle, rank, size, skip);
          REQUIRE(got.size() <= expected.size());
          CHECK(std::equal(got.begin(), got.end(), expected.begin()));
        }
      }
    }
  }

  TEST_CASE("Sampler ends each epoch where the global stream changes epoch") {
    // Determined's example: length 10, 3 shards, rank 0 -> 0,3,6,9 | 2,5,8 | 1,4,7.
    Sampler sampler(10, {.rank = 0, .size = 3});
    CHECK(sampler.yield_epoch() == std::vector<std::size_t>{0, 3, 6, 9});
    CHECK(sampler.yield_epoch() == std::vector<std::size_t>{2, 5, 8});
    CHECK(sampler.yield_epoch() == std::vector<std::size_t>{1, 4, 7});
    CHECK(sampler.yield_epoch() == std::vector<std::size_t>{0, 3, 6, 9});
  }

  TEST_CASE("Sampler makes one validation pass that covers every batch once across ranks") {
    for (const std::size_t n : {7, 100}) {
      for (std::size_t size = 1; size <= 5; ++size) {
        std::multiset<std::size_t> seen;
        for (std::size_t rank = 0; rank < size; ++rank) {
          Sampler sampler(n, {.rank = rank, .size = size, .repeat = false});
          std::uint64_t count = 0;
          while (auto t = sampler.next()) {
            CHECK(t->index % size == rank);
            seen.insert(t->index);
            ++count;
          }
          CHECK(count == sampler.pass_length());
          CHECK(count == n / size + (n % size > rank ? 1 : 0));
          CHECK(!sampler.next());
        }
        CHECK(seen.size() == n);
        for (std::size_t i = 0; i < n; ++i)
          CHECK(seen.count(i) == 1);
      }
    }
  }

  TEST_CASE("Sampler rejects fewer batches than ranks and a rank outside the size") {
    CHECK_THROWS_WITH_AS(Sampler(2, {.rank = 0, .size = 3}),
                         doctest::Contains("at least as many batches as ranks (3) but has 2"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(Sampler(10, {.rank = 3, .size = 3}),
                         doctest::Contains("rank 3 must be below size 3"), ConfigError);
    CHECK_THROWS_WITH_AS(Sampler(10, {.rank = 0, .size = 0}),
                         doctest::Contains("size must be positive but is 0"), ConfigError);
    CHECK_THROWS_WITH_AS(Sampler(10, {.repeat = false, .skip = 11}),
                         doctest::Contains("cannot skip 11 batches of a validation pass of 10"),
                         ConfigError);
  }

  TEST_CASE("Sampler restores from its state at random points as if uninterrupted") {
    std::mt19937_64 rng(12345);
    for (const bool shuffle : {false, true}) {
      for (const auto& [rank, size] :
           std::vector<std::pair<std::size_t, std::size_t>>{{0, 1}, {1, 3}, {2, 3}}) {
        const SamplerOptions options{.shuffle = shuffle, .seed = seed, .rank = rank, .size = size};
        Sampler reference(length, options);
        std::vector<std::size_t> stream;
        for (int i = 0; i < 400; ++i)
          stream.push_back(reference.next()->index);
        for (int trial = 0; trial < 25; ++trial) {
          const auto point = static_cast<std::size_t>(rng() % 350);
          Sampler original(length, options);
          for (std::size_t i = 0; i < point; ++i)
            original.next();
          const nlohmann::json saved = original.state();
          const auto state = saved.get<SamplerState>();
          CHECK(state == original.state());
          CHECK(state.seed == seed);
          CHECK(state.length == length);
          Sampler resumed(length, options, state);
          CHECK(resumed.position() == point);
          for (std::size_t i = point; i < point + 50; ++i)
            CHECK(resumed.next()->index == stream[i]);
        }
      }
    }
  }

  TEST_CASE("Sampler state names epoch and cursor in the global stream") {
    Sampler sampler(10, {.rank = 1, .size = 3});
    for (int i = 0; i < 4; ++i)
      sampler.next();                            // global positions 1, 4, 7, 10
    const SamplerState state = sampler.state();  // next: global 13 = epoch 1, cursor 3
    CHECK(state.epoch == 1);
    CHECK(state.cursor == 3);
    CHECK(state.step_start() == 12);  // rank 0's batch of that step
    const nlohmann::json j = state;
    CHECK(j == nlohmann::json::parse(
                   R"({"epoch":1,"cursor":3,"seed":0,"length":10,"rank":1,"size":3})"));
    // A state written before rank and size were recorded belongs to the restoring rank.
    const auto legacy =
        nlohmann::json::parse(R"({"epoch":1,"cursor":3,"seed":0,"length":10})").get<SamplerState>();
    CHECK(!legacy.rank);
    CHECK(Sampler(10, {.rank = 1, .size = 3}, legacy).position() == 4);
    CHECK_THROWS_WITH_AS(
        nlohmann::json::parse(R"({"epoch":1,"cursor":3,"seed":0,"length":10,"rank":1})")
            .get<SamplerState>(),
        doctest::Contains("field 'size' must be a non-negative integer"), CheckpointError);
  }

  TEST_CASE("Sampler resumes a state saved on N ranks on M ranks on the same global stream") {
    // The global stream read by one process; N ranks in step read it N batches to a step.
    std::mt19937_64 rng(31);
    for (const bool shuffle : {false, true}) {
      const std::vector<std::size_t> global = expected_stream(shuffle, 0, 1, 0, 8);
      for (std::size_t n = 1; n <= 3; ++n) {
        for (std::size_t m = 1; m <= 4; ++m) {
          const auto steps = static_cast<std::size_t>(rng() % 150);
          std::vector<Sampler> before;
          for (std::size_t r = 0; r < n; ++r)
            before.emplace_back(
                length, SamplerOptions{.shuffle = shuffle, .seed = seed, .rank = r, .size = n});
          for (std::size_t s = 0; s < steps; ++s) {
            for (auto& sampler : before)
              sampler.next();
          }
          // Any rank's state names the same step; each of the M ranks may restore another's.
          std::vector<Sampler> after;
          for (std::size_t r = 0; r < m; ++r) {
            const nlohmann::json saved = before[(r + 1) % n].state();
            after.emplace_back(
                length, SamplerOptions{.shuffle = shuffle, .seed = seed, .rank = r, .size = m},
                saved.get<SamplerState>());
          }
          CAPTURE(shuffle);
          CAPTURE(n);
          CAPTURE(m);
          CAPTURE(steps);
          std::size_t at = steps * n;
          for (std::size_t s = 0; s < 60; ++s) {
            for (auto& sampler : after) {
              const auto ticket = sampler.next();
              REQUIRE(ticket);
              CHECK(ticket->index == global[at]);
              CHECK(ticket->epoch == at / length);
              CHECK(ticket->last_in_epoch == ((at + m) / length != at / length));
              ++at;
            }
          }
          // The state after the resume names the step too, and resumes again on N ranks.
          const SamplerState again = after.back().state();
          CHECK(again.step_start() == at);
          Sampler back(length, {.shuffle = shuffle, .seed = seed, .rank = 0, .size = n}, again);
          CHECK(back.next()->index == global[at]);
        }
      }
    }
  }

  TEST_CASE("Sampler restores O(1) at any position and on other ranks") {
    // Step 10^9 of 3 ranks over 1000 batches: epoch 3,000,000.
    const std::uint64_t step = 1000000000;
    const SamplerState state{(step * 3) / 1000, (step * 3) % 1000, seed, 1000, 0, 3};
    Sampler resumed(1000, {.shuffle = true, .seed = seed, .rank = 1, .size = 2}, state);
    const auto ticket = resumed.next();
    const auto order = epoch_permutation(1000, seed, (step * 3 + 1) / 1000, true);
    CHECK(ticket->epoch == (step * 3 + 1) / 1000);
    CHECK(ticket->index == order[(step * 3 + 1) % 1000]);
  }

  TEST_CASE("Sampler resumes a validation pass on another number of ranks, each batch once") {
    for (std::size_t steps = 0; steps <= 5; ++steps) {
      std::multiset<std::size_t> seen;
      std::vector<Sampler> before;
      for (std::size_t r = 0; r < 2; ++r)
        before.emplace_back(10, SamplerOptions{.rank = r, .size = 2, .repeat = false});
      for (std::size_t s = 0; s < steps; ++s) {
        for (auto& sampler : before)
          seen.insert(sampler.next()->index);
      }
      const SamplerState state = before[0].state();
      for (std::size_t r = 0; r < 3; ++r) {
        Sampler after(10, {.rank = r, .size = 3, .repeat = false}, state);
        while (const auto ticket = after.next())
          seen.insert(ticket->index);
      }
      CAPTURE(steps);
      CHECK(seen == std::multiset<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    }
  }

  TEST_CASE("Sampler refuses a state of another seed length or stride") {
    const SamplerOptions options{.shuffle = true, .seed = seed, .rank = 1, .size = 3};
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 1, seed + 1, length}),
                         doctest::Contains("saved with seed 778 but the sampler's seed is 777"),
                         CheckpointError);
    CHECK_THROWS_WITH_AS(
        Sampler(length, options, SamplerState{0, 1, seed, 99}),
        doctest::Contains("saved for a sequence of 99 batches but this one has 100"),
        CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 2, seed, length}),
                         doctest::Contains("is not on the stride of rank 1 of 3"), CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 100, seed, length}),
                         doctest::Contains("cursor 100 is beyond the 100 batches of an epoch"),
                         CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(10, {.repeat = false}, SamplerState{1, 1, 0, 10}),
                         doctest::Contains("beyond the single validation pass"), CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(10, {.repeat = false}, SamplerState{1, 5, 0, 10, 0, 2}),
                         doctest::Contains("beyond the single validation pass"), CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 1, seed, length, 2, 2}),
                         doctest::Contains("cannot be a position of rank 2 of 2"), CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 1, seed, length, 2, 3}),
                         doctest::Contains("cannot be a position of rank 2 of 3"), CheckpointError);
    CHECK_THROWS_WITH_AS(Sampler(length, options, SamplerState{0, 1, seed + 1, length, 0, 1}),
                         doctest::Contains("saved with seed 778 but the sampler's seed is 777"),
                         CheckpointError);
    CHECK_THROWS_WITH_AS(
        nlohmann::json::parse(R"({"epoch":1,"seed":0,"length":10})").get<SamplerState>(),
        doctest::Contains("field 'cursor' must be a non-negative integer"), CheckpointError);
  }

  TEST_CASE("batch_seed differs across seeds epochs and indices and is reproducible") {
    std::set<std::uint64_t> seeds;
    for (std::uint64_t s = 0; s < 4; ++s) {
      for (std::uint64_t e = 0; e < 8; ++e) {
        for (std::uint64_t i = 0; i < 64; ++i)
          seeds.insert(loadstar::batch_seed(s, e, i));
      }
    }
    CHECK(seeds.size() == 4 * 8 * 64);
    CHECK(loadstar::batch_seed(1, 2, 3) == loadstar::batch_seed(1, 2, 3));
    static_assert(loadstar::batch_seed(1, 2, 3) != loadstar::batch_seed(1, 3, 2));
  }
}
