#!/usr/bin/python3
"""Writes tests/keras/reference/regularizers_34.json: PyTorch (float64) values of Keras's weight
regularizers (L1, L2, L1L2, OrthogonalRegularizer) and their gradients by autograd, Keras's weight
constraints (MaxNorm, MinMaxNorm, NonNeg, UnitNorm) along their axes, AlphaDropout's affine
constants, and two SGD steps of a small model whose loss carries weight and activity penalties
(Keras 3: model.losses join the loss of train_step and test_step, an activity penalty divided by
the batch size) and whose variables are projected by their constraints after each update, for
tests/keras/test_regularizers_34.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_regularizers_34.py
The formulas are those of keras/src/regularizers/regularizers.py,
keras/src/constraints/constraints.py and keras/src/layers/regularization/alpha_dropout.py.
"""
import json
import math
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3434)
DT = torch.float64
EPSILON = 1e-7  # keras.backend.epsilon()


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


# --- regularizers -------------------------------------------------------------------------------

def l1l2(l1, l2):
    return lambda x: l1 * x.abs().sum() + l2 * (x * x).sum()


def normalize(x, axis):
    """keras.ops.normalize, order 2: x * min(rsqrt(sum(x^2)), 1 / epsilon)."""
    inv = torch.rsqrt((x * x).sum(dim=axis, keepdim=True))
    return x * torch.clamp(inv, max=1.0 / EPSILON)


def orthogonal(factor, mode):
    def penalty(x):
        if mode == "rows":
            u = normalize(x, 1)
            product = u @ u.T
            size = x.shape[0]
        else:
            u = normalize(x, 0)
            product = u.T @ u
            size = x.shape[1]
        off = product * (1.0 - torch.eye(size, dtype=DT))
        pairs = size * (size - 1.0) / 2.0
        return factor * 0.5 * off.abs().sum() / pairs
    return penalty


def regularizer_case(name, config, fn, shape):
    x = rnd(*shape).requires_grad_(True)
    value = fn(x)
    value.backward()
    return {"name": name, "regularizer": config, "shape": list(shape), "x": flat(x),
            "penalty": float(value), "gradient": flat(x.grad)}


regularizers = [
    regularizer_case("L1", {"class_name": "L1", "config": {"l1": 0.03}}, l1l2(0.03, 0.0), (4, 3)),
    regularizer_case("L2", {"class_name": "L2", "config": {"l2": 0.02}}, l1l2(0.0, 0.02), (5,)),
    regularizer_case("L1L2", {"class_name": "L1L2", "config": {"l1": 0.01, "l2": 0.02}},
                     l1l2(0.01, 0.02), (2, 3, 2)),
    regularizer_case("OrthogonalRegularizer rows",
                     {"class_name": "OrthogonalRegularizer",
                      "config": {"factor": 0.5, "mode": "rows"}},
                     orthogonal(0.5, "rows"), (4, 3)),
    regularizer_case("OrthogonalRegularizer columns",
                     {"class_name": "OrthogonalRegularizer",
                      "config": {"factor": 0.3, "mode": "columns"}},
                     orthogonal(0.3, "columns"), (5, 3)),
]


# --- constraints --------------------------------------------------------------------------------

def norms(w, axis):
    return torch.sqrt((w * w).sum(dim=axis, keepdim=True))


def max_norm(max_value, axis):
    return lambda w: w * (torch.clamp(norms(w, axis), 0, max_value) / (EPSILON + norms(w, axis)))


def min_max_norm(low, high, rate, axis):
    def f(w):
        n = norms(w, axis)
        desired = rate * torch.clamp(n, low, high) + (1 - rate) * n
        return w * (desired / (EPSILON + n))
    return f


def unit_norm(axis):
    return lambda w: w / (EPSILON + norms(w, axis))


def constraint_case(name, config, fn, shape, scale=1.0):
    w = rnd(*shape, scale=scale)
    return {"name": name, "constraint": config, "shape": list(shape), "w": flat(w),
            "projected": flat(fn(w))}


