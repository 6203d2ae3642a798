/// \file
/// Every built-in Keras layer, the CPU backend and the layer registry.
#pragma once

#include "loadstar/keras/activations.hpp"
#include "loadstar/keras/backend/backend.hpp"
#include "loadstar/keras/backend/cpu_backend.hpp"
#include "loadstar/keras/initializers.hpp"
#include "loadstar/keras/layers/activation.hpp"
#include "loadstar/keras/layers/average_pooling2d.hpp"
#include "loadstar/keras/layers/conv2d.hpp"
#include "loadstar/keras/layers/dense.hpp"
#include "loadstar/keras/layers/flatten.hpp"
#include "loadstar/keras/layers/global_pooling2d.hpp"
#include "loadstar/keras/layers/input_layer.hpp"
#include "loadstar/keras/layers/max_pooling2d.hpp"
#include "loadstar/keras/layers/reshape.hpp"
