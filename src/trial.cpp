// The `loadstar_trial` library: the trial layer's non-template code compiled once, for trainers
// built with LOADSTAR_SEPARATE_COMPILATION (Meson's `loadstar-trial-compiled` dependency,
// pkg-config's `loadstar-trial-compiled`), whose headers then declare what this file defines. It
// calls the executor in `loadstar_keras`. See loadstar/config.hpp.

#ifndef LOADSTAR_SEPARATE_COMPILATION
#define LOADSTAR_SEPARATE_COMPILATION 1
#endif
#define LOADSTAR_BUILDING_TRIAL 1

#include <loadstar/trial.hpp>
