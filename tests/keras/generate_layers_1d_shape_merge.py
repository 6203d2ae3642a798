#!/usr/bin/python3
"""Writes tests/keras/reference/layers_1d_shape_merge.json: PyTorch (float64) outputs and gradients of the
1-D convolution and pooling layers, the channels_first variants of the 2-D ones, and the shape,
merge and normalisation layers, for tests/keras/test_layers_1d_shape_merge.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_layers_1d_shape_merge.py
The cases have the format of generate_layers.py: the layer's
Keras class_name and config, inputs, weights in Keras's layout, the upstream gradient g, and the
targets of loss = sum(output * g).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(4321)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


ACTIVATIONS = {
    "linear": lambda x: x,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,  # exact erf form, tf.keras's default approximate=False
    "swish": lambda x: x * torch.sigmoid(x),
}


def same_pad(size, k, s, d):
    """TensorFlow's same padding of one axis: (before, after), the odd one after."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def case(name, class_name, config, inputs, weights, fn, training=False):
    """fn(inputs, weights) -> (output, updated non-trainable weights dict)."""
    xs = [x.clone().requires_grad_(True) for x in inputs]
    ws = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    out, updated = fn(xs, ws)
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
        "updated_weights": {k: flat(v) for k, v in updated.items()},
    }


cases = []


# --- Conv1D: kernel (k, in, filters) as Keras stores it ----------------------------------------
def conv1d(xs, ws, s, d, padding, act, channels_first):
    x = xs[0] if channels_first else xs[0].permute(0, 2, 1)  # (b, c, steps)
    k = ws["kernel"]
    if padding == "same":
        l, r = same_pad(x.shape[2], k.shape[0], s, d)
        x = F.pad(x, (l, r))
    elif padding == "causal":
        x = F.pad(x, ((k.shape[0] - 1) * d, 0))
    y = act(F.conv1d(x, k.permute(2, 1, 0), ws.get("bias"), stride=s, dilation=d))
    return (y if channels_first else y.permute(0, 2, 1)), {}


for name, (shape, filters, k, s, d, padding, act, cf) in {
    "conv1d_valid": ((2, 7, 3), 4, 3, 1, 1, "valid", "linear", False),
    "conv1d_same_stride2": ((2, 8, 2), 3, 3, 2, 1, "same", "relu", False),
    "conv1d_same_even_kernel": ((1, 6, 2), 2, 2, 1, 1, "same", "tanh", False),
    "conv1d_causal_dilation2": ((2, 7, 2), 3, 3, 1, 2, "causal", "gelu", False),
    "conv1d_causal_stride2": ((1, 7, 3), 2, 2, 2, 1, "causal", "linear", False),
    "conv1d_valid_dilation3": ((2, 9, 1), 2, 2, 1, 3, "valid", "sigmoid", False),
    "conv1d_channels_first": ((2, 3, 6), 2, 3, 1, 1, "same", "relu", True),
}.items():
    cin = shape[1] if cf else shape[2]
    config = {"filters": filters, "kernel_size": [k], "strides": [s], "dilation_rate": [d],
              "padding": padding, "activation": act,
              "data_format": "channels_first" if cf else "channels_last"}
    cases.append(case(name, "Conv1D", config, [rnd(*shape)],
                      {"kernel": rnd(k, cin, filters), "bias": rnd(filters)},
                      lambda xs, ws, s=s, d=d, p=padding, a=ACTIVATIONS[act], cf=cf:
                      conv1d(xs, ws, s, d, p, a, cf)))
cases.append(case("conv1d_no_bias", "Conv1D", {"filters": 2, "kernel_size": 2, "use_bias": False},
                  [rnd(2, 4, 3)], {"kernel": rnd(2, 3, 2)},
                  lambda xs, ws: conv1d(xs, ws, 1, 1, "valid", lambda v: v, False)))


# --- Conv2D channels_first: the kernel stays (kh, kw, in, out) -----------------------------------
def conv2d_cf(xs, ws, s, d, padding, act):
    x = xs[0]
    k = ws["kernel"]
    if padding == "same":
        t, b = same_pad(x.shape[2], k.shape[0], s[0], d[0])
        l, r = same_pad(x.shape[3], k.shape[1], s[1], d[1])
        x = F.pad(x, (l, r, t, b))
    return act(F.conv2d(x, k.permute(3, 2, 0, 1), ws.get("bias"), stride=s, dilation=d)), {}


