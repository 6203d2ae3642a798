// Values a device backend computes asynchronously: `Deferred`, deferred `Logs` and the running
// metrics that add deferred losses and metric sums in order. The CUDA backend's use of them runs
// in the cuda suite (test_cuda_backend.cpp).
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <loadstar/keras.hpp>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::keras;

namespace {

/// A value that counts the times it is computed, as a device read-back would.
Deferred<double> later(double value, int& reads) {
  return Deferred<double>(std::function<double()>([value, &reads] {
    ++reads;
    return value;
  }));
}

/// The loss and metric sums of a few batches, in an order where adding them in another order
/// gives other bits.
const std::vector<double> batch_losses = {0.1, 1e16, -1e16, 0.3, 1.0 / 3.0};

}  // namespace

TEST_SUITE("keras_steps") {
  TEST_CASE("Deferred computes once, when first read, and then applies in order") {
    int reads = 0;
    const Deferred<double> known = 2.5;
    CHECK(known.ready());
    CHECK(known.get() == 2.5);
    const Deferred<double> value = later(4.0, reads);
    CHECK_FALSE(value.ready());
    const auto doubled = value.then([](double v) { return 2 * v; });
    CHECK(reads == 0);
    CHECK(doubled.get() == 8.0);
    CHECK(reads == 1);
    CHECK(value.ready());
    CHECK(value.get() == 4.0);
    CHECK(reads == 1);  // copies share the value
    CHECK(known.then([](double v) { return v + 1; }).ready());
  }

  TEST_CASE("A Deferred whose computation throws throws at every read until it succeeds") {
    int attempts = 0;
    const Deferred<double> value(std::function<double()>([&]() -> double {
      if (++attempts < 3) throw ConfigError("label 3 at row 2 is outside [0, 3)");
      return 1.0;
    }));
    CHECK_THROWS_AS(static_cast<void>(value.get()), ConfigError);
    CHECK_THROWS_AS(static_cast<void>(value.get()), ConfigError);
    CHECK(value.get() == 1.0);
  }

  TEST_CASE("Deferred logs fill at their first read; copies read them; follow stays lazy") {
    int fills = 0;
    Logs logs;
    logs.defer([&](Logs& out) {
      ++fills;
      out.set("loss", 0.5);
      out.set("accuracy", 0.75);
    });
    CHECK_FALSE(logs.ready());
    Logs follower;
    follower.follow(logs);
    CHECK_FALSE(follower.ready());
    CHECK(fills == 0);
    REQUIRE(follower.get("accuracy").has_value());
    CHECK(*follower.get("accuracy") == 0.75);
    CHECK(fills == 1);
    CHECK(logs.ready());
    CHECK(logs.size() == 2);
    CHECK(fills == 1);
    // A copy of deferred logs reads them first.
    logs.defer([&](Logs& out) {
      ++fills;
      out.set("loss", 0.25);
    });
    const Logs copy = logs;
    CHECK(fills == 2);
    CHECK(*copy.get("loss") == 0.25);
    // Following filled logs copies them.
    follower.follow(copy);
    CHECK(follower.ready());
    CHECK(*follower.get("loss") == 0.25);
    // Setting an entry fills the rest first.
    logs.defer([&](Logs& out) { out.set("loss", 0.125); });
    logs.set("val_loss", 1.0);
    CHECK(*logs.get("loss") == 0.125);
    CHECK(*logs.get("val_loss") == 1.0);
  }

  TEST_CASE("Deferred logs whose fill throws stay deferred and throw again") {
    int attempts = 0;
    Logs logs;
    logs.defer([&](Logs& out) {
      if (++attempts == 1) throw ConfigError("bad label");
      out.set("loss", 1.0);
    });
    CHECK_THROWS_AS(static_cast<void>(logs.get("loss")), ConfigError);
    CHECK_FALSE(logs.ready());
    CHECK(*logs.get("loss") == 1.0);
  }

  TEST_CASE("Running metrics add deferred losses in batch order, bit for bit as known ones") {
    // The same batches given as known values and as values read later give the same sums: the
    // pending batches are added in order when the logs are read, not as they are computed.
    RunningMetrics known, deferred;
    known.set_created();
    deferred.set_created();
    const std::vector<std::string> names = {"out"};
    int reads = 0;
    for (std::size_t b = 0; b < batch_losses.size(); ++b) {
      const double loss = batch_losses[b];
      const std::size_t rows = 3 + b;
      const std::vector<Deferred<double>> known_outputs = {loss};
      known.update(keras::detail::host_backend(), loss, known_outputs, rows, {}, {}, nullptr);
      // Every other batch deferred: a known batch after a pending one waits its turn.
      const Deferred<double> value = b % 2 == 0 ? later(loss, reads) : Deferred<double>(loss);
      const std::vector<Deferred<double>> outputs = {value};
      deferred.update(keras::detail::host_backend(), value, outputs, rows, {}, {}, nullptr);
    }
    CHECK(reads == 0);
    CHECK(deferred.pending());
    CHECK_FALSE(known.pending());
    Logs a, b;
    known.fill(a, names);
    deferred.fill(b, names);
    CHECK(reads == 3);
    CHECK_FALSE(deferred.pending());
    REQUIRE(b.get("loss").has_value());
    CHECK(*a.get("loss") == *b.get("loss"));
    CHECK(known.state() == deferred.state());
  }

  TEST_CASE("A deferred loss that throws is reported at every read of the running metrics") {
    RunningMetrics running;
    running.set_created();
    const std::vector<std::string> names = {"out"};
    bool bad = true;
    const Deferred<double> value(std::function<double()>([&]() -> double {
      if (bad) throw ConfigError("sparse_categorical_crossentropy: label 3 at row 2");
      return 1.0;
    }));
    const std::vector<Deferred<double>> outputs = {value};
    running.update(keras::detail::host_backend(), 2.0, {}, 4, {}, {}, nullptr);
    running.update(keras::detail::host_backend(), value, outputs, 4, {}, {}, nullptr);
    Logs logs;
    CHECK_THROWS_WITH_AS(running.fill(logs, names), doctest::Contains("label 3 at row 2"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(running.fill(logs, names),
                         doctest::Contains("batch 1 since the metrics were reset"), ConfigError);
    CHECK_THROWS_AS(static_cast<void>(running.state()), ConfigError);
    bad = false;
    running.fill(logs, names);
    CHECK(*logs.get("loss") == doctest::Approx((2.0 * 4 + 1.0 * 4) / 8));
  }

  TEST_CASE("A running mean adds deferred batch sums in order, and before a known value") {
    keras::detail::RunningMean known, deferred;
    int reads = 0;
    for (std::size_t b = 0; b < batch_losses.size(); ++b) {
      const MeanMetricSums sums{batch_losses[b], 1.0 + static_cast<double>(b)};
      known.add_sums(sums);
      if (b % 2 == 0) {
        deferred.add_sums(Deferred<MeanMetricSums>(std::function<MeanMetricSums()>([sums, &reads] {
          ++reads;
          return sums;
        })));
      } else {
        deferred.add_sums(sums);
      }
    }
    CHECK(reads == 0);
    CHECK(deferred.pending.size() == batch_losses.size());
    // A value added on the host comes after the pending batches.
    known.add(0.7, 2.0);
    deferred.add(0.7, 2.0);
    CHECK(reads == 3);
    CHECK(deferred.pending.empty());
    CHECK(known.total == deferred.total);
    CHECK(known.count == deferred.count);
    CHECK(known.result() == deferred.result());
  }
}
