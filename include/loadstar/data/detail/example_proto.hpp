/// \file
/// The protocol buffer messages of `tf.train.Example`, defined at run time: TensorFlow's
/// tensorflow/core/example/feature.proto and example.proto (package `tensorflow`, their message
/// names and field numbers; the features' map in its wire-identical repeated form) as text that
/// libprotoc's parser reads once into a descriptor pool; messages are parsed by Debian's protobuf
/// library (`DynamicMessageFactory`) and read through reflection, so that the wire decoding is
/// protobuf's own and no generated code is needed.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <google/protobuf/arena.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>

#include "loadstar/detail/proto_schema.hpp"
#include "loadstar/error.hpp"

namespace loadstar::detail {

/// feature.proto and example.proto's messages, field for field.
inline constexpr std::string_view example_proto = R"pb(
  syntax = "proto3"
  ;
package tensorflow;

message BytesList {
  repeated bytes value = 1;
}
message FloatList {
  repeated float value = 1 [packed = true];
}
message Int64List {
  repeated int64 value = 1 [packed = true];
}

message Feature {
  oneof kind {
    BytesList bytes_list = 1;
    FloatList float_list = 2;
    Int64List int64_list = 3;
  }
}

message Features {
  // feature.proto: map<string, Feature> feature = 1. A map is on the wire exactly a repeated
  // message of key 1 and value 2 (protobuf's language guide, "Backwards compatibility" of maps);
  // declared so, reflection reads the entries in place, where a map field would first copy every
  // entry, bytes and all, into a repeated view of itself.
  message FeatureEntry {
    string key = 1;
    Feature value = 2;
  }
  repeated FeatureEntry feature = 1;
}

message FeatureList {
  repeated Feature feature = 1;
}

message FeatureLists {
  map<string, FeatureList> feature_list = 1;
}

message Example {
  Features features = 1;
}

message SequenceExample {
  Features context = 1;
  FeatureLists feature_lists = 2;
}
)pb";

/// The descriptor pool of the messages above, built at first use, and their prototypes.
class ExampleSchema {
 public:
  static const ExampleSchema& get() {
    static const ExampleSchema schema;
    return schema;
  }

  /// A new, empty `tensorflow.Example` on `arena`, which owns it.
  google::protobuf::Message* new_example(google::protobuf::Arena& arena) const {
    return example_->New(&arena);
  }

  ExampleSchema(const ExampleSchema&) = delete;
  ExampleSchema& operator=(const ExampleSchema&) = delete;

  const google::protobuf::FieldDescriptor* features;     // Example.features
  const google::protobuf::FieldDescriptor* feature_map;  // Features.feature
  const google::protobuf::FieldDescriptor* entry_key;    // Features.FeatureEntry.key
  const google::protobuf::FieldDescriptor* entry_value;  // Features.FeatureEntry.value
  const google::protobuf::FieldDescriptor* bytes_list;   // Feature.bytes_list
  const google::protobuf::FieldDescriptor* float_list;   // Feature.float_list
  const google::protobuf::FieldDescriptor* int64_list;   // Feature.int64_list
  const google::protobuf::FieldDescriptor* bytes_value;  // BytesList.value
  const google::protobuf::FieldDescriptor* float_value;  // FloatList.value
  const google::protobuf::FieldDescriptor* int64_value;  // Int64List.value

 private:
  ExampleSchema() {
    build_proto(pool_, parse_proto(example_proto, "loadstar/data/example.proto", "example schema"),
                "example schema");
    const auto* example = pool_.FindMessageTypeByName("tensorflow.Example");
    const auto* features_type = pool_.FindMessageTypeByName("tensorflow.Features");
    const auto* feature_type = pool_.FindMessageTypeByName("tensorflow.Feature");
    example_ = factory_.GetPrototype(example);
    features = example->FindFieldByName("features");
    feature_map = features_type->FindFieldByName("feature");
    entry_key = feature_map->message_type()->FindFieldByName("key");
    entry_value = feature_map->message_type()->FindFieldByName("value");
    bytes_list = feature_type->FindFieldByName("bytes_list");
    float_list = feature_type->FindFieldByName("float_list");
    int64_list = feature_type->FindFieldByName("int64_list");
    bytes_value = bytes_list->message_type()->FindFieldByName("value");
    float_value = float_list->message_type()->FindFieldByName("value");
    int64_value = int64_list->message_type()->FindFieldByName("value");
    // Every prototype is made here, once: GetPrototype is then only read.
    factory_.GetPrototype(features_type);
    factory_.GetPrototype(feature_type);
  }

  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_{&pool_};
  const google::protobuf::Message* example_ = nullptr;
};

}  // namespace loadstar::detail