for name, (shape, filters, ks, s, d, padding, act) in {
    "conv2d_channels_first_valid": ((2, 2, 5, 4), 3, (3, 2), (1, 1), (1, 1), "valid", "relu"),
    "conv2d_channels_first_same_stride2":
        ((1, 3, 6, 5), 2, (3, 3), (2, 2), (1, 1), "same", "linear"),
    "conv2d_channels_first_dilation": ((2, 1, 6, 6), 2, (2, 2), (1, 1), (2, 2), "valid", "swish"),
}.items():
    cases.append(case(name, "Conv2D",
                      {"filters": filters, "kernel_size": list(ks), "strides": list(s),
                       "dilation_rate": list(d), "padding": padding, "activation": act,
                       "data_format": "channels_first"},
                      [rnd(*shape)], {"kernel": rnd(ks[0], ks[1], shape[1], filters),
                                      "bias": rnd(filters)},
                      lambda xs, ws, s=s, d=d, p=padding, a=ACTIVATIONS[act]:
                      conv2d_cf(xs, ws, s, d, p, a)))


# --- Pooling: TensorFlow's same padding (max ignores the padding, average counts inside only) ---
def pool_nd(x, kind, k, s, padding):
    """x channels_first (b, c, *spatial); k, s tuples of the spatial rank."""
    dims = len(k)
    if padding == "same":
        pads = []
        for i in reversed(range(dims)):
            pads += list(same_pad(x.shape[2 + i], k[i], s[i], 1))
        if kind == "max":
            x = F.pad(x, pads, value=-math.inf)
        else:
            ones = F.pad(torch.ones_like(x), pads)
            x = F.pad(x, pads)
            avg = F.avg_pool1d if dims == 1 else F.avg_pool2d
            return avg(x, k, s) / avg(ones, k, s)
    if kind == "max":
        return (F.max_pool1d if dims == 1 else F.max_pool2d)(x, k, s)
    return (F.avg_pool1d if dims == 1 else F.avg_pool2d)(x, k, s)


def pooling(xs, kind, k, s, padding, channels_first):
    dims = len(k)
    x = xs[0]
    if not channels_first:
        x = x.permute(0, dims + 1, *range(1, dims + 1))
    y = pool_nd(x, kind, k, s, padding)
    if not channels_first:
        y = y.permute(0, *range(2, dims + 2), 1)
    return y, {}


for name, (cls, shape, k, s, padding, cf) in {
    "maxpool1d_valid": ("MaxPooling1D", (2, 7, 3), 2, None, "valid", False),
    "maxpool1d_same_3s2": ("MaxPooling1D", (1, 8, 2), 3, 2, "same", False),
    "maxpool1d_channels_first": ("MaxPooling1D", (2, 3, 6), 2, 1, "valid", True),
    "avgpool1d_valid_5": ("AveragePooling1D", (2, 10, 2), 5, None, "valid", False),
    "avgpool1d_same": ("AveragePooling1D", (1, 5, 3), 2, None, "same", False),
    "avgpool1d_channels_first_same": ("AveragePooling1D", (2, 2, 7), 3, 2, "same", True),
    "maxpool2d_channels_first": ("MaxPooling2D", (2, 3, 4, 5), (2, 2), None, "valid", True),
    "maxpool2d_channels_first_same": ("MaxPooling2D", (1, 2, 5, 5), (3, 3), (2, 2), "same", True),
    "avgpool2d_channels_first_same": ("AveragePooling2D", (2, 2, 5, 4), (2, 2), None, "same", True),
}.items():
    kt = (k,) if isinstance(k, int) else k
    st = kt if s is None else ((s,) if isinstance(s, int) else s)
    config = {"pool_size": list(kt), "strides": None if s is None else list(st), "padding": padding,
              "data_format": "channels_first" if cf else "channels_last"}
    kind = "max" if cls.startswith("Max") else "avg"
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, kind=kind, k=kt, s=st, p=padding, cf=cf:
                      pooling(xs, kind, k, s, p, cf)))

