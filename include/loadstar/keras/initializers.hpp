/// \file
/// `Initializer`: Keras's weight initializers (`glorot_uniform`, `he_normal`, `zeros`, ...), seeded
/// by a deterministic generator of ours so that weights do not depend on the standard library.
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/config_reader.hpp"
#include "loadstar/keras/registry.hpp"
#include "loadstar/random.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar::keras {

/// The generator of the initializers and dropout: loadstar's one SplitMix64.
using SplitMix64 = loadstar::SplitMix64;

/// Keras's `(fan_in, fan_out)` of a weight shape: a kernel `(kh, kw, in, out)` has
/// `fan_in = kh * kw * in` and `fan_out = kh * kw * out` (keras/initializers `_compute_fans`).
LOADSTAR_DECL std::pair<double, double> compute_fans(const Shape& shape);

/// A Keras initializer: its kind, parameters and optional seed.
///
/// Converts implicitly from a Keras name, so options read as in Keras:
/// \code
/// Initializer init = "he_normal";
/// Tensor<float> kernel({784, 128});
/// init.fill(kernel, /*default_seed=*/42);
/// init.to_json();  // {"class_name": "HeNormal", "config": {"seed": null}}
/// \endcode
class Initializer {
 public:
  enum class Kind {
    zeros,
    ones,
    constant,
    random_normal,
    random_uniform,
    truncated_normal,
    variance_scaling,
    orthogonal,
    /// An initializer loadstar cannot build (a Python function, an unregistered class) kept as
    /// its file wrote it: it fills zeros, for weights a loaded file then replaces.
    unresolved,
  };
  enum class Mode { fan_in, fan_out, fan_avg };
  enum class Distribution { truncated_normal, untruncated_normal, uniform };

  /// Resolves a Keras name (`"glorot_uniform"`, `"GlorotUniform"`, `"zeros"`, ...); throws
  /// `ConfigError` for an unknown one.
  Initializer(std::string_view name) { *this = from_name(name); }  // NOLINT: implicit by design
  Initializer(const char* name) : Initializer(std::string_view(name)) {}         // NOLINT
  Initializer(const std::string& name) : Initializer(std::string_view(name)) {}  // NOLINT

  static Initializer zeros() { return Initializer(Kind::zeros, "Zeros"); }
  static Initializer ones() { return Initializer(Kind::ones, "Ones"); }
  LOADSTAR_DECL static Initializer constant(double value);
  LOADSTAR_DECL static Initializer random_normal(double mean = 0.0, double stddev = 0.05,
                                                 std::optional<std::uint64_t> seed = {});
  LOADSTAR_DECL static Initializer random_uniform(double minval = -0.05, double maxval = 0.05,
                                                  std::optional<std::uint64_t> seed = {});
  /// A normal distribution cut at two standard deviations (values beyond are redrawn), as Keras.
  LOADSTAR_DECL static Initializer truncated_normal(double mean = 0.0, double stddev = 0.05,
                                                    std::optional<std::uint64_t> seed = {});
  LOADSTAR_DECL static Initializer variance_scaling(double scale, Mode mode,
                                                    Distribution distribution,
                                                    std::optional<std::uint64_t> seed = {},
                                                    std::string class_name = "VarianceScaling");
  static Initializer glorot_uniform(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(1.0, Mode::fan_avg, Distribution::uniform, seed, "GlorotUniform");
  }
  static Initializer glorot_normal(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(1.0, Mode::fan_avg, Distribution::truncated_normal, seed,
                            "GlorotNormal");
  }
  static Initializer he_normal(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(2.0, Mode::fan_in, Distribution::truncated_normal, seed, "HeNormal");
  }
  static Initializer he_uniform(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(2.0, Mode::fan_in, Distribution::uniform, seed, "HeUniform");
  }
  static Initializer lecun_normal(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(1.0, Mode::fan_in, Distribution::truncated_normal, seed, "LecunNormal");
  }
  static Initializer lecun_uniform(std::optional<std::uint64_t> seed = {}) {
    return variance_scaling(1.0, Mode::fan_in, Distribution::uniform, seed, "LecunUniform");
  }

