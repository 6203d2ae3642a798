#include <dirent.h>
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "adapter_grid.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <limits>
#include <loadstar/data/array_sequence.hpp>
#include <loadstar/data/sampler.hpp>
#include <loadstar/data/sequence_adapter.hpp>
#include <loadstar/data/serialize.hpp>
#include <loadstar/error.hpp>
#include <loadstar/tensor.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

using loadstar::AdapterOptions;
using loadstar::ConfigError;
using loadstar::FormatError;
using loadstar::Sampler;
using loadstar::SamplerState;
using loadstar::SequenceAdapter;
using loadstar::Serializable;
using loadstar::ShapeError;
using loadstar::Tensor;
using loadstar::WorkerError;

namespace {

using adapter_grid::adapter_stream;
using adapter_grid::CpuAffinity;
using adapter_grid::IndexSequence;
using adapter_grid::length;
using adapter_grid::sampler_stream;
using adapter_grid::seed;
using adapter_grid::workers;

// Fails with a message on index 7, kills its own process on index `killed`.
struct TroubleSequence {
  std::size_t killed = 1000;
  std::size_t size() const { return 20; }
  std::size_t operator[](std::size_t i) const {
    if (i == 7) throw std::runtime_error("cannot decode image " + std::to_string(i));
    if (i == killed) ::raise(SIGKILL);
    return i;
  }
};

struct SlowSequence {
  std::chrono::milliseconds delay{20};
  std::size_t size() const { return 50; }
  Tensor<float> operator[](std::size_t i) const {
    std::this_thread::sleep_for(delay);
    return Tensor<float>({4, 4}, static_cast<float>(i));
  }
};

// Batch i has i + 1 rows: the first batch is the smallest, so the measured slot is too small
// for later ones unless a bound is given.
struct GrowingSequence {
  std::size_t size() const { return 8; }
  Tensor<float> operator[](std::size_t i) const {
    return Tensor<float>({(i + 1) * 1000}, static_cast<float>(i));
  }
};

// on_epoch_end changes state that the forked workers must see.
struct EpochSequence {
  std::uint64_t epoch = 0;
  std::size_t size() const { return 10; }
  std::tuple<std::uint64_t, std::uint64_t> operator[](std::size_t i) const {
    return {epoch, loadstar::batch_seed(seed, epoch, i)};
  }
  void on_epoch_end() { ++epoch; }
};

// A batch of every supported kind.
using RichBatch =
    std::tuple<Tensor<float>, std::vector<Tensor<std::int64_t>>, std::map<std::string, double>,
               std::optional<std::string>, std::pair<int, std::uint8_t>, std::optional<int>>;

struct RichSequence {
  std::size_t size() const { return 6; }
  RichBatch operator[](std::size_t i) const {
    const auto f = static_cast<float>(i);
    return {Tensor<float>({2, 3}, {f, f + 1, f + 2, f + 3, f + 4, f + 5}),
            {Tensor<std::int64_t>({2}, {static_cast<std::int64_t>(i), -1}), Tensor<std::int64_t>()},
            {{"lr", 0.5 * static_cast<double>(i)}, {"w", -2.0}},
            i % 2 ? std::optional<std::string>("odd " + std::to_string(i)) : std::nullopt,
            {static_cast<int>(i) - 3, static_cast<std::uint8_t>(i)},
            std::nullopt};
  }
};

// Batch `slow` sleeps for `delay`; batch `killed` kills its own process; batch `failing` throws a
// message of `message_bytes` bytes that ends in "end of message".
struct FaultSequence {
  std::size_t slow = 1000;
  std::chrono::milliseconds delay{0};
  std::size_t killed = 1000;
  std::size_t failing = 1000;
  std::size_t message_bytes = 0;
  std::size_t size() const { return 20; }
  std::size_t operator[](std::size_t i) const {
    if (i == slow) std::this_thread::sleep_for(delay);
    if (i == killed) ::raise(SIGKILL);
    if (i == failing) throw std::runtime_error(std::string(message_bytes, 'x') + "end of message");
    return i;
  }
};

// Kills the test process (SIGALRM) if it is still alive after `seconds`: a hang fails at once
// instead of at the suite's timeout.
struct Watchdog {
  explicit Watchdog(unsigned seconds) { ::alarm(seconds); }
  ~Watchdog() { ::alarm(0); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;
};

// The name of the mapping that holds `address` in this process (from /proc/self/maps), or "".
std::string mapping_of(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  std::string line;
  while (std::getline(maps, line)) {
    std::uintptr_t begin = 0;
    std::uintptr_t end = 0;
    char dash = 0;
    std::istringstream fields(line);
    fields >> std::hex >> begin >> dash >> end;
    if (at < begin || at >= end) continue;
    std::string permissions;
    std::string offset;
    std::string device;
    std::string inode;
    std::string name;
    fields >> permissions >> offset >> device >> inode;
    std::getline(fields >> std::ws, name);
    return name;
  }
  return "";
}

// Batches of 512 KiB (above the tensor cache's 256 KiB) that name the mapping their worker built
// them in.
struct PlacedSequence {
  std::size_t size() const { return 6; }
  std::tuple<Tensor<float>, std::string> operator[](std::size_t i) const {
    Tensor<float> x({256, 512}, static_cast<float>(i));
    std::string where = mapping_of(x.data());
    return {std::move(x), std::move(where)};
  }
};

// Keeps every large batch it built and hands out the kept one (shared storage) from then on.
struct CachingSequence {
  mutable std::map<std::size_t, Tensor<float>> cache;
  std::size_t size() const { return 6; }
  Tensor<float> operator[](std::size_t i) const {
    auto found = cache.find(i);
    if (found == cache.end())
      found = cache.emplace(i, Tensor<float>({256, 512}, static_cast<float>(i))).first;
    return found->second;
  }
};

// Whether every element of `x` is `value`.
bool all_equal(const Tensor<float>& x, float value) {
  return std::all_of(x.begin(), x.end(), [&](float v) { return v == value; });
}

struct NotSerializable {
  int* pointer = nullptr;
};

int open_descriptors() {
  int count = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (::readdir(dir))
      ++count;
    ::closedir(dir);
  }
  return count;
}

// No child of this process is left, zombie or not.
bool no_children() {
  return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD;
}

}  // namespace

