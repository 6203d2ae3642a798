/// \file
/// The one place that includes Eigen, inside a diagnostic push/pop so that our own code builds
/// clean with `warning_level=3` and `-Werror`. `LOADSTAR_DETAIL_EIGEN_BEGIN` / `_END` bracket any
/// further Eigen module (detail/eigen_qr.hpp).
#pragma once

#if defined(__GNUC__)
#if defined(__clang__)
#define LOADSTAR_DETAIL_EIGEN_GCC_ONLY
#else
#define LOADSTAR_DETAIL_EIGEN_GCC_ONLY                        \
  _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wclass-memaccess\"")
#endif
#define LOADSTAR_DETAIL_EIGEN_BEGIN                                                       \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpedantic\"")         \
      _Pragma("GCC diagnostic ignored \"-Wshadow\"")                                      \
          _Pragma("GCC diagnostic ignored \"-Wconversion\"")                              \
              _Pragma("GCC diagnostic ignored \"-Wsign-conversion\"")                     \
                  _Pragma("GCC diagnostic ignored \"-Wdeprecated-declarations\"")         \
                      _Pragma("GCC diagnostic ignored \"-Wunused-variable\"")             \
                          _Pragma("GCC diagnostic ignored \"-Wunused-but-set-variable\"") \
                              LOADSTAR_DETAIL_EIGEN_GCC_ONLY
#define LOADSTAR_DETAIL_EIGEN_END _Pragma("GCC diagnostic pop")
#else
#define LOADSTAR_DETAIL_EIGEN_BEGIN
#define LOADSTAR_DETAIL_EIGEN_END
#endif

LOADSTAR_DETAIL_EIGEN_BEGIN
#include <Eigen/Core>
LOADSTAR_DETAIL_EIGEN_END
