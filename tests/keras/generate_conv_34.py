#!/usr/bin/python3
"""Writes tests/keras/reference/conv_34.json: PyTorch (float64) outputs and gradients of the
depthwise and separable convolutions DepthwiseConv1D/2D and SeparableConv1D/2D, for
tests/keras/test_conv_34.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_conv_34.py
The cases have the format of generate_layers.py: the layer's Keras class_name and config, inputs,
weights in Keras's layout, the upstream gradient g, and the targets of loss = sum(output * g).
The depthwise step is PyTorch's grouped convolution (groups = input channels, output channel
c * depth_multiplier + m from input channel c), padding is TensorFlow's `same` rule (the extra
zero after) or `causal` (zeros before), applied with F.pad before a valid convolution.
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3435)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


def case(name, class_name, config, inputs, weights, fn):
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
        "training": True,
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


ACTIVATIONS = {
    "linear": lambda v: v,
    "relu": F.relu,
    "tanh": torch.tanh,
    "swish": F.silu,
}


def pads(size, kernel, stride, dilation, padding):
    """(before, after) zeros of one spatial axis."""
    span = (kernel - 1) * dilation + 1
    if padding == "valid":
        return 0, 0
    if padding == "causal":
        return (kernel - 1) * dilation, 0
    out = (size + stride - 1) // stride
    total = max((out - 1) * stride + span - size, 0)
    return total // 2, total - total // 2


def conv(x, ws, rank, cfg, channels_first):
    """The layer on x in its data format, through NCHW (or NCW) PyTorch convolutions."""
    if not channels_first:
        x = x.movedim(-1, 1)
    k, s, d = cfg["kernel_size"], cfg["strides"], cfg["dilation_rate"]
    amounts = []
    for axis in reversed(range(rank)):
        amounts += list(pads(x.shape[2 + axis], k[axis], s[axis], d[axis], cfg["padding"]))
    x = F.pad(x, amounts)
    conv_nd = F.conv2d if rank == 2 else F.conv1d
    dw = ws["depthwise_kernel"]  # (k..., in, multiplier)
    channels, multiplier = dw.shape[-2], dw.shape[-1]
    # (in * multiplier, 1, k...): output channel c * multiplier + m.
    weight = dw.movedim(-2, 0).movedim(-1, 1).reshape(channels * multiplier, 1, *dw.shape[:-2])
    y = conv_nd(x, weight, stride=s, dilation=d, groups=channels)
    if "pointwise_kernel" in ws:
        pw = ws["pointwise_kernel"]  # (1..., in * multiplier, filters)
        y = conv_nd(y, pw.reshape(pw.shape[-2], pw.shape[-1]).t().reshape(
            pw.shape[-1], pw.shape[-2], *([1] * rank)))
    if "bias" in ws:
        y = y + ws["bias"].reshape(1, -1, *([1] * rank))
    y = ACTIVATIONS[cfg["activation"]](y)
    return y if channels_first else y.movedim(1, -1)


cases = []

# name: (class, input shape, filters (0: depthwise), kernel, strides, dilation, padding,
#        depth_multiplier, activation, use_bias, channels_first)
SPECS = {
    "depthwise_conv2d": ("DepthwiseConv2D", (2, 5, 6, 3), 0, [3, 3], [1, 1], [1, 1], "valid", 1,
                         "linear", True, False),
    "depthwise_conv2d_same_strided_multiplier": ("DepthwiseConv2D", (2, 7, 6, 2), 0, [3, 2],
                                                 [2, 2], [1, 1], "same", 2, "swish", True, False),
    "depthwise_conv2d_dilated_no_bias": ("DepthwiseConv2D", (1, 7, 7, 3), 0, [3, 3], [1, 1],
                                         [2, 2], "same", 1, "linear", False, False),
    "depthwise_conv2d_channels_first": ("DepthwiseConv2D", (2, 3, 5, 5), 0, [2, 2], [1, 2],
                                        [1, 1], "same", 3, "relu", True, True),
    "separable_conv2d": ("SeparableConv2D", (2, 6, 5, 3), 4, [3, 3], [1, 1], [1, 1], "valid", 1,
                         "linear", True, False),
    "separable_conv2d_same_strided_multiplier": ("SeparableConv2D", (2, 7, 7, 2), 3, [3, 3],
                                                 [2, 2], [1, 1], "same", 2, "tanh", True, False),
    "separable_conv2d_dilated_no_bias": ("SeparableConv2D", (1, 8, 6, 2), 2, [2, 3], [1, 1],
                                         [2, 1], "valid", 1, "linear", False, False),
    "separable_conv2d_channels_first": ("SeparableConv2D", (2, 2, 6, 5), 3, [3, 3], [1, 1],
                                        [1, 1], "same", 2, "swish", True, True),
    "depthwise_conv1d": ("DepthwiseConv1D", (2, 7, 3), 0, [3], [1], [1], "valid", 2, "linear",
                         True, False),
    "depthwise_conv1d_causal_dilated": ("DepthwiseConv1D", (2, 8, 2), 0, [3], [1], [2], "causal",
                                        1, "relu", True, False),
    "depthwise_conv1d_same_strided_channels_first": ("DepthwiseConv1D", (2, 3, 9), 0, [4], [2],
                                                     [1], "same", 1, "swish", True, True),
    "separable_conv1d": ("SeparableConv1D", (2, 7, 3), 4, [3], [1], [1], "same", 2, "linear",
                         True, False),
    "separable_conv1d_causal_strided": ("SeparableConv1D", (2, 6, 2), 3, [2], [2], [1], "causal",
                                        1, "tanh", False, False),
    "separable_conv1d_channels_first": ("SeparableConv1D", (2, 3, 7), 2, [3], [1], [1], "valid",
                                        1, "swish", True, True),
}

for name, (cls, shape, filters, kernel, strides, dilation, padding, multiplier, activation,
           use_bias, cf) in SPECS.items():
    rank = len(kernel)
    channels = shape[1] if cf else shape[-1]
    config = {"kernel_size": kernel, "strides": strides, "dilation_rate": dilation,
              "padding": padding, "depth_multiplier": multiplier, "activation": activation,
              "use_bias": use_bias, "data_format": "channels_first" if cf else "channels_last"}
    weights = {"depthwise_kernel": rnd(*kernel, channels, multiplier)}
    out_channels = channels * multiplier
    if filters:
        config["filters"] = filters
        weights["pointwise_kernel"] = rnd(*([1] * rank), channels * multiplier, filters)
        out_channels = filters
    if use_bias:
        weights["bias"] = rnd(out_channels, scale=0.5)
    cases.append(case(name, cls, config, [rnd(*shape, scale=1.5)], weights,
                      lambda xs, ws, r=rank, c=config, f=cf: conv(xs[0], ws, r, c, f)))

if __name__ == "__main__":
    path = os.path.join(HERE, "reference", "conv_34.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {path}")
