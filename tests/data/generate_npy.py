#!/usr/bin/python3
"""Writes the NumPy-written .npy files under tests/data/npy/ that tests/data/test_npy.cpp reads.

Run with Debian's python3-numpy: /usr/bin/python3 tests/data/generate_npy.py
The same files are the seed corpus of tests/fuzz/fuzz_npy.cpp (tests/fuzz/corpus/npy/).
Every array of the "pattern" files holds value(i) = (i % 11) - 3 at flat index i (C order), cast
to the file's dtype (bool: i % 3 == 0), so the test computes the expected values on its own. The
other files hold the literal values listed in the test.
"""
import os
import shutil

import numpy as np

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(TESTS, "data", "npy")
# The same files seed the fuzz harness tests/fuzz/fuzz_npy.cpp (tools/fuzz fuzz_npy).
SEEDS = os.path.join(TESTS, "fuzz", "corpus", "npy")


def pattern(dtype, shape):
    n = int(np.prod(shape, dtype=np.int64))
    i = np.arange(n, dtype=np.int64)
    if np.dtype(dtype).kind == "b":
        values = i % 3 == 0
    elif np.dtype(dtype).kind == "u":
        values = i % 11  # unsigned: no negative values
    else:
        values = (i % 11) - 3
    return values.astype(dtype).reshape(shape)


def save(name, array, version=None):
    path = os.path.join(HERE, name)
    with open(path, "wb") as f:
        np.lib.format.write_array(f, array, version=version, allow_pickle=False)
    shutil.copyfile(path, os.path.join(SEEDS, name))
    back = np.load(path)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array, equal_nan=array.dtype.kind == "f")


def main():
    os.makedirs(HERE, exist_ok=True)
    os.makedirs(SEEDS, exist_ok=True)
    # Every supported dtype in both byte orders, shape (2, 3, 4), format version 1.0.
    for kind in ["f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "b1"]:
        orders = ["<", ">"] if kind[1] != "1" else ["|"]
        for order in orders:
            tag = {"<": "le", ">": "be", "|": "na"}[order]
            save(f"pattern_{kind}_{tag}.npy", pattern(np.dtype(order + kind), (2, 3, 4)))
    # Versions 2.0 and 3.0 (NumPy picks them only for huge or non-latin-1 headers).
    save("pattern_f4_le_v2.npy", pattern("<f4", (5, 7)), version=(2, 0))
    save("pattern_f8_be_v3.npy", pattern(">f8", (5, 7)), version=(3, 0))
    # Shapes: scalar, one axis, empty, rank 8.
    save("scalar_f8.npy", np.array(2.5, dtype="<f8"))
    save("vector_f4.npy", pattern("<f4", (6,)))
    save("empty_f4.npy", np.zeros((0, 3), dtype="<f4"))
    save("rank8_i2.npy", pattern("<i2", (1, 2, 1, 2, 1, 2, 1, 3)))
    # Extreme values.
    save("extremes_i8.npy", np.array([np.iinfo(np.int64).min, -1, 0, np.iinfo(np.int64).max],
                                     dtype="<i8"))
    save("extremes_u8.npy", np.array([0, 1, np.iinfo(np.uint64).max], dtype=">u8"))
    save("special_f4.npy", np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype="<f4"))
    # Refused: column-major data and a structured dtype.
    save("fortran_f4.npy", np.asfortranarray(pattern("<f4", (2, 3))))
    save("structured.npy", np.zeros(2, dtype=[("a", "<f4"), ("b", "<i4")]))
    save("complex_c8.npy", np.zeros(2, dtype="<c8"))


if __name__ == "__main__":
    main()
