/// \file
/// Data-parallel training without a transport: the `Collective` interface, the
/// `DistributedOptimizer`, and the state broadcast and metric merge. `<loadstar/dist/mpi.hpp>`
/// adds the Open MPI transport (opt-in: it needs `<mpi.h>`).
#pragma once

#include "loadstar/config.hpp"
#include "loadstar/dist/collective.hpp"
#include "loadstar/dist/distributed_optimizer.hpp"
#include "loadstar/dist/state.hpp"
