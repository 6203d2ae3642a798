#!/usr/bin/python3
"""Writes tests/keras/reference/unknown_spatial.json: PyTorch (float64) training of a small
fully convolutional model on Input(shape=(None, None, 3)), one SGD step per batch of images of a
different size each time, then a prediction at yet another size, for
tests/keras/test_unknown_spatial.cpp and the CUDA test.

The model (channels_last, as Keras):
  c1 = Conv2D(4, 3, padding="same", activation="relu")(x)
  p  = MaxPooling2D(2)(c1)
  d  = DepthwiseConv2D(3, padding="same", depth_multiplier=2)(p)
  s  = SeparableConv2D(6, 3, padding="same", activation="relu")(d)
  u  = Conv2DTranspose(4, 3, strides=2, padding="same")(s)
  z  = Conv2D(4, 2, name="padded_conv")(ZeroPadding2D(((1, 0), (0, 1)))(p))
  up = UpSampling2D(2)(z)
  y  = Conv2D(1, 1)(Concatenate()([c1, u, up]))
and the per-pixel mean squared error.

Keras's layouts mapped to PyTorch's (NCHW): a Conv2D kernel (kh, kw, in, out) is
weight.permute(3, 2, 0, 1); a depthwise kernel (kh, kw, in, m) gives output channel c * m + j,
as a grouped convolution's weight (in * m, 1, kh, kw); a Conv2DTranspose kernel (kh, kw, out, in)
is conv_transpose2d's (in, out, kh, kw). TensorFlow's "same" transposed convolution of stride 2
and kernel 3 computes the full (2H + 1)-row output and keeps its first 2H rows (its padding
before is floor(1 / 2) = 0), which PyTorch's padding arguments cannot express: the full output is
cropped here.

    /usr/bin/python3 tests/keras/generate_unknown_spatial.py
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(6121)
DT = torch.float64
LR = 0.1
BATCH = 2
SIZES = [(6, 8), (4, 6), (8, 4)]
PREDICT = (10, 6)


def rnd(*shape, scale=0.5):
    return ((torch.rand(shape, dtype=DT) * 2 - 1) * scale).requires_grad_()


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


W = {
    "conv2d/kernel": rnd(3, 3, 3, 4), "conv2d/bias": rnd(4, scale=0.2),
    "depthwise_conv2d/depthwise_kernel": rnd(3, 3, 4, 2),
    "depthwise_conv2d/bias": rnd(8, scale=0.2),
    "separable_conv2d/depthwise_kernel": rnd(3, 3, 8, 1),
    "separable_conv2d/pointwise_kernel": rnd(1, 1, 8, 6),
    "separable_conv2d/bias": rnd(6, scale=0.2),
    "conv2d_transpose/kernel": rnd(3, 3, 4, 6), "conv2d_transpose/bias": rnd(4, scale=0.2),
    "padded_conv/kernel": rnd(2, 2, 4, 4), "padded_conv/bias": rnd(4, scale=0.2),
    "conv2d_1/kernel": rnd(1, 1, 12, 1), "conv2d_1/bias": rnd(1, scale=0.2),
}
ORDER = list(W.keys())


def conv(x, kernel, bias, padding):
    return F.conv2d(x, kernel.permute(3, 2, 0, 1), bias, padding=padding)


def depthwise(x, kernel, bias):
    kh, kw, cin, m = kernel.shape
    weight = kernel.permute(2, 3, 0, 1).reshape(cin * m, 1, kh, kw)
    return F.conv2d(x, weight, bias, padding=1, groups=cin)


def forward(w, x_nhwc):
    x = x_nhwc.permute(0, 3, 1, 2)
    c1 = torch.relu(conv(x, w["conv2d/kernel"], w["conv2d/bias"], 1))
    p = F.max_pool2d(c1, 2)
    d = depthwise(p, w["depthwise_conv2d/depthwise_kernel"], w["depthwise_conv2d/bias"])
    s = depthwise(d, w["separable_conv2d/depthwise_kernel"], None)
    s = torch.relu(conv(s, w["separable_conv2d/pointwise_kernel"], w["separable_conv2d/bias"], 0))
    h, wd = s.shape[2], s.shape[3]
    u = F.conv_transpose2d(s, w["conv2d_transpose/kernel"].permute(3, 2, 0, 1),
                           w["conv2d_transpose/bias"], stride=2)[:, :, :2 * h, :2 * wd]
    z = conv(F.pad(p, (0, 1, 1, 0)), w["padded_conv/kernel"], w["padded_conv/bias"], 0)
    up = z.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    cat = torch.cat([c1, u, up], dim=1)
    y = conv(cat, w["conv2d_1/kernel"], w["conv2d_1/bias"], 0)
    return y.permute(0, 2, 3, 1)


initial = {k: flat(v) for k, v in W.items()}
batches, losses = [], []
for h, wd in SIZES:
    x = torch.rand(BATCH, h, wd, 3, dtype=DT) * 2 - 1
    y = torch.rand(BATCH, h, wd, 1, dtype=DT) * 2 - 1
    for v in W.values():
        v.grad = None
    loss = ((forward(W, x) - y) ** 2).mean()
    loss.backward()
    with torch.no_grad():
        for v in W.values():
            v -= LR * v.grad
    batches.append({"shape": [BATCH, h, wd, 3], "x": flat(x), "y": flat(y)})
    losses.append(float(loss))
x = torch.rand(BATCH, PREDICT[0], PREDICT[1], 3, dtype=DT) * 2 - 1
with torch.no_grad():
    prediction = forward(W, x)
case = {"lr": LR, "weight_order": ORDER, "initial_weights": initial, "batches": batches,
        "losses": losses, "predict_x": flat(x), "predict_shape": [BATCH, PREDICT[0], PREDICT[1], 3],
        "prediction": flat(prediction), "prediction_shape": list(prediction.shape),
        "final_weights": {k: flat(v) for k, v in W.items()}}
with open(os.path.join(HERE, "reference", "unknown_spatial.json"), "w") as f:
    json.dump({"generator": "tests/keras/generate_unknown_spatial.py", "cases": [case]}, f,
              indent=None, separators=(",", ":"))
    f.write("\n")
