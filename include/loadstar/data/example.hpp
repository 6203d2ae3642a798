/// \file
/// `parse_single_example` and `parse_example`: `tf.train.Example` records into tensors, with
/// tf.io's feature specifications (`FixedLenFeature`, `VarLenFeature`, `FixedLenSequenceFeature`).
/// An opt-in include, outside `<loadstar/data.hpp>`: it links protobuf and libprotoc (Debian's
/// libprotobuf-dev and libprotoc-dev), as the TensorBoard writer does.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "loadstar/data/detail/example_proto.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor/shape.hpp"
#include "loadstar/tensor/tensor.hpp"

namespace loadstar {

/// The three value types of a `tf.train.Feature`: `tf.string` (a `BytesList`), `tf.float32` (a
/// `FloatList`) and `tf.int64` (an `Int64List`).
enum class ExampleDtype { string, float32, int64 };

/// A tensor of byte strings: `values` in row-major order, `shape.elements()` of them.
struct BytesTensor {
  Shape shape = {};
  std::vector<std::string> values = {};
  friend bool operator==(const BytesTensor&, const BytesTensor&) = default;
};

/// The values of a feature: `Tensor<float>` for `float32`, `Tensor<std::int64_t>` for `int64`,
/// `BytesTensor` for `string`.
using FeatureTensor = std::variant<Tensor<float>, Tensor<std::int64_t>, BytesTensor>;

/// Default values, flattened row-major (their number must be the shape's element count).
using FeatureDefault =
    std::variant<std::vector<float>, std::vector<std::int64_t>, std::vector<std::string>>;

/// `tf.io.FixedLenFeature`: exactly `shape.elements()` values; a missing feature takes
/// `default_value`, or is an error without one.
struct FixedLenFeature {
  Shape shape = {};
  ExampleDtype dtype = ExampleDtype::float32;
  std::optional<FeatureDefault> default_value = {};
};

/// `tf.io.VarLenFeature`: any number of values (a missing feature has none), returned as
/// `tf.SparseTensor`'s parts.
struct VarLenFeature {
  ExampleDtype dtype = ExampleDtype::float32;
};

/// `tf.io.FixedLenSequenceFeature`: a multiple of `shape.elements()` values, stacked as rows of
/// `shape`. `allow_missing` must be true, as tf.io requires; a missing feature has no rows. In
/// `parse_example` shorter examples are padded with `default_value` (a single value; zero or the
/// empty string without one).
struct FixedLenSequenceFeature {
  Shape shape = {};
  ExampleDtype dtype = ExampleDtype::float32;
  bool allow_missing = false;
  std::optional<FeatureDefault> default_value = {};
};

using FeatureSpec = std::variant<FixedLenFeature, VarLenFeature, FixedLenSequenceFeature>;
/// Feature name to specification, as the `features` dict of `tf.io.parse_example`.
using FeatureSpecs = std::map<std::string, FeatureSpec>;

/// One parsed feature. Dense features (`FixedLenFeature`, `FixedLenSequenceFeature`) fill
/// `values` only. A `VarLenFeature` is `tf.SparseTensor`'s parts: `values` (1-D), `indices`
/// (one row of coordinates per value: `(j)` for a single example, `(b, j)` for a batch) and
/// `dense_shape` (`(n)`, or `(batch, longest)`).
struct ParsedFeature {
  FeatureTensor values = Tensor<float>();
  std::optional<Tensor<std::int64_t>> indices = {};
  std::vector<std::int64_t> dense_shape = {};
};

/// Feature name to parsed feature.
using ParsedExample = std::map<std::string, ParsedFeature>;

namespace detail {

inline const char* example_dtype_name(ExampleDtype dtype) {
  switch (dtype) {
    case ExampleDtype::string:
      return "string (bytes_list)";
    case ExampleDtype::float32:
      return "float32 (float_list)";
    default:
      return "int64 (int64_list)";
  }
}

/// The values of one feature of one example, by reference into the parsed message.
struct RawFeature {
  bool present = false;
  std::optional<ExampleDtype> kind;           // Unset for a `Feature` with no list at all.
  google::protobuf::Message* list = nullptr;  // Mutable: bytes are moved out of it.
  std::size_t size = 0;
};

/// A parsed `tf.train.Example` with the features the specs ask for located.
class ExampleView {
 public:
  ExampleView(std::string_view serialized, const FeatureSpecs& specs, const std::string& where)
      : schema_(&ExampleSchema::get()),
        arena_(std::make_unique<google::protobuf::Arena>()),
        message_(schema_->new_example(*arena_)) {
    if (serialized.size() > static_cast<std::size_t>(INT32_MAX) ||
        !message_->ParsePartialFromArray(serialized.data(), static_cast<int>(serialized.size()))) {
      throw FormatError(where + ": expected a serialized tf.train.Example but " +
                        std::to_string(serialized.size()) + " bytes do not parse as one");
    }
    const auto* reflection = message_->GetReflection();
    auto* features = reflection->MutableMessage(message_, schema_->features);
    const auto* features_reflection = features->GetReflection();
    const int count = features_reflection->FieldSize(*features, schema_->feature_map);
    for (int i = 0; i < count; ++i) {
      auto* entry = features_reflection->MutableRepeatedMessage(features, schema_->feature_map, i);
      const auto* entry_reflection = entry->GetReflection();
      std::string key = entry_reflection->GetString(*entry, schema_->entry_key);
      if (specs.find(key) == specs.end()) continue;  // Unrequested features are skipped, as tf.
      RawFeature raw;
      raw.present = true;
      auto* feature = entry_reflection->MutableMessage(entry, schema_->entry_value);
      const auto* feature_reflection = feature->GetReflection();
      const auto take = [&](ExampleDtype kind, const google::protobuf::FieldDescriptor* list,
                            const google::protobuf::FieldDescriptor* value) {
        raw.kind = kind;
        raw.list = feature_reflection->MutableMessage(feature, list);
        raw.size = static_cast<std::size_t>(raw.list->GetReflection()->FieldSize(*raw.list, value));
      };
      if (feature_reflection->HasField(*feature, schema_->bytes_list)) {
        take(ExampleDtype::string, schema_->bytes_list, schema_->bytes_value);
      } else if (feature_reflection->HasField(*feature, schema_->float_list)) {
        take(ExampleDtype::float32, schema_->float_list, schema_->float_value);
      } else if (feature_reflection->HasField(*feature, schema_->int64_list)) {
        take(ExampleDtype::int64, schema_->int64_list, schema_->int64_value);
      }
      features_[std::move(key)] = raw;  // A repeated key: the last wins, as protobuf's maps.
    }
  }

