/// \file
/// The pipeline area: tf.data-style datasets whose position is saved and restored exactly.
#pragma once

#include "loadstar/data/dataset/batch.hpp"
#include "loadstar/data/dataset/cache.hpp"
#include "loadstar/data/dataset/cache_train_dataset.hpp"
#include "loadstar/data/dataset/concepts.hpp"
#include "loadstar/data/dataset/element_seed.hpp"
#include "loadstar/data/dataset/filter.hpp"
#include "loadstar/data/dataset/from_generator.hpp"
#include "loadstar/data/dataset/from_hdf5.hpp"
#include "loadstar/data/dataset/from_sequence.hpp"
#include "loadstar/data/dataset/from_tensor_slices.hpp"
#include "loadstar/data/dataset/interleave.hpp"
#include "loadstar/data/dataset/map.hpp"
#include "loadstar/data/dataset/prefetch.hpp"
#include "loadstar/data/dataset/range.hpp"
#include "loadstar/data/dataset/repeat.hpp"
#include "loadstar/data/dataset/shard.hpp"
#include "loadstar/data/dataset/shuffle.hpp"
#include "loadstar/data/dataset/skip.hpp"
#include "loadstar/data/dataset/take.hpp"
#include "loadstar/data/dataset/unbatch.hpp"
#include "loadstar/data/dataset/wrap_dataset.hpp"
// Keras's text_dataset_from_directory and timeseries_dataset_from_array
// (image_dataset_from_directory is in <loadstar/data/image.hpp>, which needs libjpeg and libpng).
#include "loadstar/data/dataset/text_dataset_from_directory.hpp"
#include "loadstar/data/dataset/timeseries_dataset_from_array.hpp"
// File sources: list_files, TFRecord, text lines, CSV.
#include "loadstar/data/dataset/csv.hpp"
#include "loadstar/data/dataset/list_files.hpp"
#include "loadstar/data/dataset/make_csv_dataset.hpp"
#include "loadstar/data/dataset/text_line.hpp"
#include "loadstar/data/dataset/tfrecord.hpp"
// tf.data's remaining operators and AUTOTUNE.
#include "loadstar/data/dataset/autotune.hpp"
#include "loadstar/data/dataset/padded_batch.hpp"
#include "loadstar/data/dataset/sample_from_datasets.hpp"
#include "loadstar/data/dataset/window.hpp"
#include "loadstar/data/dataset/zip.hpp"
