/// \file
/// The protocol buffer messages of TensorBoard's event files, defined at run time: the parts of
/// TensorFlow's event.proto, summary.proto, tensor.proto, tensor_shape.proto and types.proto, and
/// of TensorBoard's hparams api.proto and plugin_data.proto, that loadstar writes, with their
/// packages, message names and field numbers. The text is parsed once, at first use, with
/// libprotoc's parser into a descriptor pool, and messages are built through Debian's protobuf
/// library (`DynamicMessageFactory` and reflection), so that the wire encoding is protobuf's own
/// and no generated code is needed.
#pragma once

#include "loadstar/config.hpp"

#include <memory>
#include <string>
#include <string_view>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>
#include <google/protobuf/struct.pb.h>

#include "loadstar/detail/proto_schema.hpp"
#include "loadstar/error.hpp"

namespace loadstar::tensorboard::detail {

/// TensorFlow's messages as far as event files need them (package `tensorflow`; field numbers as
/// in tensorflow/core/util/event.proto and tensorflow/core/framework/*.proto).
inline constexpr std::string_view tensorflow_proto = R"pb(
  syntax = "proto3"
  ;
package tensorflow;

enum DataType {
  DT_INVALID = 0;
  DT_FLOAT = 1;
  DT_DOUBLE = 2;
  DT_STRING = 7;
}

message TensorShapeProto {
  message Dim {
    int64 size = 1;
    string name = 2;
  }
  repeated Dim dim = 2;
  bool unknown_rank = 3;
}

message TensorProto {
  DataType dtype = 1;
  TensorShapeProto tensor_shape = 2;
  int32 version_number = 3;
  bytes tensor_content = 4;
  repeated float float_val = 5 [packed = true];
  repeated double double_val = 6 [packed = true];
  repeated bytes string_val = 8;
}

message HistogramProto {
  double min = 1;
  double max = 2;
  double num = 3;
  double sum = 4;
  double sum_squares = 5;
  repeated double bucket_limit = 6 [packed = true];
  repeated double bucket = 7 [packed = true];
}

enum DataClass {
  DATA_CLASS_UNKNOWN = 0;
  DATA_CLASS_SCALAR = 1;
  DATA_CLASS_TENSOR = 2;
  DATA_CLASS_BLOB_SEQUENCE = 3;
}

message SummaryMetadata {
  message PluginData {
    string plugin_name = 1;
    bytes content = 2;
  }
  PluginData plugin_data = 1;
  string display_name = 2;
  string summary_description = 3;
  DataClass data_class = 4;
}

message Summary {
  message Value {
    string node_name = 7;
    string tag = 1;
    SummaryMetadata metadata = 9;
    oneof value {
      float simple_value = 2;
      HistogramProto histo = 5;
      TensorProto tensor = 8;
    }
  }
  repeated Value value = 1;
}

message SessionLog {
  enum SessionStatus {
    STATUS_UNSPECIFIED = 0;
    START = 1;
    STOP = 2;
    CHECKPOINT = 3;
  }
  SessionStatus status = 1;
  string checkpoint_path = 2;
  string msg = 3;
}

message Event {
  double wall_time = 1;
  int64 step = 2;
  oneof what {
    string file_version = 3;
    bytes graph_def = 4;
    Summary summary = 5;
    SessionLog session_log = 7;
  }
}
)pb";

/// TensorBoard's hparams plugin messages (package `tensorboard.hparams`; field numbers as in
/// tensorboard/plugins/hparams/api.proto and plugin_data.proto).
inline constexpr std::string_view hparams_proto = R"pb(
  syntax = "proto3"
  ;
package tensorboard.hparams;
import "google/protobuf/struct.proto";

enum DataType {
  DATA_TYPE_UNSET = 0;
  DATA_TYPE_STRING = 1;
  DATA_TYPE_BOOL = 2;
  DATA_TYPE_FLOAT64 = 3;
}

message Interval {
  double min_value = 1;
  double max_value = 2;
}

message HParamInfo {
  string name = 1;
  string display_name = 2;
  string description = 3;
  DataType type = 4;
  oneof domain {
    google.protobuf.ListValue domain_discrete = 5;
    Interval domain_interval = 6;
  }
}

message MetricName {
  string group = 1;
  string tag = 2;
}

enum DatasetType {
  DATASET_UNKNOWN = 0;
  DATASET_TRAINING = 1;
  DATASET_VALIDATION = 2;
}

message MetricInfo {
  MetricName name = 1;
  string display_name = 3;
  string description = 4;
  DatasetType dataset_type = 5;
}

message Experiment {
  string name = 6;
  string description = 1;
  string user = 2;
  double time_created_secs = 3;
  repeated HParamInfo hparam_infos = 4;
  repeated MetricInfo metric_infos = 5;
}

enum Status {
  STATUS_UNKNOWN = 0;
  STATUS_SUCCESS = 1;
  STATUS_FAILURE = 2;
  STATUS_RUNNING = 3;
}

message SessionStartInfo {
  map<string, google.protobuf.Value> hparams = 1;
  string model_uri = 2;
  string monitor_url = 3;
  string group_name = 4;
  double start_time_secs = 5;
}

message SessionEndInfo {
  Status status = 1;
  double end_time_secs = 2;
}

message HParamsPluginData {
  int32 version = 1;
  oneof data {
    Experiment experiment = 2;
    SessionStartInfo session_start_info = 3;
    SessionEndInfo session_end_info = 4;
  }
}
)pb";

/// The descriptor pool of the messages above, built at first use (thread-safe, as a function's
/// static), and the factory of their dynamic messages.
class Schema {
 public:
  /// The one schema; `FormatError` if the embedded definitions do not build (a defect).
  static const Schema& get() {
    static const Schema schema;
    return schema;
  }

