/// \file
/// Eigen's QR module (Householder QR), included as detail/eigen.hpp includes Eigen's core.
#pragma once

#include "loadstar/detail/eigen.hpp"

LOADSTAR_DETAIL_EIGEN_BEGIN
#include <Eigen/QR>
LOADSTAR_DETAIL_EIGEN_END
