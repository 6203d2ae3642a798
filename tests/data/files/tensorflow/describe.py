#!/usr/bin/python3
"""Writes expected.json: what the TensorFlow-written files beside it hold, read independently of
loadstar (the records unframed here with their CRC-32C checked by python3-crc32c, each
tf.train.Example parsed by python3-protobuf from ../proto/example.proto, each JPEG decoded by
PIL). See ../MANIFEST for where the files come from.

Run from anywhere: /usr/bin/python3 tests/data/files/tensorflow/describe.py
"""
import io
import json
import os
import struct
import sys
import zlib

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import make_fixtures  # noqa: E402  (the framing's CRC and the Example module)


def records(path: str):
    data = open(path, "rb").read()
    i = 0
    while i < len(data):
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        assert struct.unpack("<I", data[i + 8:i + 12])[0] == make_fixtures.masked_crc(header)
        record = data[i + 12:i + 12 + length]
        assert struct.unpack("<I", data[i + 12 + length:i + 16 + length])[0] == \
            make_fixtures.masked_crc(record)
        yield record
        i += 16 + length


def features(pb, record: bytes) -> dict:
    example = pb.Example()
    example.ParseFromString(record)
    out = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        out[key] = (kind, list(getattr(feature, kind).value))
    return out


def main() -> None:
    pb = make_fixtures.example_module()
    table = []
    for record in records(os.path.join(HERE, "test.tfrecord")):
        f = features(pb, record)
        table.append({"feature0": f["feature0"][1][0], "feature1": f["feature1"][1][0],
                      "feature2": f["feature2"][1][0].decode(), "feature3": f["feature3"][1][0]})
    images = []
    for record in records(os.path.join(HERE, "images.tfrecord")):
        f = features(pb, record)
        jpeg = f["image_raw"][1][0]
        pixels = np.array(Image.open(io.BytesIO(jpeg)))
        images.append({"height": f["height"][1][0], "width": f["width"][1][0],
                       "depth": f["depth"][1][0], "label": f["label"][1][0],
                       "jpeg_bytes": len(jpeg), "jpeg_crc32": zlib.crc32(jpeg),
                       "pil_shape": list(pixels.shape),
                       "pil_crc32": zlib.crc32(pixels.astype(np.uint8).tobytes())})
    out = {"test.tfrecord": table, "images.tfrecord": images}
    make_fixtures.write("tensorflow/expected.json",
                        (json.dumps(out, indent=1, sort_keys=True) + "\n").encode())


if __name__ == "__main__":
    main()
