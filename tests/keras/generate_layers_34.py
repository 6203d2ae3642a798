#!/usr/bin/python3
"""Writes tests/keras/reference/layers_34.json: PyTorch (float64) outputs and gradients of the
cropping, zero padding and up-sampling layers of 1 and 3 spatial axes, the activation layers with
parameters (PReLU, ELU, ThresholdedReLU, ReLU with all its options), and Dot, UnitNormalization,
Rescaling and GroupNormalization, for tests/keras/test_layers_34.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_layers_34.py
The cases have the format of generate_layers.py: the layer's Keras class_name and config, inputs,
weights in Keras's layout, the upstream gradient g, and the targets of loss = sum(output * g).
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3434)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


def case(name, class_name, config, inputs, weights, fn, training=False):
    """fn(inputs, weights) -> output."""
    xs = [x.clone().requires_grad_(True) for x in inputs]
    ws = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    out = fn(xs, ws)
    g = rnd(*out.shape)
    (out * g).sum().backward()
    return {
        "name": name,
        "class_name": class_name,
        "config": config,
        "training": training,
        "input_shapes": [list(x.shape) for x in inputs],
        "inputs": [flat(x) for x in inputs],
        "weights": {k: flat(v) for k, v in weights.items()},
        "upstream": flat(g),
        "output_shape": list(out.shape),
        "output": flat(out),
        "input_gradients": [flat(x.grad) if x.grad is not None else None for x in xs],
        "weight_gradients": {k: flat(v.grad) for k, v in ws.items() if v.grad is not None},
        "updated_weights": {},
    }


cases = []


def to_last(x, channels_first):
    """channels_first (b, c, d...) to channels_last (b, d..., c)."""
    if not channels_first:
        return x
    return x.permute(0, *range(2, x.dim()), 1)


def to_first(x, channels_first):
    if not channels_first:
        return x
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))


def edges_of(value, n):
    """Keras's cropping or padding argument as n (before, after) pairs."""
    if isinstance(value, int):
        return [(value, value)] * n
    if n == 1:
        return [tuple(value)]
    return [tuple(v) if isinstance(v, list) else (v, v) for v in value]


# --- Cropping1D/2D/3D: slices of the spatial axes ----------------------------------------------
def crop(x, edges, cf):
    x = to_last(x, cf)
    index = [slice(None)]
    for (b, e), size in zip(edges, x.shape[1:-1]):
        index.append(slice(b, size - e))
    return to_first(x[tuple(index)], cf)


for name, (cls, shape, cropping, cf) in {
    "cropping1d": ("Cropping1D", (2, 7, 3), [1, 2], False),
    "cropping1d_int": ("Cropping1D", (2, 6, 2), 2, False),
    "cropping2d": ("Cropping2D", (2, 6, 5, 3), [[1, 2], [0, 1]], False),
    "cropping2d_symmetric": ("Cropping2D", (1, 5, 6, 2), [1, 2], False),
    "cropping2d_channels_first": ("Cropping2D", (2, 3, 6, 5), [[2, 1], [1, 1]], True),
    "cropping3d": ("Cropping3D", (2, 5, 6, 4, 2), [[1, 1], [2, 0], [0, 1]], False),
    "cropping3d_channels_first": ("Cropping3D", (1, 2, 4, 5, 6), 1, True),
}.items():
    n = len(shape) - 2
    config = {"cropping": cropping}
    if n > 1:
        config["data_format"] = "channels_first" if cf else "channels_last"
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, e=edges_of(cropping, n), cf=cf: crop(xs[0], e, cf)))


# --- ZeroPadding1D/3D: F.pad on the spatial axes ---------------------------------------------
def pad(x, edges, cf):
    x = to_last(x, cf)
    amounts = [0, 0]  # the channel axis, last
    for b, e in reversed(edges):
        amounts += [b, e]
    return to_first(F.pad(x, amounts), cf)