  /// Keras's `Orthogonal`: `gain` times the `Q` of the QR decomposition of a standard normal
  /// matrix `(prod(shape[:-1]), shape[-1])` (transposed when it has fewer rows than columns),
  /// with `Q`'s columns signed so that `R`'s diagonal is positive (Keras's `sign(diag(r))`).
  LOADSTAR_DECL static Initializer orthogonal(double gain = 1.0,
                                              std::optional<std::uint64_t> seed = {});

  LOADSTAR_DECL static Initializer from_name(std::string_view name);

  /// The initializer a config names but loadstar cannot build (`{"class_name": "function",
  /// "config": "random_kernel"}`): `to_json` gives `config` back unchanged, `fill` writes zeros.
  LOADSTAR_DECL static Initializer unresolved(nlohmann::json config);

  /// Reads Keras's `{"class_name": ..., "config": {...}}` (or a plain name string) of a built-in
  /// initializer; throws `ConfigError` naming the key for a bad value. `Registry<Initializer>`
  /// resolves custom ones too.
  LOADSTAR_DECL static Initializer from_json(const nlohmann::json& j);

  /// The built-in initializer `class_name` (`"RandomNormal"`, `"glorot_uniform"`) from its Keras
  /// config (`{"mean": 0.0, "stddev": 0.05, "seed": null}`).
  LOADSTAR_DECL static Initializer from_config(const std::string& class_name,
                                               const nlohmann::json& config);

  /// Keras's serialisation: `{"class_name": "GlorotUniform", "config": {"seed": null}}`.
  LOADSTAR_DECL nlohmann::json to_json() const;

  /// Fills `t` (of the weight's shape); `default_seed` is used when the initializer has no seed.
  LOADSTAR_DECL void fill(const Tensor<float>& t, std::uint64_t default_seed) const;

  Kind kind() const noexcept { return kind_; }
  const std::string& class_name() const noexcept { return class_name_; }
  /// Keras's `get_config()`: the `config` of `to_json()`.
  nlohmann::json get_config() const { return to_json()["config"]; }

 private:
  Initializer(Kind kind, std::string class_name)
      : kind_(kind), class_name_(std::move(class_name)) {}
  LOADSTAR_DECL void fill_orthogonal(const Tensor<float>& t, SplitMix64& rng) const;

  Kind kind_ = Kind::zeros;
  std::string class_name_ = "Zeros";
  double a_ = 0.0;
  double b_ = 0.0;
  Mode mode_ = Mode::fan_in;
  Distribution distribution_ = Distribution::uniform;
  std::optional<std::uint64_t> seed_;
  nlohmann::json original_;  // the config of an unresolved initializer
};

