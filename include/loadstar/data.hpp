/// \file
/// Umbrella header of the data area: array loaders, readers, sequences and their concepts.
/// A user who only wants a fast loader includes this and never compiles the executor.
#pragma once

#include "loadstar/config.hpp"  // first: says at once when the standard is older than C++20

#include "loadstar/data/array_like.hpp"
#include "loadstar/data/array_sequence.hpp"
#include "loadstar/data/class_weight.hpp"
#include "loadstar/data/concepts.hpp"
#include "loadstar/data/dataset.hpp"
#include "loadstar/data/hdf5.hpp"
#include "loadstar/data/hdf5_options.hpp"
#include "loadstar/data/hdf5_sequence.hpp"
#include "loadstar/data/idx.hpp"
#include "loadstar/data/npy.hpp"
#include "loadstar/data/npz.hpp"
#include "loadstar/data/sampler.hpp"
#include "loadstar/data/sequence_adapter.hpp"
#include "loadstar/data/serialize.hpp"
#include "loadstar/data/validation_split.hpp"
#include "loadstar/tensor/tensor.hpp"
