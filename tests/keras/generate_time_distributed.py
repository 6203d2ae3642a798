#!/usr/bin/python3
"""Writes tests/keras/reference/time_distributed.json: PyTorch (float64) outputs and gradients of
TimeDistributed around Dense, Conv2D and Flatten, for tests/keras/test_time_distributed.cpp and
the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_time_distributed.py
Keras applies the wrapped layer to every step x[:, t] with one set of weights; here that is the
PyTorch layer applied to each step in a loop and the outputs stacked on axis 1 (not a reshape, so
the reference does not assume loadstar's implementation). The cases have the format of
generate_layers.py: the Keras class_name and config, inputs, weights in Keras's layout, the
upstream gradient g, and the targets of loss = sum(output * g).
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3333)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


def case(name, inner, inputs, weights, step):
    """step(x_t, weights) -> the wrapped layer's output for one time step."""
    x = inputs.clone().requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    out = torch.stack([step(x[:, t], ws) for t in range(x.shape[1])], dim=1)
    g = rnd(*out.shape)
    (out * g).sum().backward()
    return {
        "name": name,
        "class_name": "TimeDistributed",
        "config": {"layer": inner},
        "training": False,
        "input_shapes": [list(inputs.shape)],
        "inputs": [flat(inputs)],
        "weights": {k: flat(v) for k, v in weights.items()},
        "upstream": flat(g),
        "output_shape": list(out.shape),
        "output": flat(out),
        "input_gradients": [flat(x.grad)],
        "weight_gradients": {k: flat(v.grad) for k, v in ws.items()},
        "updated_weights": {},
    }


cases = []

# Dense(4, tanh): kernel (in, out) in Keras's layout, x @ kernel + bias.
cases.append(case(
    "td_dense", {"class_name": "Dense", "config": {"units": 4, "activation": "tanh"}},
    rnd(3, 5, 6), {"kernel": rnd(6, 4), "bias": rnd(4)},
    lambda x, w: torch.tanh(x @ w["kernel"] + w["bias"])))

# Dense on a rank-3 step: (batch, time, 2, 3) -> Dense over the last axis.
cases.append(case(
    "td_dense_rank3", {"class_name": "Dense", "config": {"units": 2, "use_bias": False}},
    rnd(2, 4, 2, 3), {"kernel": rnd(3, 2)},
    lambda x, w: x @ w["kernel"]))


# Conv2D(3, 2x2, strides 1, valid, relu), channels_last steps (batch, h, w, c); Keras's kernel is
# (kh, kw, in, out), PyTorch's (out, in, kh, kw).
def conv_step(x, w):
    y = F.conv2d(x.permute(0, 3, 1, 2), w["kernel"].permute(3, 2, 0, 1), w["bias"])
    return torch.relu(y).permute(0, 2, 3, 1)


cases.append(case(
    "td_conv2d",
    {"class_name": "Conv2D",
     "config": {"filters": 3, "kernel_size": [2, 2], "activation": "relu"}},
    rnd(2, 3, 5, 4, 2), {"kernel": rnd(2, 2, 2, 3), "bias": rnd(3, scale=0.2)}, conv_step))

cases.append(case(
    "td_flatten", {"class_name": "Flatten", "config": {}},
    rnd(2, 3, 2, 2), {}, lambda x, w: x.reshape(x.shape[0], -1)))

out = os.path.join(HERE, "reference", "time_distributed.json")
with open(out + ".tmp", "w") as f:
    json.dump({"cases": cases}, f)
os.replace(out + ".tmp", out)
print("wrote", len(cases), "cases to", out)
