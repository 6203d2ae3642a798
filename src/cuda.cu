// The `loadstar_cuda` library: the CUDA backend's kernels (loadstar/cuda/detail/kernels.cuh),
// compiled once by nvcc. The backend itself (loadstar/cuda/cuda_backend.hpp) is host code in the
// headers and calls the launchers defined here.

#include "loadstar/cuda/detail/kernels.cuh"
