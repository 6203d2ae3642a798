#!/usr/bin/python3
"""Writes tests/keras/reference/depthwise_threads.json: PyTorch (float64) outputs and gradients
of depthwise and separable convolutions large enough that the CPU backend splits them over its
threads (output rows in the forward pass, groups of images in the backward pass, channel blocks of
16 plus a remainder, a pointwise step without im2col), for tests/keras/test_depthwise_threads.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_depthwise_threads.py
The cases have the format of generate_layers.py (class_name, config, inputs, weights in Keras's
layout, the upstream gradient g and the targets of loss = sum(output * g)). The depthwise step is
PyTorch's grouped convolution (groups = input channels), `same` padding is TensorFlow's rule (the
extra zero after), applied with F.pad before a valid convolution. Inputs, weights and upstream
gradients are rounded to 3 decimals before use, so that the file stays small and exact.
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3436)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return torch.round((torch.rand(*shape, dtype=DT) * 2 - 1) * scale * 1000) / 1000


def short(t):
    return [round(float(v), 3) for v in t.detach().reshape(-1).tolist()]


def precise(t):
    return [float(f"{float(v):.7g}") for v in t.detach().reshape(-1).tolist()]


def same_pads(size, kernel, stride):
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def separable(x, ws, cfg):
    """channels_last x through the depthwise step, the pointwise step (if any), bias, activation."""
    x = x.movedim(-1, 1)
    k, s = cfg["kernel_size"], cfg["strides"]
    if cfg["padding"] == "same":
        (top, bottom), (left, right) = (same_pads(x.shape[2 + a], k[a], s[a]) for a in (0, 1))
        x = F.pad(x, [left, right, top, bottom])
    dw = ws["depthwise_kernel"]  # (kh, kw, in, 1)
    channels = dw.shape[2]
    y = F.conv2d(x, dw[..., 0].permute(2, 0, 1).unsqueeze(1), stride=s, groups=channels)
    if "pointwise_kernel" in ws:
        pw = ws["pointwise_kernel"][0, 0]  # (in, filters)
        y = F.conv2d(y, pw.t().reshape(pw.shape[1], pw.shape[0], 1, 1))
    if "bias" in ws:
        y = y + ws["bias"].reshape(1, -1, 1, 1)
    if cfg["activation"] == "relu":
        y = F.relu(y)
    return y.movedim(1, -1)


def case(name, class_name, config, shape, filters, use_bias):
    channels = shape[-1]
    weights = {"depthwise_kernel": rnd(*config["kernel_size"], channels, 1)}
    out_channels = channels
    if filters:
        weights["pointwise_kernel"] = rnd(1, 1, channels, filters)
        out_channels = filters
    if use_bias:
        weights["bias"] = rnd(out_channels, scale=0.5)
    x = rnd(*shape, scale=1.5).requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    out = separable(x, ws, config)
    g = rnd(*out.shape)
    (out * g).sum().backward()
    return {
        "name": name,
        "class_name": class_name,
        "config": config,
        "training": True,
        "input_shapes": [list(shape)],
        "inputs": [short(x)],
        "weights": {k: short(v) for k, v in weights.items()},
        "upstream": short(g),
        "output_shape": list(out.shape),
        "output": precise(out),
        "input_gradients": [precise(x.grad)],
        "weight_gradients": {k: precise(v.grad) for k, v in ws.items()},
        "updated_weights": {},
    }


def config_of(strides, padding, activation, use_bias, filters=0):
    config = {"kernel_size": [3, 3], "strides": [strides, strides], "dilation_rate": [1, 1],
              "padding": padding, "depth_multiplier": 1, "activation": activation,
              "use_bias": use_bias, "data_format": "channels_last"}
    if filters:
        config["filters"] = filters
    return config


cases = [
    # 40 channels: two blocks of 16 and a remainder of 8; 24 output rows split over the threads.
    case("depthwise_threads_same", "DepthwiseConv2D", config_of(1, "same", "linear", True),
         (3, 8, 8, 40), 0, True),
    # Stride 2 with TensorFlow's padding after, no bias, 3 images in groups over the threads.
    case("depthwise_threads_strided", "DepthwiseConv2D", config_of(2, "same", "linear", False),
         (3, 9, 10, 24), 0, False),
    # Valid padding, relu on the depthwise output.
    case("depthwise_threads_valid_relu", "DepthwiseConv2D", config_of(1, "valid", "relu", True),
         (2, 7, 7, 17), 0, True),
    # The pointwise step: a 1x1 convolution read from the depthwise output without im2col.
    case("separable_threads", "SeparableConv2D", config_of(1, "same", "relu", True, 12),
         (2, 8, 8, 20), 12, True),
]

if __name__ == "__main__":
    path = os.path.join(HERE, "reference", "depthwise_threads.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {path}")
