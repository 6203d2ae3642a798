// A translation unit linked into the README tour that includes the umbrella headers header-only,
// as the tour does: that the two link together proves each definition in a header inline or a
// template (tests/usage/meson.build).

#include <loadstar/data.hpp>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/loadstar.hpp>
#include <loadstar/random.hpp>
#include <loadstar/tensor.hpp>
#include <loadstar/trial.hpp>
