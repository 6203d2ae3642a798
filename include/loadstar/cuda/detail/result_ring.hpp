/// \file
/// `ResultRing`: the device records the loss and metric kernels leave their results in, read back
/// when a result is first read. Internal to the CUDA backend; defined in src/cuda/result_ring.cpp.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <array>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "loadstar/cuda/detail/context.hpp"

namespace loadstar::cuda::detail {

/// One result of a loss or metric kernel as the host sees it: filled when its record is read
/// back.
struct ResultCell {
  std::array<double, 4> values{};
  bool ready = false;
};

/// Where the loss and metric kernels leave their results: a ring of 4-double records in device
/// memory. Nothing is copied back when a kernel is queued; the first read of a result copies
/// every record not read yet in one or two copies and waits once (so a training step that nobody
/// reads the logs of does not wait), and so does a kernel that finds the ring full.
class ResultRing {
 public:
  static constexpr std::size_t records = 1024;
  static constexpr std::size_t record_doubles = 4;

  explicit ResultRing(std::shared_ptr<Context> context) : context_(std::move(context)) {}
  ResultRing(const ResultRing&) = delete;
  ResultRing& operator=(const ResultRing&) = delete;
  ~ResultRing();

  /// The next record for a kernel to write, and the cell its values will reach.
  std::pair<double*, std::shared_ptr<ResultCell>> acquire();

  /// The records that can be acquired before one makes the ring read back.
  std::size_t room() const noexcept { return records - outstanding_.size(); }

  /// Copies every record not read yet to the host, waits, and fills their cells.
  void read_back();

  /// The values of `cell`, read back first when they are not yet.
  static const std::array<double, 4>& values(const std::shared_ptr<ResultCell>& cell,
                                             const std::weak_ptr<ResultRing>& ring);

 private:
  struct Outstanding {
    std::shared_ptr<ResultCell> cell;
    std::size_t record;
  };
  std::shared_ptr<Context> context_;
  double* device_ = nullptr;
  double* host_ = nullptr;
  PinnedBuffer host_memory_;
  std::vector<Outstanding> outstanding_;  // in record order, from the oldest
  std::size_t next_ = 0;
};

}  // namespace loadstar::cuda::detail
