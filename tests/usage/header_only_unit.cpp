// A translation unit linked into the README tour that includes the umbrella headers header-only,
// as the tour does: that the two link together proves each definition in a header inline or a
// template (tests/usage/meson.build). It starts with sequential.hpp, which model.hpp's saving
// headers need (they wait for it when it comes first); header_order_unit.cpp starts with them.

#include <loadstar/keras/sequential.hpp>
// (the rest in any order)
#include <loadstar/data.hpp>
#include <loadstar/error.hpp>
#include <loadstar/keras.hpp>
#include <loadstar/loadstar.hpp>
#include <loadstar/random.hpp>
#include <loadstar/tensor.hpp>
#include <loadstar/trial.hpp>
