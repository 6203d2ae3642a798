/// \file
/// The exception hierarchy: every bad input a user can give throws one of these.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <stdexcept>
#include <string>

namespace loadstar {

/// Base of every exception loadstar throws for bad data, files, configurations or environment.
/// Messages name the object, what was expected and what was found.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A tensor, batch or array whose shape, rank, row count or element type is not the expected one.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// A file whose contents are not in the expected format (truncated, corrupt, wrong magic number).
class FormatError : public Error {
 public:
  using Error::Error;
};

/// Memory that cannot be had: a tensor larger than the allocator can give (a layer of a trillion
/// units in a model's configuration, a shape read from a corrupt file). Thrown instead of
/// `std::bad_alloc` so that the message names the tensor and its size.
class MemoryError : public Error {
 public:
  using Error::Error;
};

/// A file or directory that cannot be opened, read or written.
class IoError : public Error {
 public:
  using Error::Error;
};

/// An argument or configuration value outside its allowed range (a batch size of 0, a
/// `validation_split` of 1.5, a class missing from `class_weight`).
class ConfigError : public Error {
 public:
  using Error::Error;
};

/// A data-loading worker (thread or process) that threw, died or timed out.
class WorkerError : public Error {
 public:
  using Error::Error;
};

/// A checkpoint that cannot be written or restored.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

/// A tensor used where its memory cannot be reached: device memory read or written on the host
/// outside the backend that owns it.
class DeviceError : public Error {
 public:
  using Error::Error;
};

/// A collective that cannot go on: ranks that disagree (tensor counts, batch sizes, the model),
/// a failing MPI call, or a rank that threw or died (the message names the rank).
class DistributedError : public Error {
 public:
  using Error::Error;
};

/// A failure reported by the CUDA runtime or a CUDA library.
class CudaError : public Error {
 public:
  using Error::Error;
};

}  // namespace loadstar