# --- Global pooling ------------------------------------------------------------------------------
for name, (cls, shape, config, fn) in {
    "global_average_1d": ("GlobalAveragePooling1D", (2, 5, 3), {},
                          lambda x: x.mean(dim=1)),
    "global_max_1d_keepdims": ("GlobalMaxPooling1D", (2, 5, 3), {"keepdims": True},
                               lambda x: x.amax(dim=1, keepdim=True)),
    "global_max_1d_channels_first": ("GlobalMaxPooling1D", (2, 3, 5),
                                     {"data_format": "channels_first"}, lambda x: x.amax(dim=2)),
    "global_average_2d_channels_first_keepdims": (
        "GlobalAveragePooling2D", (2, 3, 2, 4), {"data_format": "channels_first", "keepdims": True},
        lambda x: x.mean(dim=(2, 3), keepdim=True)),
    "global_max_2d_channels_first": ("GlobalMaxPooling2D", (2, 3, 3, 2),
                                     {"data_format": "channels_first"},
                                     lambda x: x.amax(dim=(2, 3))),
    "global_average_2d_keepdims": ("GlobalAveragePooling2D", (2, 2, 3, 3), {"keepdims": True},
                                   lambda x: x.mean(dim=(1, 2), keepdim=True)),
}.items():
    cases.append(case(name, cls, config, [rnd(*shape)], {}, lambda xs, ws, fn=fn: (fn(xs[0]), {})))

# --- Flatten channels_first: Keras moves axis 1 last first ---------------------------------------
cases.append(case("flatten_channels_first", "Flatten", {"data_format": "channels_first"},
                  [rnd(2, 3, 2, 4)], {},
                  lambda xs, ws: (xs[0].permute(0, 2, 3, 1).reshape(2, -1), {})))
cases.append(case("flatten_channels_first_rank1", "Flatten", {"data_format": "channels_first"},
                  [rnd(2, 5)], {}, lambda xs, ws: (xs[0].reshape(2, -1), {})))

# --- LayerNormalization: axes numbered with the batch axis as 0; gamma/beta of the axes' shape ----
def layer_norm(xs, ws, axes, eps=1e-3):
    x = xs[0]
    mean = x.mean(dim=axes, keepdim=True)
    var = x.var(dim=axes, unbiased=False, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps)
    shape = [x.shape[i] if i in axes else 1 for i in range(x.dim())]
    if "gamma" in ws:
        y = y * ws["gamma"].reshape(shape)
    if "beta" in ws:
        y = y + ws["beta"].reshape(shape)
    return y, {}


for name, (shape, axis, center, scale) in {
    "layer_norm_last": ((3, 5), -1, True, True),
    "layer_norm_rank3_last": ((2, 3, 4), -1, True, True),
    "layer_norm_two_axes": ((2, 3, 4), [1, 2], True, True),
    "layer_norm_middle_axis": ((2, 3, 4), [1], True, True),
    "layer_norm_image_axes": ((2, 2, 3, 2), [1, 2, 3], True, False),
    "layer_norm_no_center": ((2, 4, 3), [-1], False, True),
    "layer_norm_bare": ((2, 3, 2), [-2, -1], False, False),
}.items():
    axes = sorted(a % len(shape) for a in ([axis] if isinstance(axis, int) else axis))
    pshape = [shape[a] for a in axes]
    weights = {}
    if scale:
        weights["gamma"] = 1 + rnd(*pshape, scale=0.5)
    if center:
        weights["beta"] = rnd(*pshape)
    cases.append(case(name, "LayerNormalization",
                      {"axis": axis, "epsilon": 0.001, "center": center, "scale": scale},
                      [rnd(*shape, scale=2.0)], weights,
                      lambda xs, ws, axes=axes: layer_norm(xs, ws, axes)))


# --- ZeroPadding2D and UpSampling2D --------------------------------------------------------------
def channels_first_op(x, op, channels_first):
    y = op(x if channels_first else x.permute(0, 3, 1, 2))
    return y if channels_first else y.permute(0, 2, 3, 1)


