// AUTOTUNE of map, interleave and prefetch: the budget is kept, the choice is reported, and the
// output and its exact resume do not depend on it. No test depends on timing.
#include <doctest/doctest.h>

#include <loadstar/data/dataset.hpp>

TEST_SUITE("autotune") {}
