/// \file
/// `Registry<Base>`: one registry per kind of object (layers, activations, initializers, losses,
/// metrics, optimizers, learning-rate schedules, callbacks) that resolves Keras's names and
/// `{"class_name": ..., "config": ...}` configs, extensible by users, with per-call
/// `CustomObjects` (Keras's `custom_objects`).
#pragma once

#include "loadstar/config.hpp"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loadstar/error.hpp"
#include "loadstar/keras/detail/config_reader.hpp"

namespace loadstar::keras {

/// What a registry of `Base` makes and how it speaks of it; specialised by each kind's header
/// (losses.hpp specialises it for `Loss`, ...). A specialisation provides `using Object` (what a
/// factory returns: `std::unique_ptr<Loss>`, `std::shared_ptr<Layer>`, `Initializer`), `kind`
/// (`"loss"`, used in messages), `case_insensitive` (Keras's optimizer names are) and
/// `static void defaults(Registry<Base>&)`, which registers the built-in objects.
template <class Base>
struct RegistryTraits;

template <class Base>
class Registry;

/// Objects given to one call (Keras's `custom_objects`): factories by kind and name, consulted
/// before the registries, also for the objects nested in the config being read (a custom
/// initializer in a layer's config), as Keras's `custom_object_scope`.
/// \code
/// CustomObjects custom;
/// custom.add<Layer>("MyDense", [](const nlohmann::json& config) {
///   return std::make_shared<MyDense>(config);
/// });
/// auto model = model_from_json(text, &custom);
/// \endcode
class CustomObjects {
 public:
  template <class Base>
  using Factory = std::function<typename RegistryTraits<Base>::Object(const nlohmann::json&)>;

  /// Adds (or replaces) the factory of `name` for objects of kind `Base`.
  template <class Base>
  CustomObjects& add(std::string name, Factory<Base> factory) {
    factories_[{std::type_index(typeid(Base)), std::move(name)}] = Erased{std::move(factory)};
    return *this;
  }

  /// The factory of `name` for kind `Base`, or `nullptr`.
  template <class Base>
  const Factory<Base>* find(std::string_view name) const {
    const auto it = factories_.find({std::type_index(typeid(Base)), std::string(name)});
    if (it == factories_.end()) return nullptr;
    return static_cast<const Factory<Base>*>(it->second.factory.get());
  }

 private:
  /// A factory of any kind; `find<Base>` knows its type from the key.
  struct Erased {
    template <class F>
    explicit Erased(F f)
        : factory(new F(std::move(f)), [](const void* p) { delete static_cast<const F*>(p); }) {}
    Erased() = default;
    std::shared_ptr<const void> factory;
  };
  std::map<std::pair<std::type_index, std::string>, Erased> factories_;
};

namespace detail {

/// The custom objects of the `create` call running on this thread (Keras's thread-local
/// `custom_object_scope`), so that nested objects are resolved with them too.
LOADSTAR_DECL const CustomObjects*& current_custom_objects();

/// Sets the current custom objects for a scope (a `nullptr` keeps the enclosing ones).
class CustomObjectScope {
 public:
  explicit CustomObjectScope(const CustomObjects* custom) : previous_(current_custom_objects()) {
    if (custom != nullptr) current_custom_objects() = custom;
  }
  ~CustomObjectScope() { current_custom_objects() = previous_; }
  CustomObjectScope(const CustomObjectScope&) = delete;
  CustomObjectScope& operator=(const CustomObjectScope&) = delete;

 private:
  const CustomObjects* previous_;
};

LOADSTAR_DECL std::string lower_case(std::string_view text);

}  // namespace detail

/// One registry per kind of object (Keras's `object_registration`): names (`"adam"`,
/// `"relu"`, `"Dense"`) to factories that build the object from its Keras config. The process-wide
/// registry of a kind, `Registry<Base>::instance()`, starts with the built-in objects and users add
/// their own; every lookup and `add` is thread-safe. `create` takes a name or a Keras config
/// `{"class_name": ..., "config": {...}}`, and optional per-call `CustomObjects`, which take
/// precedence.
/// \code
/// auto adam = Registry<Optimizer>::instance().create("adam");
/// auto sgd = Registry<Optimizer>::instance().create(
///     nlohmann::json::parse(R"({"class_name": "SGD", "config": {"learning_rate": 0.1}})"));
/// Registry<Loss>::instance().add("my_loss", [](const nlohmann::json& config) {
///   return std::make_unique<MyLoss>(config);
/// });
/// \endcode
template <class Base>
class Registry {
 public:
  using Traits = RegistryTraits<Base>;
  using Object = typename Traits::Object;
  using Factory = std::function<Object(const nlohmann::json& config)>;

  /// An empty registry (the built-in objects are in `instance()`).
  Registry() = default;

  /// The process-wide registry of this kind, with the built-in objects.
  static Registry& instance() {
    static Registry registry = [] {
      Registry r;
      Traits::defaults(r);
      return r;
    }();
    return registry;
  }

