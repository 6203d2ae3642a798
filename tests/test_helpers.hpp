// Helpers the tests share: doctest's Contains for a message built at run time, and the elements of
// one epoch of a Dataset.
#pragma once

#include <doctest/doctest.h>

#include <loadstar/data/dataset/concepts.hpp>
#include <string>
#include <utility>
#include <vector>

namespace test_support {

/// `doctest::Contains` for a message built at run time.
inline doctest::Contains contains(const std::string& text) {
  return doctest::Contains(text.c_str());
}

/// Every element `dataset.next()` gives until the end of its epoch.
template <class D>
std::vector<loadstar::element_t<D>> drain(D& dataset) {
  std::vector<loadstar::element_t<D>> out;
  while (auto element = dataset.next())
    out.push_back(std::move(*element));
  return out;
}

}  // namespace test_support