for name, (cls, shape, padding, cf) in {
    "zero_padding1d": ("ZeroPadding1D", (2, 4, 3), [2, 1], False),
    "zero_padding1d_int": ("ZeroPadding1D", (2, 3, 2), 1, False),
    "zero_padding1d_channels_first": ("ZeroPadding1D", (2, 3, 4), [0, 2], True),
    "zero_padding3d": ("ZeroPadding3D", (2, 2, 3, 2, 2), [[1, 0], [0, 2], [1, 1]], False),
    "zero_padding3d_symmetric": ("ZeroPadding3D", (1, 2, 2, 2, 3), [1, 0, 2], False),
    "zero_padding3d_channels_first": ("ZeroPadding3D", (1, 2, 2, 3, 2), 1, True),
}.items():
    n = len(shape) - 2
    config = {"padding": padding}
    if cf:
        config["data_format"] = "channels_first"
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, e=edges_of(padding, n), cf=cf: pad(xs[0], e, cf)))


# --- UpSampling1D/3D: every element repeated along each axis ---------------------------------
def repeat(x, factors, cf):
    x = to_last(x, cf)
    for axis, f in enumerate(factors):
        x = x.repeat_interleave(f, dim=axis + 1)
    return to_first(x, cf)


cases.append(case("up_sampling1d", "UpSampling1D", {"size": 3}, [rnd(2, 3, 4)], {},
                  lambda xs, ws: repeat(xs[0], [3], False)))
cases.append(case("up_sampling3d", "UpSampling3D", {"size": [2, 1, 3]}, [rnd(2, 2, 3, 2, 2)], {},
                  lambda xs, ws: repeat(xs[0], [2, 1, 3], False)))
cases.append(case("up_sampling3d_channels_first", "UpSampling3D",
                  {"size": 2, "data_format": "channels_first"}, [rnd(1, 2, 2, 2, 3)], {},
                  lambda xs, ws: repeat(xs[0], [2, 2, 2], True)))


# --- Activation layers ---------------------------------------------------------------------
def prelu(x, alpha):
    return torch.where(x > 0, x, alpha * x)


cases.append(case("prelu", "PReLU", {}, [rnd(3, 4, 5)], {"alpha": rnd(4, 5)},
                  lambda xs, ws: prelu(xs[0], ws["alpha"])))
cases.append(case("prelu_shared_axes", "PReLU", {"shared_axes": [1, 2]}, [rnd(2, 3, 4, 5)],
                  {"alpha": rnd(1, 1, 5)}, lambda xs, ws: prelu(xs[0], ws["alpha"])))
cases.append(case("prelu_dense", "PReLU",
                  {"alpha_initializer": {"class_name": "Constant", "config": {"value": 0.25}}},
                  [rnd(4, 6)], {"alpha": rnd(6)}, lambda xs, ws: prelu(xs[0], ws["alpha"])))
for name, alpha in {"elu": None, "elu_alpha": 0.4}.items():
    a = 1.0 if alpha is None else alpha
    config = {} if alpha is None else {"alpha": alpha}
    cases.append(case(name, "ELU", config, [rnd(3, 7, scale=2.0)], {},
                      lambda xs, ws, a=a: torch.where(xs[0] > 0, xs[0], a * (torch.exp(xs[0]) - 1))))
for name, theta in {"thresholded_relu": None, "thresholded_relu_theta": 0.3}.items():
    t = 1.0 if theta is None else theta
    config = {} if theta is None else {"theta": theta}
    cases.append(case(name, "ThresholdedReLU", config, [rnd(2, 3, 5, scale=2.0)], {},
                      lambda xs, ws, t=t: torch.where(xs[0] > t, xs[0], torch.zeros_like(xs[0]))))


def keras_relu(x, top, slope, threshold):
    below = slope * (x - threshold)
    y = torch.where(x >= threshold, x, below)
    return torch.where(x >= top, torch.full_like(x, top), y) if top is not None else y


for name, (top, slope, threshold) in {
    "relu_all_options": (0.6, 0.1, 0.2),
    "relu_threshold_slope": (None, 0.3, 0.25),
    "relu_max_value": (0.5, 0.0, 0.0),
}.items():
    config = {"max_value": top, "negative_slope": slope, "threshold": threshold}
    cases.append(case(name, "ReLU", config, [rnd(3, 8)], {},
                      lambda xs, ws, a=(top, slope, threshold): keras_relu(xs[0], *a)))


