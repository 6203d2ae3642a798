#!/usr/bin/python3
"""Writes tests/keras/reference/layers.json: PyTorch (float64) outputs and gradients of every
built-in layer, with weights laid out as Keras stores them, for tests/keras/test_layers.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_layers.py
Each case: the layer's Keras class_name and config, the inputs, the weights (Keras layout), the
upstream gradient g, and the targets of loss = sum(output * g): output, gradients of the inputs
and of the trainable weights, and the weights after the call (BatchNormalization's moving stats).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

torch.manual_seed(1234)
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
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "elu": F.elu,
    "selu": F.selu,
    "softplus": F.softplus,
    "softsign": F.softsign,
    "gelu": F.gelu,  # exact erf form, tf.keras's default approximate=False
    "swish": lambda x: x * torch.sigmoid(x),
    "hard_sigmoid": lambda x: torch.clamp(0.2 * x + 0.5, 0.0, 1.0),  # Keras 2's definition
    "exponential": torch.exp,
}


def same_pad(size, k, s, d):
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def case(name, class_name, config, inputs, weights, fn, training=False, extra=None):
    """fn(inputs, weights) -> (output, updated non-trainable weights dict)."""
    xs = [x.clone().requires_grad_(True) for x in inputs]
    ws = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    out, updated = fn(xs, ws)
    g = rnd(*out.shape)
    (out * g).sum().backward()
    c = {
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
    if extra:
        c.update(extra)
    return c


cases = []

# Dense with every activation: kernel (in, out) as Keras stores it.
for act, f in ACTIVATIONS.items():
    x = rnd(2, 4, scale=2.0)
    cases.append(case(f"dense_{act}", "Dense", {"units": 3, "activation": act},
                      [x], {"kernel": rnd(4, 3), "bias": rnd(3)},
                      lambda xs, ws, f=f: (f(xs[0] @ ws["kernel"] + ws["bias"]), {})))
cases.append(case("dense_rank3_no_bias", "Dense", {"units": 2, "use_bias": False},
                  [rnd(2, 3, 4)], {"kernel": rnd(4, 2)},
                  lambda xs, ws: (xs[0] @ ws["kernel"], {})))
for act in ["gelu", "swish", "softmax", "hard_sigmoid"]:
    cases.append(case(f"activation_{act}", "Activation", {"activation": act}, [rnd(2, 5, scale=3.0)],
                      {}, lambda xs, ws, f=ACTIVATIONS[act]: (f(xs[0]), {})))


def conv(xs, ws, s, d, padding, act=lambda v: v):
    x = xs[0].permute(0, 3, 1, 2)
    k = ws["kernel"]
    kh, kw = k.shape[0], k.shape[1]
    if padding == "same":
        t, b = same_pad(x.shape[2], kh, s[0], d[0])
        l, r = same_pad(x.shape[3], kw, s[1], d[1])
        x = F.pad(x, (l, r, t, b))
    y = F.conv2d(x, k.permute(3, 2, 0, 1), ws.get("bias"), stride=s, dilation=d)
    return act(y.permute(0, 2, 3, 1)), {}


for name, (shape, filters, ks, s, d, padding, act) in {
    "conv_valid": ((2, 5, 5, 2), 3, (3, 3), (1, 1), (1, 1), "valid", "linear"),
    "conv_same_stride2": ((2, 6, 5, 2), 3, (3, 2), (2, 2), (1, 1), "same", "relu"),
    "conv_same_stride2_even": ((1, 6, 6, 3), 2, (2, 2), (2, 1), (1, 1), "same", "tanh"),
    "conv_dilation2": ((1, 7, 6, 2), 2, (3, 3), (1, 1), (2, 2), "valid", "linear"),
    "conv_dilation2_same": ((2, 5, 5, 1), 2, (3, 3), (1, 1), (2, 2), "same", "gelu"),
}.items():
    cin = shape[3]
    cases.append(case(name, "Conv2D",
                      {"filters": filters, "kernel_size": list(ks), "strides": list(s),
                       "dilation_rate": list(d), "padding": padding, "activation": act},
                      [rnd(*shape)], {"kernel": rnd(ks[0], ks[1], cin, filters), "bias": rnd(filters)},
                      lambda xs, ws, s=s, d=d, p=padding, a=ACTIVATIONS[act]: conv(xs, ws, s, d, p, a)))


def pool(xs, kind, k, s, padding):
    x = xs[0].permute(0, 3, 1, 2)
    if padding == "same":
        t, b = same_pad(x.shape[2], k[0], s[0], 1)
        l, r = same_pad(x.shape[3], k[1], s[1], 1)
        if kind == "max":
            x = F.pad(x, (l, r, t, b), value=-math.inf)
            y = F.max_pool2d(x, k, s)
        else:  # TensorFlow averages over the elements inside the input only
            ones = F.pad(torch.ones_like(x), (l, r, t, b))
            x = F.pad(x, (l, r, t, b))
            y = F.avg_pool2d(x, k, s) / F.avg_pool2d(ones, k, s)
    else:
        y = F.max_pool2d(x, k, s) if kind == "max" else F.avg_pool2d(x, k, s)
    return y.permute(0, 2, 3, 1), {}


for name, (cls, shape, k, s, padding) in {
    "maxpool_valid": ("MaxPooling2D", (2, 4, 5, 2), (2, 2), None, "valid"),
    "maxpool_same_3s2": ("MaxPooling2D", (1, 5, 6, 2), (3, 3), (2, 2), "same"),
    "avgpool_valid": ("AveragePooling2D", (2, 4, 4, 2), (2, 2), None, "valid"),
    "avgpool_same": ("AveragePooling2D", (1, 5, 5, 2), (2, 2), None, "same"),
    "avgpool_same_3s1": ("AveragePooling2D", (1, 4, 4, 1), (3, 3), (1, 1), "same"),
}.items():
    config = {"pool_size": list(k), "padding": padding, "strides": list(s) if s else None}
    kind = "max" if cls == "MaxPooling2D" else "avg"
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, kind=kind, k=k, s=s or k, p=padding: pool(xs, kind, k, s, p)))

cases.append(case("global_average", "GlobalAveragePooling2D", {}, [rnd(2, 3, 2, 3)], {},
                  lambda xs, ws: (xs[0].mean(dim=(1, 2)), {})))
cases.append(case("global_max", "GlobalMaxPooling2D", {}, [rnd(2, 3, 2, 3)], {},
                  lambda xs, ws: (xs[0].amax(dim=(1, 2)), {})))


def batch_norm(xs, ws, training, momentum=0.99, eps=1e-3):
    x = xs[0]
    c = x.shape[-1]
    x2 = x.reshape(-1, c)
    mm, mv = ws["moving_mean"].detach(), ws["moving_variance"].detach()
    if training:
        mean = x2.mean(0)
        var = x2.var(0, unbiased=False)
        n = x2.shape[0]
        # tf.keras 2: the fused path (rank-4 inputs) updates with the Bessel-corrected variance.
        upd_var = var.detach() * (n / (n - 1) if x.dim() == 4 else 1.0)
        new_mm = mm * momentum + mean.detach() * (1 - momentum)
        new_mv = mv * momentum + upd_var * (1 - momentum)
    else:
        mean, var, new_mm, new_mv = mm, mv, mm, mv
    y = (x2 - mean) / torch.sqrt(var + eps) * ws["gamma"] + ws["beta"]
    return y.reshape(x.shape), {"moving_mean": new_mm, "moving_variance": new_mv}


for name, shape, training in [("bn_train_rank2", (4, 3), True), ("bn_train_rank4", (2, 2, 3, 2), True),
                              ("bn_inference", (3, 3), False)]:
    c = shape[-1]
    weights = {"gamma": 1 + rnd(c, scale=0.5), "beta": rnd(c), "moving_mean": rnd(c),
               "moving_variance": 1 + rnd(c, scale=0.5)}
    cases.append(case(name, "BatchNormalization", {"momentum": 0.99, "epsilon": 0.001},
                      [rnd(*shape, scale=2.0)], weights,
                      lambda xs, ws, t=training: batch_norm(xs, ws, t), training=training))

idx = torch.tensor([[1.0, 3.0, 0.0], [4.0, 1.0, 1.0]], dtype=DT)
cases.append(case("embedding", "Embedding", {"input_dim": 5, "output_dim": 2}, [idx],
                  {"embeddings": rnd(5, 2)},
                  lambda xs, ws: (ws["embeddings"][xs[0].detach().long()], {})))
cases[-1]["input_gradients"] = [None]
cases.append(case("concatenate_last", "Concatenate", {"axis": -1}, [rnd(2, 2, 3), rnd(2, 2, 1)], {},
                  lambda xs, ws: (torch.cat(xs, dim=-1), {})))
cases.append(case("concatenate_axis1", "Concatenate", {"axis": 1}, [rnd(2, 1, 3), rnd(2, 2, 3)], {},
                  lambda xs, ws: (torch.cat(xs, dim=1), {})))
cases.append(case("add", "Add", {}, [rnd(2, 3), rnd(2, 3), rnd(2, 3)], {},
                  lambda xs, ws: (xs[0] + xs[1] + xs[2], {})))
x = rnd(2, 6, scale=3.0)


def keras_relu(v, max_value, slope, threshold):
    y = torch.where(v >= threshold, v, slope * (v - threshold))
    return torch.clamp(y, max=max_value) if max_value is not None else y


cases.append(case("relu_params", "ReLU", {"max_value": 1.5, "negative_slope": 0.1, "threshold": 0.25},
                  [x], {}, lambda xs, ws: (keras_relu(xs[0], 1.5, 0.1, 0.25), {})))
cases.append(case("leaky_relu", "LeakyReLU", {}, [x], {},
                  lambda xs, ws: (F.leaky_relu(xs[0], 0.3), {})))
cases.append(case("softmax_axis1", "Softmax", {"axis": 1}, [rnd(2, 3, 2, scale=2.0)], {},
                  lambda xs, ws: (torch.softmax(xs[0], dim=1), {})))
cases.append(case("flatten", "Flatten", {}, [rnd(2, 2, 3)], {},
                  lambda xs, ws: (xs[0].reshape(2, -1), {})))
cases.append(case("reshape", "Reshape", {"target_shape": [3, -1]}, [rnd(2, 6)], {},
                  lambda xs, ws: (xs[0].reshape(2, 3, 2), {})))

# Keras 3's further element-wise activations, through Dense and Activation (appended, so that the
# cases above keep their random draws).
MORE_ACTIVATIONS = {
    "relu6": F.relu6,
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2),  # keras.activations.leaky_relu's default slope
    "mish": F.mish,
    "hard_silu": F.hardswish,  # x * relu6(x + 3) / 6
    "log_sigmoid": F.logsigmoid,
    "hard_tanh": F.hardtanh,
    "tanh_shrink": F.tanhshrink,
    "soft_shrink": lambda x: F.softshrink(x, 0.5),
    "hard_shrink": lambda x: F.hardshrink(x, 0.5),
    "squareplus": lambda x: (x + torch.sqrt(x * x + 4)) / 2,
    "sparse_plus": lambda x: torch.where(x <= -1, torch.zeros_like(x),
                                         torch.where(x >= 1, x, (x + 1) ** 2 / 4)),
    "silu": F.silu,
    "hard_swish": F.hardswish,
    "celu": F.celu,
}
for act, f in MORE_ACTIVATIONS.items():
    x = rnd(2, 4, scale=2.0)
    cases.append(case(f"dense_{act}", "Dense", {"units": 3, "activation": act},
                      [x], {"kernel": rnd(4, 3), "bias": rnd(3)},
                      lambda xs, ws, f=f: (f(xs[0] @ ws["kernel"] + ws["bias"]), {})))
    cases.append(case(f"activation_{act}", "Activation", {"activation": act},
                      [rnd(3, 7, scale=4.0)], {}, lambda xs, ws, f=f: (f(xs[0]), {})))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "layers.json")
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path, "w") as f:
    json.dump({"generator": "tests/keras/generate_layers.py", "torch": torch.__version__,
               "cases": cases}, f, separators=(",", ":"))
print(f"wrote {len(cases)} cases to {path}")
