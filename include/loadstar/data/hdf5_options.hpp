/// \file
/// `Trust` and `Hdf5Options`: how far the HDF5 readers trust the file they open, and the limits
/// they check before allocating.
///
/// Which paths trust their input:
/// - `read_hdf5`, `Hdf5Sequence` and `from_hdf5` default to `Trust::untrusted`: libhdf5 parses the
///   file in a forked child process first, so a corrupt or hostile file that crashes libhdf5
///   (libhdf5 1.10 dereferences corrupt addresses in `H5F__accum_read` and reads past compact
///   data) gives a `FormatError` naming the file and the signal. `Trust::trusted` skips the child
///   for files the caller wrote itself; a crash inside libhdf5 then ends the process.
/// - `load_model` and `load_weights` (`keras/saving/options.hpp`) default to `Trust::untrusted`
///   too, for `.h5` and `.keras` files alike; a trial reads its own checkpoint's model file
///   trusted only when this process wrote it and it is unchanged since (`trial/checkpoint.hpp`).
/// - `read_idx` and the dataset cache reader (`cache(path)`) parse their formats themselves and
///   check every size against the file before allocating; they need no child.
/// - Whatever the trust, sizes a file declares are checked before anything is allocated: element
///   and byte counts are overflow-checked, a read is refused above `max_bytes`, and data a file
///   declares but does not store (chunks never written) is refused above `max_fill_bytes`.
#pragma once

#include <chrono>
#include <cstddef>

namespace loadstar {

/// Whether a file may be hostile: `untrusted` parses it where a crash is survivable.
///
/// What `trusted` gives up: libhdf5 (1.10, Debian 12's) is not written for hostile input. Fed
/// corrupt global heaps, attribute messages or chunk indexes it dereferences wild addresses
/// (segmentation faults), reads and writes past its heap buffers, and loops forever; fuzzing
/// loadstar's readers found all of these inside libhdf5 itself. Untrusted, each is a
/// `FormatError` naming the file (the child dies, or is killed at the deadline). Trusted, the
/// same file ends or hangs this process, and a heap overflow may corrupt it silently first.
/// loadstar's own checks (sizes before allocating, typed errors) hold either way; trusting buys
/// only the fork and the copy back, some milliseconds a file.
enum class Trust {
  /// Written by the caller (or by a program the caller trusts): parsed in this process.
  trusted,
  /// Downloaded, received or otherwise not written by the caller: parsed in a forked child
  /// process first, whose death becomes a `FormatError`.
  untrusted,
};

/// Options of the HDF5 readers (`read_hdf5`, `Hdf5Sequence`, `from_hdf5`).
/// \code
/// auto x = read_hdf5<float>("mine.h5", "x", {}, {.trust = Trust::trusted});
/// auto y = read_hdf5<float>("downloaded.h5", "x", {}, {.max_bytes = std::size_t{1} << 30});
/// \endcode
struct Hdf5Options {
  /// `untrusted` (the default): the file is parsed in a forked child first. `read_hdf5` reads
  /// the dataset there, into shared memory the tensor then views (no copy); `Hdf5Sequence`
  /// reads every row of both datasets there once, when constructed, before serving batches from
  /// this process.
  Trust trust = Trust::untrusted;
  /// The most bytes one read may allocate: the whole tensor for `read_hdf5`, one batch of `x` or
  /// `y` for `Hdf5Sequence` (default 16 GiB).
  std::size_t max_bytes = std::size_t{1} << 34;
  /// The most bytes of a dataset that may come from its fill value rather than from data the
  /// file stores (chunks never written, contiguous storage never allocated): HDF5 fills them
  /// without reading anything, so a file of a few hundred bytes could otherwise declare
  /// gigabytes (default 64 MiB).
  std::size_t max_fill_bytes = std::size_t{1} << 26;
  /// How long the sandbox child of an untrusted read may take before this process kills it and
  /// throws `FormatError` (libhdf5 loops forever on some corrupt files); zero waits for ever. The
  /// default leaves a whole 16 GiB read from a slow disk time to finish.
  std::chrono::milliseconds sandbox_deadline = std::chrono::minutes(10);
};

}  // namespace loadstar
