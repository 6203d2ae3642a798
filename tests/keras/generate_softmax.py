#!/usr/bin/python3
"""Writes tests/keras/reference/softmax.json: PyTorch (float64) values of Keras 3's `Softmax` over
several axes jointly and with masks, for tests/keras/test_softmax.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_softmax.py

Keras 3 (keras/src/layers/activations/softmax.py): over a list of axes the output is
`exp(x - logsumexp(x, axes))`, here `torch.logsumexp` over the joint dims. A mask (the call
argument, or the mask an earlier layer attached to the inputs, which Keras passes as that
argument) broadcasts against the inputs as NumPy does, from the last axis (`np.broadcast_to` of
the mask to the inputs' shape, here); where it is not above 0.5 the input becomes -1e9 before the
softmax and the output 0 after it.

"cases": layer cases (the layer alone, its inputs, an upstream gradient g and the gradients of
sum(output * g)), in tests/keras/layer_cases.hpp's format. "models": models whose Softmax reads
the mask `Masking` attaches to its input, with their initial weights, one batch, its loss (mean
squared error; Keras 3 weighs each sample by the output's mask, so the loss is the mean over the
unmasked samples), the weights after one SGD step, and the predictions.
"""
import json
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3303)
DT = torch.float64
LR = 0.5


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


def keras_softmax(x, axes, mask=None):
    """Keras 3's Softmax.call, written with PyTorch and NumPy's broadcasting of the mask."""
    axes = tuple(a % x.dim() for a in axes)
    keep = None
    if mask is not None:
        keep = torch.from_numpy(np.broadcast_to(mask.detach().numpy() > 0.5, tuple(x.shape)).copy())
        x = torch.where(keep, x, torch.full_like(x, -1e9))
    y = torch.exp(x - torch.logsumexp(x, dim=axes, keepdim=True))
    if keep is not None:
        y = torch.where(keep, y, torch.zeros_like(y))
    return y


def layer_case(name, config, x_shape, axes, mask=None):
    x = rnd(*x_shape, scale=2.0).requires_grad_()
    y = keras_softmax(x, axes, mask)
    g = rnd(*y.shape)
    (y * g).sum().backward()
    inputs = [x] + ([mask] if mask is not None else [])
    c = {"name": name, "class_name": "Softmax", "config": config, "training": True,
         "input_shapes": [list(t.shape) for t in inputs], "inputs": [flat(t) for t in inputs],
         "weights": {}, "upstream": flat(g), "output_shape": list(y.shape), "output": flat(y),
         "input_gradients": [flat(x.grad)] + ([None] if mask is not None else []),
         "weight_gradients": {}, "updated_weights": {}}
    if mask is not None:
        c["call_kwargs"] = {"mask": ["mask", 0, 0]}
    return c


def bits(*shape, keep=0.6):
    m = (torch.rand(*shape) < keep).to(DT)
    m.view(-1)[0] = 1.0
    return m


cases = [
    # Adjacent axes: one axis of a view.
    layer_case("softmax_axes_1_2", {"axis": [1, 2]}, (2, 3, 4), (1, 2)),
    layer_case("softmax_axes_last_two", {"axis": [-2, -1]}, (2, 2, 3, 4), (-2, -1)),
    layer_case("softmax_axes_middle", {"axis": [2, 1]}, (2, 3, 2, 4), (1, 2)),
    # Apart: moved to the end and back.
    layer_case("softmax_axes_apart", {"axis": [1, 3]}, (2, 3, 2, 4), (1, 3)),
    layer_case("softmax_axes_apart_negative", {"axis": [-1, -3]}, (2, 2, 3, 2), (-1, -3)),
    # A list of one axis is that axis.
    layer_case("softmax_axes_one", {"axis": [1]}, (2, 3, 4), (1,)),
]
# The mask as a second input: over joint axes, some positions masked along all of them.
m = bits(2, 3, 4)
m[1] = 0.0  # sample 1: every position masked, zeros out
cases.append(layer_case("softmax_axes_mask", {"axis": [1, 2]}, (2, 3, 4), (1, 2), m))
m = bits(2, 1, 2, 1)
cases.append(layer_case("softmax_axes_apart_mask_broadcast", {"axis": [1, 3]}, (2, 3, 2, 4),
                        (1, 3), m))
# A mask of lower rank meets the inputs' last axes: (2, 4) against (2, 2, 4), its first axis
# (the batch's) meeting the inputs' second.
m = bits(2, 4)
cases.append(layer_case("softmax_mask_lower_rank", {"axis": -1}, (2, 2, 4), (-1,), m))


def masked_dense_softmax(w, x, axes):
    """Masking(0.0) -> Dense -> Softmax(axes), the Softmax given Masking's mask: any(x != 0) over
    the last axis, of the inputs' shape without it, which broadcasts from the last axis."""
    mask = (x != 0).any(dim=-1).to(DT)
    h = (x * mask.unsqueeze(-1)) @ w["dense/kernel"] + w["dense/bias"]
    return keras_softmax(h, axes, mask), mask


def model_case(name, axes, x, units):
    features = x.shape[-1]
    w = {"dense/kernel": rnd(features, units), "dense/bias": rnd(units, scale=0.2)}
    y = torch.rand(*x.shape[:-1], units, dtype=DT)
    params = {k: v.clone().requires_grad_() for k, v in w.items()}
    p, mask = masked_dense_softmax(params, x, axes)
    per_sample = ((p - y) ** 2).mean(dim=-1)
    loss = (per_sample * mask).sum() / mask.sum()
    loss.backward()
    final = {k: params[k] - LR * params[k].grad for k in w}
    with torch.no_grad():
        predicted, _ = masked_dense_softmax({k: v.detach() for k, v in final.items()}, x, axes)
    return {"name": name, "axis": list(axes), "x_shape": list(x.shape), "x": flat(x),
            "y": flat(y), "initial_weights": {k: flat(v) for k, v in w.items()},
            "weight_order": ["dense/kernel", "dense/bias"], "loss": float(loss),
            "final_weights": {k: flat(v) for k, v in final.items()},
            "prediction": flat(predicted)}


# Masking on (batch, 3) attaches a (batch,) mask, which meets the features axis: a batch of 3
# fits, sample f's mask masking feature f of every sample (as NumPy's where broadcasts it).
x = rnd(3, 3, scale=2.0)
x[1] = 0.0
models = [model_case("masking_rows", (-1,), x, 3)]
# Masking on (batch, 3, 3) attaches (batch, 3), which meets the last two axes.
x = rnd(3, 3, 3, scale=2.0)
x[0, 2] = 0.0
x[2, 0] = 0.0
models.append(model_case("masking_joint", (1, 2), x, 3))

with open(os.path.join(HERE, "reference", "softmax.json"), "w") as out:
    json.dump({"generator": "tests/keras/generate_softmax.py", "lr": LR, "cases": cases,
               "models": models}, out, separators=(",", ":"))
    out.write("\n")
print("wrote", len(cases), "cases and", len(models), "models")
