#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <loadstar/random.hpp>
#include <loadstar/trial/hyperparameters.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

using namespace loadstar;
using namespace loadstar::trial;
using nlohmann::json;
using Type = Hyperparameter::Type;

namespace {

NamedHyperparameter constant(std::string name, json val) {
  Hyperparameter hp;
  hp.type = Type::constant;
  hp.val = std::move(val);
  return {std::move(name), hp};
}

NamedHyperparameter ranged(std::string name, Type type, double minval, double maxval,
                           std::optional<std::uint64_t> count = std::nullopt, double base = 10) {
  Hyperparameter hp;
  hp.type = type;
  hp.minval = minval;
  hp.maxval = maxval;
  hp.count = count;
  hp.base = base;
  return {std::move(name), hp};
}

NamedHyperparameter categorical(std::string name, std::vector<json> vals) {
  Hyperparameter hp;
  hp.type = Type::categorical;
  hp.vals = std::move(vals);
  return {std::move(name), hp};
}

NamedHyperparameter group(std::string name, std::vector<NamedHyperparameter> members) {
  Hyperparameter hp;
  hp.type = Type::nested;
  hp.members = std::move(members);
  return {std::move(name), hp};
}

/// The values of hyperparameter `name` over the grid, in order.
std::vector<json> column(const std::vector<json>& grid, const std::string& name) {
  std::vector<json> out;
  for (const auto& point : grid)
    out.push_back(point.at(name));
  return out;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("grid_hparams spaces int points with Determined's rounding") {
    // round(min + i*(max-min)/(count-1)), hand-computed.
    CHECK(column(grid_hparams({ranged("n", Type::integer, 1, 10, 4)}), "n") ==
          std::vector<json>{1, 4, 7, 10});
    // 1 + 9/2 = 5.5 rounds away from zero to 6.
    CHECK(column(grid_hparams({ranged("n", Type::integer, 1, 10, 3)}), "n") ==
          std::vector<json>{1, 6, 10});
    // 2 + 5/3 = 3.67 -> 4, 2 + 10/3 = 5.33 -> 5.
    CHECK(column(grid_hparams({ranged("n", Type::integer, 2, 7, 4)}), "n") ==
          std::vector<json>{2, 4, 5, 7});
    // The count is clamped to the 5 integers of [1, 5].
    CHECK(column(grid_hparams({ranged("n", Type::integer, 1, 5, 20)}), "n") ==
          std::vector<json>{1, 2, 3, 4, 5});
    // A count of 1 gives the midpoint, rounded: (1 + 4)/2 = 2.5 -> 3.
    CHECK(column(grid_hparams({ranged("n", Type::integer, 1, 4, 1)}), "n") == std::vector<json>{3});
    // Negative ranges: -5 + i*10/3 = -5, -1.67 -> -2, 1.67 -> 2, 5.
    CHECK(column(grid_hparams({ranged("n", Type::integer, -5, 5, 4)}), "n") ==
          std::vector<json>{-5, -2, 2, 5});
    const auto points = grid_hparams({ranged("n", Type::integer, 1, 10, 4)});
    CHECK(points[1].at("n").is_number_integer());
  }

  TEST_CASE("grid_hparams spaces double and log points evenly") {
    CHECK(column(grid_hparams({ranged("x", Type::real, 0, 1, 5)}), "x") ==
          std::vector<json>{0.0, 0.25, 0.5, 0.75, 1.0});
    CHECK(column(grid_hparams({ranged("x", Type::real, 2, 3, 1)}), "x") == std::vector<json>{2.5});
    // Log: evenly spaced exponents -4, -3, -2, -1 of base 10.
    const auto logs = column(grid_hparams({ranged("lr", Type::log, -4, -1, 4)}), "lr");
    REQUIRE(logs.size() == 4);
    const double expected[] = {1e-4, 1e-3, 1e-2, 1e-1};
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("point ", i, " is ", logs[i], " expected ", expected[i]);
      CHECK(logs[i].get<double>() == doctest::Approx(expected[i]).epsilon(1e-12));
    }
    // Base 2, count 1: the midpoint exponent 3 of [2, 4].
    CHECK(column(grid_hparams({ranged("w", Type::log, 2, 4, 1, 2)}), "w")[0].get<double>() ==
          doctest::Approx(8.0).epsilon(1e-12));
  }

  TEST_CASE("grid_hparams takes every categorical value and the const value") {
    const auto grid = grid_hparams({categorical("act", {"relu", "tanh", 3}), constant("c", 7)});
    CHECK(grid == std::vector<json>{{{"act", "relu"}, {"c", 7}},
                                    {{"act", "tanh"}, {"c", 7}},
                                    {{"act", 3}, {"c", 7}}});
  }

