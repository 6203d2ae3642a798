#!/usr/bin/python3
"""Writes tests/keras/reference/permute_repeat_unknown.json: PyTorch (float64) training of two
models whose inputs have an axis of unknown length and go through `Permute` and `RepeatVector`,
fed batches of different lengths one after another, for tests/keras/test_unknown_axes.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_permute_repeat_unknown.py

Each model starts from the weights written here (Keras's layouts), takes one plain SGD step per
batch (loss: mean squared error over every element, Keras's `sum_over_batch_size`), and the file
holds each step's loss (before its update), the predictions of a last batch of another length
after the steps, and the final weights. The layers, written out:
- `Permute((2, 1))`: `transpose(1, 2)`; `RepeatVector(n)`: `x.unsqueeze(1).expand(b, n, f)`.
- `Dense`: `x @ kernel + bias`; `Softmax()` over the last axis; `Multiply`: the product;
  `GlobalAveragePooling1D`: the mean over the steps.
"""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(5151)
DT = torch.float64
LR = 0.5
BATCH = 2


def rnd(*shape, scale=0.5):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


def permute_attention(w, x):
    """Input((None, 4)) -> Dense(3, tanh) as h -> Permute((2, 1)) -> Softmax() (over the steps,
    of unknown length) -> Permute((2, 1)) as a -> Multiply([a, h]) -> GlobalAveragePooling1D ->
    Dense(2)."""
    h = torch.tanh(x @ w["dense/kernel"] + w["dense/bias"])
    a = torch.softmax(h.transpose(1, 2), dim=-1).transpose(1, 2)
    pooled = (a * h).mean(dim=1)
    return pooled @ w["dense_1/kernel"] + w["dense_1/bias"]


def repeat_permute(w, x):
    """Input((None,)) -> RepeatVector(3) -> (3, None) -> Permute((2, 1)) -> (None, 3) ->
    Dense(2) -> GlobalAveragePooling1D."""
    r = x.unsqueeze(1).expand(x.shape[0], 3, x.shape[1])
    p = r.transpose(1, 2)
    return (p @ w["dense/kernel"] + w["dense/bias"]).mean(dim=1)


def run(name, model, w, x_shape, lengths, predict_length):
    params = {k: v.clone() for k, v in w.items()}
    batches, losses = [], []
    for length in lengths:
        x = rnd(*x_shape(length), scale=2.0)
        for v in params.values():
            v.requires_grad_(True)
        p = model(params, x)
        y = torch.rand(*p.shape, dtype=DT)
        loss = ((p - y) ** 2).mean()
        loss.backward()
        losses.append(float(loss))
        params = {k: (v - LR * v.grad).detach() for k, v in params.items()}
        batches.append({"length": length, "x": flat(x), "y": flat(y), "y_shape": list(y.shape)})
    x = rnd(*x_shape(predict_length), scale=2.0)
    with torch.no_grad():
        predicted = model(params, x)
    return {"name": name, "weight_order": list(w), "initial_weights": {k: flat(v) for k, v in
                                                                      w.items()},
            "batches": batches, "losses": losses, "predict_length": predict_length,
            "predict_x": flat(x), "prediction_shape": list(predicted.shape),
            "prediction": flat(predicted),
            "final_weights": {k: flat(v) for k, v in params.items()}}


cases = [
    run("permute_attention", permute_attention,
        {"dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1), "dense_1/kernel": rnd(3, 2),
         "dense_1/bias": rnd(2, scale=0.1)},
        lambda n: (BATCH, n, 4), [5, 3], 4),
    run("repeat_permute", repeat_permute, {"dense/kernel": rnd(3, 2), "dense/bias": rnd(2)},
        lambda n: (BATCH, n), [5, 3], 4),
]

with open(os.path.join(HERE, "reference", "permute_repeat_unknown.json"), "w") as out:
    json.dump({"generator": "tests/keras/generate_permute_repeat_unknown.py", "lr": LR,
               "batch": BATCH, "cases": cases}, out, separators=(",", ":"))
    out.write("\n")
print("wrote", len(cases), "cases")
