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

/// Alignment in bytes of every tensor's storage (one cache line, and enough for AVX-512 loads).
#ifndef LOADSTAR_TENSOR_ALIGNMENT
#define LOADSTAR_TENSOR_ALIGNMENT 64
#endif

/// The most bytes of freed large tensor storage (blocks of at least 256 KiB) kept for reuse, so
/// that a loader building one large batch after another does not fault in fresh pages for each;
/// 0 gives every block back at once.
#ifndef LOADSTAR_TENSOR_CACHE_BYTES
#define LOADSTAR_TENSOR_CACHE_BYTES (std::size_t{256} << 20U)
#endif

/// Separate compilation of the executor (opt-in). By default loadstar is header-only: every
/// function is defined, `inline`, in the headers, and each translation unit that includes
/// `<loadstar/keras.hpp>` compiles the executor's code again. Defining
/// `LOADSTAR_SEPARATE_COMPILATION` (Meson's `loadstar-compiled` dependency and the pkg-config module
/// of the same name do) keeps the executor's non-template code out of the headers: it is compiled
/// once, in the `loadstar_keras` library (src/keras.cpp), and linked. Templates (the `fit`,
/// `evaluate` and `predict` overloads for each loader) stay in the headers in both modes.
///
/// `LOADSTAR_DECL` marks the functions the library defines: `inline` when header-only, plain when
/// separately compiled. `LOADSTAR_HEADER_BODIES` says whether this translation unit sees their
/// bodies: always when header-only, and in the library's own source when separately compiled.
#if defined(LOADSTAR_SEPARATE_COMPILATION)
#define LOADSTAR_DECL
#if defined(LOADSTAR_BUILDING_LIBRARY)
#define LOADSTAR_HEADER_BODIES 1
#else
#define LOADSTAR_HEADER_BODIES 0
#endif
#else
#define LOADSTAR_DECL inline
#define LOADSTAR_HEADER_BODIES 1
#endif