  /// The feature `name` (not present when the example lacks it).
  RawFeature find(const std::string& name) const {
    const auto it = features_.find(name);
    return it == features_.end() ? RawFeature{} : it->second;
  }

  /// Copies the numbers of `raw` into `out`.
  void copy(const RawFeature& raw, float* out) const {
    const auto* r = raw.list->GetReflection();
    for (std::size_t i = 0; i < raw.size; ++i)
      out[i] = r->GetRepeatedFloat(*raw.list, schema_->float_value, static_cast<int>(i));
  }
  void copy(const RawFeature& raw, std::int64_t* out) const {
    const auto* r = raw.list->GetReflection();
    for (std::size_t i = 0; i < raw.size; ++i)
      out[i] = r->GetRepeatedInt64(*raw.list, schema_->int64_value, static_cast<int>(i));
  }
  /// Moves the byte strings out of the message (each feature is read once): the aggregate
  /// accessor is protobuf's one way to take a string from a message without copying it.
  void copy(const RawFeature& raw, std::string* out) const {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    auto* values = raw.list->GetReflection()->MutableRepeatedPtrField<std::string>(
        raw.list, schema_->bytes_value);
#pragma GCC diagnostic pop
    for (std::size_t i = 0; i < raw.size; ++i)
      out[i].swap(*values->Mutable(static_cast<int>(i)));
  }

