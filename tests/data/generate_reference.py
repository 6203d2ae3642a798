#!/usr/bin/python3
"""Reference values for tests/data/test_idx.cpp, computed independently of loadstar.

Reads the Fashion-MNIST IDX files with Python's gzip module and NumPy (not with the C++ reader
under test) and prints the numbers the test hard-codes. Run with Debian's interpreter, where
NumPy lives:

    /usr/bin/python3 tests/data/generate_reference.py [/usr/share/datasets/fashion-mnist]
"""
import gzip
import os
import sys

import numpy as np


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    assert data[0] == 0 and data[1] == 0 and data[2] == 0x08, "expected an unsigned byte idx file"
    rank = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * rank).reshape(dims)


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
    for split in ("train", "t10k"):
        images = read_idx(os.path.join(directory, f"{split}-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(directory, f"{split}-labels-idx1-ubyte.gz"))
        last = images.shape[0] - 1
        print(f"{split}: images {images.shape} labels {labels.shape}")
        print(f"  class counts {np.bincount(labels, minlength=10).tolist()}")
        print(f"  first labels {labels[:10].tolist()}")
        print(f"  image 0 pixel sum {int(images[0].sum(dtype=np.uint64))}")
        print(f"  image 0 pixels (14, 10..17) {images[0, 14, 10:18].tolist()}")
        print(f"  image {last} pixel sum {int(images[last].sum(dtype=np.uint64))}")
        print(f"  image {last} label {int(labels[last])}")
        print(f"  all pixels sum {int(images.sum(dtype=np.uint64))}")


if __name__ == "__main__":
    main()
