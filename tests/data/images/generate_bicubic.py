#!/usr/bin/python3
"""Writes the bicubic resize references that tests/data/test_images.cpp reads.

Run with Debian's python3-pil and python3-numpy:
    /usr/bin/python3 tests/data/images/generate_bicubic.py
tf.image.resize(method="bicubic", antialias=False) is TensorFlow's ResizeBicubic with half-pixel
centres (tensorflow/core/kernels/image/resize_bicubic_op.cc): Keys' cubic convolution with
a = -0.5, its weights looked up in a table of 1025 entries (the fractional position rounded to
1/1024), taps outside the image given weight 0 and the four weights renormalised to sum to 1,
interpolated along x first, then y. That formula is reproduced here in NumPy; and, without the
table, it is checked against PIL's bicubic resampling (Keys' kernel with a = -0.5 and the same
renormalisation at the borders) where PIL does not widen the kernel, i.e. when enlarging.
"""
import json
import os

import numpy as np
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
REF = os.path.join(HERE, "reference")
TABLE = 1024


def keys(x, a=-0.5):
    x = abs(x)
    if x < 1:
        return ((a + 2) * x - (a + 3)) * x * x + 1
    if x < 2:
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return 0.0


def coefficients_table(a=-0.5):
    """TensorFlow's InitCoeffsTable: entry i for the fraction i / 1024 (float32 values)."""
    table = np.zeros((TABLE + 1, 2), dtype=np.float32)
    for i in range(TABLE + 1):
        x = np.float32(i * 1.0 / TABLE)
        table[i, 0] = ((a + 2) * float(x) - (a + 3)) * float(x) * float(x) + 1
        x = np.float32(float(x) + 1.0)
        table[i, 1] = ((a * float(x) - 5 * a) * float(x) + 8 * a) * float(x) - 4 * a
    return table


def taps(in_size, out_size, quantised):
    """Per output position: four (index, weight) pairs, as GetWeightsAndIndices with Keys."""
    table = coefficients_table()
    scale = np.float32(in_size / out_size)
    result = []
    for i in range(out_size):
        in_f = np.float32((np.float32(i) + np.float32(0.5)) * scale - np.float32(0.5))
        loc = int(np.floor(in_f))
        delta = np.float32(in_f - np.float32(loc))
        if quantised:
            offset = int(np.rint(delta * np.float32(TABLE)))
            w = [table[offset, 1], table[offset, 0], table[TABLE - offset, 0],
                 table[TABLE - offset, 1]]
        else:
            w = [keys(float(delta) + 1), keys(float(delta)), keys(1 - float(delta)),
                 keys(2 - float(delta))]
        pairs = []
        for k, weight in enumerate(w):
            index = loc - 1 + k
            inside = 0 <= index < in_size
            pairs.append((min(max(index, 0), in_size - 1), float(weight) if inside else 0.0))
        total = sum(p[1] for p in pairs)
        pairs = [(p[0], p[1] / total) for p in pairs]
        result.append(pairs)
    return result


def bicubic(image, out_h, out_w, quantised=True):
    """x first, then y, in float64 (the C++ side is float32: the tolerance covers it)."""
    in_h, in_w, c = image.shape
    ys, xs = taps(in_h, out_h, quantised), taps(in_w, out_w, quantised)
    rows = np.zeros((in_h, out_w, c))
    for x in range(out_w):
        for index, weight in xs[x]:
            rows[:, x] += weight * image[:, index]
    out = np.zeros((out_h, out_w, c))
    for y in range(out_h):
        for index, weight in ys[y]:
            out[y] += weight * rows[index]
    return out.astype(np.float32)


def pil_bicubic(image, out_h, out_w):
    channels = [Image.fromarray(image[:, :, k].astype(np.float32), mode="F")
                .resize((out_w, out_h), Image.BICUBIC) for k in range(image.shape[2])]
    return np.stack([np.array(ch) for ch in channels], axis=2)


def main():
    image = np.array(Image.open(os.path.join(HERE, "rgb.png"))).astype(np.float64)
    cases = []
    for h, w in [(20, 30), (80, 45), (13, 70), (37, 53), (97, 111), (74, 60)]:
        out = bicubic(image, h, w)
        if h >= image.shape[0] and w >= image.shape[1]:
            exact = bicubic(image, h, w, quantised=False)
            assert np.allclose(exact, pil_bicubic(image, h, w), atol=1e-3), (h, w)
        name = f"resize_bicubic_{h}x{w}.npy"
        np.save(os.path.join(REF, name), out)
        cases.append({"height": h, "width": w, "reference": name})
    with open(os.path.join(REF, "bicubic.json.tmp"), "w") as f:
        json.dump({"shape": list(image.shape), "cases": cases}, f, indent=1)
    os.replace(os.path.join(REF, "bicubic.json.tmp"), os.path.join(REF, "bicubic.json"))
    print("wrote", len(cases), "bicubic references to", REF)


if __name__ == "__main__":
    main()