static_assert(Serializable<Tensor<float>>);
static_assert(Serializable<RichBatch>);
static_assert(Serializable<std::tuple<Tensor<float>, Tensor<float>>>);
static_assert(Serializable<std::map<std::string, Tensor<std::uint8_t>>>);
static_assert(!Serializable<NotSerializable>);
static_assert(!Serializable<std::vector<NotSerializable>>);
static_assert(!Serializable<std::tuple<int, NotSerializable>>);
static_assert(!Serializable<int*>);

TEST_SUITE("data") {
  TEST_CASE("Serializer round-trips tensors scalars strings and containers") {
    const RichBatch batch = RichSequence{}[3];
    std::vector<std::byte> bytes(loadstar::serialized_size(batch));
    CHECK(loadstar::serialize(batch, bytes) <= bytes.size());
    const auto back = loadstar::deserialize<RichBatch>(bytes);
    CHECK(std::get<0>(back) == std::get<0>(batch));
    CHECK(!std::get<0>(back).shares_storage_with(std::get<0>(batch)));
    REQUIRE(std::get<1>(back).size() == 2);
    CHECK(std::get<1>(back)[0] == std::get<1>(batch)[0]);
    CHECK(std::get<1>(back)[1].shape() == loadstar::Shape{0});
    CHECK(std::get<2>(back) == std::get<2>(batch));
    CHECK(std::get<3>(back) == std::optional<std::string>("odd 3"));
    CHECK(std::get<4>(back) == std::pair<int, std::uint8_t>{0, 3});
    CHECK(!std::get<5>(back));
  }

  TEST_CASE("Serializer reports a short buffer and truncated bytes") {
    const Tensor<float> t({10}, 1.f);
    std::vector<std::byte> bytes(loadstar::serialized_size(t));
    // 1 byte of rank, 8 of shape, up to 63 of padding, 40 of data.
    std::vector<std::byte> small(bytes.size() - 1);
    CHECK_THROWS_WITH_AS(loadstar::serialize(t, small),
                         doctest::Contains("needs 112 bytes but the buffer holds 111"), ShapeError);
    const std::size_t written = loadstar::serialize(t, bytes);
    CHECK(written == 104);
    CHECK_THROWS_WITH_AS(
        loadstar::deserialize<Tensor<float>>(std::span<const std::byte>(bytes.data(), written - 4)),
        doctest::Contains("shape (10,) needs 40 bytes but only 36 remain"), FormatError);
  }

  TEST_CASE("Serializer references tensor data already inside the buffer it writes") {
    // A buffer whose second half holds a tensor built in place.
    auto buffer = std::make_shared<std::vector<std::byte>>(8192 + 64);
    const auto base = reinterpret_cast<std::uintptr_t>(buffer->data());
    std::byte* begin = buffer->data() + (64 - base % 64) % 64;
    const Tensor<float> x =
        Tensor<float>::wrap(reinterpret_cast<float*>(begin + 4096), loadstar::Shape{8, 4}, buffer);
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i);
    loadstar::ByteWriter writer(begin, 4096, begin, 8192);
    loadstar::Serializer<Tensor<float>>::write(x, writer);
    // 1 byte of rank, 16 of shape, 8 of offset: no data.
    CHECK(writer.written() == 25);
    CHECK(!writer.overflowed());
    const std::span<const std::byte> bytes(begin, 8192);
    const auto view = loadstar::deserialize<Tensor<float>>(bytes, buffer);
    CHECK(view == x);
    CHECK(view.data() == x.data());
    const auto copy = loadstar::deserialize<Tensor<float>>(bytes);
    CHECK(copy == x);
    CHECK(copy.data() != x.data());
    // Data outside the buffer read back is refused.
    CHECK_THROWS_WITH_AS(
        loadstar::deserialize<Tensor<float>>(std::span<const std::byte>(begin, 4096 + 64)),
        doctest::Contains("128 bytes at offset 4096 lie outside its 4160 bytes"), FormatError);
    // Tensors outside the mirror are copied; what passes the capacity is counted, not written.
    const Tensor<float> y({100}, 2.f);
    loadstar::ByteWriter small(begin, 64, begin, 8192);
    loadstar::Serializer<Tensor<float>>::write(y, small);
    CHECK(small.written() == 64 + 400);
    CHECK(small.overflowed());
  }

  TEST_CASE(
      "SequenceAdapter on processes builds large tensors in shared memory and reads them "
      "there" *
      doctest::timeout(30)) {
    // The user's sequence writes each batch once, where the consumer reads it: no copy into the
    // slot, and none out of it.
    SequenceAdapter<PlacedSequence, 2, true> adapter(PlacedSequence{}, {.max_queue_size = 3});
    adapter.next();  // batch 0 is built here, to measure the slot
    for (std::size_t i = 1; i < 15; ++i) {
      const auto [x, built_in] = *adapter.next();
      CAPTURE(i);
      CHECK(built_in.find("loadstar-batch-ring") != std::string::npos);
      CHECK(mapping_of(x.data()).find("loadstar-batch-ring") != std::string::npos);
      CHECK(all_equal(x, static_cast<float>(i % 6)));
    }
  }

  TEST_CASE("SequenceAdapter on processes keeps tensors a sequence caches out of the ring" *
            doctest::timeout(30)) {
    // Each worker's cache holds tensors first built in a slot; later batches written to that slot
    // must not change them, nor may the cache change what the consumer reads.
    {
      SequenceAdapter<CachingSequence, 2, true> adapter(CachingSequence{}, {.max_queue_size = 2});
      for (std::size_t i = 0; i < 36; ++i) {
        const Tensor<float> x = *adapter.next();
        CAPTURE(i);
        CHECK(all_equal(x, static_cast<float>(i % 6)));
      }
    }
    CHECK(no_children());
  }

  TEST_CASE_TEMPLATE("SequenceAdapter on processes yields the sampler's stream across the grid" *
                         doctest::timeout(120),
                     W, workers<0>, workers<1>, workers<2>, workers<5>) {
    adapter_grid::for_each_grid_point([](const AdapterOptions& o, std::size_t count) {
      CHECK(adapter_stream<W::value, true>(o, count) == sampler_stream(o, count));
    });
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes makes one finite validation pass" *
            doctest::timeout(30)) {
    for (std::size_t rank = 0; rank < 3; ++rank) {
      SequenceAdapter<IndexSequence, 2, true> adapter(
          IndexSequence{}, {.sampler = {.rank = rank, .size = 3, .repeat = false}});
      std::vector<std::size_t> got;
      for (std::size_t batch : adapter)
        got.push_back(batch);
      std::vector<std::size_t> expected;
      for (std::size_t i = rank; i < length; i += 3)
        expected.push_back(i);
      CHECK(got == expected);
    }
  }

  TEST_CASE("SequenceAdapter on processes carries tensors and containers intact" *
            doctest::timeout(30)) {
    SequenceAdapter<RichSequence, 3, true> adapter(RichSequence{}, {.max_queue_size = 2});
    for (std::size_t i = 0; i < 12; ++i) {
      const RichBatch got = *adapter.next();
      const RichBatch expected = RichSequence{}[i % 6];
      CHECK(std::get<0>(got) == std::get<0>(expected));
      CHECK(std::get<1>(got)[0] == std::get<1>(expected)[0]);
      CHECK(std::get<2>(got) == std::get<2>(expected));
      CHECK(std::get<3>(got) == std::get<3>(expected));
      CHECK(std::get<4>(got) == std::get<4>(expected));
    }
    // ArraySequence batches, (x, y) views, cross as copies.
    Tensor<float> x({10, 3});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i);
    Tensor<std::int64_t> y({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    loadstar::ArraySequence arrays(x, y, 4);
    SequenceAdapter<decltype(arrays), 2, true> served(arrays);
    for (std::size_t i = 0; i < 6; ++i) {
      const auto [bx, by] = *served.next();
      const auto [ex, ey] = arrays[i % 3];
      CHECK(bx == ex);
      CHECK(by == ey);
    }
  }

  TEST_CASE("SequenceAdapter on processes hands out views of shared memory that stay valid" *
            doctest::timeout(30)) {
    Tensor<float> x({12, 5});
    for (std::size_t i = 0; i < x.size(); ++i)
      x.data()[i] = static_cast<float>(i);
    Tensor<float> y({12}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    loadstar::ArraySequence arrays(x, y, 2);
    using Batch = decltype(arrays)::batch_type;
    std::vector<Batch> kept;
    {
      // Keeping many more batches than slots: no slot is overwritten under a live view, and the
      // adapter does not wait for a release that never comes.
      SequenceAdapter<decltype(arrays), 2, true> adapter(arrays, {.max_queue_size = 3});
      for (int i = 0; i < 20; ++i)
        kept.push_back(*adapter.next());
      // x and y of a batch read from a slot (batch 0 was built here to measure the slot) view
      // the same shared memory.
      CHECK(std::get<0>(kept[1]).shares_storage_with(std::get<1>(kept[1])));
    }
    // The views outlive the adapter and still hold their batches.
    for (std::size_t i = 0; i < kept.size(); ++i) {
      CHECK(std::get<0>(kept[i]) == std::get<0>(arrays[i % 6]));
      CHECK(std::get<1>(kept[i]) == std::get<1>(arrays[i % 6]));
    }
    CHECK(no_children());
  }

  TEST_CASE_TEMPLATE(
      "SequenceAdapter on processes lets workers see on_epoch_end" * doctest::timeout(30), W,
      workers<1>, workers<3>) {
    SequenceAdapter<EpochSequence, W::value, true> adapter(EpochSequence{}, {.max_queue_size = 4});
    for (std::uint64_t e = 0; e < 4; ++e) {
      for (std::size_t i = 0; i < 10; ++i) {
        const auto [epoch, value] = *adapter.next();
        CHECK(epoch == e);
        CHECK(value == loadstar::batch_seed(seed, e, i));
      }
    }
    CHECK(adapter.sequence().epoch == 3);
  }

  TEST_CASE("SequenceAdapter gives the same augmented batches on threads and processes" *
            doctest::timeout(30)) {
    std::vector<std::tuple<std::uint64_t, std::uint64_t>> inline_batches;
    std::vector<std::tuple<std::uint64_t, std::uint64_t>> thread_batches;
    std::vector<std::tuple<std::uint64_t, std::uint64_t>> process_batches;
    {
      SequenceAdapter<EpochSequence, 0> a(EpochSequence{},
                                          {.sampler = {.shuffle = true, .seed = seed}});
      SequenceAdapter<EpochSequence, 4> b(EpochSequence{},
                                          {.sampler = {.shuffle = true, .seed = seed}});
      SequenceAdapter<EpochSequence, 2, true> c(EpochSequence{},
                                                {.sampler = {.shuffle = true, .seed = seed}});
      for (int i = 0; i < 35; ++i) {
        inline_batches.push_back(*a.next());
        thread_batches.push_back(*b.next());
        process_batches.push_back(*c.next());
      }
    }
    CHECK(inline_batches == thread_batches);
    CHECK(inline_batches == process_batches);
  }

  TEST_CASE("SequenceAdapter on processes rethrows a failed batch as WorkerError and goes on" *
            doctest::timeout(30)) {
    SequenceAdapter<TroubleSequence, 3, true> adapter(TroubleSequence{}, {.max_queue_size = 3});
    for (std::size_t i = 0; i < 7; ++i)
      CHECK(*adapter.next() == i);
    CHECK_THROWS_WITH_AS(adapter.next(),
                         doctest::Contains("batch 7 (epoch 0, position 7) failed in worker "
                                           "process"),
                         WorkerError);
    for (std::size_t i = 8; i < 20; ++i)
      CHECK(*adapter.next() == i);
    SequenceAdapter<TroubleSequence, 1, true> again(TroubleSequence{}, {.sampler = {.skip = 7}});
    CHECK_THROWS_WITH_AS(again.next(), doctest::Contains("cannot decode image 7"), WorkerError);
    CHECK(*again.next() == 8);
  }

  TEST_CASE("SequenceAdapter on processes reports a worker killed by SIGKILL" *
            doctest::timeout(30)) {
    {
      // One worker, so that batches 1 to 4 are built before it dies (with more, a death is
      // reported as soon as the consumer waits, and batches still being built are lost).
      SequenceAdapter<TroubleSequence, 1, true> adapter(
          TroubleSequence{5}, {.max_queue_size = 4, .sampler = {.skip = 1}});
      for (std::size_t i = 1; i < 5; ++i)
        CHECK(*adapter.next() == i);
      const auto started = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS(adapter.next(),
                           doctest::Contains("was killed by signal 9 (SIGKILL) while building "
                                             "batch 5 (epoch 0, position 5)"),
                           WorkerError);
      // Reported within a second (well below the test's own timeout).
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));
      CHECK_THROWS_WITH_AS(adapter.next(), doctest::Contains("worker process"), WorkerError);
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes is destroyed promptly with busy workers" *
            doctest::timeout(30)) {
    const int descriptors = open_descriptors();
    for (int round = 0; round < 3; ++round) {
      SequenceAdapter<SlowSequence, 3, true> adapter(
          SlowSequence{std::chrono::seconds(20)},
          {.max_queue_size = 2, .timeout = std::chrono::milliseconds(50), .slot_bytes = 4096});
      // Every worker is stuck in a batch: nothing arrives.
      CHECK_THROWS_WITH_AS(adapter.next(), doctest::Contains("not ready after 50 ms"), WorkerError);
    }
    {
      SequenceAdapter<SlowSequence, 2, true> adapter(SlowSequence{std::chrono::milliseconds(1)},
                                                     {.max_queue_size = 2});
      std::size_t seen = 0;
      for (const auto& batch : adapter) {
        CHECK(batch(0, 0) == static_cast<float>(seen));
        if (++seen == 5) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // full queue
      CHECK(adapter.stats().batches_produced >= 5);
    }
    CHECK(no_children());
    CHECK(open_descriptors() == descriptors);
  }

  TEST_CASE("SequenceAdapter on processes names the bytes a batch needs beyond its slot" *
            doctest::timeout(30)) {
    {
      SequenceAdapter<GrowingSequence, 2, true> adapter(GrowingSequence{});
      // Batch 0 measured 4072 bytes: with headroom and page rounding the slot holds 12224, so
      // batches 0 to 2 fit and batch 3 does not.
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(adapter.next()->size() == (i + 1) * 1000);
      CHECK_THROWS_WITH_AS(adapter.next(),
                           doctest::Contains("batch 3 (epoch 0, position 3) needs 16072 bytes but "
                                             "a shared-memory slot holds 12224"),
                           WorkerError);
      // The adapter goes on after it.
      for (int i = 4; i < 8; ++i)
        CHECK_THROWS_AS(adapter.next(), WorkerError);
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(adapter.next()->size() == (i + 1) * 1000);
    }
    {
      SequenceAdapter<GrowingSequence, 2, true> bounded(GrowingSequence{}, {.slot_bytes = 40000});
      for (std::size_t i = 0; i < 8; ++i)
        CHECK(bounded.next()->size() == (i + 1) * 1000);
    }
    CHECK_THROWS_WITH_AS((SequenceAdapter<GrowingSequence, 2, true>(
                             GrowingSequence{}, {.slot_bytes = AdapterOptions::max_slot_bytes})),
                         doctest::Contains("bytes of shared memory (10 slots of"), WorkerError);
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes names the largest slot_bytes it accepts" *
            doctest::timeout(30)) {
    // Sizes near SIZE_MAX once wrapped around: a ring of 0 bytes, or a slot of 4032.
    for (const std::size_t bytes :
         {std::numeric_limits<std::size_t>::max() - 4095, std::numeric_limits<std::size_t>::max(),
          AdapterOptions::max_slot_bytes + 1}) {
      CAPTURE(bytes);
      CHECK_THROWS_WITH_AS(
          (SequenceAdapter<IndexSequence, 2, true>(IndexSequence{}, {.slot_bytes = bytes})),
          doctest::Contains(
              ("slot_bytes must be at most 1099511627776 but is " + std::to_string(bytes)).c_str()),
          ConfigError);
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes runs three rings of small batches for any queue size" *
            doctest::timeout(120)) {
    const Watchdog watchdog(100);
    for (const std::size_t queue : {16, 4096, 8192, 65536}) {
      CAPTURE(queue);
      SequenceAdapter<IndexSequence, 2, true> adapter(IndexSequence{},
                                                      {.max_queue_size = queue, .slot_bytes = 1});
      bool in_order = true;
      for (std::size_t i = 0; i < 3 * queue; ++i)
        in_order = in_order && *adapter.next() == i % length;
      CHECK(in_order);
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes hands off cheap batches in order on one and two CPUs" *
            doctest::timeout(120)) {
    // Children asleep on a full ring are woken only when half of it is free or the consumer is
    // about to wait, and signal the consumer only when it sleeps for their batch: with four
    // children taking turns on one or two CPUs, every batch still arrives, once and in order.
    const Watchdog watchdog(100);
    for (const int cpus : {1, 2}) {
      const CpuAffinity affinity(cpus);
      for (const std::size_t queue : {1, 2, 3, 16}) {
        CAPTURE(cpus);
        CAPTURE(queue);
        const AdapterOptions o{.max_queue_size = queue, .sampler = {.shuffle = true, .seed = seed}};
        SequenceAdapter<IndexSequence, 4, true> adapter(IndexSequence{}, o);
        const auto expected = sampler_stream(o, 2000);
        bool in_order = true;
        for (std::size_t i = 0; i < expected.size(); ++i)
          in_order = in_order && *adapter.next() == expected[i];
        CHECK(in_order);
      }
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes gives up a batch past the timeout and kills its worker" *
            doctest::timeout(30)) {
    {
      SequenceAdapter<FaultSequence, 2, true> adapter(
          FaultSequence{.slow = 1, .delay = std::chrono::seconds(3)},
          {.max_queue_size = 4, .timeout = std::chrono::milliseconds(100), .slot_bytes = 4096});
      const auto started = std::chrono::steady_clock::now();
      CHECK(*adapter.next() == 0);
      // Measured: about 2 ms (3 s before, waiting for the slow batch).
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));
      CHECK_THROWS_WITH_AS(adapter.next(),
                           doctest::Contains("batch 1 (epoch 0, position 1) was not ready after "
                                             "100 ms (per-batch timeout); worker process "),
                           WorkerError);
      // Measured: 0.1 s.
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(2));
      // A fresh worker takes over; the stream goes on after the batch given up.
      for (std::size_t i = 2; i < 20; ++i)
        CHECK(*adapter.next() == i);
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes reports a dead worker while another is busy" *
            doctest::timeout(30)) {
    {
      SequenceAdapter<FaultSequence, 2, true> adapter(
          FaultSequence{.slow = 0, .delay = std::chrono::seconds(4), .killed = 1},
          {.max_queue_size = 4, .slot_bytes = 4096});
      const auto started = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS(adapter.next(),
                           doctest::Contains("was killed by signal 9 (SIGKILL) while building "
                                             "batch 1 (epoch 0, position 1)"),
                           WorkerError);
      // Measured: about 2 ms (4.1 s before, when the busy worker finished).
      CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(1));
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter on processes delivers a long exception message whole" *
            doctest::timeout(30)) {
    // 20 KB arrived cut at the slot (4 KiB here); 1 MB is more than a socket buffer holds.
    for (const std::size_t bytes : {20000, 1000000}) {
      CAPTURE(bytes);
      SequenceAdapter<FaultSequence, 2, true> adapter(
          FaultSequence{.failing = 3, .message_bytes = bytes},
          {.max_queue_size = 4, .slot_bytes = 4096});
      for (std::size_t i = 0; i < 3; ++i)
        CHECK(*adapter.next() == i);
      try {
        adapter.next();
        FAIL("batch 3 did not fail");
      } catch (const WorkerError& e) {
        const std::string message = e.what();
        CHECK(message.find("batch 3 (epoch 0, position 3) failed in worker process") !=
              std::string::npos);
        CHECK(message.size() > bytes);
        CHECK(message.ends_with(std::string(100, 'x') + "end of message"));
      }
      for (std::size_t i = 4; i < 20; ++i)
        CHECK(*adapter.next() == i);
    }
    CHECK(no_children());
  }

  TEST_CASE("SequenceAdapter resumes on processes from a state saved on threads" *
            doctest::timeout(60)) {
    std::mt19937_64 rng(99);
    const AdapterOptions o{.sampler = {.shuffle = true, .seed = seed, .rank = 1, .size = 3}};
    const auto uninterrupted = sampler_stream(o, 300);
    for (int trial = 0; trial < 8; ++trial) {
      const auto point = static_cast<std::size_t>(rng() % 240);
      nlohmann::json saved;
      {
        SequenceAdapter<IndexSequence, 2> first(IndexSequence{}, o);
        for (std::size_t i = 0; i < point; ++i)
          first.next();
        saved = first.state();
      }
      SequenceAdapter<IndexSequence, 3, true> resumed(IndexSequence{}, o,
                                                      saved.get<SamplerState>());
      std::vector<std::size_t> got;
      for (int i = 0; i < 50; ++i)
        got.push_back(*resumed.next());
      CAPTURE(point);
      CHECK(std::equal(got.begin(), got.end(),
                       uninterrupted.begin() + static_cast<std::ptrdiff_t>(point)));
      CHECK(resumed.state() == Sampler(length, {o.sampler.shuffle, o.sampler.seed, o.sampler.rank,
                                                o.sampler.size, o.sampler.repeat, point + 50})
                                   .state());
    }
  }

  TEST_CASE("SequenceAdapter on processes resumes a state saved on 2 ranks on 3, any workers" *
            doctest::timeout(60)) {
    const auto global = sampler_stream({.sampler = {.shuffle = true, .seed = seed}}, 300);
    nlohmann::json saved;  // rank 1 of 2 after 29 steps: the step starts at batch 58
    {
      SequenceAdapter<IndexSequence, 2, true> rank(
          IndexSequence{}, {.sampler = {.shuffle = true, .seed = seed, .rank = 1, .size = 2}});
      for (int s = 0; s < 29; ++s)
        rank.next();
      saved = rank.state();
    }
    for (std::size_t r = 0; r < 3; ++r) {
      AdapterOptions o{.sampler = {.shuffle = true, .seed = seed, .rank = r, .size = 3}};
      o.workers = 1 + r;
      SequenceAdapter<IndexSequence, loadstar::dynamic_workers, true> resumed(
          IndexSequence{}, o, saved.get<SamplerState>());
      CHECK(resumed.worker_count() == 1 + r);
      for (std::size_t s = 0; s < 40; ++s) {
        CAPTURE(r);
        CAPTURE(s);
        CHECK(*resumed.next() == global[58 + s * 3 + r]);
      }
    }
    CHECK(no_children());
  }
}
