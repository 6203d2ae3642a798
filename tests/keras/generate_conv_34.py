#!/usr/bin/python3
"""Writes tests/keras/reference/conv_34.json: PyTorch (float64) outputs and gradients of the
depthwise and separable convolutions DepthwiseConv1D/2D and SeparableConv1D/2D, the transposed
convolutions Conv1DTranspose/Conv2DTranspose, Conv1D/Conv2D with groups, Conv3D,
Conv3DTranspose and the 3-D poolings, for tests/keras/test_conv_34.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_conv_34.py
The cases have the format of generate_layers.py: the layer's Keras class_name and config, inputs,
weights in Keras's layout, the upstream gradient g, and the targets of loss = sum(output * g).
The depthwise step is PyTorch's grouped convolution (groups = input channels, output channel
c * depth_multiplier + m from input channel c), padding is TensorFlow's `same` rule (the extra
zero after) or `causal` (zeros before), applied with F.pad before a valid convolution. The
transposed convolutions are PyTorch's without padding, cut to Keras's output size.
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
    # Over the channels: the last axis of the channels_last outputs it is used with.
    "softmax": lambda v: F.softmax(v, dim=1),
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


# --- Conv1DTranspose/Conv2DTranspose: PyTorch's transposed convolution without padding, then
# the window [pad_before, pad_before + out) of each axis (zeros past its end), with Keras's output
# sizes (deconv_output_length) and TensorFlow's padding of the convolution it is the adjoint of.
def transpose_axis(size, kernel, stride, dilation, padding, output_padding):
    span = (kernel - 1) * dilation + 1
    if output_padding is None:
        out = size * stride if padding == "same" else size * stride + max(span - stride, 0)
    else:
        pad = span // 2 if padding == "same" else 0
        out = (size - 1) * stride + span - 2 * pad + output_padding
    if padding == "valid":
        return out, 0
    return out, max((size - 1) * stride + span - out, 0) // 2


def conv_transpose(x, ws, rank, cfg, channels_first):
    if not channels_first:
        x = x.movedim(-1, 1)
    k, s, d = cfg["kernel_size"], cfg["strides"], cfg["dilation_rate"]
    op = cfg["output_padding"]
    kernel = ws["kernel"]  # (k..., filters, in)
    weight = kernel.movedim(-1, 0).movedim(-1, 1)  # (in, filters, k...)
    transpose_nd = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[rank]
    full = transpose_nd(x, weight, stride=s, dilation=d)
    for axis in range(rank):
        out, before = transpose_axis(x.shape[2 + axis], k[axis], s[axis], d[axis], cfg["padding"],
                                     None if op is None else op[axis])
        have = full.shape[2 + axis]
        if before + out > have:
            amounts = [0, 0] * (rank - 1 - axis) + [0, before + out - have]
            full = F.pad(full, amounts)
        full = full.narrow(2 + axis, before, out)
    y = full
    if "bias" in ws:
        y = y + ws["bias"].reshape(1, -1, *([1] * rank))
    y = ACTIVATIONS[cfg["activation"]](y)
    return y if channels_first else y.movedim(1, -1)


# name: (class, input shape, filters, kernel, strides, dilation, padding, output_padding,
#        activation, use_bias, channels_first)
TRANSPOSE_SPECS = {
    "conv2d_transpose": ("Conv2DTranspose", (2, 3, 4, 3), 2, [3, 3], [1, 1], [1, 1], "valid",
                         None, "linear", True, False),
    "conv2d_transpose_same_strided": ("Conv2DTranspose", (2, 3, 3, 2), 3, [3, 3], [2, 2], [1, 1],
                                      "same", None, "relu", True, False),
    "conv2d_transpose_valid_stride_above_kernel": ("Conv2DTranspose", (1, 3, 2, 2), 2, [2, 1],
                                                   [3, 2], [1, 1], "valid", None, "linear", True,
                                                   False),
    "conv2d_transpose_same_output_padding": ("Conv2DTranspose", (2, 3, 3, 2), 2, [3, 3], [2, 2],
                                             [1, 1], "same", [1, 1], "swish", True, False),
    "conv2d_transpose_valid_output_padding": ("Conv2DTranspose", (1, 3, 3, 2), 2, [3, 2], [2, 2],
                                              [1, 1], "valid", [1, 0], "linear", True, False),
    "conv2d_transpose_dilated_channels_first": ("Conv2DTranspose", (2, 2, 4, 3), 3, [2, 2],
                                                [1, 1], [2, 2], "same", None, "tanh", False,
                                                True),
    "conv1d_transpose": ("Conv1DTranspose", (2, 5, 3), 2, [3], [2], [1], "valid", None, "linear",
                         True, False),
    "conv1d_transpose_same_output_padding": ("Conv1DTranspose", (2, 4, 2), 3, [4], [3], [1],
                                             "same", [2], "relu", True, False),
    "conv1d_transpose_channels_first": ("Conv1DTranspose", (2, 3, 5), 2, [2], [1], [1], "same",
                                        None, "swish", True, True),
}

for name, (cls, shape, filters, kernel, strides, dilation, padding, output_padding, activation,
           use_bias, cf) in TRANSPOSE_SPECS.items():
    rank = len(kernel)
    channels = shape[1] if cf else shape[-1]
    config = {"filters": filters, "kernel_size": kernel, "strides": strides,
              "dilation_rate": dilation, "padding": padding, "output_padding": output_padding,
              "activation": activation, "use_bias": use_bias,
              "data_format": "channels_first" if cf else "channels_last"}
    weights = {"kernel": rnd(*kernel, filters, channels)}
    if use_bias:
        weights["bias"] = rnd(filters, scale=0.5)
    cases.append(case(name, cls, config, [rnd(*shape, scale=1.5)], weights,
                      lambda xs, ws, r=rank, c=config, f=cf: conv_transpose(xs[0], ws, r, c, f)))


# --- Conv1D/Conv2D with groups: PyTorch's grouped convolution (input and output channels split
# into contiguous groups, as TensorFlow's), kernel (k..., in / groups, filters) in Keras's layout.
def grouped_conv(x, ws, rank, cfg, channels_first):
    if not channels_first:
        x = x.movedim(-1, 1)
    k, s, d = cfg["kernel_size"], cfg["strides"], cfg["dilation_rate"]
    amounts = []
    for axis in reversed(range(rank)):
        amounts += list(pads(x.shape[2 + axis], k[axis], s[axis], d[axis], cfg["padding"]))
    x = F.pad(x, amounts)
    weight = ws["kernel"].movedim(-1, 0).movedim(-1, 1)  # (filters, in / groups, k...)
    conv_nd = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[rank]
    y = conv_nd(x, weight, stride=s, dilation=d, groups=cfg.get("groups", 1))
    if "bias" in ws:
        y = y + ws["bias"].reshape(1, -1, *([1] * rank))
    y = ACTIVATIONS[cfg["activation"]](y)
    return y if channels_first else y.movedim(1, -1)


# name: (class, input shape, filters, groups, kernel, strides, dilation, padding, activation,
#        use_bias, channels_first)
GROUPED_SPECS = {
    "conv2d_groups": ("Conv2D", (2, 5, 5, 4), 6, 2, [3, 3], [1, 1], [1, 1], "same", "relu", True,
                      False),
    "conv2d_groups_strided_channels_first": ("Conv2D", (2, 6, 5, 6), 3, 3, [2, 3], [2, 2],
                                             [1, 1], "valid", "linear", False, True),
    "conv1d_groups_causal_dilated": ("Conv1D", (2, 7, 4), 4, 4, [3], [1], [2], "causal", "tanh",
                                     True, False),
    "conv1d_groups_same": ("Conv1D", (2, 6, 6), 9, 3, [2], [1], [1], "same", "swish", True,
                           False),
}

for name, (cls, shape, filters, groups, kernel, strides, dilation, padding, activation,
           use_bias, cf) in GROUPED_SPECS.items():
    rank = len(kernel)
    channels = shape[1] if cf else shape[-1]
    config = {"filters": filters, "groups": groups, "kernel_size": kernel, "strides": strides,
              "dilation_rate": dilation, "padding": padding, "activation": activation,
              "use_bias": use_bias, "data_format": "channels_first" if cf else "channels_last"}
    weights = {"kernel": rnd(*kernel, channels // groups, filters)}
    if use_bias:
        weights["bias"] = rnd(filters, scale=0.5)
    cases.append(case(name, cls, config, [rnd(*shape, scale=1.5)], weights,
                      lambda xs, ws, r=rank, c=config, f=cf: grouped_conv(xs[0], ws, r, c, f)))


# --- GlobalAveragePooling3D/GlobalMaxPooling3D: the mean or maximum over the three spatial axes.
for name, (cls, shape, cf, keepdims) in {
    "global_average_pooling3d": ("GlobalAveragePooling3D", (2, 3, 4, 2, 3), False, False),
    "global_average_pooling3d_channels_first_keepdims": ("GlobalAveragePooling3D",
                                                         (2, 3, 2, 3, 4), True, True),
    "global_max_pooling3d": ("GlobalMaxPooling3D", (2, 2, 3, 4, 2), False, False),
    "global_max_pooling3d_keepdims": ("GlobalMaxPooling3D", (1, 3, 2, 2, 3), False, True),
}.items():
    axes = (2, 3, 4) if cf else (1, 2, 3)
    reduce = (lambda x, a=axes, k=keepdims: x.amax(dim=a, keepdim=k)) if "Max" in cls else \
        (lambda x, a=axes, k=keepdims: x.mean(dim=a, keepdim=k))
    config = {"data_format": "channels_first" if cf else "channels_last", "keepdims": keepdims}
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, r=reduce: r(xs[0])))


# --- MaxPooling3D/AveragePooling3D: TensorFlow's padding (the extra after), the maximum over the
# elements inside the input (padding -inf) or their mean (the sum over the window divided by the
# count of inside elements).
def pool3d(x, pool, strides, padding, cf, is_max):
    x = x if cf else x.movedim(-1, 1)
    amounts = []
    for axis in reversed(range(3)):
        amounts += list(pads(x.shape[2 + axis], pool[axis], strides[axis], 1, padding))
    if is_max:
        y = F.max_pool3d(F.pad(x, amounts, value=float("-inf")), pool, strides)
    else:
        ones = torch.ones_like(x)
        y = F.avg_pool3d(F.pad(x, amounts), pool, strides) / \
            F.avg_pool3d(F.pad(ones, amounts), pool, strides)
    return y if cf else y.movedim(1, -1)


for name, (cls, shape, pool, strides, padding, cf) in {
    "max_pooling3d": ("MaxPooling3D", (2, 4, 4, 4, 2), [2, 2, 2], None, "valid", False),
    "max_pooling3d_same_strided": ("MaxPooling3D", (2, 5, 4, 3, 2), [3, 2, 2], [2, 1, 2], "same",
                                   False),
    "max_pooling3d_channels_first": ("MaxPooling3D", (1, 2, 4, 5, 3), [2, 2, 1], None, "valid",
                                     True),
    "average_pooling3d": ("AveragePooling3D", (2, 4, 4, 4, 2), [2, 2, 2], None, "valid", False),
    "average_pooling3d_same_strided": ("AveragePooling3D", (2, 5, 3, 4, 2), [3, 3, 3],
                                       [2, 2, 2], "same", False),
    "average_pooling3d_channels_first_same": ("AveragePooling3D", (1, 3, 3, 4, 5), [2, 3, 2],
                                              [1, 1, 1], "same", True),
}.items():
    config = {"pool_size": pool, "strides": strides, "padding": padding,
              "data_format": "channels_first" if cf else "channels_last"}
    cases.append(case(name, cls, config, [rnd(*shape)], {},
                      lambda xs, ws, a=(pool, strides or pool, padding, cf, "Max" in cls):
                      pool3d(xs[0], *a)))


# --- Conv3D and Conv3DTranspose: the helpers above with three spatial axes.
for name, (cls, shape, filters, kernel, strides, dilation, padding, output_padding, activation,
           use_bias, cf) in {
    "conv3d": ("Conv3D", (2, 4, 5, 4, 2), 3, [2, 3, 2], [1, 1, 1], [1, 1, 1], "valid", None,
               "linear", True, False),
    "conv3d_same_strided": ("Conv3D", (2, 5, 4, 4, 2), 2, [3, 3, 3], [2, 1, 2], [1, 1, 1], "same",
                            None, "relu", True, False),
    "conv3d_dilated_channels_first": ("Conv3D", (1, 2, 5, 5, 4), 2, [2, 2, 2], [1, 1, 1],
                                      [2, 1, 2], "same", None, "swish", False, True),
    "conv3d_transpose": ("Conv3DTranspose", (2, 2, 3, 2, 3), 2, [2, 2, 3], [1, 1, 1], [1, 1, 1],
                         "valid", None, "linear", True, False),
    "conv3d_transpose_same_strided": ("Conv3DTranspose", (1, 2, 2, 3, 2), 3, [3, 3, 3],
                                      [2, 2, 2], [1, 1, 1], "same", None, "tanh", True, False),
    "conv3d_transpose_output_padding_channels_first": ("Conv3DTranspose", (1, 2, 2, 3, 2), 2,
                                                       [3, 2, 2], [2, 2, 1], [1, 1, 1], "valid",
                                                       [1, 0, 0], "linear", True, True),
}.items():
    channels = shape[1] if cf else shape[-1]
    config = {"filters": filters, "kernel_size": kernel, "strides": strides,
              "dilation_rate": dilation, "padding": padding, "activation": activation,
              "use_bias": use_bias, "data_format": "channels_first" if cf else "channels_last"}
    transposed = cls == "Conv3DTranspose"
    if transposed:
        config["output_padding"] = output_padding
        weights = {"kernel": rnd(*kernel, filters, channels)}
    else:
        weights = {"kernel": rnd(*kernel, channels, filters)}
    if use_bias:
        weights["bias"] = rnd(filters, scale=0.5)
    fn = conv_transpose if transposed else grouped_conv
    cases.append(case(name, cls, config, [rnd(*shape, scale=1.5)], weights,
                      lambda xs, ws, c=config, f=cf, g=fn: g(xs[0], ws, 3, c, f)))

# --- Conv1D/Conv2D with groups, appended after every case above (whose values stay as they were):
# a case of several tiles of one image each (a 7x7 kernel over 10x10 images, 3 images), so that
# the CPU backend's work splits into tiles and groups over its threads, a pointwise one (read
# without im2col), a dilated channels_first one and a softmax over the channels (its gradient
# mixes the groups). The inputs are rounded to 3 decimals, so that the file stays small.
GROUPED_THREAD_SPECS = {
    "conv2d_groups_tiles": ("Conv2D", (3, 10, 10, 8), 4, 2, [7, 7], [1, 1], [1, 1], "same",
                            "swish", True, False),
    "conv2d_groups_pointwise": ("Conv2D", (2, 4, 5, 12), 6, 3, [1, 1], [1, 1], [1, 1], "valid",
                                "relu", True, False),
    "conv2d_groups_dilated_channels_first": ("Conv2D", (2, 8, 7, 6), 8, 4, [3, 2], [1, 2], [2, 1],
                                             "same", "tanh", True, True),
    "conv1d_groups_softmax": ("Conv1D", (2, 5, 6), 6, 2, [2], [1], [1], "same", "softmax", True,
                              False),
}

for name, (cls, shape, filters, groups, kernel, strides, dilation, padding, activation,
           use_bias, cf) in GROUPED_THREAD_SPECS.items():
    rank = len(kernel)
    channels = shape[1] if cf else shape[-1]
    config = {"filters": filters, "groups": groups, "kernel_size": kernel, "strides": strides,
              "dilation_rate": dilation, "padding": padding, "activation": activation,
              "use_bias": use_bias, "data_format": "channels_first" if cf else "channels_last"}
    weights = {"kernel": torch.round(rnd(*kernel, channels // groups, filters) * 1000) / 1000}
    if use_bias:
        weights["bias"] = torch.round(rnd(filters, scale=0.5) * 1000) / 1000
    cases.append(case(name, cls, config, [torch.round(rnd(*shape, scale=1.5) * 1000) / 1000],
                      weights,
                      lambda xs, ws, r=rank, c=config, f=cf: grouped_conv(xs[0], ws, r, c, f)))

if __name__ == "__main__":
    path = os.path.join(HERE, "reference", "conv_34.json")
    with open(path, "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {path}")
