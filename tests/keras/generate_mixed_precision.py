#!/usr/bin/python3
"""Reference values of mixed-precision training for tests/keras/test_mixed_precision.cpp.

PyTorch (on the CPU) trains the test's small models from the same initial weights on the same
batches, with SGD, and records the loss of every step:

- `mlp_bf16_autocast`: under torch.autocast(device_type="cpu", dtype=torch.bfloat16), the
  float32 softmax output computed outside it, as a Keras model whose output Activation has
  dtype="float32".
- `mlp_*_rounded`, `cnn_bf16_rounded`: in float32 with every value Keras holds in the compute
  dtype rounded through torch's float16 / bfloat16 casts at the same boundaries (each layer's
  inputs, the weights as used, its output and the gradient flowing into its output, the weights'
  gradients), the loss scaled by the loss scale and the gradients unscaled for float16.
- `loss_scale_overflow`: the float16 MLP with dynamic loss scaling (initial scale 2**15, growth
  interval 3) and an inf in the input of batch 4. torch 1.13's GradScaler runs on CUDA only
  (torch._amp_update_scale_ has no CPU kernel), so its update rule (torch/cuda/amp/grad_scaler.py,
  aten/src/ATen/native/cuda/AmpKernels.cu: on a non-finite gradient scale *= backoff_factor and
  the growth tracker resets, the optimizer step skipped; otherwise the tracker counts and at
  growth_interval the scale doubles) is applied here to the found-inf flag torch computes.
- the float32 losses of the same runs, which the mixed ones must differ from.

Run with /usr/bin/python3 from the repository root; writes tests/keras/reference/mixed_precision.json.
"""

import json
import math
import os

import numpy as np
import torch

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "reference", "mixed_precision.json")

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": None}


class Round(torch.autograd.Function):
    """The value rounded to a half dtype, and the gradient flowing back through it rounded too."""

    @staticmethod
    def forward(ctx, x, dtype):
        ctx.dtype = dtype
        return x.to(dtype).to(torch.float32)

    @staticmethod
    def backward(ctx, g):
        return g.to(ctx.dtype).to(torch.float32), None


def rounder(name):
    dtype = DTYPES[name]
    if dtype is None:
        return lambda x: x
    return lambda x: Round.apply(x, dtype)


def keras_sparse_ce(probabilities, labels):
    # Keras's sparse_categorical_crossentropy from probabilities: clipped to [eps, 1 - eps].
    eps = 1e-7
    p = probabilities.clamp(eps, 1 - eps)
    return -torch.log(p.gather(1, labels.view(-1, 1))).mean()


def mlp_forward(params, x, r):
    w1, b1, w2, b2 = params
    h = r(torch.relu(r(x) @ r(w1) + r(b1)))
    logits = r(h @ r(w2) + r(b2))
    return torch.softmax(logits, dim=1)  # the float32 output layer


def cnn_forward(params, x, r):
    kernel, bias, w, b = params
    # NHWC input, Keras's (kh, kw, cin, cout) kernel.
    xt = r(x).permute(0, 3, 1, 2)
    k = r(kernel).permute(3, 2, 0, 1)
    conv = torch.nn.functional.conv2d(xt, k, r(bias))
    h = r(torch.relu(conv))
    pooled = r(torch.nn.functional.max_pool2d(h, 2))
    flat = r(pooled.permute(0, 2, 3, 1).reshape(x.shape[0], -1))
    logits = r(flat @ r(w) + r(b))
    return torch.softmax(logits, dim=1)


def train(forward, params, batches, compute, lr, growth_interval=None, scale=None):
    params = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in params]
    r = rounder(compute)
    losses, scales = [], []
    tracker = 0
    for x, y in batches:
        x = torch.tensor(x, dtype=torch.float32)
        y = torch.tensor(y, dtype=torch.int64)
        for p in params:
            p.grad = None
        loss = keras_sparse_ce(forward(params, x, r), y)
        (loss * (scale if scale else 1.0)).backward()
        grads = [p.grad / (scale if scale else 1.0) for p in params]
        finite = all(bool(torch.isfinite(g).all()) for g in grads)
        losses.append(float(loss))
        if scale is not None and not finite:
            scale *= 0.5
            tracker = 0
        else:
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * g
            if scale is not None:
                tracker += 1
                if tracker == growth_interval:
                    scale *= 2.0
                    tracker = 0
        scales.append(scale)
    return losses, scales, [p.detach().numpy().tolist() for p in params]


