#!/usr/bin/python3
"""Reference values for the optimizers, common options and schedules of
tests/keras/test_optimizers.cpp that Keras 3 added to tf.keras 2's.

Each optimizer runs several float64 steps from fixed weights and gradients with Keras 3's
`update_step` written out in NumPy (keras/src/optimizers/*.py): Nadam (torch.optim.NAdam would
need momentum_decay=1 for Keras's momentum cache, not its default 0.004, and the torch 1.13 that
Debian ships multiplies u_t twice into the product of the next step, so it is not used), Adamax (torch's Adamax adds epsilon inside the maximum, so it is not used), Lion, Ftrl and
Adafactor (factored second moments for variables of rank 2 or more). The common options follow
Keras 3's BaseOptimizer: clipping, then the decoupled weight decay `w -= w * wd * lr`, then the
rule, then the moving average of the weights (use_ema) and its copy into them every
ema_overwrite_frequency steps. The schedules are Keras 3's CosineDecay with a linear warmup,
CosineDecayRestarts and PolynomialDecay (keras/src/optimizers/schedules/learning_rate_schedule.py).

Run with Debian's interpreter (it has python3-numpy):
    /usr/bin/python3 tests/keras/generate_optimizers_34.py
It writes tests/keras/reference/optimizers_34.json.
"""
import json
import math
import os
import re

import numpy as np

RNG = np.random.default_rng(34)


def rounded(a):
    # Inputs go through float32 first, so that C++ (which reads float32) sees the same numbers.
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def flat(a):
    return [float(v) for v in np.asarray(a).reshape(-1)]


# ---------------------------------------------------------------- schedules

def schedule_value(spec, step):
    kind, a = spec["schedule"], spec["args"]
    if kind == "CosineDecay":
        decay_steps, alpha = a["decay_steps"], a.get("alpha", 0.0)

        def decay(s, start):
            cosine = 0.5 * (1 + math.cos(math.pi * s / decay_steps))
            return start * ((1 - alpha) * cosine + alpha)

        if a.get("warmup_target") is None:
            return decay(min(step, decay_steps), a["initial_learning_rate"])
        warmup_steps = a.get("warmup_steps", 0)
        s = min(step, decay_steps + warmup_steps)
        if s < warmup_steps:
            return (a["warmup_target"] - a["initial_learning_rate"]) * s / warmup_steps + \
                a["initial_learning_rate"]
        return decay(s - warmup_steps, a["warmup_target"])
    if kind == "CosineDecayRestarts":
        t_mul, m_mul, alpha = a.get("t_mul", 2.0), a.get("m_mul", 1.0), a.get("alpha", 0.0)
        fraction = step / a["first_decay_steps"]
        if t_mul == 1.0:
            restart = math.floor(fraction)
            fraction -= restart
        else:
            restart = math.floor(math.log(1 - fraction * (1 - t_mul)) / math.log(t_mul))
            sum_r = (1 - t_mul ** restart) / (1 - t_mul)
            fraction = (fraction - sum_r) / t_mul ** restart
        cosine = 0.5 * m_mul ** restart * (1 + math.cos(math.pi * fraction))
        return a["initial_learning_rate"] * ((1 - alpha) * cosine + alpha)
    if kind == "PolynomialDecay":
        decay_steps = a["decay_steps"]
        end = a.get("end_learning_rate", 0.0001)
        s = float(step)
        if a.get("cycle", False):
            decay_steps = decay_steps * (1.0 if s == 0 else math.ceil(s / decay_steps))
        else:
            s = min(s, decay_steps)
        p = s / decay_steps
        return (a["initial_learning_rate"] - end) * (1 - p) ** a.get("power", 1.0) + end
    raise ValueError(kind)


SCHEDULES = [
    {"schedule": "CosineDecay",
     "args": {"initial_learning_rate": 0.0, "decay_steps": 6, "alpha": 0.1,
              "warmup_target": 0.1, "warmup_steps": 3}},
    {"schedule": "CosineDecay",
     "args": {"initial_learning_rate": 0.02, "decay_steps": 5, "alpha": 0.0,
              "warmup_target": 0.08, "warmup_steps": 4}},
    {"schedule": "CosineDecayRestarts",
     "args": {"initial_learning_rate": 0.1, "first_decay_steps": 3, "t_mul": 2.0, "m_mul": 1.0,
              "alpha": 0.0}},
    {"schedule": "CosineDecayRestarts",
     "args": {"initial_learning_rate": 0.1, "first_decay_steps": 2, "t_mul": 1.0, "m_mul": 0.5,
              "alpha": 0.1}},
    {"schedule": "CosineDecayRestarts",
     "args": {"initial_learning_rate": 0.05, "first_decay_steps": 2, "t_mul": 1.5, "m_mul": 0.8,
              "alpha": 0.05}},
    {"schedule": "PolynomialDecay",
     "args": {"initial_learning_rate": 0.1, "decay_steps": 5, "end_learning_rate": 0.01,
              "power": 1.0, "cycle": False}},
    {"schedule": "PolynomialDecay",
     "args": {"initial_learning_rate": 0.1, "decay_steps": 4, "end_learning_rate": 0.001,
              "power": 2.0, "cycle": True}},
    {"schedule": "PolynomialDecay",
     "args": {"initial_learning_rate": 0.1, "decay_steps": 3, "end_learning_rate": 0.0,
              "power": 0.5, "cycle": False}},
]