# --- Rescaling, UnitNormalization, Dot, GroupNormalization ---------------------------------
cases.append(case("rescaling", "Rescaling", {"scale": 0.5, "offset": -0.25}, [rnd(2, 3, 4)], {},
                  lambda xs, ws: xs[0] * 0.5 - 0.25))


def l2_normalize(x, axes):
    """tf.math.l2_normalize: x / sqrt(max(sum(x^2), 1e-12))."""
    squares = (x * x).sum(dim=axes, keepdim=True)
    return x * torch.rsqrt(torch.clamp(squares, min=1e-12))


cases.append(case("unit_normalization", "UnitNormalization", {}, [rnd(3, 5)], {},
                  lambda xs, ws: l2_normalize(xs[0], [1])))
cases.append(case("unit_normalization_axes", "UnitNormalization", {"axis": [1, 2]},
                  [rnd(2, 3, 4, 2)], {}, lambda xs, ws: l2_normalize(xs[0], [1, 2])))


def batch_dot(x, y, axes, normalize):
    ax = axes[0] % x.dim()
    ay = axes[1] % y.dim()
    if normalize:
        x = l2_normalize(x, [ax])
        y = l2_normalize(y, [ay])
    xm = x.movedim(ax, -1)
    ym = y.movedim(ay, -1)
    k = xm.shape[-1]
    out = xm.reshape(x.shape[0], -1, k) @ ym.reshape(y.shape[0], -1, k).transpose(1, 2)
    shape = list(xm.shape[1:-1]) + list(ym.shape[1:-1])
    return out.reshape(x.shape[0], *(shape if shape else [1]))


for name, (axes, a, b, normalize) in {
    "dot_vectors": (1, (3, 4), (3, 4), False),
    "dot_last_axes": ([2, 2], (2, 3, 4), (2, 5, 4), False),
    "dot_mixed_axes": ([1, 2], (2, 4, 3), (2, 5, 4), False),
    "dot_normalize": (-1, (2, 3, 4), (2, 5, 4), True),
    "dot_normalize_vectors": (1, (3, 6), (3, 6), True),
}.items():
    pair = [axes, axes] if isinstance(axes, int) else axes
    cases.append(case(name, "Dot", {"axes": axes, "normalize": normalize}, [rnd(*a), rnd(*b)], {},
                      lambda xs, ws, p=pair, n=normalize: batch_dot(xs[0], xs[1], p, n)))


def group_norm(x, ws, groups, axis, eps):
    axis = axis % x.dim()
    xc = x.movedim(axis, 1)
    shape = xc.shape
    g = xc.reshape(shape[0], groups, -1)
    mean = g.mean(dim=2, keepdim=True)
    var = g.var(dim=2, unbiased=False, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(shape)
    view = [1, shape[1]] + [1] * (len(shape) - 2)
    if "gamma" in ws:
        y = y * ws["gamma"].reshape(view)
    if "beta" in ws:
        y = y + ws["beta"].reshape(view)
    return y.movedim(1, axis)


for name, (shape, groups, axis, center, scale, eps) in {
    "group_normalization": ((2, 3, 4, 6), 3, -1, True, True, 1e-3),
    "group_normalization_no_center": ((2, 5, 4), 2, -1, False, True, 1e-3),
    "group_normalization_axis1": ((2, 4, 3), 2, 1, True, False, 0.01),
    "group_normalization_per_channel": ((3, 2, 4), 4, -1, True, True, 1e-3),
}.items():
    channels = shape[axis]
    weights = {}
    if scale:
        weights["gamma"] = 1 + rnd(channels, scale=0.5)
    if center:
        weights["beta"] = rnd(channels)
    config = {"groups": groups, "axis": axis, "epsilon": eps, "center": center, "scale": scale}
    cases.append(case(name, "GroupNormalization", config, [rnd(*shape, scale=2.0)], weights,
                      lambda xs, ws, a=(groups, axis, eps): group_norm(xs[0], ws, *a)))

if __name__ == "__main__":
    path = os.path.join(HERE, "reference", "layers_34.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {path}")
