/// \file
/// A recorded step's signature and `StepGraph`, a step shape's CUDA graph: what the CUDA backend
/// compares and replays when it runs whole steps as graphs (`CudaOptions::graphs`). Internal to the
/// CUDA backend; the recording itself is in src/cuda/step_graph.cpp.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include <cuda_runtime_api.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <type_traits>
#include <vector>

#include "loadstar/cuda/detail/kernels.hpp"

namespace loadstar::cuda::detail {

/// A recorded step's signature: every argument of every call it queued (pointers, sizes and
/// scalars, as words), in order, so that two steps with the same signature queue the same work.
using Signature = std::vector<std::uint64_t>;

/// What a signature word holds: a pointer, a floating-point number, an integer or an enumerator.
template <class T>
concept SignatureScalar = std::is_pointer_v<T> || std::is_arithmetic_v<T> || std::is_enum_v<T>;

/// A pointer, floating-point number, integer or enumerator as a signature word (its bits).
template <SignatureScalar T>
std::uint64_t word(T value) noexcept {
  if constexpr (std::is_pointer_v<T>) {
    return reinterpret_cast<std::uintptr_t>(value);
  } else if constexpr (std::is_same_v<T, float>) {
    return std::bit_cast<std::uint32_t>(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return std::bit_cast<std::uint64_t>(value);
  } else {
    return static_cast<std::uint64_t>(value);
  }
}

template <class T>
void sign(Signature& out, const T& value) {
  if constexpr (SignatureScalar<T>) {
    out.push_back(word(value));
  } else {
    // Geometry structs of sizes only: every byte is a value byte.
    static_assert(std::has_unique_object_representations_v<T> && sizeof(T) % 8 == 0,
                  "sign: give this type its own overload");
    std::uint64_t words[sizeof(T) / 8];
    std::memcpy(words, &value, sizeof(T));
    out.insert(out.end(), std::begin(words), std::end(words));
  }
}

inline void sign(Signature& out, const RowLossParams& p) {
  sign(out, p.kind);
  sign(out, p.from_logits);
  sign(out, p.label_smoothing);
  sign(out, p.denominator);
  sign(out, p.delta);
}

inline void sign(Signature& out, const RecurrentKernel& k) {
  for (const auto v : {static_cast<std::uint64_t>(k.op), static_cast<std::uint64_t>(k.merge),
                       static_cast<std::uint64_t>(k.activations.activation),
                       static_cast<std::uint64_t>(k.activations.recurrent), std::uint64_t{k.batch},
                       std::uint64_t{k.steps}, std::uint64_t{k.units}, std::uint64_t{k.width},
                       std::uint64_t{k.rows}, std::uint64_t{k.count}, std::uint64_t{k.each},
                       std::uint64_t{k.second_units}, k.first_stream})
    out.push_back(v);
  sign(out, k.rate);
  sign(out, k.value);
  out.push_back(std::uint64_t{k.reverse} | std::uint64_t{k.to_batch_major} << 1U |
                std::uint64_t{k.batch_major} << 2U | std::uint64_t{k.reset_after} << 3U |
                std::uint64_t{k.accumulate} << 4U);
}

inline void sign(Signature& out, const AttentionCall& c) {
  for (const void* p :
       {static_cast<const void*>(c.query_mask), static_cast<const void*>(c.value_mask),
        static_cast<const void*>(c.key_mask), static_cast<const void*>(c.attention_mask)})
    out.push_back(word(p));
  sign(out, c.rate);
  out.push_back(c.key);
  out.push_back(std::uint64_t{c.causal} | std::uint64_t{c.training} << 1U |
                std::uint64_t{c.query_mask_in_scores} << 2U |
                std::uint64_t{c.scores_after_dropout} << 3U);
}

inline void sign(Signature& out, const LayerKernel& k) {
  out.push_back(static_cast<std::uint64_t>(k.op));
  sign(out, k.box);
  sign(out, k.map);
  for (const float v : {k.alpha, k.scale, k.offset, k.dropped})
    sign(out, v);
  sign(out, k.rate);
}

/// A step's shape as the backend has seen it: how often, and its CUDA graph once captured.
struct StepGraph {
  StepGraph() = default;
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  ~StepGraph() { reset(); }
  void reset() noexcept;
  Signature signature;             // of the work the graph holds
  cudaGraphExec_t exec = nullptr;  // null until captured
  std::size_t seen = 0;            // steps begun with this key
  std::uint64_t last_used = 0;     // the backend's step count when one last began
  std::size_t captures = 0;
  std::size_t fallbacks = 0;
  bool eager = false;  // its steps are no longer recorded
};

}  // namespace loadstar::cuda::detail