def train_autocast(params, batches, lr):
    params = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in params]
    losses = []
    for x, y in batches:
        x = torch.tensor(x, dtype=torch.float32)
        y = torch.tensor(y, dtype=torch.int64)
        for p in params:
            p.grad = None
        w1, b1, w2, b2 = params
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            h = torch.relu(torch.nn.functional.linear(x, w1.t(), b1))
            logits = torch.nn.functional.linear(h, w2.t(), b2)
        loss = keras_sparse_ce(torch.softmax(logits.float(), dim=1), y)
        loss.backward()
        losses.append(float(loss))
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
    return losses


def flat(values):
    return np.asarray(values, dtype=np.float32).reshape(-1).tolist()


def main():
    rng = np.random.default_rng(36)
    cases = {}

    # The MLP: 8 features -> Dense(16, relu) -> Dense(3) -> Activation(softmax, float32).
    mlp = [rng.normal(0, 0.5, (8, 16)), rng.normal(0, 0.1, (16,)),
           rng.normal(0, 0.5, (16, 3)), rng.normal(0, 0.1, (3,))]
    mlp = [np.asarray(p, dtype=np.float32) for p in mlp]
    batches = [(rng.normal(0, 1.5, (16, 8)).astype(np.float32), rng.integers(0, 3, 16))
               for _ in range(6)]

    def describe(params, batches):
        return {"weights": [flat(p) for p in params],
                "shapes": [list(np.asarray(p).shape) for p in params],
                "x": [flat(x) for x, _ in batches],
                "y": [np.asarray(y, dtype=np.float32).tolist() for _, y in batches]}

    lr = 0.1
    float32_losses, _, _ = train(mlp_forward, mlp, batches, "float32", lr)
    case = describe(mlp, batches)
    case["lr"] = lr
    case["float32_losses"] = float32_losses
    case["bfloat16_losses"], _, _ = train(mlp_forward, mlp, batches, "bfloat16", lr)
    case["float16_losses"], case["float16_scales"], _ = train(
        mlp_forward, mlp, batches, "float16", lr, growth_interval=2000, scale=2.0**15)
    case["bfloat16_autocast_losses"] = train_autocast(mlp, batches, lr)
    cases["mlp"] = case

    # Loss scaling with an overflow: an inf in batch 4's input.
    overflow = [(x.copy(), y) for x, y in batches] + [
        (rng.normal(0, 1.5, (16, 8)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(4)]
    overflow[4][0][0, 0] = np.inf
    losses, scales, _ = train(mlp_forward, mlp, overflow, "float16", lr, growth_interval=3,
                              scale=2.0**15)
    case = describe(mlp, overflow)
    case["x"][4] = [("inf" if math.isinf(v) else v) for v in case["x"][4]]
    case["lr"] = lr
    case["growth_interval"] = 3
    case["losses"] = [(None if not math.isfinite(v) else v) for v in losses]
    case["scales"] = scales
    cases["loss_scale_overflow"] = case

    # The CNN: 8x8x1 -> Conv2D(4, 3, relu) -> MaxPooling2D(2) -> Flatten -> Dense(3) -> softmax.
    cnn = [rng.normal(0, 0.4, (3, 3, 1, 4)), rng.normal(0, 0.1, (4,)),
           rng.normal(0, 0.3, (36, 3)), rng.normal(0, 0.1, (3,))]
    cnn = [np.asarray(p, dtype=np.float32) for p in cnn]
    cnn_batches = [(rng.normal(0, 1.0, (8, 8, 8, 1)).astype(np.float32), rng.integers(0, 3, 8))
                   for _ in range(5)]
    case = describe(cnn, cnn_batches)
    case["lr"] = lr
    case["float32_losses"], _, _ = train(cnn_forward, cnn, cnn_batches, "float32", lr)
    case["bfloat16_losses"], _, _ = train(cnn_forward, cnn, cnn_batches, "bfloat16", lr)
    cases["cnn"] = case

    with open(OUT, "w") as out:
        json.dump(cases, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
