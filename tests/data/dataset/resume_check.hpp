// Shared helpers of the dataset tests: stream recording and the exact-resume check.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <loadstar/data/dataset.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

namespace dataset_test {

// Every element of `epochs` epochs (with a reset between them), and the state before each.
template <class D>
struct Recording {
  std::vector<loadstar::element_t<D>> elements;
  std::vector<nlohmann::json> states;  // states[i]: taken before elements[i] was produced.
  std::vector<std::size_t> epoch_of;   // The epoch elements[i] belongs to.
};

template <class D>
Recording<D> record(D& dataset, std::size_t epochs) {
  Recording<D> r;
  for (std::size_t epoch = 0; epoch < epochs; ++epoch) {
    if (epoch > 0) dataset.reset();
    while (true) {
      auto state = dataset.state();
      auto element = dataset.next();
      if (!element) break;
      r.states.push_back(std::move(state));
      r.elements.push_back(std::move(*element));
      r.epoch_of.push_back(epoch);
    }
  }
  return r;
}

// Restores the state taken at `points` random positions into a fresh dataset (and through a
// JSON text round trip, as a checkpoint would) and checks that the rest of the stream equals
// the uninterrupted run, element by element.
template <class Make>
void check_exact_resume(Make make, std::size_t epochs, std::size_t points, unsigned seed = 1) {
  auto reference_dataset = make();
  const auto reference = record(reference_dataset, epochs);
  REQUIRE(!reference.elements.empty());
  std::mt19937 rng(seed);
  std::uniform_int_distribution<std::size_t> pick(0, reference.elements.size() - 1);
  for (std::size_t p = 0; p < points; ++p) {
    const std::size_t at = p == 0 ? 0 : p == 1 ? reference.elements.size() - 1 : pick(rng);
    auto resumed = make();
    resumed.restore(nlohmann::json::parse(reference.states[at].dump()));
    std::size_t i = at;
    for (std::size_t epoch = reference.epoch_of[at]; epoch < epochs; ++epoch) {
      if (epoch > reference.epoch_of[at]) resumed.reset();
      while (auto element = resumed.next()) {
        REQUIRE_MESSAGE(i < reference.elements.size(), "resumed at " << at << ": extra element");
        REQUIRE_MESSAGE(*element == reference.elements[i],
                        "resumed at " << at << ": element " << i << " differs");
        ++i;
      }
    }
    CHECK_MESSAGE(i == reference.elements.size(), "resumed at " << at << ": stream ended early");
  }
}

}  // namespace dataset_test
