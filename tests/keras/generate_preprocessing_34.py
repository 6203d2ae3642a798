#!/usr/bin/python3
"""Writes tests/keras/reference/preprocessing_34.json: PyTorch (float64) outputs and input
gradients of the preprocessing layers Normalization, Resizing and CenterCrop, for
tests/keras/test_preprocessing_34.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_preprocessing_34.py
The cases have the format of generate_layers.py: the layer's Keras class_name and config, inputs,
weights in Keras's layout, the upstream gradient g, and the targets of loss = sum(output * g).

Normalization follows Keras's formula (x - mean) / max(sqrt(variance), 1e-7). Bilinear resizing is
torch.nn.functional.interpolate(mode="bilinear", align_corners=False), which samples as
tf.image.resize without antialiasing (half-pixel centres). Nearest resizing is TensorFlow's rule
for half-pixel centres, written here with NumPy in float32 as TensorFlow computes it:
source = min(floor((i + 0.5) * (in / out)), in - 1). Bicubic resizing: Pillow's weights where
Pillow computes Keras's (enlargements), the formula written out elsewhere (below). The crop boxes
follow Keras's CenterCrop
and smart_resize (crop_to_aspect_ratio). Lanczos, area, antialiasing, pad_to_aspect_ratio and
UpSampling2D's kinds: Pillow's matrices where Pillow computes Keras's, torch's area mode where it
agrees, and the formulas written out below, checked against both, elsewhere.
"""
import json
import math
import os

import numpy as np
import torch
from PIL import Image
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3435)
DT = torch.float64
EPSILON = 1e-7