constraints = [
    constraint_case("MaxNorm axis 0", {"class_name": "MaxNorm",
                                       "config": {"max_value": 1.0, "axis": 0}},
                    max_norm(1.0, 0), (4, 3)),
    constraint_case("MaxNorm conv axes", {"class_name": "MaxNorm",
                                          "config": {"max_value": 0.5, "axis": [0, 1, 2]}},
                    max_norm(0.5, (0, 1, 2)), (2, 2, 3, 4)),
    constraint_case("MinMaxNorm", {"class_name": "MinMaxNorm",
                                   "config": {"min_value": 0.8, "max_value": 1.0, "rate": 0.7,
                                              "axis": 1}},
                    min_max_norm(0.8, 1.0, 0.7, 1), (3, 4), scale=0.6),
    constraint_case("NonNeg", {"class_name": "NonNeg", "config": {}},
                    lambda w: torch.clamp(w, min=0.0), (3, 4)),
    constraint_case("UnitNorm axis 0", {"class_name": "UnitNorm", "config": {"axis": 0}},
                    unit_norm(0), (4, 3)),
    constraint_case("UnitNorm axis -1", {"class_name": "UnitNorm", "config": {"axis": -1}},
                    unit_norm(-1), (2, 3, 4)),
]


# --- AlphaDropout -------------------------------------------------------------------------------

def alpha_dropout(rate):
    alpha = 1.6732632423543772848170429916717
    scale = 1.0507009873554804934193349852946
    alpha_p = -alpha * scale
    a = ((1 - rate) * (1 + rate * alpha_p ** 2)) ** -0.5
    b = -a * alpha_p * rate
    return {"rate": rate, "a": a, "b": b, "dropped": a * alpha_p + b}


# --- training -----------------------------------------------------------------------------------
# Input(4) -> Dense(3, tanh, kernel L2(0.05), bias L1(0.02), activity L1L2(0.01, 0.03),
# kernel_constraint MaxNorm(0.8)) -> ActivityRegularization(0.02, 0.01)
# -> Dense(2, kernel OrthogonalRegularizer(0.1, "columns"), bias_constraint NonNeg) ; MSE, SGD(0.1).

ROWS = 5
x = rnd(ROWS, 4)
y = rnd(ROWS, 2)
x_eval = rnd(3, 4)
y_eval = rnd(3, 2)
params = {"k1": rnd(4, 3), "b1": rnd(3, scale=0.3), "k2": rnd(3, 2), "b2": rnd(2, scale=0.3)}
initial = {k: flat(v) for k, v in params.items()}


def model_loss(p, xs, ys):
    rows = xs.shape[0]
    h = torch.tanh(xs @ p["k1"] + p["b1"])
    activity = l1l2(0.01, 0.03)(h) / rows
    activity2 = l1l2(0.02, 0.01)(h) / rows
    out = h @ p["k2"] + p["b2"]
    mse = ((out - ys) ** 2).mean()
    weights = (l1l2(0.0, 0.05)(p["k1"]) + l1l2(0.02, 0.0)(p["b1"]) +
               orthogonal(0.1, "columns")(p["k2"]))
    return mse + activity + activity2 + weights


steps = []
for step in range(2):
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = model_loss(leaves, x, y)
    loss.backward()
    with torch.no_grad():
        params = {k: leaves[k] - 0.1 * leaves[k].grad for k in leaves}
        params["k1"] = max_norm(0.8, 0)(params["k1"])
        params["b2"] = torch.clamp(params["b2"], min=0.0)
    steps.append({"loss": float(loss), "weights": {k: flat(v) for k, v in params.items()}})
with torch.no_grad():
    eval_loss = float(model_loss(params, x_eval, y_eval))

training = {"x": flat(x), "y": flat(y), "x_eval": flat(x_eval), "y_eval": flat(y_eval),
            "rows": ROWS, "initial": initial, "steps": steps, "evaluate_loss": eval_loss}

out = {"regularizers": regularizers, "constraints": constraints,
       "alpha_dropout": alpha_dropout(0.2), "training": training}
path = os.path.join(HERE, "reference", "regularizers_34.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("wrote", path)
