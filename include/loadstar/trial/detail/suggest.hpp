/// \file
/// "Did you mean" suggestions for misspelt names (configuration keys, hyperparameters), by edit
/// distance.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace loadstar::trial::detail {

/// The optimal-string-alignment distance between `a` and `b`: insertions, deletions,
/// substitutions and transpositions of two neighbours each cost 1 (`bathces` is 1 from
/// `batches`, where Levenshtein counts 2).
LOADSTAR_DECL std::size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `word` when one is close enough (at most a third of the word's
/// letters, and at least 2, differ), else empty. Ties go to the candidate listed first.
template <class Range>
std::string nearest_name(std::string_view word, const Range& candidates) {
  const std::size_t limit = std::max<std::size_t>(2, (word.size() + 2) / 3);
  std::size_t best = limit + 1;
  std::string found;
  for (const auto& candidate : candidates) {
    const std::string_view text(candidate);
    const std::size_t distance = edit_distance(word, text);
    if (distance < best) {
      best = distance;
      found = std::string(text);
    }
  }
  return found;
}

/// ` (did you mean 'batches'?)` naming `nearest_name(word, candidates)`, or empty.
template <class Range>
std::string did_you_mean(std::string_view word, const Range& candidates) {
  const std::string found = nearest_name(word, candidates);
  if (found.empty()) return {};
  return " (did you mean '" + found + "'?)";
}

}  // namespace loadstar::trial::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

std::size_t edit_distance(std::string_view a, std::string_view b) {
  const std::size_t n = a.size();
  const std::size_t m = b.size();
  // Three rows suffice: a transposition looks two rows back.
  std::vector<std::size_t> before(m + 1);
  std::vector<std::size_t> previous(m + 1);
  std::vector<std::size_t> current(m + 1);
  for (std::size_t j = 0; j <= m; ++j)
    previous[j] = j;
  for (std::size_t i = 1; i <= n; ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= m; ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        current[j] = std::min(current[j], before[j - 2] + 1);
      }
    }
    std::swap(before, previous);
    std::swap(previous, current);
  }
  return previous[m];
}

}  // namespace loadstar::trial::detail
#endif