  TEST_CASE("grid_hparams varies the first sorted name slowest") {
    // File order b, a; Determined visits sorted names, so a varies slowest.
    const auto grid =
        grid_hparams({ranged("b", Type::integer, 1, 2, 2), categorical("a", {"x", "y"})});
    CHECK(grid == std::vector<json>{{{"a", "x"}, {"b", 1}},
                                    {{"a", "x"}, {"b", 2}},
                                    {{"a", "y"}, {"b", 1}},
                                    {{"a", "y"}, {"b", 2}}});
    CHECK(grid_hparams({}).empty());
  }

  TEST_CASE("grid_hparams gives nested groups as nested objects") {
    const auto grid = grid_hparams(
        {group("optimizer", {ranged("lr", Type::real, 0, 1, 2), constant("momentum", 0.9)}),
         constant("global_batch_size", 32), categorical("z", {1, 2})});
    // Sorted dotted names: global_batch_size, optimizer.lr, optimizer.momentum, z.
    CHECK(
        grid ==
        std::vector<json>{
            {{"global_batch_size", 32}, {"optimizer", {{"lr", 0.0}, {"momentum", 0.9}}}, {"z", 1}},
            {{"global_batch_size", 32}, {"optimizer", {{"lr", 0.0}, {"momentum", 0.9}}}, {"z", 2}},
            {{"global_batch_size", 32}, {"optimizer", {{"lr", 1.0}, {"momentum", 0.9}}}, {"z", 1}},
            {{"global_batch_size", 32},
             {"optimizer", {{"lr", 1.0}, {"momentum", 0.9}}},
             {"z", 2}}});
  }

  TEST_CASE("grid_hparams refuses a range without count") {
    CHECK_THROWS_WITH_AS(grid_hparams({constant("a", 1), ranged("lr", Type::log, -4, -1)}),
                         "hyperparameter 'lr': the grid searcher needs a count >= 1 for a log "
                         "hyperparameter but found none",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        grid_hparams({group("opt", {ranged("units", Type::integer, 1, 4, 0)})}),
        "hyperparameter 'opt.units': the grid searcher needs a count >= 1 for an int "
        "hyperparameter but found count 0",
        ConfigError);
    CHECK_THROWS_WITH_AS(grid_hparams({ranged("x", Type::real, 0, 1)}),
                         doctest::Contains("for a double hyperparameter"), ConfigError);
  }

  TEST_CASE("sample_hparams draws within each range and reaches both int ends") {
    const std::vector<NamedHyperparameter> hps{
        ranged("units", Type::integer, 1, 3), ranged("dropout", Type::real, 0.25, 0.5),
        ranged("lr", Type::log, -4, -2), categorical("act", {"relu", "tanh"}),
        constant("global_batch_size", 32)};
    SplitMix64 rng(42);
    std::set<std::int64_t> units;
    std::set<std::string> acts;
    for (int i = 0; i < 1000; ++i) {
      const json draw = sample_hparams(hps, rng);
      INFO(draw.dump());
      REQUIRE(draw.size() == 5);
      REQUIRE(draw.at("units").is_number_integer());
      units.insert(draw.at("units").get<std::int64_t>());
      const double dropout = draw.at("dropout").get<double>();
      CHECK((dropout >= 0.25 && dropout < 0.5));
      const double lr = draw.at("lr").get<double>();
      CHECK((lr >= 1e-4 * (1 - 1e-12) && lr <= 1e-2));
      acts.insert(draw.at("act").get<std::string>());
      CHECK(draw.at("global_batch_size") == 32);
      // Every draw fits its hyperparameters.
      CHECK(check_hparams(hps, draw) == draw);
    }
    // Determined >= 0.17 includes maxval (#2884).
    CHECK(units == std::set<std::int64_t>{1, 2, 3});
    CHECK(acts == std::set<std::string>{"relu", "tanh"});
  }

