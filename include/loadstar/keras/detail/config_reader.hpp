/// \file
/// `ConfigReader`: reads the keys of a Keras config with their path, so that a bad config throws a
/// `ConfigError` naming the object, the key path, what was expected and what was found.
#pragma once

#include "loadstar/config.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"

namespace loadstar::keras::detail {

/// A short rendering of a JSON value for messages: its dump, cut after 80 characters.
LOADSTAR_DECL std::string describe_json(const nlohmann::json& value);

template <class T>
struct ConfigValue;

/// How a config value of type `T` is checked and read; `expected` says what it must be.
template <>
struct ConfigValue<bool> {
  static std::string expected() { return "a boolean"; }
  static bool fits(const nlohmann::json& j) { return j.is_boolean(); }
  static bool read(const nlohmann::json& j) { return j.get<bool>(); }
};
template <>
struct ConfigValue<std::string> {
  static std::string expected() { return "a string"; }
  static bool fits(const nlohmann::json& j) { return j.is_string(); }
  static std::string read(const nlohmann::json& j) { return j.get<std::string>(); }
};
template <>
struct ConfigValue<double> {
  static std::string expected() { return "a number"; }
  static bool fits(const nlohmann::json& j) { return j.is_number(); }
  static double read(const nlohmann::json& j) { return j.get<double>(); }
};
template <>
struct ConfigValue<float> {
  static std::string expected() { return "a number"; }
  static bool fits(const nlohmann::json& j) { return j.is_number(); }
  static float read(const nlohmann::json& j) { return j.get<float>(); }
};
template <>
struct ConfigValue<int> {
  static std::string expected() { return "an integer"; }
  static bool fits(const nlohmann::json& j) {
    return j.is_number_integer() && j.get<std::int64_t>() >= -2147483647 &&
           j.get<std::int64_t>() <= 2147483647;
  }
  static int read(const nlohmann::json& j) { return j.get<int>(); }
};
template <>
struct ConfigValue<std::int64_t> {
  static std::string expected() { return "an integer"; }
  static bool fits(const nlohmann::json& j) { return j.is_number_integer(); }
  static std::int64_t read(const nlohmann::json& j) { return j.get<std::int64_t>(); }
};
template <>
struct ConfigValue<std::size_t> {
  static std::string expected() { return "a non-negative integer"; }
  static bool fits(const nlohmann::json& j) {
    return j.is_number_unsigned() || (j.is_number_integer() && j.get<std::int64_t>() >= 0);
  }
  static std::size_t read(const nlohmann::json& j) { return j.get<std::size_t>(); }
};
template <class T>
struct ConfigValue<std::vector<T>> {
  static std::string expected() {
    // "a number" -> "a list of numbers", "an integer" -> "a list of integers".
    const std::string one = ConfigValue<T>::expected();
    return "a list of " + one.substr(one.find(' ') + 1) + "s";
  }
  static bool fits(const nlohmann::json& j) {
    if (!j.is_array()) return false;
    for (const auto& e : j)
      if (!ConfigValue<T>::fits(e)) return false;
    return true;
  }
  static std::vector<T> read(const nlohmann::json& j) {
    std::vector<T> out;
    for (const auto& e : j)
      out.push_back(ConfigValue<T>::read(e));
    return out;
  }
};

/// Reads a Keras config (`{"units": 10, ...}`) key by key. Every failure throws `ConfigError`
/// with the owner, the key path, the expectation and what was found:
/// `layer 'fc1' (Dense): config.units: expected a positive integer but found "ten"`.
/// \code
/// ConfigReader read(config, "layer 'fc1' (Dense)");
/// auto units = read.positive("units");
/// bool use_bias = read.get("use_bias", true);
/// \endcode
class ConfigReader {
 public:
  /// `owner` names the object in messages (`"layer 'fc1' (Dense)"`); `path` is the config's own
  /// path (`"config"`, `"config.layers[2].config"`). Throws unless `config` is an object.
  LOADSTAR_DECL ConfigReader(const nlohmann::json& config, std::string owner,
                             std::string path = "config");

  /// A reader for the config of a registered object: its owner is `"<kind> '<name>'
  /// (<class_name>)"`, or `"<kind> (<class_name>)"` when the config has no name.
  LOADSTAR_DECL static ConfigReader of(const nlohmann::json& config, std::string_view kind,
                                       std::string_view class_name);

