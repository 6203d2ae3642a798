// Compile-time conformance of the data area's concepts, both ways (accepted and rejected).
#include <doctest/doctest.h>

#include <cstdint>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/concepts.hpp>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {
using loadstar::Tensor;
using F = Tensor<float>;
using I = Tensor<std::int64_t>;

// ArrayLike: a tensor, a list, a map or a tuple of tensors, and nothing else.
static_assert(loadstar::ArrayLike<F>);
static_assert(loadstar::ArrayLike<const F&>);
static_assert(loadstar::ArrayLike<std::vector<F>>);
static_assert(loadstar::ArrayLike<std::map<std::string, I>>);
static_assert(loadstar::ArrayLike<std::tuple<F, I>>);
static_assert(!loadstar::ArrayLike<float>);
static_assert(!loadstar::ArrayLike<std::vector<float>>);
static_assert(!loadstar::ArrayLike<std::map<int, F>>);
static_assert(!loadstar::ArrayLike<std::tuple<>>);
static_assert(!loadstar::ArrayLike<std::tuple<F, int>>);
static_assert(!loadstar::ArrayLike<std::vector<std::vector<F>>>);

// Batch shapes: (x, y) and (x, y, w) with a float weight tensor.
static_assert(loadstar::XYBatch<std::pair<F, I>>);
static_assert(loadstar::XYBatch<std::tuple<std::vector<F>, std::map<std::string, I>>>);
static_assert(!loadstar::XYBatch<std::tuple<F, I, F>>);
static_assert(!loadstar::XYBatch<std::tuple<F>>);
static_assert(!loadstar::XYBatch<std::pair<F, int>>);
static_assert(loadstar::XYWBatch<std::tuple<F, I, F>>);
static_assert(!loadstar::XYWBatch<std::tuple<F, I, Tensor<double>>>);
static_assert(!loadstar::XYWBatch<std::tuple<F, I>>);
static_assert(loadstar::KerasBatch<std::tuple<F, I>>);
static_assert(loadstar::KerasBatch<std::tuple<F, I, F>>);
static_assert(!loadstar::KerasBatch<F>);
static_assert(!loadstar::KerasBatch<std::tuple<F, I, F, F>>);

struct GoodSequence {
  std::size_t size() const { return 3; }
  std::pair<F, I> operator[](std::size_t) const { return {}; }
};
struct SequenceWithHook : GoodSequence {
  void on_epoch_end() {}
};
struct NonConstIndex {
  std::size_t size() const { return 3; }
  std::pair<F, I> operator[](std::size_t) { return {}; }
};
struct NoSize {
  std::pair<F, I> operator[](std::size_t) const { return {}; }
};
struct VoidBatch {
  std::size_t size() const { return 3; }
  void operator[](std::size_t) const {}
};
struct IntBatches {
  std::size_t size() const { return 3; }
  int operator[](std::size_t) const { return 0; }
};

static_assert(loadstar::Sequence<GoodSequence>);
static_assert(loadstar::KerasSequence<GoodSequence>);
static_assert(!loadstar::SequenceWithEpochEnd<GoodSequence>);
static_assert(loadstar::SequenceWithEpochEnd<SequenceWithHook>);
static_assert(!loadstar::Sequence<NonConstIndex>);
static_assert(!loadstar::Sequence<NoSize>);
static_assert(!loadstar::Sequence<VoidBatch>);
static_assert(loadstar::Sequence<IntBatches>);
static_assert(!loadstar::KerasSequence<IntBatches>);
static_assert(std::same_as<loadstar::batch_t<GoodSequence>, std::pair<F, I>>);

// The array sequence models the concepts with (x, y) or (x, y, w) batches.
static_assert(loadstar::KerasSequence<loadstar::ArraySequence<F, I>>);
static_assert(loadstar::XYBatch<loadstar::batch_t<loadstar::ArraySequence<F, I>>>);
static_assert(loadstar::XYWBatch<loadstar::batch_t<loadstar::ArraySequence<F, I, true>>>);
static_assert(loadstar::KerasSequence<loadstar::ArraySequence<std::map<std::string, F>, I>>);
}  // namespace

TEST_SUITE("data") {
  TEST_CASE("Sequence concepts hold at compile time") {
    // The static_asserts above are the test; this case records that the file compiled.
    CHECK(loadstar::Sequence<GoodSequence>);
  }
}
