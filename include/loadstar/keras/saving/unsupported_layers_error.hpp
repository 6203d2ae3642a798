/// \file
/// `UnsupportedLayersError`: a model config lists layer classes that neither the layer registry nor
/// the custom objects know, every one of them named at once.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "loadstar/error.hpp"

namespace loadstar::keras {

/// Thrown by `model_from_config`, `model_from_json` and `load_model` when a config lists layers
/// whose classes loadstar cannot build: all of them, with their names and key paths (layers of a
/// nested model included), so that a user learns every missing class from one attempt. A
/// `ConfigError`; `layers()` lets a program (the `loadstar` tool) word its own message.
/// \code
/// try { load_model("model.h5"); }
/// catch (const UnsupportedLayersError& e) { for (const auto& l : e.layers()) use(l.class_name); }
/// \endcode
class UnsupportedLayersError : public ConfigError {
 public:
  /// One layer of a class loadstar lacks.
  struct Entry {
    /// The key path of its entry: `"config.layers[2]"`, `"config.layers[1].config.layers[0]"`.
    std::string path;
    /// Its name (`"?"` when the entry has none).
    std::string name;
    std::string class_name;
  };

  /// `where` names the file or model; `layers` is not empty.
  UnsupportedLayersError(std::string where, std::vector<Entry> layers)
      : ConfigError(message(where, layers, true)),
        where_(std::move(where)),
        layers_(std::move(layers)) {}

  const std::string& where() const noexcept { return where_; }
  const std::vector<Entry>& layers() const noexcept { return layers_; }

  /// The message, with or without the advice to pass factories in the custom objects (a
  /// command-line user cannot).
  std::string describe(bool custom_objects_advice) const {
    return message(where_, layers_, custom_objects_advice);
  }

 private:
  static std::string message(const std::string& where, const std::vector<Entry>& layers,
                             bool advice) {
    std::string out = where + ": ";
    if (layers.size() == 1) {
      const Entry& l = layers.front();
      out += "layer '" + l.name + "' (" + l.path + ") has class '" + l.class_name +
             "', which loadstar does not support";
      if (advice) out += "; pass a factory for it in the custom objects";
      return out;
    }
    out += std::to_string(layers.size()) + " layers have classes loadstar does not support: ";
    for (std::size_t i = 0; i < layers.size(); ++i) {
      out += (i == 0 ? "'" : ", '") + layers[i].name + "' (" + layers[i].class_name + ", " +
             layers[i].path + ")";
    }
    if (advice) out += "; pass factories for them in the custom objects";
    return out;
  }

  std::string where_;
  std::vector<Entry> layers_;
};

}  // namespace loadstar::keras