  const nlohmann::json& json() const noexcept { return *config_; }
  const std::string& owner() const noexcept { return owner_; }
  const std::string& path() const noexcept { return path_; }
  /// `"config.units"`.
  std::string path(std::string_view key) const { return path_ + "." + std::string(key); }

  /// Whether `key` is present and not null.
  LOADSTAR_DECL bool has(std::string_view key) const;

  /// The value of `key`, or `nullptr` when absent.
  LOADSTAR_DECL const nlohmann::json* find(std::string_view key) const;

  /// The required value of `key` as `T`.
  template <class T>
  T get(std::string_view key) const {
    const nlohmann::json* value = find(key);
    if (value == nullptr || !ConfigValue<T>::fits(*value)) fail(key, ConfigValue<T>::expected());
    return ConfigValue<T>::read(*value);
  }

  /// The value of `key` as `T`, or `fallback` when absent or null.
  template <class T>
  T get(std::string_view key, T fallback) const {
    if (!has(key)) return fallback;
    return get<T>(key);
  }
  std::string get(std::string_view key, const char* fallback) const {
    return get<std::string>(key, std::string(fallback));
  }

  /// The value of `key` as `T`, or nothing when absent or null.
  template <class T>
  std::optional<T> optional(std::string_view key) const {
    if (!has(key)) return std::nullopt;
    return get<T>(key);
  }

  /// A required integer above 0.
  LOADSTAR_DECL std::size_t positive(std::string_view key) const;

  /// Throws unless `key` is absent or holds `expected` (a setting loadstar does not support in
  /// another value: `data_format` other than `"channels_last"`, a regularizer, ...). `why` says
  /// why.
  LOADSTAR_DECL void expect(std::string_view key, const nlohmann::json& expected,
                            std::string_view why) const;

  /// Throws `ConfigError` for `key`: `"<owner>: <path>.<key>: expected <expected> but found
  /// <value or nothing>"`.
  [[noreturn]] LOADSTAR_DECL void fail(std::string_view key, std::string_view expected) const;

  /// Runs `read` (which resolves a nested object at `key`) and prefixes any `ConfigError` it
  /// throws with the owner and the key path.
  template <class F>
  auto nested(std::string_view key, F&& read) const -> decltype(read()) {
    try {
      return read();
    } catch (const ConfigError& e) {
      throw ConfigError(owner_ + ": " + path(key) + ": " + e.what());
    }
  }

 private:
  const nlohmann::json* config_;
  std::string owner_;
  std::string path_;
};

}  // namespace loadstar::keras::detail

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

ConfigReader::ConfigReader(const nlohmann::json& config, std::string owner, std::string path)
    : config_(&config), owner_(std::move(owner)), path_(std::move(path)) {
  if (!config.is_object()) {
    throw ConfigError(owner_ + ": " + path_ + ": expected an object but found " +
                      describe_json(config));
  }
}

ConfigReader ConfigReader::of(const nlohmann::json& config, std::string_view kind,
                              std::string_view class_name) {
  std::string owner(kind);
  if (config.is_object() && config.contains("name") && config["name"].is_string())
    owner += " '" + config["name"].get<std::string>() + "'";
  owner += " (" + std::string(class_name) + ")";
  return ConfigReader(config, std::move(owner));
}

bool ConfigReader::has(std::string_view key) const {
  const auto it = config_->find(key);
  return it != config_->end() && !it->is_null();
}

const nlohmann::json* ConfigReader::find(std::string_view key) const {
  const auto it = config_->find(key);
  return it == config_->end() ? nullptr : &*it;
}

std::size_t ConfigReader::positive(std::string_view key) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr || !ConfigValue<std::size_t>::fits(*value) ||
      value->get<std::size_t>() == 0) {
    fail(key, "a positive integer");
  }
  return value->get<std::size_t>();
}

void ConfigReader::expect(std::string_view key, const nlohmann::json& expected,
                          std::string_view why) const {
  const nlohmann::json* value = find(key);
  if (value == nullptr || *value == expected) return;
  if (expected.is_null() && value->is_null()) return;
  fail(key, describe_json(expected) + " (" + std::string(why) + ")");
}

void ConfigReader::fail(std::string_view key, std::string_view expected) const {
  const nlohmann::json* value = find(key);
  throw ConfigError(owner_ + ": " + path(key) + ": expected " + std::string(expected) +
                    " but found " + (value == nullptr ? "nothing" : describe_json(*value)));
}

std::string describe_json(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

}  // namespace loadstar::keras::detail
#endif
