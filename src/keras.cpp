// The `loadstar_keras` library: the executor's non-template code compiled once, for trainers built
// with LOADSTAR_SEPARATE_COMPILATION (Meson's `loadstar-compiled` dependency, pkg-config's
// `loadstar-compiled`), whose headers then declare what this file defines. See
// loadstar/config.hpp.

#ifndef LOADSTAR_SEPARATE_COMPILATION
#define LOADSTAR_SEPARATE_COMPILATION 1
#endif
#define LOADSTAR_BUILDING_KERAS 1

#include <loadstar/keras.hpp>
