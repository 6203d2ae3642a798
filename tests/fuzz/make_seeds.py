#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz harnesses (tests/fuzz/corpus/<harness>/): small real
files of every kind each reader takes. Run from anywhere; the output is checked in, so this runs
again only when a seed is added. Needs h5py and numpy (Debian's python3-h5py, python3-numpy)."""
import gzip
import os
import struct
import zlib

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def corpus(name):
    path = os.path.join(HERE, "corpus", name)
    os.makedirs(path, exist_ok=True)
    return path


def idx(type_code, array):
    fmt = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}[type_code]
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(struct.pack(">I", d) for d in array.shape)
    return header + array.astype(fmt).tobytes()


def idx_seeds():
    rng = np.random.default_rng(17)
    return {
        "u8-2x3": idx(0x08, np.arange(6, dtype=np.uint8).reshape(2, 3)),
        "u8-images": idx(0x08, rng.integers(0, 256, (3, 4, 4))),
        "i8": idx(0x09, np.array([-128, 0, 127])),
        "i16": idx(0x0B, np.array([[-32768, 1], [258, 32767]])),
        "i32": idx(0x0C, np.array([-(2**31), -1, 0, 2**31 - 1])),
        "f32": idx(0x0D, np.array([-1.5, 0.0, 3.25, 1e-30])),
        "f64": idx(0x0E, np.arange(8, dtype=np.float64).reshape(2, 2, 2)),
        "scalar": idx(0x08, np.array(7, dtype=np.uint8)),
        "empty": idx(0x0D, np.zeros((0, 4))),
    }


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


def main():
    seeds = idx_seeds()
    plain = corpus("idx")
    packed = corpus("idx_gzip")
    for name, data in seeds.items():
        write(os.path.join(plain, name), data)
        # gzip with a fixed mtime so the seed is reproducible
        write(os.path.join(plain, name + ".gz"), gzip.compress(data, mtime=0))
        write(os.path.join(packed, name), data)

    h5 = corpus("hdf5")
    seq = corpus("hdf5_sequence")
    rng = np.random.default_rng(17)
    layouts = {
        "contiguous": {},
        "chunked": {"chunks": (2, 3)},
        "gzip": {"chunks": (2, 3), "compression": "gzip", "shuffle": True},
        "fletcher": {"chunks": (4, 3), "fletcher32": True},
        "compact": {"compact": True},
    }
    for layout, options in layouts.items():
        for dtype in ("<f4", ">f8", "<i8", "|u1"):
            name = f"{layout}-{dtype.strip('<>|')}"
            x = (rng.standard_normal((5, 3)) * 10).astype(dtype)
            y = np.arange(5).astype("<i8" if dtype[1] != "f" else dtype)
            for folder in (h5, seq):
                path = os.path.join(folder, name + ".h5")
                with h5py.File(path, "w", libver="earliest" if layout != "gzip" else "latest") as f:
                    for dataset, values in (("x", x), ("y", y)):
                        if options.get("compact"):
                            space = h5py.h5s.create_simple(values.shape)
                            plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
                            plist.set_layout(h5py.h5d.COMPACT)
                            tid = h5py.h5t.py_create(values.dtype)
                            h5py.h5d.create(f.id, dataset.encode(), tid, space, plist).write(
                                h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(values))
                        elif "chunks" in options and values.ndim == 1:
                            f.create_dataset(dataset, data=values, chunks=(2,),
                                             **{k: v for k, v in options.items() if k != "chunks"})
                        else:
                            f.create_dataset(dataset, data=values, **options)
    # A scalar, an empty dataset and a dataset inside a group.
    with h5py.File(os.path.join(h5, "shapes.h5"), "w", libver="earliest") as f:
        f["x"] = np.float32(2.5)
        f["y"] = np.zeros((0, 2), dtype="<f4")
        f.create_group("g")["x"] = np.arange(3, dtype="<i4")
    # Chunks never written: a dataset read as its fill value.
    with h5py.File(os.path.join(h5, "unwritten.h5"), "w", libver="earliest") as f:
        f.create_dataset("x", shape=(4, 4), chunks=(2, 2), dtype="<f4", fillvalue=1.5)
        f.create_dataset("y", shape=(4,), chunks=(2,), dtype="<i8")

    cache = corpus("cache")
    for name, records in {
        "ints": [struct.pack("<q", v) for v in range(4)],
        "tensors": [tensor_record(np.arange(6, dtype="<f4").reshape(2, 3) + i) for i in range(3)],
        "empty": [],
    }.items():
        write(os.path.join(cache, name), cache_file(records))


def tensor_record(array):
    # Serializer<Tensor<float>>: u8 rank, u64 dims, padding to 64 bytes, data.
    head = bytes([array.ndim]) + b"".join(struct.pack("<Q", d) for d in array.shape)
    head += b"\0" * ((64 - len(head) % 64) % 64)
    return head + array.tobytes()


def cache_file(records):
    # detail/cache_file.hpp: 48-byte header, payload, count + 1 u64 offsets.
    payload = b"".join(records)
    offsets = [0]
    for r in records:
        offsets.append(offsets[-1] + len(r))
    table = b"".join(struct.pack("<Q", o) for o in offsets)
    crc = zlib.crc32(payload + table)
    header = b"LDSCACHE" + struct.pack("<IIQQII", 1, 0, len(records), len(payload), crc, 0)
    header += b"\0" * 8
    return header + payload + table


if __name__ == "__main__":
    main()