 private:
  const ExampleSchema* schema_;
  // The message and its parts live on one arena (one allocation for most examples, one free).
  // proto3 has no required fields, so parsing skips the check for them.
  std::unique_ptr<google::protobuf::Arena> arena_;
  google::protobuf::Message* message_;
  std::map<std::string, RawFeature> features_;
};

/// The C++ element type of an `ExampleDtype`, as a call `f.template operator()<T>()`.
template <class F>
decltype(auto) with_example_type(ExampleDtype dtype, F&& f) {
  switch (dtype) {
    case ExampleDtype::string:
      return f.template operator()<std::string>();
    case ExampleDtype::float32:
      return f.template operator()<float>();
    default:
      return f.template operator()<std::int64_t>();
  }
}

/// A buffer of `count` values of `T` with `shape`, converted to its `FeatureTensor` at the end.
template <class T>
struct DenseOut {
  Shape shape;
  std::vector<T> values;
  FeatureTensor finish() && {
    if constexpr (std::same_as<T, std::string>) {
      return BytesTensor{shape, std::move(values)};
    } else {
      return Tensor<T>(shape, std::span<const T>(values));
    }
  }
};

template <class T>
const std::vector<T>* default_as(const FeatureDefault& value) {
  return std::get_if<std::vector<T>>(&value);
}

inline std::string example_where(std::string_view name) {
  return "example feature '" + std::string(name) + "'";
}

/// Checks the kind of a present feature.
inline void check_kind(const RawFeature& raw, ExampleDtype dtype, const std::string& name,
                       const std::string& where) {
  if (raw.kind && *raw.kind != dtype) {
    throw FormatError(where + example_where(name) + ": expected " + example_dtype_name(dtype) +
                      " values but found " + example_dtype_name(*raw.kind));
  }
}

/// Validates a spec on its own (shapes, defaults, `allow_missing`).
inline void check_spec(const std::string& name, const FeatureSpec& spec) {
  const auto default_count = [&](const FeatureDefault& value, ExampleDtype dtype) -> std::size_t {
    return with_example_type(dtype, [&]<class T>() -> std::size_t {
      const auto* values = default_as<T>(value);
      if (values == nullptr) {
        throw ConfigError(example_where(name) + ": default_value must hold " +
                          example_dtype_name(dtype) + " values but holds another type");
      }
      return values->size();
    });
  };
  if (const auto* fixed = std::get_if<FixedLenFeature>(&spec)) {
    if (fixed->default_value) {
      const std::size_t n = default_count(*fixed->default_value, fixed->dtype);
      if (n != fixed->shape.elements()) {
        throw ConfigError(example_where(name) + ": default_value must have " +
                          std::to_string(fixed->shape.elements()) + " values (shape " +
                          fixed->shape.str() + ") but has " + std::to_string(n));
      }
    }
  } else if (const auto* sequence = std::get_if<FixedLenSequenceFeature>(&spec)) {
    if (!sequence->allow_missing) {
      throw ConfigError(example_where(name) +
                        ": FixedLenSequenceFeature requires allow_missing to be true (as "
                        "tf.io.parse_example) but it is false");
    }
    if (sequence->default_value) {
      const std::size_t n = default_count(*sequence->default_value, sequence->dtype);
      if (n != 1) {
        throw ConfigError(example_where(name) +
                          ": a FixedLenSequenceFeature's default_value must be one value (the "
                          "padding) but has " +
                          std::to_string(n));
      }
    }
    if (sequence->shape.elements() == 0) {
      throw ConfigError(example_where(name) +
                        ": a FixedLenSequenceFeature's shape must have elements but is " +
                        sequence->shape.str());
    }
  }
}

/// Parses the `batch` examples and fills the features; with `single`, no batch dimension.
inline ParsedExample parse_examples(std::span<const std::string_view> batch,
                                    const FeatureSpecs& specs, bool single) {
  for (const auto& [name, spec] : specs)
    check_spec(name, spec);
  std::vector<ExampleView> views;
  views.reserve(batch.size());
  for (std::size_t b = 0; b < batch.size(); ++b) {
    views.emplace_back(batch[b], specs,
                       single ? std::string("parse_single_example")
                              : "parse_example: example " + std::to_string(b));
  }
  const auto where = [&](std::size_t b) {
    return single ? std::string("parse_single_example: ")
                  : "parse_example: example " + std::to_string(b) + ": ";
  };
  const std::size_t rows = batch.size();
  ParsedExample out;
  for (const auto& entry : specs) {
    // Named, not bound: the lambdas below capture them, and clang 14 captures no bindings.
    const std::string& name = entry.first;
    const FeatureSpec& spec = entry.second;
    ParsedFeature parsed;
    if (const auto* fixed = std::get_if<FixedLenFeature>(&spec)) {
      const std::size_t per = fixed->shape.elements();
      parsed.values = with_example_type(fixed->dtype, [&]<class T>() -> FeatureTensor {
        DenseOut<T> dense{single ? fixed->shape : fixed->shape.prepend(rows), {}};
        dense.values.resize(per * rows);
        for (std::size_t b = 0; b < rows; ++b) {
          const RawFeature raw = views[b].find(name);
          T* target = dense.values.data() + b * per;
          if (!raw.present || !raw.kind) {
            if (!fixed->default_value) {
              throw FormatError(where(b) + example_where(name) + ": expected " +
                                std::to_string(per) + " " + example_dtype_name(fixed->dtype) +
                                " values (a required FixedLenFeature) but the feature is missing");
            }
            const auto& values = *default_as<T>(*fixed->default_value);
            std::copy(values.begin(), values.end(), target);
            continue;
          }
          check_kind(raw, fixed->dtype, name, where(b));
          if (raw.size != per) {
            throw FormatError(where(b) + example_where(name) + ": expected " + std::to_string(per) +
                              " values (shape " + fixed->shape.str() + ") but found " +
                              std::to_string(raw.size));
          }
          views[b].copy(raw, target);
        }
        return std::move(dense).finish();
      });
    } else if (const auto* sequence = std::get_if<FixedLenSequenceFeature>(&spec)) {
      const std::size_t per = sequence->shape.elements();
      std::vector<RawFeature> raws(rows);
      std::size_t longest = 0;
      for (std::size_t b = 0; b < rows; ++b) {
        raws[b] = views[b].find(name);
        if (!raws[b].present || !raws[b].kind) continue;
        check_kind(raws[b], sequence->dtype, name, where(b));
        if (raws[b].size % per != 0) {
          throw FormatError(where(b) + example_where(name) + ": expected a multiple of " +
                            std::to_string(per) + " values (rows of shape " +
                            sequence->shape.str() + ") but found " + std::to_string(raws[b].size));
        }
        longest = std::max(longest, raws[b].size / per);
      }
      parsed.values = with_example_type(sequence->dtype, [&]<class T>() -> FeatureTensor {
        const Shape shape = single ? sequence->shape.prepend(longest)
                                   : sequence->shape.prepend(longest).prepend(rows);
        T padding{};
        if (sequence->default_value) padding = default_as<T>(*sequence->default_value)->front();
        DenseOut<T> dense{shape, std::vector<T>(rows * longest * per, padding)};
        for (std::size_t b = 0; b < rows; ++b) {
          if (raws[b].present && raws[b].kind) {
            views[b].copy(raws[b], dense.values.data() + b * longest * per);
          }
        }
        return std::move(dense).finish();
      });
    } else {
      const auto& var = std::get<VarLenFeature>(spec);
      std::vector<RawFeature> raws(rows);
      std::size_t total = 0, longest = 0;
      for (std::size_t b = 0; b < rows; ++b) {
        raws[b] = views[b].find(name);
        if (!raws[b].present || !raws[b].kind) continue;
        check_kind(raws[b], var.dtype, name, where(b));
        total += raws[b].size;
        longest = std::max(longest, raws[b].size);
      }
      const std::size_t rank = single ? 1 : 2;
      Tensor<std::int64_t> indices({total, rank});
      parsed.values = with_example_type(var.dtype, [&]<class T>() -> FeatureTensor {
        DenseOut<T> dense{Shape{total}, std::vector<T>(total)};
        std::size_t at = 0;
        for (std::size_t b = 0; b < rows; ++b) {
          if (!raws[b].present || !raws[b].kind) continue;
          views[b].copy(raws[b], dense.values.data() + at);
          for (std::size_t j = 0; j < raws[b].size; ++j, ++at) {
            if (!single) indices.data()[at * 2] = static_cast<std::int64_t>(b);
            indices.data()[at * rank + rank - 1] = static_cast<std::int64_t>(j);
          }
        }
        return std::move(dense).finish();
      });
      parsed.indices = std::move(indices);
      if (!single) parsed.dense_shape.push_back(static_cast<std::int64_t>(rows));
      parsed.dense_shape.push_back(static_cast<std::int64_t>(longest));
    }
    out.emplace(name, std::move(parsed));
  }
  return out;
}

}  // namespace detail

/// Parses one serialized `tf.train.Example` (`tf.io.parse_single_example`): every feature of
/// `features`, by name; features of the example that `features` does not name are skipped.
///
/// A `FixedLenFeature` gives its `shape`, a `FixedLenSequenceFeature` `(rows, shape...)`, a
/// `VarLenFeature` the sparse parts with `indices` of shape `(n, 1)` and `dense_shape` `(n)`.
/// \code
/// const FeatureSpecs features = {
///     {"image", FixedLenFeature{{}, ExampleDtype::string}},
///     {"label", FixedLenFeature{{}, ExampleDtype::int64, std::vector<std::int64_t>{-1}}},
///     {"boxes", FixedLenSequenceFeature{{4}, ExampleDtype::float32, true}},
///     {"tags", VarLenFeature{ExampleDtype::string}}};
/// auto parsed = parse_single_example(record, features);
/// auto label = std::get<Tensor<std::int64_t>>(parsed["label"].values);
/// \endcode
/// \throws FormatError naming the feature, the expectation and what was found for bytes that are
///         not an Example, a missing required feature, values of another type, or a number of
///         values the shape does not allow.
/// \throws ConfigError for a specification tf.io refuses (a default of the wrong type or size,
///         a FixedLenSequenceFeature without allow_missing).
inline ParsedExample parse_single_example(std::string_view serialized,
                                          const FeatureSpecs& features) {
  return detail::parse_examples(std::span<const std::string_view>(&serialized, 1), features, true);
}

/// Parses a batch of serialized `tf.train.Example`s (`tf.io.parse_example`): a `FixedLenFeature`
/// gives `(batch, shape...)`, a `FixedLenSequenceFeature` `(batch, longest, shape...)` padded
/// with its default, a `VarLenFeature` the sparse parts with `indices` `(n, 2)` and
/// `dense_shape` `(batch, longest)`. Errors as `parse_single_example`, naming the example's index.
inline ParsedExample parse_example(std::span<const std::string> batch,
                                   const FeatureSpecs& features) {
  std::vector<std::string_view> views(batch.begin(), batch.end());
  return detail::parse_examples(views, features, false);
}

}  // namespace loadstar
