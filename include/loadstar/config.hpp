/// \file
/// The one place that reads `LOADSTAR_*` macros and defines the library's portability macros.
#pragma once

// loadstar is C++20 (concepts, ranges, std::span): say so once, before the first concept would give
// hundreds of errors, and stop (a missing include is fatal in GCC and Clang).
#if !defined(__cplusplus) || __cplusplus < 202002L
#error "loadstar requires C++20: compile with -std=c++20 (or -std=gnu++20), or a newer standard"
#include <loadstar_requires_cpp20_compile_with_std_cxx20>
#endif

#include <cstddef>
#include <cstdio>
#include <cstdlib>

/// Marks a function callable from host and device code when compiled by nvcc.
#if defined(__CUDACC__)
#define LOADSTAR_HOST_DEVICE __host__ __device__
#else
#define LOADSTAR_HOST_DEVICE
#endif

/// Checks a precondition the caller is responsible for; compiled out under `NDEBUG`.
/// Bad data, files or configurations are never asserted: they throw a `loadstar::Error`.
#if defined(NDEBUG) && !defined(LOADSTAR_ENABLE_ASSERTS)
#define LOADSTAR_ASSERT(condition, message) ((void)0)
#else
#define LOADSTAR_ASSERT(condition, message)                                                     \
  ((condition) ? (void)0                                                                        \
               : (std::fprintf(stderr, "%s:%d: loadstar assertion '%s' failed: %s\n", __FILE__, \
                               __LINE__, #condition, message),                                  \
                  std::abort()))
#endif

/// Whether `CudaBackend` has cuDNN's convolutions (`Convolution::cudnn`): Meson's
/// `loadstar-cuda` dependency defines LOADSTAR_CUDA_WITH_CUDNN=1 where it found cuDNN.
#ifndef LOADSTAR_CUDA_WITH_CUDNN
#define LOADSTAR_CUDA_WITH_CUDNN 0
#endif

/// Alignment in bytes of every tensor's storage (one cache line, and enough for AVX-512 loads).
/// oneDNN (Debian's libdnnl-dev) computes the CPU backend's GEMMs when 1: Meson's `loadstar`
/// dependency (and its pkg-config file) defines LOADSTAR_WITH_DNNL=1 and links oneDNN where it
/// finds it (`-Ddnnl=auto`); otherwise Eigen's GEMM kernel does. Every translation unit of a
/// program must see the same value, as with LOADSTAR_WITH_MPI.
#ifndef LOADSTAR_WITH_DNNL
#define LOADSTAR_WITH_DNNL 0
#endif

#ifndef LOADSTAR_TENSOR_ALIGNMENT
#define LOADSTAR_TENSOR_ALIGNMENT 64
#endif

/// The most bytes of freed large tensor storage (blocks of at least 256 KiB) kept for reuse, so
/// that a loader building one large batch after another does not fault in fresh pages for each;
/// 0 gives every block back at once.
#ifndef LOADSTAR_TENSOR_CACHE_BYTES
#define LOADSTAR_TENSOR_CACHE_BYTES (std::size_t{256} << 20U)
#endif

/// Separate compilation (opt-in). By default loadstar is header-only: every function is defined,
/// `inline`, in the headers, and each translation unit that includes `<loadstar/keras.hpp>` or
/// `<loadstar/trial.hpp>` compiles the executor's and the trial layer's code again. Defining
/// `LOADSTAR_SEPARATE_COMPILATION` (Meson's `loadstar-compiled` and `loadstar-trial-compiled`
/// dependencies and the pkg-config modules of the same names do) keeps their non-template code out
/// of the headers: it is compiled once, in the `loadstar_keras` library (src/keras.cpp) and the
/// `loadstar_trial` library (src/trial.cpp), and linked. Templates (the `fit`, `evaluate` and
/// `predict` overloads for each loader) and the code that depends on the trainer's own macros
/// (`LOADSTAR_WITH_MPI`) stay in the headers in both modes.
///
/// `LOADSTAR_DECL` marks the first declaration of each function the libraries define: `inline`
/// when header-only, plain when separately compiled. The definitions, in each header's block
/// under "Definitions", repeat nothing: a function declared inline is inline (as Asio does it). `LOADSTAR_KERAS_BODIES` and `LOADSTAR_TRIAL_BODIES` say whether this
/// translation unit sees their bodies: always when header-only, and in the library's own source
/// when separately compiled.
#if defined(LOADSTAR_SEPARATE_COMPILATION)
#define LOADSTAR_DECL
#if defined(LOADSTAR_BUILDING_KERAS)
#define LOADSTAR_KERAS_BODIES 1
#else
#define LOADSTAR_KERAS_BODIES 0
#endif
#if defined(LOADSTAR_BUILDING_TRIAL)
#define LOADSTAR_TRIAL_BODIES 1
#else
#define LOADSTAR_TRIAL_BODIES 0
#endif
#else
#define LOADSTAR_DECL inline
#define LOADSTAR_KERAS_BODIES 1
#define LOADSTAR_TRIAL_BODIES 1
#endif
