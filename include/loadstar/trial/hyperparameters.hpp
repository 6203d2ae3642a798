/// \file
/// Hyperparameter values from an experiment's `hyperparameters`: one random draw
/// (`sample_hparams`, the `random` and `adaptive_asha` searchers), the grid (`grid_hparams`, the
/// `grid` searcher) and a check that given values fit (`check_hparams`, on resume and for values a
/// user gives).
///
/// Values are JSON objects, name → value, a nested group giving a nested object:
/// `{"global_batch_size": 32, "optimizer": {"learning_rate": 0.01}}`. Hyperparameters are visited
/// in the order of their dotted names (`optimizer.learning_rate`), as Determined's
/// `Hyperparameters.Each` visits its sorted names, so that neither a draw nor the grid's order
/// depends on the order of the file.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/detail/json_state.hpp"
#include "loadstar/error.hpp"
#include "loadstar/random.hpp"
#include "loadstar/trial/detail/suggest.hpp"
#include "loadstar/trial/experiment_config.hpp"

namespace loadstar::trial {

namespace detail {

/// A hyperparameter that is not a group, with its path of names from the top.
struct FlatHparam {
  std::vector<std::string> path;
  std::string name;  // the path joined by '.'
  const Hyperparameter* value = nullptr;
};

LOADSTAR_DECL void flatten_hparams_into(const std::vector<NamedHyperparameter>& hparams,
                                        std::vector<std::string>& prefix,
                                        std::vector<FlatHparam>& out);

/// Every hyperparameter that is not a group, sorted by dotted name (Determined flattens nested
/// hyperparameters to dotted names and visits them sorted).
LOADSTAR_DECL std::vector<FlatHparam> flatten_hparams(
    const std::vector<NamedHyperparameter>& hparams);

/// Sets `values[path[0]][path[1]]... = value`, creating the groups.
LOADSTAR_DECL void set_hparam_at(nlohmann::json& values, const std::vector<std::string>& path,
                                 nlohmann::json value);

/// `x` as a message shows it: an integral value without a fraction, others in JSON's shortest
/// round-trip form.
LOADSTAR_DECL std::string format_hparam_number(double x);

/// What a hyperparameter accepts, for messages: `an int in [1, 8]`, `one of [16, 32]`.
LOADSTAR_DECL std::string describe_hparam(const Hyperparameter& hp);

/// The grid points of one hyperparameter (Determined's `grid.go`).
LOADSTAR_DECL std::vector<nlohmann::json> hparam_grid_points(const FlatHparam& flat);

/// Checks `value` against `hp` (named `name`) and returns it normalised (an integral double given
/// for an int becomes an int).
LOADSTAR_DECL nlohmann::json check_hparam_value(const std::string& name, const Hyperparameter& hp,
                                                const nlohmann::json& value);

LOADSTAR_DECL nlohmann::json check_hparam_group(const std::vector<NamedHyperparameter>& hparams,
                                                const nlohmann::json& values,
                                                const std::string& prefix);

}  // namespace detail

/// One random draw of every hyperparameter (Determined >= 0.17's `sampleAll`): an int uniform in
/// `[minval, maxval]` (both included), a double uniform in `[minval, maxval)`, a log
/// `base^uniform(minval, maxval)`, a categorical a uniform choice among `vals`, a const its value.
/// Hyperparameters draw from `rng` in the order of their dotted names.
/// \code
/// SplitMix64 rng(experiment_seed);
/// const nlohmann::json hparams = sample_hparams(config.hyperparameters, rng);
/// \endcode
LOADSTAR_DECL nlohmann::json sample_hparams(const std::vector<NamedHyperparameter>& hparams,
                                            SplitMix64& rng);

/// Every point of the grid (Determined's `grid.go`): the Cartesian product of each
/// hyperparameter's points, the first dotted name varying slowest. An int takes
/// `min(count, maxval - minval + 1)` points `round(minval + i*(maxval - minval)/(count - 1))`, a
/// double `count` evenly spaced points, a log `count` points evenly spaced in the exponent (a
/// count of 1 gives the midpoint, rounded for an int), a categorical all its `vals`, a const its
/// value. `ConfigError` naming the hyperparameter when an int, double or log has no `count`.
/// \code
/// for (const nlohmann::json& hparams : grid_hparams(config.hyperparameters)) create(hparams);
/// \endcode
LOADSTAR_DECL std::vector<nlohmann::json> grid_hparams(
    const std::vector<NamedHyperparameter>& hparams);

/// Checks that `values` gives every hyperparameter a value that fits it (a const its value, an int
/// an integer in range, a double or log a number in range, a categorical one of its `vals`, a
/// group an object) and nothing else; returns the values normalised (an integral double given for
/// an int becomes an int). `ConfigError` naming the hyperparameter, what it accepts and what was
/// found.
inline nlohmann::json check_hparams(const std::vector<NamedHyperparameter>& hparams,
                                    const nlohmann::json& values) {
  return detail::check_hparam_group(hparams, values, "");
}

}  // namespace loadstar::trial

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_TRIAL_BODIES
namespace loadstar::trial::detail {

void flatten_hparams_into(const std::vector<NamedHyperparameter>& hparams,
                          std::vector<std::string>& prefix, std::vector<FlatHparam>& out) {
  for (const auto& hp : hparams) {
    prefix.push_back(hp.name);
    if (hp.value.type == Hyperparameter::Type::nested) {
      flatten_hparams_into(hp.value.members, prefix, out);
    } else {
      std::string name;
      for (const auto& part : prefix)
        name += (name.empty() ? "" : ".") + part;
      out.push_back({prefix, std::move(name), &hp.value});
    }
    prefix.pop_back();
  }
}

std::vector<FlatHparam> flatten_hparams(const std::vector<NamedHyperparameter>& hparams) {
  std::vector<FlatHparam> out;
  std::vector<std::string> prefix;
  flatten_hparams_into(hparams, prefix, out);
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

void set_hparam_at(nlohmann::json& values, const std::vector<std::string>& path,
                   nlohmann::json value) {
  nlohmann::json* at = &values;
  for (const auto& part : path)
    at = &(*at)[part];
  *at = std::move(value);
}

std::string format_hparam_number(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::fabs(x) < 1e15) {
    return std::to_string(static_cast<std::int64_t>(x));
  }
  return nlohmann::json(x).dump();
}

std::string describe_hparam(const Hyperparameter& hp) {
  using Type = Hyperparameter::Type;
  switch (hp.type) {
    case Type::constant:
      return "the constant " + loadstar::detail::shown(hp.val);
    case Type::integer:
      return "an int in [" + format_hparam_number(hp.minval) + ", " +
             format_hparam_number(hp.maxval) + "]";
    case Type::real:
      return "a double in [" + format_hparam_number(hp.minval) + ", " +
             format_hparam_number(hp.maxval) + "]";
    case Type::log:
      return "a double in [" + format_hparam_number(hp.base) + "^" +
             format_hparam_number(hp.minval) + ", " + format_hparam_number(hp.base) + "^" +
             format_hparam_number(hp.maxval) + "]";
    case Type::categorical:
      return "one of " + loadstar::detail::shown(nlohmann::json(hp.vals));
    case Type::nested:
      break;
  }
  return "a group of hyperparameters";
}

std::vector<nlohmann::json> hparam_grid_points(const FlatHparam& flat) {
  using Type = Hyperparameter::Type;
  const Hyperparameter& hp = *flat.value;
  std::vector<nlohmann::json> points;
  const bool ranged = hp.type == Type::integer || hp.type == Type::real || hp.type == Type::log;
  if (ranged && (!hp.count || *hp.count == 0)) {
    const char* kind = hp.type == Type::integer ? "an int"
                       : hp.type == Type::real  ? "a double"
                                                : "a log";
    throw ConfigError("hyperparameter '" + flat.name +
                      "': the grid searcher needs a count >= 1 for " + kind +
                      " hyperparameter but found " +
                      (hp.count ? "count " + std::to_string(*hp.count) : std::string("none")));
  }
  switch (hp.type) {
    case Type::constant:
      points.push_back(hp.val);
      break;
    case Type::integer: {
      const auto low = static_cast<std::int64_t>(hp.minval);
      const auto high = static_cast<std::int64_t>(hp.maxval);
      // Clamped to the number of integers in the range.
      const auto count =
          std::min<std::int64_t>(static_cast<std::int64_t>(*hp.count), high - low + 1);
      if (count == 1) {
        points.emplace_back(
            static_cast<std::int64_t>(std::round(static_cast<double>(low + high) / 2.0)));
      } else {
        for (std::int64_t i = 0; i < count; ++i) {
          // Go: round(float64(min) + float64(i*(max-min))/float64(count-1)); std::round rounds
          // halves away from zero as Go's math.Round does.
          points.emplace_back(static_cast<std::int64_t>(
              std::round(static_cast<double>(low) +
                         static_cast<double>(i * (high - low)) / static_cast<double>(count - 1))));
        }
      }
      break;
    }
    case Type::real:
    case Type::log: {
      const auto count = *hp.count;
      const auto point = [&](double exponent) {
        return hp.type == Type::log ? std::pow(hp.base, exponent) : exponent;
      };
      if (count == 1) {
        points.emplace_back(point((hp.minval + hp.maxval) / 2.0));
      } else {
        for (std::uint64_t i = 0; i < count; ++i) {
          points.emplace_back(point(hp.minval + static_cast<double>(i) * (hp.maxval - hp.minval) /
                                                    static_cast<double>(count - 1)));
        }
      }
      break;
    }
    case Type::categorical:
      points = hp.vals;
      break;
    case Type::nested:
      break;
  }
  return points;
}

nlohmann::json check_hparam_value(const std::string& name, const Hyperparameter& hp,
                                  const nlohmann::json& value) {
  using Type = Hyperparameter::Type;
  const auto refuse = [&]() -> ConfigError {
    return ConfigError("hyperparameter '" + name + "': expected " + describe_hparam(hp) +
                       " but found " + loadstar::detail::shown(value));
  };
  switch (hp.type) {
    case Type::constant:
      if (value != hp.val) throw refuse();
      return value;
    case Type::integer: {
      if (!value.is_number()) throw refuse();
      const double x = value.get<double>();
      if (x != std::floor(x) || x < hp.minval || x > hp.maxval) throw refuse();
      return static_cast<std::int64_t>(x);
    }
    case Type::real: {
      if (!value.is_number()) throw refuse();
      const double x = value.get<double>();
      if (!(x >= hp.minval && x <= hp.maxval)) throw refuse();
      return x;
    }
    case Type::log: {
      if (!value.is_number()) throw refuse();
      const double x = value.get<double>();
      // base^x is rounded: allow the ends a few units in the last place.
      const double low = std::pow(hp.base, std::min(hp.minval, hp.maxval));
      const double high = std::pow(hp.base, std::max(hp.minval, hp.maxval));
      const double slack = 1e-12;
      if (!(x >= low * (1 - slack) && x <= high * (1 + slack))) throw refuse();
      return x;
    }
    case Type::categorical:
      for (const auto& option : hp.vals) {
        if (option == value) return option;
      }
      throw refuse();
    case Type::nested:
      break;
  }
  throw refuse();
}

nlohmann::json check_hparam_group(const std::vector<NamedHyperparameter>& hparams,
                                  const nlohmann::json& values, const std::string& prefix) {
  const std::string group =
      prefix.empty() ? std::string("hyperparameters") : "hyperparameter '" + prefix + "'";
  if (!values.is_object()) {
    throw ConfigError(group + ": expected an object of values but found " +
                      loadstar::detail::shown(values));
  }
  std::vector<std::string> names;
  names.reserve(hparams.size());
  for (const auto& hp : hparams)
    names.push_back(hp.name);
  for (const auto& [key, value] : values.items()) {
    if (std::find(names.begin(), names.end(), key) == names.end()) {
      throw ConfigError("hyperparameter '" + (prefix.empty() ? key : prefix + "." + key) +
                        "': not among the experiment's hyperparameters" + did_you_mean(key, names));
    }
  }
  nlohmann::json out = nlohmann::json::object();
  for (const auto& hp : hparams) {
    const std::string name = prefix.empty() ? hp.name : prefix + "." + hp.name;
    const auto found = values.find(hp.name);
    if (found == values.end()) {
      throw ConfigError("hyperparameter '" + name + "': expected " + describe_hparam(hp.value) +
                        " but found no value");
    }
    out[hp.name] = hp.value.type == Hyperparameter::Type::nested
                       ? check_hparam_group(hp.value.members, *found, name)
                       : check_hparam_value(name, hp.value, *found);
  }
  return out;
}

}  // namespace loadstar::trial::detail
namespace loadstar::trial {

nlohmann::json sample_hparams(const std::vector<NamedHyperparameter>& hparams, SplitMix64& rng) {
  using Type = Hyperparameter::Type;
  nlohmann::json values = nlohmann::json::object();
  for (const auto& flat : detail::flatten_hparams(hparams)) {
    const Hyperparameter& hp = *flat.value;
    nlohmann::json value;
    switch (hp.type) {
      case Type::constant:
        value = hp.val;
        break;
      case Type::integer: {
        const auto low = static_cast<std::int64_t>(hp.minval);
        const auto high = static_cast<std::int64_t>(hp.maxval);
        value =
            low + static_cast<std::int64_t>(rng.below(static_cast<std::uint64_t>(high - low) + 1));
        break;
      }
      case Type::real:
        value = hp.minval + rng.uniform() * (hp.maxval - hp.minval);
        break;
      case Type::log:
        value = std::pow(hp.base, hp.minval + rng.uniform() * (hp.maxval - hp.minval));
        break;
      case Type::categorical:
        if (hp.vals.empty()) {
          throw ConfigError("hyperparameter '" + flat.name +
                            "': expected at least one categorical value but found none");
        }
        value = hp.vals[static_cast<std::size_t>(rng.below(hp.vals.size()))];
        break;
      case Type::nested:
        continue;  // flatten_hparams() yields no groups
    }
    detail::set_hparam_at(values, flat.path, std::move(value));
  }
  return values;
}

std::vector<nlohmann::json> grid_hparams(const std::vector<NamedHyperparameter>& hparams) {
  const auto flat = detail::flatten_hparams(hparams);
  std::vector<std::vector<nlohmann::json>> points;
  points.reserve(flat.size());
  for (const auto& hp : flat)
    points.push_back(detail::hparam_grid_points(hp));
  // No hyperparameters: no point, as Determined's cartesianProduct returns none.
  if (flat.empty()) return {};
  std::vector<nlohmann::json> grid{nlohmann::json::object()};
  // Built from the last name outwards so that the first name varies slowest.
  for (std::size_t k = flat.size(); k-- > 0;) {
    std::vector<nlohmann::json> next;
    next.reserve(points[k].size() * grid.size());
    for (const auto& value : points[k]) {
      for (const auto& rest : grid) {
        nlohmann::json point = rest;
        detail::set_hparam_at(point, flat[k].path, value);
        next.push_back(std::move(point));
      }
    }
    grid = std::move(next);
  }
  return grid;
}

}  // namespace loadstar::trial
#endif
