/// \file
/// `element_seed`: per-element randomness that depends on (seed, epoch, index) only; defined with
/// the rest of loadstar's randomness in `loadstar/random.hpp`.
#pragma once

#include "loadstar/random.hpp"
