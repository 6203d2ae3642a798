#!/usr/bin/python3
"""Writes the fixtures of tests/data/test_files.cpp, independently of loadstar.

TFRecord files are framed here (length, masked CRC-32C of the length, data, masked CRC-32C of the
data, as TensorFlow's RecordWriter) with python3-crc32c, and tf.train.Example records are built
with python3-protobuf from proto/example.proto (compiled with protoc into a temporary
directory). The GZIP and ZLIB variants use Python's gzip and zlib modules. CSV expectations come
from Python's csv module; text-line expectations from splitting the bytes in Python. Each
fixture's expected content is written as JSON beside it.

Run from anywhere: /usr/bin/python3 tests/data/files/make_fixtures.py
"""
import csv
import gzip
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import zlib

import crc32c
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def masked_crc(data: bytes) -> int:
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    length = struct.pack("<Q", len(record))
    return (length + struct.pack("<I", masked_crc(length)) + record +
            struct.pack("<I", masked_crc(record)))


def write(name: str, data: bytes) -> None:
    path = os.path.join(HERE, name)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def write_json(name: str, value) -> None:
    write(name, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


def compressed_variants(stem: str, ext: str, data: bytes) -> None:
    write(stem + ext, data)
    write(stem + ext + ".gz", gzip.compress(data, mtime=0))
    write(stem + ext + ".zlib", zlib.compress(data))


def example_module():
    out = tempfile.mkdtemp()
    subprocess.run(["protoc", "-I", os.path.join(HERE, "proto"), "--python_out", out,
                    "example.proto"], check=True)
    sys.path.insert(0, out)
    import example_pb2  # noqa: E402  (generated above)
    return example_pb2


def examples(pb) -> None:
    rng = random.Random(35)
    records, expected = [], []
    for i in range(12):
        ex = pb.Example()
        feature = ex.features.feature
        values = {}
        label = rng.randrange(-(2**40), 2**40)
        feature["label"].int64_list.value.append(label)
        values["label"] = [label]
        weights = np.float32([rng.uniform(-10, 10) for _ in range(3)])
        feature["weights"].float_list.value.extend(weights.tolist())
        values["weights"] = [float(w) for w in weights]
        name = f"example-{i}".encode()
        feature["name"].bytes_list.value.append(name)
        values["name"] = [name.decode()]
        tags = [f"t{rng.randrange(100)}".encode() for _ in range(rng.randrange(4))]
        feature["tags"].bytes_list.value.extend(tags)
        values["tags"] = [t.decode() for t in tags]
        rows = rng.randrange(4)
        if rows > 0:  # A FixedLenSequenceFeature with no rows is left out of the example.
            boxes = np.float32([rng.uniform(0, 1) for _ in range(2 * rows)])
            feature["boxes"].float_list.value.extend(boxes.tolist())
            values["boxes"] = [float(b) for b in boxes]
        else:
            values["boxes"] = []
        if i % 3 != 0:  # An optional feature, missing from every third example.
            score = np.float32(rng.uniform(0, 1))
            feature["score"].float_list.value.append(float(score))
            values["score"] = [float(score)]
        ids = [rng.randrange(-5, 1000) for _ in range(rng.randrange(5))]
        feature["ids"].int64_list.value.extend(ids)
        values["ids"] = ids
        feature["unrequested"].bytes_list.value.append(b"skipped")
        records.append(ex.SerializeToString(deterministic=True))
        expected.append(values)
    compressed_variants("examples", ".tfrecord", b"".join(frame(r) for r in records))
    write_json("examples.json", expected)


def plain_records() -> None:
    """Three files of raw records of many lengths (0 bytes, and over 64 KiB to cross buffers)."""
    rng = random.Random(7)
    expected = []
    for f, count in enumerate([5, 9, 3]):
        records = []
        for r in range(count):
            length = rng.choice([0, 1, 7, 100, 1000, 70000]) if r % 4 else 12
            body = f"f{f}r{r}:".encode()
            records.append((body * (length // len(body) + 1))[:length])
        compressed_variants(f"records-{f}", ".tfrecord", b"".join(frame(r) for r in records))
        # Each record by its length, first bytes and zlib CRC-32 (the long ones stay out of JSON).
        expected.append([{"length": len(r), "prefix": r[:24].decode(), "crc32": zlib.crc32(r)}
                         for r in records])
    write_json("records.json", expected)


def text_lines() -> None:
    data = (b"first line\n\nthird\r\nfourth with \r inside\n"
            b"\r\n  spaced  \nlast line without newline")
    compressed_variants("lines", ".txt", data)
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    lines = [line.replace(b"\r", b"") for line in lines]
    if lines and data[-1:] != b"\n" and lines[-1] == b"":
        lines.pop()
    write_json("lines.json", [line.decode() for line in lines])


def csv_table() -> None:
    text = ('id,name,score,count\r\n'
            '1,plain,0.5,10\r\n'
            '2,"quoted, with comma",1.25,-3\r\n'
            '3,"has ""quotes""",,7\r\n'
            '4,"multi\nline",2.5,\r\n'
            '5,NA,3.75,12\r\n'
            '6,,-0.125,+4\r\n'
            '7,last,1e3,99')
    compressed_variants("table", ".csv", text.encode())
    rows = list(csv.reader(io.StringIO(text, newline="")))
    write_json("table.json", rows)


def npz_archives() -> None:
    arrays = {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
              "y": np.array([3, -1, 2**40, 7], dtype=np.int64),
              "flag": np.array([True, False])}
    positional = np.array([0.5, -2.25, 1e10])
    for name, save in (("arrays.npz", np.savez), ("arrays_compressed.npz", np.savez_compressed)):
        path = os.path.join(HERE, name)
        with open(path + ".tmp", "wb") as f:
            save(f, positional, **arrays)
        os.replace(path + ".tmp", path)
    expected = {k: {"shape": list(v.shape), "values": v.astype(np.float64).ravel().tolist()}
                for k, v in dict(arrays, arr_0=positional).items()}
    write_json("arrays.json", expected)


def main() -> None:
    examples(example_module())
    plain_records()
    text_lines()
    csv_table()
    npz_archives()


if __name__ == "__main__":
    main()