for name, (shape, padding, cf) in {
    "zero_padding_int": ((2, 3, 2, 2), 1, False),
    "zero_padding_pair": ((1, 2, 3, 2), [1, 2], False),
    "zero_padding_pairs_channels_first": ((2, 2, 3, 2), [[0, 1], [2, 0]], True),
}.items():
    if isinstance(padding, int):
        t = b = l = r = padding
    elif isinstance(padding[0], int):
        t = b = padding[0]
        l = r = padding[1]
    else:
        (t, b), (l, r) = padding
    cases.append(case(name, "ZeroPadding2D",
                      {"padding": padding,
                       "data_format": "channels_first" if cf else "channels_last"},
                      [rnd(*shape)], {},
                      lambda xs, ws, pads=(l, r, t, b), cf=cf:
                      (channels_first_op(xs[0], lambda v: F.pad(v, pads), cf), {})))

for name, (shape, size, interpolation, cf) in {
    "up_sampling_nearest": ((2, 2, 3, 2), [2, 3], "nearest", False),
    "up_sampling_nearest_channels_first": ((1, 2, 3, 2), [2, 2], "nearest", True),
    "up_sampling_bilinear": ((2, 3, 3, 2), [2, 2], "bilinear", False),
    "up_sampling_bilinear_channels_first": ((1, 2, 3, 4), [3, 2], "bilinear", True),
}.items():
    def up(v, size=size, mode=interpolation):
        if mode == "nearest":
            return F.interpolate(v, scale_factor=tuple(float(s) for s in size), mode="nearest")
        # tf.image.resize (TF 2, half pixel centres) = PyTorch's align_corners=False.
        return F.interpolate(v, scale_factor=tuple(float(s) for s in size), mode="bilinear",
                             align_corners=False)
    cases.append(case(name, "UpSampling2D",
                      {"size": size, "interpolation": interpolation,
                       "data_format": "channels_first" if cf else "channels_last"},
                      [rnd(*shape)], {},
                      lambda xs, ws, up=up, cf=cf: (channels_first_op(xs[0], up, cf), {})))

# --- Merge layers (random inputs: no ties, where PyTorch splits a maximum's gradient) -------------
cases.append(case("multiply", "Multiply", {}, [rnd(2, 3), rnd(2, 3), rnd(2, 3)], {},
                  lambda xs, ws: (xs[0] * xs[1] * xs[2], {})))
cases.append(case("subtract", "Subtract", {}, [rnd(2, 2, 3), rnd(2, 2, 3)], {},
                  lambda xs, ws: (xs[0] - xs[1], {})))
cases.append(case("average", "Average", {}, [rnd(2, 4), rnd(2, 4), rnd(2, 4)], {},
                  lambda xs, ws: ((xs[0] + xs[1] + xs[2]) / 3, {})))
cases.append(case("maximum", "Maximum", {}, [rnd(2, 5), rnd(2, 5), rnd(2, 5)], {},
                  lambda xs, ws: (torch.maximum(torch.maximum(xs[0], xs[1]), xs[2]), {})))
cases.append(case("minimum", "Minimum", {}, [rnd(3, 2, 2), rnd(3, 2, 2)], {},
                  lambda xs, ws: (torch.minimum(xs[0], xs[1]), {})))
# Keras's _Merge broadcasts as NumPy does: right-aligned, axes of 1 stretched.
cases.append(case("multiply_broadcast", "Multiply", {}, [rnd(2, 3, 4), rnd(2, 3, 1), rnd(2, 4)], {},
                  lambda xs, ws: (xs[0] * xs[1] * xs[2].unsqueeze(1), {})))
cases.append(case("subtract_broadcast", "Subtract", {}, [rnd(2, 1, 4), rnd(2, 3, 1)], {},
                  lambda xs, ws: (xs[0] - xs[1], {})))
cases.append(case("average_broadcast", "Average", {}, [rnd(2, 3, 2), rnd(2, 2)], {},
                  lambda xs, ws: ((xs[0] + xs[1].unsqueeze(1)) / 2, {})))
cases.append(case("maximum_broadcast", "Maximum", {}, [rnd(2, 3, 1), rnd(2, 1, 4)], {},
                  lambda xs, ws: (torch.maximum(xs[0], xs[1]), {})))