def make_schedules():
    steps = list(range(0, 16))
    return [dict(s, steps=steps, values=[schedule_value(s, t) for t in steps]) for s in SCHEDULES]


# ---------------------------------------------------------------- optimizers

def clip(grads, o):
    # Keras 3 BaseOptimizer._clip_gradients: clipnorm, else global_clipnorm, else clipvalue.
    if o.get("clipnorm"):
        c = o["clipnorm"]
        return [g * c / max(float(np.sqrt((g * g).sum())), c) for g in grads]
    if o.get("global_clipnorm"):
        c = o["global_clipnorm"]
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        return [g * c / max(norm, c) for g in grads]
    if o.get("clipvalue"):
        c = o["clipvalue"]
        return [np.clip(g, -c, c) for g in grads]
    return grads


def rms(x):
    return math.sqrt(float((x * x).mean()))


DEFAULTS = {"nadam": 0.001, "adamax": 0.001, "lion": 0.001, "ftrl": 0.001, "adafactor": 0.001,
            "sgd": 0.01, "rmsprop": 0.001, "adagrad": 0.001, "adadelta": 0.001, "adam": 0.001}


def make_slots(kind, o, x):
    if kind == "ftrl":
        return {"accumulator": np.full_like(x, o.get("initial_accumulator_value", 0.1)),
                "linear": np.zeros_like(x)}
    if kind == "adagrad":
        return {"accumulator": np.full_like(x, o.get("initial_accumulator_value", 0.1))}
    if kind == "adafactor":
        if x.ndim < 2:
            return {"r": np.zeros(()), "c": np.zeros(()), "v": np.zeros_like(x)}
        return {"r": np.zeros(x.shape[:-1]), "c": np.zeros(x.shape[:-2] + x.shape[-1:]),
                "v": np.zeros_like(x)}
    return {k: np.zeros_like(x) for k in ("a", "b", "c")}


