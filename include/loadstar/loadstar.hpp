/// \file
/// Everything loadstar offers on the CPU. CUDA and MPI headers are opt-in includes.
#pragma once

#include "loadstar/config.hpp"
#include "loadstar/data.hpp"
#include "loadstar/error.hpp"
#include "loadstar/tensor.hpp"