cases.append(case("minimum_broadcast", "Minimum", {}, [rnd(2, 4), rnd(2, 1), rnd(2, 4)], {},
                  lambda xs, ws: (torch.minimum(torch.minimum(xs[0], xs[1]), xs[2]), {})))

# --- Permute (dims from 1) and RepeatVector ------------------------------------------------------
cases.append(case("permute_swap", "Permute", {"dims": [2, 1]}, [rnd(2, 3, 4)], {},
                  lambda xs, ws: (xs[0].permute(0, 2, 1), {})))
cases.append(case("permute_rank3", "Permute", {"dims": [3, 1, 2]}, [rnd(2, 2, 3, 4)], {},
                  lambda xs, ws: (xs[0].permute(0, 3, 1, 2), {})))
cases.append(case("repeat_vector", "RepeatVector", {"n": 3}, [rnd(2, 4)], {},
                  lambda xs, ws: (xs[0].unsqueeze(1).expand(2, 3, 4), {})))

# --- Whole Keras files: PyTorch on their weights, for the models loadstar builds from their configs.
# The fixtures live in the shared directory (LOADSTAR_SHARED_DIR/fixtures/keras); skipped without.
def read_weights(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        group = f["model_weights"]
        for layer in group:
            for w in group[layer].attrs.get("weight_names", []):
                w = w.decode() if isinstance(w, bytes) else w
                out.setdefault(layer, {})[w.split("/")[-1].split(":")[0]] = \
                    torch.tensor(group[layer][w][()], dtype=DT)
    return out


def issue_9349(w, ids):
    x = w["embedding"]["embeddings"][ids.long()]                        # (b, 6, 3)
    x = F.relu(F.conv1d(x.permute(0, 2, 1), w["conv1d"]["kernel"].permute(2, 1, 0),
                        w["conv1d"]["bias"]))                            # (b, 3, 5)
    x = F.max_pool1d(x, 5, 5).permute(0, 2, 1).reshape(x.shape[0], -1)  # (b, 3)
    return torch.softmax(x @ w["dense"]["kernel"] + w["dense"]["bias"], dim=-1)


def simpleconv2d(w, x):
    # conv2d_1 is channels_first: (b, 1, 28, 28) -> (b, 30, 26, 26).
    x = F.relu(F.conv2d(x, w["conv2d_1"]["kernel"].permute(3, 2, 0, 1), w["conv2d_1"]["bias"]))
    # Every later layer is channels_last: it sees (h=30, w=26, c=26).
    x = F.max_pool2d(x.permute(0, 3, 1, 2), 2, 2)                       # NCHW of (15, 13, 26)
    x = F.relu(F.conv2d(x, w["conv2d_2"]["kernel"].permute(3, 2, 0, 1), w["conv2d_2"]["bias"]))
    x = F.max_pool2d(x, 2, 2).permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # (b, 6 * 5 * 15)
    for name in ["dense_1", "dense_2", "dense_3"]:
        x = F.relu(x @ w[name]["kernel"] + w[name]["bias"])
    return torch.softmax(x @ w["dense_4"]["kernel"] + w["dense_4"]["bias"], dim=-1)


models = []
fixtures = os.path.join(os.environ.get("LOADSTAR_SHARED_DIR", "/work/shared"), "fixtures", "keras")
for file, fn, inputs in [
    ("dl4j_tfkeras_issue_9349.hdf5", issue_9349, torch.randint(0, 5, (4, 6)).to(DT)),
    ("dl4j_simpleconv2d.hdf5", simpleconv2d, torch.rand(2, 1, 28, 28, dtype=DT)),
]:
    path = os.path.join(fixtures, file)
    if not os.path.exists(path):
        print(f"skipped {file}: {path} is missing")
        continue
    out = fn(read_weights(path), inputs)
    models.append({"file": file, "input_shape": list(inputs.shape), "input": flat(inputs),
                   "output_shape": list(out.shape), "output": flat(out)})

path = os.path.join(HERE, "reference", "layers_1d_shape_merge.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump({"generator": "tests/keras/generate_layers_1d_shape_merge.py", "torch": torch.__version__,
               "cases": cases, "models": models}, f, separators=(",", ":"))
print(f"wrote {len(cases)} cases to {path}")