  /// A new, empty message of the type named `full_name` (`"tensorflow.Event"`).
  std::unique_ptr<google::protobuf::Message> make(const std::string& full_name) const {
    const auto* descriptor = pool_.FindMessageTypeByName(full_name);
    if (descriptor == nullptr) {
      throw FormatError("tensorboard schema: expected a message type '" + full_name +
                        "' but the embedded definitions have none");
    }
    return std::unique_ptr<google::protobuf::Message>(factory_.GetPrototype(descriptor)->New());
  }

  Schema(const Schema&) = delete;
  Schema& operator=(const Schema&) = delete;

 private:
  Schema() {
    // google/protobuf/struct.proto (the hparams' values) from libprotobuf's own descriptors.
    google::protobuf::FileDescriptorProto structs;
    google::protobuf::Struct::descriptor()->file()->CopyTo(&structs);
    build(structs);
    build(loadstar::detail::parse_proto(
        tensorflow_proto, "loadstar/tensorboard/tensorflow.proto",
        "tensorboard schema 'loadstar/tensorboard/tensorflow.proto'"));
    build(loadstar::detail::parse_proto(hparams_proto, "loadstar/tensorboard/hparams.proto",
                                        "tensorboard schema 'loadstar/tensorboard/hparams.proto'"));
  }

  void build(const google::protobuf::FileDescriptorProto& file) {
    loadstar::detail::build_proto(pool_, file, "tensorboard schema '" + file.name() + "'");
  }

  google::protobuf::DescriptorPool pool_;
  mutable google::protobuf::DynamicMessageFactory factory_{&pool_};
};

/// A message under construction, set field by field by name through reflection.
class Fields {
 public:
  explicit Fields(google::protobuf::Message& message)
      : message_(&message), reflection_(message.GetReflection()) {}

  /// Sets a singular scalar field: a number (double, float, int32, int64, bool or an enum's
  /// number).
  Fields& set(std::string_view name, double value) {
    const auto* f = field(name);
    using Cpp = google::protobuf::FieldDescriptor;
    switch (f->cpp_type()) {
      case Cpp::CPPTYPE_DOUBLE:
        reflection_->SetDouble(message_, f, value);
        break;
      case Cpp::CPPTYPE_FLOAT:
        reflection_->SetFloat(message_, f, static_cast<float>(value));
        break;
      case Cpp::CPPTYPE_INT64:
        reflection_->SetInt64(message_, f, static_cast<std::int64_t>(value));
        break;
      case Cpp::CPPTYPE_INT32:
        reflection_->SetInt32(message_, f, static_cast<std::int32_t>(value));
        break;
      case Cpp::CPPTYPE_BOOL:
        reflection_->SetBool(message_, f, value != 0);
        break;
      case Cpp::CPPTYPE_ENUM:
        reflection_->SetEnumValue(message_, f, static_cast<int>(value));
        break;
      default:
        mismatch(f, "a number");
    }
    return *this;
  }
  /// Sets a 64-bit integer field exactly (steps beyond 2^53).
  Fields& set_int64(std::string_view name, std::int64_t value) {
    const auto* f = field(name);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_INT64) mismatch(f, "int64");
    reflection_->SetInt64(message_, f, value);
    return *this;
  }
  /// Sets a singular string or bytes field.
  Fields& set(std::string_view name, std::string value) {
    const auto* f = field(name);
    if (f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      mismatch(f, "a string");
    }
    reflection_->SetString(message_, f, std::move(value));
    return *this;
  }
  Fields& set(std::string_view name, const char* value) { return set(name, std::string(value)); }
  /// Appends to a repeated number field.
  Fields& add(std::string_view name, double value) {
    const auto* f = field(name);
    using Cpp = google::protobuf::FieldDescriptor;
    if (f->cpp_type() == Cpp::CPPTYPE_DOUBLE) {
      reflection_->AddDouble(message_, f, value);
    } else if (f->cpp_type() == Cpp::CPPTYPE_FLOAT) {
      reflection_->AddFloat(message_, f, static_cast<float>(value));
    } else {
      mismatch(f, "a repeated double or float");
    }
    return *this;
  }
  /// Appends to a repeated string or bytes field.
  Fields& add_string(std::string_view name, std::string value) {
    reflection_->AddString(message_, field(name), std::move(value));
    return *this;
  }
  /// The singular message field `name`, created if unset.
  Fields message(std::string_view name) {
    return Fields(*reflection_->MutableMessage(message_, field(name)));
  }
  /// A new element of the repeated message field (or map) `name`.
  Fields add_message(std::string_view name) {
    return Fields(*reflection_->AddMessage(message_, field(name)));
  }

  google::protobuf::Message& get() const noexcept { return *message_; }

 private:
  const google::protobuf::FieldDescriptor* field(std::string_view name) const {
    const auto* f = message_->GetDescriptor()->FindFieldByName(std::string(name));
    if (f == nullptr) {
      throw FormatError("tensorboard schema: message '" + message_->GetDescriptor()->full_name() +
                        "': expected a field '" + std::string(name) + "' but found none");
    }
    return f;
  }
  [[noreturn]] static void mismatch(const google::protobuf::FieldDescriptor* f,
                                    const char* expected) {
    throw FormatError("tensorboard schema: field '" + f->full_name() + "': expected " + expected +
                      " but the field is of type " + f->type_name());
  }

  google::protobuf::Message* message_;
  const google::protobuf::Reflection* reflection_;
};

}  // namespace loadstar::tensorboard::detail
