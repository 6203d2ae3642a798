// Whole steps as CUDA graphs (`CudaOptions::graphs`): a step's calls recorded with their
// signature, captured as a graph, replayed while the signature stays the same, and run kernel by
// kernel where a step cannot be captured.

#include "loadstar/cuda/detail/step_graph.hpp"

#include "loadstar/cuda/detail/cuda_backend.hpp"

namespace loadstar::cuda::detail {

void StepGraph::reset() noexcept {
  if (exec != nullptr) static_cast<void>(cudaGraphExecDestroy(exec));
  exec = nullptr;
  signature.clear();
}

void CudaBackendImpl::begin_step(std::uint64_t key) {
  abandon_step();
  if (!options_.graphs) {
    ++stats_.eager;
    return;
  }
  detail::StepGraph& graph = graphs_[key];
  ++graph.seen;
  graph.last_used = ++steps_begun_;
  if (graphs_.size() > max_shapes) forget_oldest_shape();
  if (graph.eager || graph.seen < 2) {
    ++stats_.eager;
    return;
  }
  // Room for the step's results without a read-back mid-step, and the memory the recorded
  // work reads its results area and its scalars from, allocated before recording begins.
  if (results_->room() < step_result_records) results_->read_back();
  context_->activate();
  if (step_scalars_ == nullptr) {
    step_scalars_ = static_cast<std::uint64_t*>(
        context_->allocate(step_scalar_words * sizeof(std::uint64_t), "a step's scalars"));
  }
  if (step_results_ == nullptr) {
    step_results_ = static_cast<double*>(context_->allocate(
        step_result_records * detail::ResultRing::record_doubles * sizeof(double),
        "a step's loss and metric results"));
  }
  step_ = &graph;
  context_->recording = true;
}

void CudaBackendImpl::end_step() {
  if (!context_->recording) {
    clear_step();
    return;
  }
  detail::StepGraph& graph = *step_;
  context_->recording = false;
  const StepCleanup cleanup(*this);
  bool captured = false;
  if (graph.exec == nullptr || graph.signature != signature_) captured = capture(graph);
  queue_recorded(graph.exec);
  if (graph.exec != nullptr) ++(captured ? stats_.captured : stats_.replayed);
}

void CudaBackendImpl::abandon_step() noexcept {
  try {
    flush_recording("an exception");
  } catch (...) {  // NOLINT(bugprone-empty-catch): the step's own exception is the one to see
  }
  release_deferred_frees();
  clear_step();
}

double* CudaBackendImpl::step_result(double* record) {
  if (context_->recording && ring_records_.size() == step_result_records)
    flush_recording("more results than a step holds");
  if (!context_->recording) return record;
  ring_records_.push_back(record);
  return step_results_ + (ring_records_.size() - 1) * detail::ResultRing::record_doubles;
}

bool CudaBackendImpl::capture(detail::StepGraph& graph) {
  graph.reset();
  const auto give_up = [&] {
    graph.eager = true;
    ++stats_.fallbacks;
    return false;
  };
  // A shape whose work keeps changing (buffers moved, scalars passed by value changed) is
  // captured a few times, then left to run kernel by kernel.
  if (graph.captures >= max_captures) return give_up();
  context_->activate();
  const cudaStream_t s = context_->stream;
  check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  bool queued = true;
  try {
    for (auto& work : pending_)
      work(s);
  } catch (const CudaError&) {
    queued = false;  // run kernel by kernel below, where the error is reported if it stays
  }
  cudaGraph_t captured = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(s, &captured);
  cudaGraphExec_t exec = nullptr;
  bool ok = queued && ended == cudaSuccess && captured != nullptr &&
            cudaGraphInstantiate(&exec, captured, 0) == cudaSuccess;
  if (captured != nullptr) static_cast<void>(cudaGraphDestroy(captured));
  if (!ok) {
    static_cast<void>(cudaGetLastError());
    if (exec != nullptr) static_cast<void>(cudaGraphExecDestroy(exec));
    return give_up();
  }
  graph.exec = exec;
  graph.signature = signature_;
  ++graph.captures;
  return true;
}

void CudaBackendImpl::run_pending() {
  context_->activate();
  for (auto& work : pending_)
    work(context_->stream);
  pending_.clear();
}

void CudaBackendImpl::copy_step_results() {
  constexpr std::size_t record_bytes = detail::ResultRing::record_doubles * sizeof(double);
  for (std::size_t j = 0; j < ring_records_.size();) {
    std::size_t n = 1;
    while (j + n < ring_records_.size() &&
           ring_records_[j + n] == ring_records_[j] + n * detail::ResultRing::record_doubles) {
      ++n;
    }
    check(cudaMemcpyAsync(ring_records_[j], step_results_ + j * detail::ResultRing::record_doubles,
                          n * record_bytes, cudaMemcpyDeviceToDevice, context_->stream),
          "cudaMemcpyAsync (device to device)");
    j += n;
  }
  ring_records_.clear();
}

void CudaBackendImpl::flush_recording(const std::string& why) {
  if (!context_->recording) return;
  context_->recording = false;
  ++stats_.fallbacks;
  stats_.last_fallback = why;
  if (step_ != nullptr && ++step_->fallbacks >= 2) step_->eager = true;
  const StepCleanup cleanup(*this);
  queue_recorded(nullptr);
}

void CudaBackendImpl::queue_recorded(cudaGraphExec_t exec) {
  context_->activate();
  if (!block_.empty()) {
    context_->upload(step_scalars_, block_.data(), block_.size() * sizeof(std::uint64_t));
  }
  if (exec != nullptr) {
    check(cudaGraphLaunch(exec, context_->stream), "cudaGraphLaunch");
  } else {
    run_pending();
  }
  copy_step_results();
}

void CudaBackendImpl::release_deferred_frees() noexcept {
  std::vector<void*> frees;
  frees.swap(context_->deferred_frees);
  for (void* memory : frees)
    context_->free(memory);
}

void CudaBackendImpl::clear_step() noexcept {
  pending_.clear();
  signature_.clear();
  block_.clear();
  ring_records_.clear();
  step_ = nullptr;
}

void CudaBackendImpl::forget_oldest_shape() {
  auto oldest = graphs_.begin();
  for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
    if (it->second.last_used < oldest->second.last_used) oldest = it;
  graphs_.erase(oldest);  // never the current step's: it was used last
}

}  // namespace loadstar::cuda::detail
