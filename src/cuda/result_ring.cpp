// The device ring of loss and metric results (loadstar/cuda/detail/result_ring.hpp).

#include "loadstar/cuda/detail/result_ring.hpp"

#include <algorithm>

namespace loadstar::cuda::detail {

ResultRing::~ResultRing() {
  if (device_ != nullptr) context_->free(device_);
}

std::pair<double*, std::shared_ptr<ResultCell>> ResultRing::acquire() {
  if (device_ == nullptr) {
    device_ = static_cast<double*>(
        context_->allocate(records * record_doubles * sizeof(double), "loss and metric results"));
    host_ = static_cast<double*>(host_memory_.reserve(records * record_doubles * sizeof(double)));
  }
  if (outstanding_.size() == records) read_back();
  const std::size_t record = next_;
  next_ = (next_ + 1) % records;
  auto cell = std::make_shared<ResultCell>();
  outstanding_.push_back({cell, record});
  return {device_ + record * record_doubles, std::move(cell)};
}

void ResultRing::read_back() {
  // Their kernels first.
  if (context_->recording && context_->flush) context_->flush("a read-back of results");
  if (outstanding_.empty()) return;
  context_->activate();
  const std::size_t first = outstanding_.front().record;
  const std::size_t count = outstanding_.size();
  const std::size_t head = std::min(count, records - first);  // up to the ring's end
  const auto copy = [&](std::size_t from, std::size_t n) {
    check(cudaMemcpyAsync(host_ + from * record_doubles, device_ + from * record_doubles,
                          n * record_doubles * sizeof(double), cudaMemcpyDeviceToHost,
                          context_->stream),
          "cudaMemcpyAsync (device to host)");
  };
  copy(first, head);
  if (count > head) copy(0, count - head);
  check(cudaStreamSynchronize(context_->stream), "cudaStreamSynchronize");
  for (const auto& [cell, record] : outstanding_) {
    std::copy_n(host_ + record * record_doubles, record_doubles, cell->values.begin());
    cell->ready = true;
  }
  outstanding_.clear();
}

const std::array<double, 4>& ResultRing::values(const std::shared_ptr<ResultCell>& cell,
                                                const std::weak_ptr<ResultRing>& ring) {
  if (!cell->ready) {
    const auto owner = ring.lock();
    if (!owner) {
      throw CudaError(
          "cuda backend: a loss or metric result was read after its backend was "
          "destroyed without reading it back");
    }
    owner->read_back();
  }
  return cell->values;
}

}  // namespace loadstar::cuda::detail
