/// \file
/// Protocol buffer definitions embedded as `.proto` text, turned into descriptors at run time by
/// libprotoc's parser (the TensorBoard event writer's and the `tf.train.Example` parser's).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include <google/protobuf/compiler/parser.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "loadstar/error.hpp"

namespace loadstar::detail {

/// Collects the first error of the `.proto` parser or of a descriptor pool.
class ProtoErrors : public google::protobuf::io::ErrorCollector,
                    public google::protobuf::DescriptorPool::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first.empty()) {
      first = "line " + std::to_string(line + 1) + " column " + std::to_string(column + 1) + ": " +
              message;
    }
  }
  void AddError(const std::string& /*filename*/, const std::string& element_name,
                const google::protobuf::Message* /*descriptor*/, ErrorLocation /*location*/,
                const std::string& message) override {
    if (first.empty()) first = element_name + ": " + message;
  }
  std::string first;
};

/// The `.proto` definitions `text` as the file `name`; throws `FormatError` prefixed by `what`
/// (`"example schema"`) naming the first error's line and column.
inline google::protobuf::FileDescriptorProto parse_proto(std::string_view text, std::string name,
                                                         const std::string& what) {
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  ProtoErrors errors;
  google::protobuf::io::Tokenizer tokenizer(&input, &errors);
  google::protobuf::compiler::Parser parser;
  parser.RecordErrorsTo(&errors);
  google::protobuf::FileDescriptorProto file;
  if (!parser.Parse(&tokenizer, &file) || !errors.first.empty()) {
    throw FormatError(what + ": expected protocol buffer definitions but found an error at " +
                      errors.first);
  }
  file.set_name(std::move(name));
  return file;
}

/// Adds `file` to `pool`; throws `FormatError` prefixed by `what` naming the first error.
inline void build_proto(google::protobuf::DescriptorPool& pool,
                        const google::protobuf::FileDescriptorProto& file,
                        const std::string& what) {
  ProtoErrors errors;
  if (pool.BuildFileCollectingErrors(file, &errors) == nullptr) {
    throw FormatError(what + ": expected definitions that build but found " + errors.first);
  }
}

}  // namespace loadstar::detail