  Registry(const Registry& other) : entries_(other.snapshot()) {}
  Registry& operator=(const Registry& other) {
    if (this != &other) {
      auto entries = other.snapshot();
      const std::lock_guard lock(mutex_);
      entries_ = std::move(entries);
    }
    return *this;
  }
  ~Registry() = default;

  /// Registers (or replaces) the factory of `name`.
  void add(const std::string& name, Factory factory) {
    const std::lock_guard lock(mutex_);
    for (auto& [known, f] : entries_) {
      if (known == name) {
        f = std::move(factory);
        return;
      }
    }
    entries_.emplace_back(name, std::move(factory));
  }

  /// Whether `name` resolves (exactly, or as the kind's rules allow: any case for optimizers,
  /// Keras's `"package>name"` registered names).
  bool contains(std::string_view name) const { return static_cast<bool>(lookup(name)); }

  /// The registered names, in registration order.
  std::vector<std::string> names() const {
    const std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [name, factory] : entries_)
      out.push_back(name);
    return out;
  }

  /// The object a name (`"adam"`) or a Keras config (`{"class_name": "Adam", "config": {...}}`)
  /// describes. Throws `ConfigError` for an unknown name (listing the known ones), for JSON that
  /// is neither, and whatever the factory throws for a bad config (a `ConfigError` naming the key).
  Object create(const nlohmann::json& name_or_config, const CustomObjects* custom = nullptr) const {
    if (name_or_config.is_string()) {
      return create(name_or_config.get<std::string>(), nlohmann::json::object(), custom);
    }
    if (!name_or_config.is_object() || !name_or_config.contains("class_name") ||
        !name_or_config["class_name"].is_string()) {
      throw ConfigError(std::string(Traits::kind) +
                        ": expected a name or {\"class_name\": ..., \"config\": {...}} but found " +
                        detail::describe_json(name_or_config));
    }
    std::string class_name = name_or_config["class_name"].get<std::string>();
    const CustomObjects* in_scope = custom != nullptr ? custom : detail::current_custom_objects();
    // Keras 3 and tf.keras 2.13 add "registered_name" ("package>Name") for custom objects.
    if (const auto it = name_or_config.find("registered_name");
        it != name_or_config.end() && it->is_string() && !lookup_any(class_name, in_scope) &&
        lookup_any(it->get<std::string>(), in_scope)) {
      class_name = it->get<std::string>();
    }
    const auto config = name_or_config.find("config");
    if (config == name_or_config.end() || config->is_null()) {
      return create(class_name, nlohmann::json::object(), custom);
    }
    return create(class_name, *config, custom);
  }

  /// The object of `class_name` built from `config`.
  Object create(const std::string& class_name, const nlohmann::json& config,
                const CustomObjects* custom = nullptr) const {
    const detail::CustomObjectScope scope(custom);
    Factory factory = lookup_any(class_name, detail::current_custom_objects());
    if (!factory) {
      std::string known;
      for (const auto& name : names())
        known += (known.empty() ? "" : ", ") + name;
      throw ConfigError("unknown " + std::string(Traits::kind) + " '" + class_name +
                        "'; known: " + known);
    }
    try {
      return factory(config);
    } catch (const nlohmann::json::exception& e) {
      // A user's factory that reads the JSON itself: name the class and the config.
      throw ConfigError(std::string(Traits::kind) + " '" + class_name + "': invalid config " +
                        detail::describe_json(config) + ": " + e.what());
    }
  }

 private:
  std::vector<std::pair<std::string, Factory>> snapshot() const {
    const std::lock_guard lock(mutex_);
    return entries_;
  }

  /// The per-call factory of `name` if any, else the registry's.
  Factory lookup_any(const std::string& name, const CustomObjects* custom) const {
    if (custom != nullptr) {
      if (const auto* f = custom->find<Base>(name)) return *f;
    }
    return lookup(name);
  }

  Factory lookup(std::string_view name) const {
    const std::lock_guard lock(mutex_);
    for (const auto& [known, factory] : entries_)
      if (known == name) return factory;
    if constexpr (Traits::case_insensitive) {
      const std::string lower = detail::lower_case(name);
      for (const auto& [known, factory] : entries_)
        if (detail::lower_case(known) == lower) return factory;
    }
    // Keras's registered names are "package>Name" (tf.keras 2.11 writes "Custom>RMSprop").
    if (const auto separator = name.rfind('>'); separator != std::string_view::npos) {
      const std::string_view bare = name.substr(separator + 1);
      for (const auto& [known, factory] : entries_) {
        if (known == bare) return factory;
        if (Traits::case_insensitive && detail::lower_case(known) == detail::lower_case(bare))
          return factory;
      }
    }
    return {};
  }

  mutable std::mutex mutex_;
  std::vector<std::pair<std::string, Factory>> entries_;
};

}  // namespace loadstar::keras

// Definitions: here when header-only, in the library when separately compiled (config.hpp).
#if LOADSTAR_KERAS_BODIES
namespace loadstar::keras::detail {

const CustomObjects*& current_custom_objects() {
  thread_local const CustomObjects* current = nullptr;
  return current;
}

std::string lower_case(std::string_view text) {
  std::string out(text);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace loadstar::keras::detail
#endif
