// The `loadstar_cuda` library: the CUDA backend's kernels (loadstar/cuda/detail/kernels.cuh),
// compiled once by nvcc. The backend's host code (src/cuda/*.cpp, compiled into the same library
// by the C++ compiler) calls the launchers defined here.

#include "loadstar/cuda/detail/kernels.cuh"
