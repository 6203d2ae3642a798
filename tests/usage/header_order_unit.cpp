// Linked into the README tour with header_only_unit.cpp: the executor's saving header first, which
// includes model.hpp, whose last lines include it back (tests/usage/meson.build).

#include <loadstar/keras/saving/model_config.hpp>
// (the rest in any order)
#include <loadstar/keras.hpp>