def rnd(*shape, scale=1.0):
    return (torch.rand(tuple(shape), dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


def case(name, class_name, config, x, weights, fn):
    xs = x.clone().requires_grad_(True)
    out = fn(xs)
    g = rnd(*out.shape)
    (out * g).sum().backward()
    return {
        "name": name,
        "class_name": class_name,
        "config": config,
        "training": False,
        "input_shapes": [list(x.shape)],
        "inputs": [flat(x)],
        "weights": {k: flat(v) for k, v in weights.items()},
        "upstream": flat(g),
        "output_shape": list(out.shape),
        "output": flat(out),
        "input_gradients": [flat(xs.grad)],
        "weight_gradients": {},
        "updated_weights": {},
    }


cases = []


# --- Normalization -------------------------------------------------------------------------------
def normalize(x, mean, variance, invert):
    scale = torch.clamp(torch.sqrt(variance), min=EPSILON)
    return mean + x * scale if invert else (x - mean) / scale


def normalization_case(name, shape, kept_axes, invert, tiny=False):
    """Statistics stored as the weights mean, variance, count over the kept axes (batch axis 0)."""
    kept = [shape[a] for a in kept_axes]
    mean = rnd(*kept, scale=2.0)
    variance = torch.rand(tuple(kept), dtype=DT) * 3 + 0.1
    if tiny:
        variance.reshape(-1)[0] = 1e-16  # below epsilon squared: the scale is epsilon
    view = [shape[d] if d in kept_axes else 1 for d in range(len(shape))]
    x = rnd(*shape, scale=3.0)
    config = {"axis": kept_axes, "invert": invert, "mean": None, "variance": None}
    weights = {"mean": mean, "variance": variance, "count": torch.tensor(11.0, dtype=DT)}
    cases.append(case(name, "Normalization", config, x, weights,
                      lambda t: normalize(t, mean.reshape(view), variance.reshape(view), invert)))


normalization_case("normalization", (2, 3, 4), [2], False)
normalization_case("normalization_invert", (3, 4), [1], True)
normalization_case("normalization_two_axes", (2, 3, 4, 2), [1, 3], False, tiny=True)
normalization_case("normalization_no_axis", (2, 5), [], False)


def fixed_normalization_case(name, shape, config, mean, variance):
    """Statistics from the config (no weights), broadcast over the last axis."""
    m = torch.tensor(mean, dtype=DT)
    v = torch.tensor(variance, dtype=DT)
    cases.append(case(name, "Normalization", config, rnd(*shape, scale=3.0), {},
                      lambda t: normalize(t, m, v, config.get("invert", False))))


fixed_normalization_case("normalization_fixed_scalar", (2, 3, 2),
                         {"axis": None, "mean": 0.5, "variance": 2.0}, 0.5, 2.0)
fixed_normalization_case("normalization_fixed_list", (3, 3),
                         {"axis": -1, "mean": [0.5, -1.0, 2.0], "variance": [4.0, 0.25, 1.0],
                          "invert": True}, [0.5, -1.0, 2.0], [4.0, 0.25, 1.0])


# --- Resizing and CenterCrop ----------------------------------------------------------------------
def aspect_box(h, w, height, width):
    """Keras's smart_resize / crop_to_aspect_ratio box (top, left, crop_h, crop_w)."""
    crop_h = max(min(h, int(float(w * height) / width)), 1)
    crop_w = max(min(w, int(float(h * width) / height)), 1)
    return int(float(h - crop_h) / 2), int(float(w - crop_w) / 2), crop_h, crop_w


def nearest_indices(n_in, n_out):
    scale = np.float32(n_in) / np.float32(n_out)
    i = np.arange(n_out, dtype=np.float32)
    src = np.floor((i + np.float32(0.5)) * scale).astype(np.int64)
    return torch.tensor(np.minimum(src, n_in - 1))


def resize(x, box, height, width, nearest):
    """x: (b, h, w, c); the box is cropped, then resized to (height, width)."""
    top, left, bh, bw = box
    x = x[:, top:top + bh, left:left + bw, :]
    if nearest:
        x = x.index_select(1, nearest_indices(bh, height))
        return x.index_select(2, nearest_indices(bw, width))
    y = F.interpolate(x.permute(0, 3, 1, 2), size=(height, width), mode="bilinear",
                      align_corners=False)
    return y.permute(0, 2, 3, 1)


def resizing_case(name, shape, height, width, interpolation="bilinear", crop=False):
    _, h, w, _ = shape
    box = aspect_box(h, w, height, width) if crop else (0, 0, h, w)
    config = {"height": height, "width": width, "interpolation": interpolation,
              "crop_to_aspect_ratio": crop}
    cases.append(case(name, "Resizing", config, rnd(*shape), {},
                      lambda t: resize(t, box, height, width, interpolation == "nearest")))


resizing_case("resizing_up", (2, 4, 5, 3), 7, 8)
resizing_case("resizing_down", (1, 9, 7, 2), 4, 3)
resizing_case("resizing_mixed", (2, 3, 8, 1), 5, 6)
resizing_case("resizing_nearest_up", (2, 3, 5, 2), 7, 8, "nearest")
resizing_case("resizing_nearest_down", (1, 9, 7, 2), 4, 3, "nearest")
resizing_case("resizing_crop_to_aspect_ratio", (2, 6, 9, 2), 4, 3, crop=True)
resizing_case("resizing_nearest_crop_to_aspect_ratio", (1, 8, 5, 2), 3, 4, "nearest", crop=True)


# Bicubic: Keys's cubic convolution (a = -0.5) at half-pixel centres without antialiasing, a pixel
# outside the image weighing 0 and the others normalised to sum 1 (TensorFlow's resize_bicubic
# with half_pixel_centers, up to its 1/1024 table of the fraction, and JAX's image.resize). Each
# axis is a matrix (out, in). Pillow's BICUBIC resize of float images computes the same weights
# when it enlarges (it antialiases when it shrinks): enlargements take Pillow's matrices, read
# back from the resize of each one-hot row; the formula written out below gives the others, and
# is first checked against Pillow's on enlargements.
def pil_bicubic_matrix(n_in, n_out):
    m = np.zeros((n_out, n_in))
    for j in range(n_in):
        basis = np.zeros((1, n_in), dtype=np.float32)
        basis[0, j] = 1.0
        row = Image.fromarray(basis, mode="F").resize((n_out, 1), Image.BICUBIC)
        m[:, j] = np.asarray(row, dtype=np.float64)[0]
    return m


def keys_matrix(n_in, n_out, a=-0.5):
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        s = (i + 0.5) * n_in / n_out - 0.5
        base = math.floor(s)
        weights = {}
        for k in range(4):
            p = base - 1 + k
            if 0 <= p < n_in:
                x = abs(s - p)
                weights[p] = ((a + 2) * x - (a + 3)) * x * x + 1 if x <= 1 else \
                    ((a * x - 5 * a) * x + 8 * a) * x - 4 * a if x < 2 else 0.0
        total = sum(weights.values())
        for p, v in weights.items():
            m[i, p] = v / total
    return m


for n_in, n_out in [(4, 7), (5, 8), (3, 5), (2, 9), (6, 6)]:
    assert np.allclose(keys_matrix(n_in, n_out), pil_bicubic_matrix(n_in, n_out), atol=2e-7), \
        (n_in, n_out)


def bicubic_case(name, shape, height, width, crop=False, pillow=False):
    _, h, w, _ = shape
    top, left, bh, bw = aspect_box(h, w, height, width) if crop else (0, 0, h, w)
    matrix = pil_bicubic_matrix if pillow else keys_matrix
    rows = torch.tensor(matrix(bh, height), dtype=DT)
    cols = torch.tensor(matrix(bw, width), dtype=DT)
    config = {"height": height, "width": width, "interpolation": "bicubic",
              "crop_to_aspect_ratio": crop}
    cases.append(case(name, "Resizing", config, rnd(*shape), {},
                      lambda t: torch.einsum("ip,jq,bpqc->bijc", rows, cols,
                                             t[:, top:top + bh, left:left + bw, :])))


def center_crop_case(name, shape, height, width):
    _, h, w, _ = shape
    if h >= height and w >= width:
        box = (int((h - height) / 2), int((w - width) / 2), height, width)
    else:
        box = aspect_box(h, w, height, width)
    config = {"height": height, "width": width}
    cases.append(case(name, "CenterCrop", config, rnd(*shape), {},
                      lambda t: resize(t, box, height, width, False)))


center_crop_case("center_crop", (2, 7, 6, 3), 4, 3)
center_crop_case("center_crop_even_odd", (1, 6, 5, 2), 3, 2)
center_crop_case("center_crop_smaller", (2, 3, 5, 2), 4, 4)
center_crop_case("center_crop_one_axis_smaller", (1, 8, 3, 2), 5, 4)

bicubic_case("resizing_bicubic_up", (2, 4, 5, 3), 7, 8, pillow=True)
bicubic_case("resizing_bicubic_down", (1, 9, 7, 2), 4, 3)
bicubic_case("resizing_bicubic_mixed", (2, 3, 8, 1), 5, 6)
bicubic_case("resizing_bicubic_crop_to_aspect_ratio", (2, 6, 9, 2), 4, 3, crop=True)



# --- Lanczos, area, antialiasing and padding to the aspect ratio; UpSampling2D's kinds ------------
# tf.image.resize's kernels (TensorFlow's scale_and_translate, JAX's image.resize): output i samples
# s = (i + 0.5) * n / out - 0.5 of an axis of n samples; each sample p weighs kernel(|s - p| / k),
# the weights of an output scaled to sum 1, where k = max(n / out, 1) with antialiasing (a
# low-pass filter when shrinking) and 1 otherwise. Pillow resamples float images the same way with
# k = max(n / out, 1) always, for its BILINEAR (triangle), BICUBIC (Keys, a = -0.5) and LANCZOS
# (radius 3) filters: the cases Pillow computes take Pillow's matrices, the formula below is
# checked against them and gives Lanczos 5 and shrinking without antialiasing. Area is
# TensorFlow's resize_area: the mean of the box [i * n / out, (i + 1) * n / out), each sample
# weighted by its overlap; torch's area mode (adaptive average pooling) computes the same when
# n / out or out / n is a whole number, and the formula is checked against it there.
PIL_FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos3": Image.LANCZOS}


def pil_matrix(kind, n_in, n_out):
    m = np.zeros((n_out, n_in))
    for j in range(n_in):
        basis = np.zeros((1, n_in), dtype=np.float32)
        basis[0, j] = 1.0
        row = Image.fromarray(basis, mode="F").resize((n_out, 1), PIL_FILTERS[kind])
        m[:, j] = np.asarray(row, dtype=np.float64)[0]
    return m


def kernel(kind, x):
    x = abs(x)
    if kind == "bilinear":
        return max(0.0, 1.0 - x)
    if kind == "bicubic":
        return (1.5 * x - 2.5) * x * x + 1 if x < 1 else \
            ((-0.5 * x + 2.5) * x - 4) * x + 2 if x < 2 else 0.0
    radius = 3.0 if kind == "lanczos3" else 5.0
    if x >= radius:
        return 0.0
    if x <= 1e-3:
        return 1.0
    return radius * math.sin(math.pi * x) * math.sin(math.pi * x / radius) / (math.pi * x) ** 2


def kernel_matrix(kind, n_in, n_out, antialias):
    k = max(n_in / n_out, 1.0) if antialias else 1.0
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        s = (i + 0.5) * n_in / n_out - 0.5
        w = np.array([kernel(kind, (s - p) / k) for p in range(n_in)])
        m[i] = w / w.sum()
    return m


def area_matrix(n_in, n_out):
    m = np.zeros((n_out, n_in))
    scale = n_in / n_out
    for i in range(n_out):
        low, high = i * scale, (i + 1) * scale
        for p in range(n_in):
            m[i, p] = max(0.0, min(p + 1, high) - max(p, low)) / scale
    return m


def torch_area_matrix(n_in, n_out):
    eye = torch.eye(n_in, dtype=DT).reshape(n_in, 1, n_in)
    return F.interpolate(eye, size=n_out, mode="area").reshape(n_in, n_out).T.numpy()


for kind in PIL_FILTERS:
    for n_in, n_out in [(4, 7), (9, 4), (12, 5), (10, 3), (7, 4), (3, 9), (8, 2)]:
        assert np.allclose(kernel_matrix(kind, n_in, n_out, True), pil_matrix(kind, n_in, n_out),
                           atol=2e-7), (kind, n_in, n_out)
for n_in, n_out in [(8, 4), (9, 3), (3, 6), (2, 6), (4, 8)]:
    assert np.allclose(area_matrix(n_in, n_out), torch_area_matrix(n_in, n_out), atol=1e-12)


def axis_matrix(kind, n_in, n_out, antialias, source):
    if kind == "area":
        return torch_area_matrix(n_in, n_out) if source == "torch" else area_matrix(n_in, n_out)
    if kind == "nearest":
        m = np.zeros((n_out, n_in))
        m[np.arange(n_out), nearest_indices(n_in, n_out).numpy()] = 1.0
        return m
    if source == "pillow":
        return pil_matrix(kind, n_in, n_out)
    return kernel_matrix(kind, n_in, n_out, antialias)


def padded_box(h, w, height, width):
    """Keras's pad_to_aspect_ratio with TensorFlow: rows (or columns) of the fill value on both
    sides, int((pad - h) / 2) of them, pad = max(h, int(w * height / width)) in float32."""
    pad_h = max(h, int(np.float32(w * height) / np.float32(width)))
    pad_w = max(w, int(np.float32(h * width) / np.float32(height)))
    return int(np.float32(pad_h - h) / 2), int(np.float32(pad_w - w) / 2)


def resample(t, rows, cols, layout="nhwc"):
    r, c = torch.tensor(rows, dtype=DT), torch.tensor(cols, dtype=DT)
    if layout == "nchw":
        return torch.einsum("ip,jq,bcpq->bcij", r, c, t)
    return torch.einsum("ip,jq,bpqc->bijc", r, c, t)


def general_resizing_case(name, shape, height, width, kind, antialias=False, source="formula",
                          pad=None):
    _, h, w, ch = shape
    config = {"height": height, "width": width, "interpolation": kind, "antialias": antialias}
    pad_rows = pad_cols = 0
    if pad is not None:
        pad_rows, pad_cols = padded_box(h, w, height, width)
        config.update({"pad_to_aspect_ratio": True, "fill_value": pad})
    rows = axis_matrix(kind, h + 2 * pad_rows, height, antialias, source)
    cols = axis_matrix(kind, w + 2 * pad_cols, width, antialias, source)

    def fn(t):
        if pad_rows:
            band = torch.full((t.shape[0], pad_rows, w, ch), pad, dtype=DT)
            t = torch.cat([band, t, band], dim=1)
        if pad_cols:
            band = torch.full((t.shape[0], t.shape[1], pad_cols, ch), pad, dtype=DT)
            t = torch.cat([band, t, band], dim=2)
        return resample(t, rows, cols)

    cases.append(case(name, "Resizing", config, rnd(*shape), {}, fn))


def up_sampling_case(name, shape, size, kind, source="formula", channels_first=False):
    h, w = (shape[2], shape[3]) if channels_first else (shape[1], shape[2])
    rows = axis_matrix(kind, h, h * size[0], False, source)
    cols = axis_matrix(kind, w, w * size[1], False, source)
    config = {"size": list(size), "interpolation": kind,
              "data_format": "channels_first" if channels_first else "channels_last"}
    cases.append(case(name, "UpSampling2D", config, rnd(*shape), {},
                      lambda t: resample(t, rows, cols, "nchw" if channels_first else "nhwc")))


general_resizing_case("resizing_lanczos3_up", (2, 4, 5, 3), 7, 8, "lanczos3", source="pillow")
general_resizing_case("resizing_lanczos5_down", (1, 9, 7, 2), 4, 3, "lanczos5")
general_resizing_case("resizing_lanczos5_mixed", (1, 3, 11, 1), 8, 4, "lanczos5")
general_resizing_case("resizing_lanczos3_antialias_down", (1, 12, 10, 2), 5, 4, "lanczos3", True,
                      source="pillow")
general_resizing_case("resizing_bilinear_antialias_down", (2, 9, 8, 1), 4, 3, "bilinear", True,
                      source="pillow")
general_resizing_case("resizing_bicubic_antialias_down", (1, 10, 7, 2), 3, 4, "bicubic", True,
                      source="pillow")
general_resizing_case("resizing_lanczos5_antialias_down", (1, 11, 6, 1), 3, 4, "lanczos5", True)
general_resizing_case("resizing_area_down", (2, 8, 9, 2), 4, 3, "area", source="torch")
general_resizing_case("resizing_area_mixed", (1, 5, 7, 1), 3, 9, "area")
general_resizing_case("resizing_pad_to_aspect_ratio", (2, 4, 9, 2), 6, 6, "bilinear", pad=0.5)
general_resizing_case("resizing_pad_nearest", (1, 7, 3, 2), 4, 4, "nearest", pad=-1.0)
general_resizing_case("resizing_pad_bicubic_antialias", (1, 3, 8, 1), 4, 2, "bicubic", True,
                      source="pillow", pad=0.25)
up_sampling_case("up_sampling2d_bicubic", (2, 3, 4, 2), (2, 3), "bicubic", source="pillow")
up_sampling_case("up_sampling2d_lanczos3", (1, 4, 3, 1), (2, 2), "lanczos3", source="pillow")
up_sampling_case("up_sampling2d_lanczos5_channels_first", (1, 2, 3, 3), (2, 2), "lanczos5",
                 channels_first=True)
up_sampling_case("up_sampling2d_area", (1, 3, 2, 2), (3, 2), "area", source="torch")

with open(os.path.join(HERE, "reference", "preprocessing_34.json"), "w") as f:
    json.dump({"cases": cases}, f, indent=0)
    f.write("\n")