def update(kind, o, step, lr, w, g, s):
    """One Keras 3 update_step of `w` (in place) from `g` with slots `s`."""
    t = step + 1
    if kind == "nadam":
        b1, b2, eps = o.get("beta_1", 0.9), o.get("beta_2", 0.999), o.get("epsilon", 1e-7)
        u_t = b1 * (1 - 0.5 * 0.96 ** t)
        u_next = b1 * (1 - 0.5 * 0.96 ** (t + 1))
        u_product = math.prod(b1 * (1 - 0.5 * 0.96 ** i) for i in range(1, t + 1))
        u_product_next = u_product * u_next
        s["a"] += (g - s["a"]) * (1 - b1)
        s["b"] += (g * g - s["b"]) * (1 - b2)
        m_hat = u_next * s["a"] / (1 - u_product_next) + (1 - u_t) * g / (1 - u_product)
        v_hat = s["b"] / (1 - b2 ** t)
        w -= m_hat * lr / (np.sqrt(v_hat) + eps)
    elif kind == "adamax":
        b1, b2, eps = o.get("beta_1", 0.9), o.get("beta_2", 0.999), o.get("epsilon", 1e-7)
        s["a"] += (g - s["a"]) * (1 - b1)
        s["b"][...] = np.maximum(b2 * s["b"], np.abs(g))
        w -= lr * s["a"] / ((1 - b1 ** t) * (s["b"] + eps))
    elif kind == "lion":
        b1, b2 = o.get("beta_1", 0.9), o.get("beta_2", 0.99)
        w -= lr * np.sign(s["a"] * b1 + g * (1 - b1))
        s["a"][...] = s["a"] * b2 + g * (1 - b2)
    elif kind == "ftrl":
        power = o.get("learning_rate_power", -0.5)
        l1 = o.get("l1_regularization_strength", 0.0)
        l2 = o.get("l2_regularization_strength", 0.0) + o.get("beta", 0.0) / (2 * lr)
        shrinkage = o.get("l2_shrinkage_regularization_strength", 0.0)
        accumulator, linear = s["accumulator"], s["linear"]
        grad_to_use = g + 2 * shrinkage * w
        new_accumulator = accumulator + g * g
        linear += grad_to_use - (new_accumulator ** -power - accumulator ** -power) / lr * w
        quadratic = new_accumulator ** -power / lr + 2 * l2
        w[...] = (np.clip(linear, -l1, l1) - linear) / quadratic
        accumulator[...] = new_accumulator
    elif kind == "adafactor":
        eps_1, eps_2 = o.get("epsilon_1", 1e-30), o.get("epsilon_2", 1e-3)
        clip_threshold = o.get("clip_threshold", 1.0)
        if not isinstance(o.get("learning_rate"), dict) and o.get("relative_step", True):
            lr = min(lr, 1 / math.sqrt(t))
        rho = min(lr, 1 / math.sqrt(t))
        alpha = max(eps_2, rms(w)) * rho
        squares = g * g + eps_1
        beta = 1 - t ** o.get("beta_2_decay", -0.8)
        if w.ndim >= 2:
            s["r"][...] = beta * s["r"] + (1 - beta) * squares.mean(axis=-1)
            s["c"][...] = beta * s["c"] + (1 - beta) * squares.mean(axis=-2)
            s["v"][...] = np.expand_dims(s["r"] / s["r"].mean(axis=-1, keepdims=True), -1) * \
                np.expand_dims(s["c"], -2)
        else:
            s["v"][...] = beta * s["v"] + (1 - beta) * squares
        u = g / np.sqrt(s["v"])
        u_hat = u / max(1.0, rms(u) / clip_threshold)
        w -= alpha * u_hat
    elif kind == "sgd":
        m = o.get("momentum", 0.0)
        if m == 0:
            w -= lr * g
        else:
            s["a"][...] = m * s["a"] - lr * g
            w += (m * s["a"] - lr * g) if o.get("nesterov") else s["a"]
    elif kind == "rmsprop":
        rho, eps = o.get("rho", 0.9), o.get("epsilon", 1e-7)
        s["a"][...] = rho * s["a"] + (1 - rho) * g * g
        w -= lr * g / np.sqrt(s["a"] + eps)
    elif kind == "adagrad":
        s["accumulator"] += g * g
        w -= lr * g / np.sqrt(s["accumulator"] + o.get("epsilon", 1e-7))
    elif kind == "adadelta":
        rho, eps = o.get("rho", 0.95), o.get("epsilon", 1e-7)
        s["a"][...] = rho * s["a"] + (1 - rho) * g * g
        delta = -np.sqrt(s["b"] + eps) * g / np.sqrt(s["a"] + eps)
        s["b"][...] = rho * s["b"] + (1 - rho) * delta * delta
        w += lr * delta
    elif kind == "adam":
        b1, b2, eps = o.get("beta_1", 0.9), o.get("beta_2", 0.999), o.get("epsilon", 1e-7)
        alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        s["a"] += (g - s["a"]) * (1 - b1)
        s["b"] += (g * g - s["b"]) * (1 - b2)
        w -= s["a"] * alpha / (np.sqrt(s["b"]) + eps)
    else:
        raise ValueError(kind)


def decayed(index, exclude):
    """Keras 3's BaseOptimizer._use_weight_decay for weight `index` (named kernel, then bias)."""
    if exclude is None:
        return True
    if index in exclude.get("var_list", []):
        return False
    names = exclude.get("var_names", [])
    return not (names and re.search("|".join(set(names)), ["kernel", "bias"][index]))


def run_optimizer(kind, o, weights, grads_per_step, exclude=None):
    """Keras 3's BaseOptimizer.apply: clip, decay, update, then the moving averages."""
    w = [x.copy() for x in weights]
    slots = [make_slots(kind, o, x) for x in w]
    averages = [np.zeros_like(x) for x in w]
    for step, grads in enumerate(grads_per_step):
        lr = schedule_value(o["learning_rate"], step) if isinstance(o.get("learning_rate"), dict) \
            else o.get("learning_rate", DEFAULTS[kind])
        grads = clip(grads, o)
        if o.get("weight_decay") is not None:
            for i, x in enumerate(w):
                if decayed(i, exclude):
                    x -= x * o["weight_decay"] * lr
        for x, g, s in zip(w, grads, slots):
            update(kind, o, step, lr, x, g, s)
        if o.get("use_ema"):
            momentum = 0.0 if step == 0 else o.get("ema_momentum", 0.99)
            for x, a in zip(w, averages):
                a[...] = momentum * a + (1 - momentum) * x
            frequency = o.get("ema_overwrite_frequency")
            if frequency and (step + 1) % frequency == 0:
                for x, a in zip(w, averages):
                    x[...] = a
    return w, averages


