#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <loadstar/trial/experiment_config.hpp>
#include <loadstar/trial/hyperparameters.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

using namespace loadstar::trial;
using nlohmann::json;

namespace {

/// tests/trial/config/reference/grid.json, written by generate_grid.py from Determined's formulas.
json load_reference() {
  const char* root = std::getenv("LOADSTAR_SOURCE_DIR");
  REQUIRE_MESSAGE(root != nullptr, "LOADSTAR_SOURCE_DIR is not set");
  std::ifstream in(std::string(root) + "/tests/trial/config/reference/grid.json");
  REQUIRE_MESSAGE(in.good(), "tests/trial/config/reference/grid.json cannot be read");
  return json::parse(in);
}

ExperimentConfig config_with(const json& hparams) {
  return experiment_config_from_json(
      json{{"entrypoint", "t"},
           {"hyperparameters", hparams},
           {"searcher", {{"name", "grid"}, {"metric", "m"}, {"max_length", {{"batches", 1}}}}}},
      "grid.json");
}

/// Whether `value` matches `target`: ints exactly (and as ints), floats within 1e-13 relative
/// (log points go through `pow`), objects and arrays element by element, the rest exactly.
bool matches(const json& value, const json& target) {
  if (target.is_number_float()) {
    if (!value.is_number_float()) return false;
    const double v = value.get<double>();
    const double t = target.get<double>();
    return std::fabs(v - t) <= 1e-13 * std::max(1.0, std::fabs(t));
  }
  if (target.is_number_integer()) return value.is_number_integer() && value == target;
  if (target.is_object()) {
    if (!value.is_object() || value.size() != target.size()) return false;
    for (const auto& [key, item] : target.items()) {
      if (!value.contains(key) || !matches(value.at(key), item)) return false;
    }
    return true;
  }
  if (target.is_array()) {
    if (!value.is_array() || value.size() != target.size()) return false;
    for (std::size_t i = 0; i < target.size(); ++i) {
      if (!matches(value[i], target[i])) return false;
    }
    return true;
  }
  return value == target;
}

}  // namespace

TEST_SUITE("trial") {
  TEST_CASE("grid_hparams matches Determined's grid formulas point by point") {
    const json reference = load_reference();
    REQUIRE(reference.at("values").size() > 500);
    for (const json& entry : reference.at("values")) {
      const json& hp = entry.at("hyperparameter");
      const auto grid =
          grid_hparams(config_with({{"global_batch_size", 1}, {"h", hp}}).hyperparameters);
      const json& target = entry.at("values");
      REQUIRE(grid.size() == target.size());
      for (std::size_t i = 0; i < grid.size(); ++i) {
        INFO("hyperparameter ", hp.dump(), " point ", i, " is ", grid[i].at("h").dump(),
             " expected ", target[i].dump());
        CHECK(matches(grid[i].at("h"), target[i]));
      }
    }
  }

  TEST_CASE("grid_hparams orders products of nested groups as Determined does") {
    const json reference = load_reference();
    for (const json& entry : reference.at("products")) {
      const auto grid = grid_hparams(config_with(entry.at("hyperparameters")).hyperparameters);
      const json& target = entry.at("points");
      REQUIRE(grid.size() == target.size());
      for (std::size_t i = 0; i < grid.size(); ++i) {
        INFO("point ", i, " is ", grid[i].dump(), " expected ", target[i].dump());
        CHECK(matches(grid[i], target[i]));
      }
    }
  }
}