  TEST_CASE("sample_hparams is a function of the seed alone") {
    const std::vector<NamedHyperparameter> hps{
        ranged("units", Type::integer, 1, 1000), ranged("lr", Type::log, -5, -1),
        group("opt", {ranged("beta", Type::real, 0, 1), categorical("kind", {1, 2, 3, 4})})};
    SplitMix64 a(7);
    SplitMix64 b(7);
    SplitMix64 c(8);
    const json first = sample_hparams(hps, a);
    CHECK(first == sample_hparams(hps, b));
    CHECK(first != sample_hparams(hps, c));
    CHECK(first.at("opt").is_object());
    CHECK(first.at("opt").size() == 2);
    // The draw does not depend on the order of the file: names are visited sorted.
    const std::vector<NamedHyperparameter> reordered{
        group("opt", {categorical("kind", {1, 2, 3, 4}), ranged("beta", Type::real, 0, 1)}),
        ranged("lr", Type::log, -5, -1), ranged("units", Type::integer, 1, 1000)};
    SplitMix64 d(7);
    CHECK(sample_hparams(reordered, d) == first);
    // A second draw from the same generator differs from the first.
    CHECK(sample_hparams(hps, a) != first);
  }

  TEST_CASE("check_hparams accepts fitting values and normalises integral ints") {
    const std::vector<NamedHyperparameter> hps{
        ranged("units", Type::integer, 1, 8), ranged("lr", Type::log, -4, -1),
        group("opt", {ranged("beta", Type::real, 0, 1), categorical("kind", {"a", 2})}),
        constant("global_batch_size", 32)};
    const json values = {{"units", 8.0},
                         {"lr", 1e-4},
                         {"opt", {{"beta", 0.0}, {"kind", 2}}},
                         {"global_batch_size", 32}};
    const json checked = check_hparams(hps, values);
    CHECK(checked.at("units").is_number_integer());
    CHECK(checked.at("units") == 8);
    CHECK(checked.at("lr") == 1e-4);
    CHECK(checked.at("opt").at("kind") == 2);
    // Grid points fit too, the log ends included.
    std::vector<NamedHyperparameter> gridded = hps;
    gridded[0].value.count = 3;
    gridded[1].value.count = 4;
    gridded[2].value.members[0].value.count = 2;
    for (const json& point : grid_hparams(gridded))
      CHECK(check_hparams(gridded, point) == point);
  }

  TEST_CASE("check_hparams refuses values that do not fit") {
    const std::vector<NamedHyperparameter> hps{
        ranged("units", Type::integer, 1, 8), ranged("lr", Type::log, -4, -1),
        ranged("dropout", Type::real, 0, 0.5), group("opt", {categorical("kind", {"adam", "sgd"})}),
        constant("global_batch_size", 32)};
    const json good = {{"units", 4},
                       {"lr", 0.01},
                       {"dropout", 0.1},
                       {"opt", {{"kind", "adam"}}},
                       {"global_batch_size", 32}};
    REQUIRE_NOTHROW(check_hparams(hps, good));
    const auto with = [&](const json::json_pointer& at, json value) {
      json v = good;
      v[at] = std::move(value);
      return v;
    };
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/units"), 9)),
                         "hyperparameter 'units': expected an int in [1, 8] but found 9",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/units"), 2.5)),
                         "hyperparameter 'units': expected an int in [1, 8] but found 2.5",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/units"), "4")),
                         "hyperparameter 'units': expected an int in [1, 8] but found \"4\"",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/lr"), 0.5)),
                         "hyperparameter 'lr': expected a double in [10^-4, 10^-1] but found 0.5",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/dropout"), -0.1)),
                         "hyperparameter 'dropout': expected a double in [0, 0.5] but found -0.1",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/opt/kind"), "rmsprop")),
                         "hyperparameter 'opt.kind': expected one of [\"adam\",\"sgd\"] but found "
                         "\"rmsprop\"",
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        check_hparams(hps, with(json::json_pointer("/global_batch_size"), 64)),
        "hyperparameter 'global_batch_size': expected the constant 32 but found 64", ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/opt"), 3)),
                         "hyperparameter 'opt': expected an object of values but found 3",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/unit"), 3)),
                         "hyperparameter 'unit': not among the experiment's hyperparameters (did "
                         "you mean 'units'?)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/opt/kinds"), "sgd")),
                         "hyperparameter 'opt.kinds': not among the experiment's hyperparameters "
                         "(did you mean 'kind'?)",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, with(json::json_pointer("/zzzzzz"), 1)),
                         "hyperparameter 'zzzzzz': not among the experiment's hyperparameters",
                         ConfigError);
    json missing = good;
    missing.erase("dropout");
    CHECK_THROWS_WITH_AS(check_hparams(hps, missing),
                         "hyperparameter 'dropout': expected a double in [0, 0.5] but found no "
                         "value",
                         ConfigError);
    CHECK_THROWS_WITH_AS(check_hparams(hps, json::array()),
                         "hyperparameters: expected an object of values but found []", ConfigError);
  }
}
