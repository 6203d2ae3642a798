#!/usr/bin/python3
"""Reference values for tests/keras/test_model.cpp, computed with PyTorch (Debian's torch 1.13).

Two models are trained from given initial weights, without shuffling, and their per-epoch losses
(Keras's running means weighted by batch size) and final weights are written to
tests/keras/reference/model.json:

- mlp: Dense(5, relu) -> Dense(3) on 12 samples of 4 features, sparse categorical cross-entropy
  from logits, Adam(0.01) with Keras's update rule (epsilon added to sqrt(v_hat) as tf.keras
  does: lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t), w -= lr_t * m / (sqrt(v) + eps)), batch 5 (the
  last batch of each epoch has 2 rows), 3 epochs.
- functional: inputs a (3,) and b (3,); a shared Dense(4, relu) called on both; out1 = Dense(2)
  and out2 = Dense(1) on shared(a) (a tensor feeding two layers), out3 = Dense(1) on shared(b);
  losses [sparse CE from logits, MSE, MSE] weighted [1, 0.5, 2]; SGD(0.1); batch 4; 2 epochs.

Weights are stored as Keras lays them out (kernel (in, out), then bias). Run with /usr/bin/python3.
"""
import json
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def dense_init(rng, n_in, n_out):
    return (rng.uniform(-0.7, 0.7, size=(n_in, n_out)).astype(np.float32),
            rng.uniform(-0.1, 0.1, size=(n_out,)).astype(np.float32))


def tensors(weights):
    return {name: [torch.tensor(k, dtype=torch.float64, requires_grad=True),
                   torch.tensor(b, dtype=torch.float64, requires_grad=True)]
            for name, (k, b) in weights.items()}


def as_lists(params):
    return {name: [p.detach().numpy().astype(np.float64).tolist() for p in ps]
            for name, ps in params.items()}


def sce_logits(logits, labels):
    return torch.nn.functional.cross_entropy(logits, labels, reduction="mean")


def mlp():
    rng = np.random.RandomState(7)
    x = rng.uniform(-1, 1, size=(12, 4)).astype(np.float32)
    y = rng.randint(0, 3, size=(12,)).astype(np.int64)
    init = {"dense": dense_init(rng, 4, 5), "dense_1": dense_init(rng, 5, 3)}
    params = tensors(init)
    flat = [p for ps in params.values() for p in ps]
    lr, b1, b2, eps = 0.01, 0.9, 0.999, 1e-7
    m = [torch.zeros_like(p) for p in flat]
    v = [torch.zeros_like(p) for p in flat]
    t = 0
    history = []
    for epoch in range(3):
        total, rows = 0.0, 0
        for start in range(0, 12, 5):
            xb = torch.tensor(x[start:start + 5], dtype=torch.float64)
            yb = torch.tensor(y[start:start + 5])
            h = torch.relu(xb @ params["dense"][0] + params["dense"][1])
            logits = h @ params["dense_1"][0] + params["dense_1"][1]
            loss = sce_logits(logits, yb)
            for p in flat:
                p.grad = None
            loss.backward()
            t += 1
            with torch.no_grad():
                lr_t = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                for i, p in enumerate(flat):
                    m[i] = b1 * m[i] + (1 - b1) * p.grad
                    v[i] = b2 * v[i] + (1 - b2) * p.grad * p.grad
                    p -= lr_t * m[i] / (torch.sqrt(v[i]) + eps)
            total += loss.item() * xb.shape[0]
            rows += xb.shape[0]
        history.append(total / rows)
    return {"x": x.tolist(), "y": y.tolist(),
            "initial": {k: [w.tolist() for w in ws] for k, ws in init.items()},
            "loss": history, "final": as_lists(params)}


def functional():
    rng = np.random.RandomState(11)
    a = rng.uniform(-1, 1, size=(8, 3)).astype(np.float32)
    b = rng.uniform(-1, 1, size=(8, 3)).astype(np.float32)
    y1 = rng.randint(0, 2, size=(8,)).astype(np.int64)
    y2 = rng.uniform(-1, 1, size=(8, 1)).astype(np.float32)
    y3 = rng.uniform(-1, 1, size=(8, 1)).astype(np.float32)
    init = {"shared": dense_init(rng, 3, 4), "out1": dense_init(rng, 4, 2),
            "out2": dense_init(rng, 4, 1), "out3": dense_init(rng, 4, 1)}
    params = tensors(init)
    flat = [p for ps in params.values() for p in ps]
    weights = [1.0, 0.5, 2.0]
    history = {"loss": [], "out1_loss": [], "out2_loss": [], "out3_loss": []}
    for epoch in range(2):
        sums = [0.0, 0.0, 0.0, 0.0]
        rows = 0
        for start in range(0, 8, 4):
            sl = slice(start, start + 4)
            ab = torch.tensor(a[sl], dtype=torch.float64)
            bb = torch.tensor(b[sl], dtype=torch.float64)
            ha = torch.relu(ab @ params["shared"][0] + params["shared"][1])
            hb = torch.relu(bb @ params["shared"][0] + params["shared"][1])
            o1 = ha @ params["out1"][0] + params["out1"][1]
            o2 = ha @ params["out2"][0] + params["out2"][1]
            o3 = hb @ params["out3"][0] + params["out3"][1]
            l1 = sce_logits(o1, torch.tensor(y1[sl]))
            l2 = torch.mean((o2 - torch.tensor(y2[sl], dtype=torch.float64)) ** 2)
            l3 = torch.mean((o3 - torch.tensor(y3[sl], dtype=torch.float64)) ** 2)
            loss = weights[0] * l1 + weights[1] * l2 + weights[2] * l3
            for p in flat:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                for p in flat:
                    p -= 0.1 * p.grad
            n = ab.shape[0]
            for i, value in enumerate([loss, l1, l2, l3]):
                sums[i] += value.item() * n
            rows += n
        for i, key in enumerate(["loss", "out1_loss", "out2_loss", "out3_loss"]):
            history[key].append(sums[i] / rows)
    return {"a": a.tolist(), "b": b.tolist(), "y1": y1.tolist(), "y2": y2.tolist(),
            "y3": y3.tolist(), "initial": {k: [w.tolist() for w in ws] for k, ws in init.items()},
            "history": history, "final": as_lists(params)}


def main():
    out = {"generator": "tests/keras/generate_model.py", "torch": torch.__version__,
           "mlp": mlp(), "functional": functional()}
    os.makedirs(os.path.join(HERE, "reference"), exist_ok=True)
    with open(os.path.join(HERE, "reference", "model.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
