/// \file
/// Images: decoding (libjpeg-turbo, libpng), `tf.image`'s operations, and Keras's
/// `image_dataset_from_directory`. An opt-in include: it needs the `loadstar-image` dependency
/// (libjpeg and libpng), which `<loadstar/data.hpp>` does not.
#pragma once

#include "loadstar/data/dataset/image_dataset_from_directory.hpp"
#include "loadstar/data/image/crop_decode.hpp"
#include "loadstar/data/image/decode.hpp"
#include "loadstar/data/image/exif.hpp"
#include "loadstar/data/image/ops.hpp"
#include "loadstar/data/numpy_random_state.hpp"