def make_optimizers():
    weights = [rounded(RNG.standard_normal((3, 2))), rounded(RNG.standard_normal(2))]
    steps = 5
    grads = [[rounded(RNG.standard_normal(x.shape) * 0.5) for x in weights] for _ in range(steps)]
    grads[2] = [g * 10 for g in grads[2]]  # a large step, so clipping acts
    cube = [rounded(RNG.standard_normal((2, 3, 4))), rounded(RNG.standard_normal(4))]
    cube_grads = [[rounded(RNG.standard_normal(x.shape) * 0.5) for x in cube]
                  for _ in range(steps)]
    specs = [
        ("nadam", {}),
        ("nadam", {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-3}),
        ("adamax", {}),
        ("adamax", {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.9, "epsilon": 1e-3}),
        ("lion", {}),
        ("lion", {"learning_rate": 0.01, "beta_1": 0.5, "beta_2": 0.9}),
        ("ftrl", {}),
        ("ftrl", {"learning_rate": 0.1, "learning_rate_power": -0.7,
                  "initial_accumulator_value": 0.2, "l1_regularization_strength": 0.05,
                  "l2_regularization_strength": 0.1, "l2_shrinkage_regularization_strength": 0.02,
                  "beta": 0.3}),
        ("ftrl", {"learning_rate": 0.5, "l1_regularization_strength": 0.5}),
        ("adafactor", {}),
        ("adafactor", {"learning_rate": 0.5, "beta_2_decay": -0.5, "epsilon_1": 1e-20,
                       "epsilon_2": 1e-2, "clip_threshold": 0.5, "relative_step": False}),
        ("adafactor", {"learning_rate": 0.2, "clip_threshold": 0.8}, "cube"),
        # Clipping and weight decay on the new optimizers, weight decay on the old ones.
        ("nadam", {"learning_rate": 0.01, "clipnorm": 1.0, "weight_decay": 0.1}),
        ("adamax", {"learning_rate": 0.01, "global_clipnorm": 1.5, "weight_decay": 0.05}),
        ("lion", {"learning_rate": 0.01, "clipvalue": 0.6, "weight_decay": 0.2}),
        ("ftrl", {"learning_rate": 0.1, "clipnorm": 0.8, "weight_decay": 0.1}),
        ("adafactor", {"learning_rate": 0.1, "global_clipnorm": 1.0, "weight_decay": 0.3}),
        ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.1}),
        ("rmsprop", {"learning_rate": 0.01, "weight_decay": 0.2}),
        ("adagrad", {"learning_rate": 0.1, "weight_decay": 0.1, "clipvalue": 1.0}),
        ("adadelta", {"learning_rate": 1.0, "weight_decay": 0.05}),
        # Moving averages of the weights, copied into them every 2 steps or never.
        ("sgd", {"learning_rate": 0.1, "use_ema": True, "ema_momentum": 0.8,
                 "ema_overwrite_frequency": 2}),
        ("adam", {"learning_rate": 0.01, "use_ema": True}),
        ("nadam", {"learning_rate": 0.01, "use_ema": True, "ema_momentum": 0.5,
                   "ema_overwrite_frequency": 3}),
        # Schedules drive the new optimizers too.
        ("nadam", {"learning_rate": SCHEDULES[0]}),
        ("ftrl", {"learning_rate": SCHEDULES[5], "beta": 0.1}),
        ("adafactor", {"learning_rate": SCHEDULES[2]}),
        # exclude_from_weight_decay: by name (a regular expression searched in the weight's
        # name), by the variable itself, and a pattern that finds part of a name.
        ("adam", {"learning_rate": 0.01, "weight_decay": 0.1}, {"var_names": ["bias"]}),
        ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.1}, {"var_list": [0]}),
        ("lion", {"learning_rate": 0.01, "weight_decay": 0.2},
         {"var_names": ["^ker", "gamma"], "var_list": [1]}),
        ("rmsprop", {"learning_rate": 0.01, "weight_decay": 0.2}, {"var_names": ["ias$"]}),
    ]
    cases = []
    for spec in specs:
        kind, o = spec[0], spec[1]
        extra = spec[2] if len(spec) > 2 else None
        exclude = extra if isinstance(extra, dict) else None
        w0, g0 = (cube, cube_grads) if extra == "cube" else (weights, grads)
        final, averages = run_optimizer(kind, o, w0, g0, exclude)
        case = {"optimizer": kind, "options": o,
                "weights": [flat(x) for x in w0], "shapes": [list(x.shape) for x in w0],
                "gradients": [[flat(g) for g in step] for step in g0],
                "expected": [flat(x) for x in final]}
        if o.get("use_ema"):
            case["averages"] = [flat(a) for a in averages]
        if exclude is not None:
            case["exclude_from_weight_decay"] = exclude
        cases.append(case)
    return cases


def main():
    out = {"schedules": make_schedules(), "optimizers": make_optimizers()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference",
                        "optimizers_34.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