/// The initializer registry makes `Initializer`s: every Keras name of the built-in ones
/// (`"glorot_uniform"`, `"GlorotUniform"`, ...); users register other names whose factories return
/// a configured built-in one (`Initializer` is a value type).
template <>
struct RegistryTraits<Initializer> {
  using Object = Initializer;
  static constexpr const char* kind = "initializer";
  static constexpr bool case_insensitive = false;
  LOADSTAR_DECL static void defaults(Registry<Initializer>& registry);
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
// Only the definitions use Eigen (the orthogonal initializer's QR decomposition).
#include "loadstar/detail/eigen_qr.hpp"

namespace loadstar::keras {

Initializer Initializer::constant(double value) {
  Initializer i(Kind::constant, "Constant");
  i.a_ = value;
  return i;
}

Initializer Initializer::random_normal(double mean, double stddev,
                                       std::optional<std::uint64_t> seed) {
  Initializer i(Kind::random_normal, "RandomNormal");
  i.a_ = mean;
  i.b_ = stddev;
  i.seed_ = seed;
  return i;
}

Initializer Initializer::random_uniform(double minval, double maxval,
                                        std::optional<std::uint64_t> seed) {
  Initializer i(Kind::random_uniform, "RandomUniform");
  i.a_ = minval;
  i.b_ = maxval;
  i.seed_ = seed;
  return i;
}

Initializer Initializer::truncated_normal(double mean, double stddev,
                                          std::optional<std::uint64_t> seed) {
  Initializer i(Kind::truncated_normal, "TruncatedNormal");
  i.a_ = mean;
  i.b_ = stddev;
  i.seed_ = seed;
  return i;
}

Initializer Initializer::variance_scaling(double scale, Mode mode, Distribution distribution,
                                          std::optional<std::uint64_t> seed,
                                          std::string class_name) {
  Initializer i(Kind::variance_scaling, std::move(class_name));
  i.a_ = scale;
  i.mode_ = mode;
  i.distribution_ = distribution;
  i.seed_ = seed;
  return i;
}

Initializer Initializer::orthogonal(double gain, std::optional<std::uint64_t> seed) {
  Initializer i(Kind::orthogonal, "Orthogonal");
  i.a_ = gain;
  i.seed_ = seed;
  return i;
}

Initializer Initializer::from_name(std::string_view name) {
  if (name == "zeros" || name == "Zeros" || name == "zero") return zeros();
  if (name == "ones" || name == "Ones" || name == "one") return ones();
  if (name == "constant" || name == "Constant") return constant(0.0);
  if (name == "random_normal" || name == "RandomNormal") return random_normal();
  if (name == "random_uniform" || name == "RandomUniform" || name == "uniform")
    return random_uniform();
  if (name == "truncated_normal" || name == "TruncatedNormal") return truncated_normal();
  if (name == "glorot_uniform" || name == "GlorotUniform") return glorot_uniform();
  if (name == "glorot_normal" || name == "GlorotNormal") return glorot_normal();
  if (name == "he_normal" || name == "HeNormal") return he_normal();
  if (name == "he_uniform" || name == "HeUniform") return he_uniform();
  if (name == "lecun_normal" || name == "LecunNormal") return lecun_normal();
  if (name == "lecun_uniform" || name == "LecunUniform") return lecun_uniform();
  if (name == "variance_scaling" || name == "VarianceScaling")
    return variance_scaling(1.0, Mode::fan_in, Distribution::truncated_normal);
  if (name == "orthogonal" || name == "Orthogonal") return orthogonal();
  throw ConfigError("unknown initializer '" + std::string(name) +
                    "'; known: zeros, ones, constant, random_normal, random_uniform, "
                    "truncated_normal, glorot_uniform, glorot_normal, he_normal, he_uniform, "
                    "lecun_normal, lecun_uniform, variance_scaling, orthogonal");
}

Initializer Initializer::from_json(const nlohmann::json& j) {
  if (j.is_string()) return from_name(j.get<std::string>());
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string()) {
    throw ConfigError(
        "initializer config: expected a name or {\"class_name\", \"config\"} but found " +
        detail::describe_json(j));
  }
  const auto config = j.find("config");
  return from_config(j["class_name"].get<std::string>(),
                     config == j.end() || config->is_null() ? nlohmann::json::object() : *config);
}

Initializer Initializer::from_config(const std::string& class_name, const nlohmann::json& config) {
  Initializer i = from_name(class_name);
  const auto read = detail::ConfigReader::of(config, "initializer", i.class_name_);
  switch (i.kind_) {
    case Kind::constant:
      i.a_ = read.get("value", 0.0);
      break;
    case Kind::random_normal:
    case Kind::truncated_normal:
      i.a_ = read.get("mean", 0.0);
      i.b_ = read.get("stddev", 0.05);
      break;
    case Kind::random_uniform:
      i.a_ = read.get("minval", -0.05);
      i.b_ = read.get("maxval", 0.05);
      break;
    case Kind::variance_scaling:
      if (i.class_name_ == "VarianceScaling") {
        i.a_ = read.get("scale", 1.0);
        const std::string mode = read.get("mode", "fan_in");
        if (mode != "fan_in" && mode != "fan_out" && mode != "fan_avg")
          read.fail("mode", "\"fan_in\", \"fan_out\" or \"fan_avg\"");
        i.mode_ = mode == "fan_out"   ? Mode::fan_out
                  : mode == "fan_avg" ? Mode::fan_avg
                                      : Mode::fan_in;
        // Keras 2.0 wrote "normal" for what later versions call "truncated_normal".
        const std::string d = read.get("distribution", "truncated_normal");
        if (d != "uniform" && d != "untruncated_normal" && d != "truncated_normal" &&
            d != "normal") {
          read.fail("distribution", "\"truncated_normal\", \"untruncated_normal\" or \"uniform\"");
        }
        i.distribution_ = d == "uniform"              ? Distribution::uniform
                          : d == "untruncated_normal" ? Distribution::untruncated_normal
                                                      : Distribution::truncated_normal;
      }
      break;
    case Kind::orthogonal:
      i.a_ = read.get("gain", 1.0);
      break;
    default:
      break;
  }
  i.seed_ = read.optional<std::uint64_t>("seed");
  return i;
}

Initializer Initializer::unresolved(nlohmann::json config) {
  std::string class_name = "?";
  if (config.is_string()) {
    class_name = config.get<std::string>();
  } else if (config.is_object() && config.contains("class_name") &&
             config["class_name"].is_string()) {
    class_name = config["class_name"].get<std::string>();
  }
  Initializer i(Kind::unresolved, std::move(class_name));
  i.original_ = std::move(config);
  return i;
}

nlohmann::json Initializer::to_json() const {
  if (kind_ == Kind::unresolved) return original_;
  nlohmann::json config = nlohmann::json::object();
  auto seed = [&] { return seed_ ? nlohmann::json(*seed_) : nlohmann::json(nullptr); };
  switch (kind_) {
    case Kind::zeros:
    case Kind::ones:
      break;
    case Kind::constant:
      config["value"] = a_;
      break;
    case Kind::random_normal:
    case Kind::truncated_normal:
      config = {{"mean", a_}, {"stddev", b_}, {"seed", seed()}};
      break;
    case Kind::random_uniform:
      config = {{"minval", a_}, {"maxval", b_}, {"seed", seed()}};
      break;
    case Kind::variance_scaling:
      if (class_name_ == "VarianceScaling") {
        const char* modes[] = {"fan_in", "fan_out", "fan_avg"};
        const char* distributions[] = {"truncated_normal", "untruncated_normal", "uniform"};
        config = {{"scale", a_},
                  {"mode", modes[int(mode_)]},
                  {"distribution", distributions[int(distribution_)]},
                  {"seed", seed()}};
      } else {
        config = {{"seed", seed()}};
      }
      break;
    case Kind::orthogonal:
      config = {{"gain", a_}, {"seed", seed()}};
      break;
    case Kind::unresolved:
      break;
  }
  return {{"class_name", class_name_}, {"config", config}};
}

void Initializer::fill(const Tensor<float>& t, std::uint64_t default_seed) const {
  SplitMix64 rng(seed_.value_or(default_seed));
  auto truncated = [&](double mean, double stddev) {
    for (;;) {
      const double z = rng.normal();
      if (std::abs(z) <= 2.0) return mean + stddev * z;
    }
  };
  switch (kind_) {
    case Kind::zeros:
    case Kind::unresolved:
      std::fill(t.begin(), t.end(), 0.0F);
      return;
    case Kind::ones:
      std::fill(t.begin(), t.end(), 1.0F);
      return;
    case Kind::constant:
      std::fill(t.begin(), t.end(), float(a_));
      return;
    case Kind::random_normal:
      for (float& v : t)
        v = float(a_ + b_ * rng.normal());
      return;
    case Kind::random_uniform:
      for (float& v : t)
        v = float(a_ + (b_ - a_) * rng.uniform());
      return;
    case Kind::truncated_normal:
      for (float& v : t)
        v = float(truncated(a_, b_));
      return;
    case Kind::variance_scaling: {
      const auto [fan_in, fan_out] = compute_fans(t.shape());
      const double n = mode_ == Mode::fan_in    ? fan_in
                       : mode_ == Mode::fan_out ? fan_out
                                                : (fan_in + fan_out) / 2.0;
      const double scale = a_ / std::max(1.0, n);
      if (distribution_ == Distribution::uniform) {
        const double limit = std::sqrt(3.0 * scale);
        for (float& v : t)
          v = float(-limit + 2.0 * limit * rng.uniform());
      } else if (distribution_ == Distribution::untruncated_normal) {
        const double stddev = std::sqrt(scale);
        for (float& v : t)
          v = float(stddev * rng.normal());
      } else {
        // Keras divides by the standard deviation of a unit normal truncated at +-2.
        const double stddev = std::sqrt(scale) / 0.87962566103423978;
        for (float& v : t)
          v = float(truncated(0.0, stddev));
      }
      return;
    }
    case Kind::orthogonal:
      fill_orthogonal(t, rng);
      return;
  }
}

void Initializer::fill_orthogonal(const Tensor<float>& t, SplitMix64& rng) const {
  // keras/initializers: flat shape (rows, cols) = (prod(shape[:-1]), shape[-1]); a normal matrix
  // of (max, min) is drawn, its QR taken and Q's columns multiplied by sign(diag(R)), then Q
  // transposed back when rows < cols.
  if (t.size() == 0) return;
  const auto cols = static_cast<Eigen::Index>(t.rank() == 0 ? 1 : t.shape()[t.rank() - 1]);
  const auto rows = static_cast<Eigen::Index>(t.size()) / cols;
  const Eigen::Index m = std::max(rows, cols), n = std::min(rows, cols);
  Eigen::MatrixXd a(m, n);
  for (Eigen::Index r = 0; r < m; ++r) {
    for (Eigen::Index c = 0; c < n; ++c)
      a(r, c) = rng.normal();
  }
  const Eigen::HouseholderQR<Eigen::MatrixXd> qr(a);
  Eigen::MatrixXd q = qr.householderQ() * Eigen::MatrixXd::Identity(m, n);
  for (Eigen::Index c = 0; c < n; ++c) {
    if (qr.matrixQR()(c, c) < 0.0) q.col(c) = -q.col(c);
  }
  float* out = t.data();
  for (Eigen::Index r = 0; r < rows; ++r) {
    for (Eigen::Index c = 0; c < cols; ++c)
      out[r * cols + c] = float(a_ * (rows >= cols ? q(r, c) : q(c, r)));
  }
}

void RegistryTraits<loadstar::keras::Initializer>::defaults(Registry<Initializer>& registry) {
  for (const char* name : {"zeros",
                           "Zeros",
                           "zero",
                           "ones",
                           "Ones",
                           "one",
                           "constant",
                           "Constant",
                           "random_normal",
                           "RandomNormal",
                           "random_uniform",
                           "RandomUniform",
                           "uniform",
                           "truncated_normal",
                           "TruncatedNormal",
                           "glorot_uniform",
                           "GlorotUniform",
                           "glorot_normal",
                           "GlorotNormal",
                           "he_normal",
                           "HeNormal",
                           "he_uniform",
                           "HeUniform",
                           "lecun_normal",
                           "LecunNormal",
                           "lecun_uniform",
                           "LecunUniform",
                           "variance_scaling",
                           "VarianceScaling",
                           "orthogonal",
                           "Orthogonal"}) {
    registry.add(name, [class_name = std::string(name)](const nlohmann::json& config) {
      return Initializer::from_config(class_name, config);
    });
  }
}

std::pair<double, double> compute_fans(const Shape& shape) {
  if (shape.rank() == 0) return {1.0, 1.0};
  if (shape.rank() == 1) return {double(shape[0]), double(shape[0])};
  if (shape.rank() == 2) return {double(shape[0]), double(shape[1])};
  double receptive = 1;
  for (std::size_t i = 0; i + 2 < shape.rank(); ++i)
    receptive *= double(shape[i]);
  return {double(shape[shape.rank() - 2]) * receptive, double(shape[shape.rank() - 1]) * receptive};
}

}  // namespace loadstar::keras
#endif
