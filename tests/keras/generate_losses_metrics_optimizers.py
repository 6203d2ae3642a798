#!/usr/bin/python3
"""Reference values for tests/keras/test_losses.cpp, test_metrics.cpp and test_optimizers.cpp.

Computes Keras 2 (tf.keras) semantics with PyTorch in float64: every loss's reduced value and its
gradient with respect to y_pred (autograd), every metric's running result over two batches, and
several steps of every optimizer from fixed weights and gradients, plus the learning-rate
schedules and gradient clipping. Where torch's own function differs from Keras's, Keras's formula
is written out in torch tensors (said where it happens).

Run with Debian's interpreter (it has python3-torch):
    /usr/bin/python3 tests/keras/generate_losses_metrics_optimizers.py
It writes tests/keras/reference/losses_metrics_optimizers.json.
"""
import json
import math
import os

import torch

torch.manual_seed(5)
EPS = 1e-7  # keras.backend.epsilon()
D = torch.float64


def rounded(t):
    # Inputs go through float32 first, so that C++ (which reads float32) sees the same numbers.
    return t.float().double()


def flat(t):
    return [float(v) for v in t.reshape(-1).tolist()]


# ---------------------------------------------------------------- losses

def reduce(per_sample, w):
    # Keras's compute_weighted_loss with SUM_OVER_BATCH_SIZE: divide by the number of per-sample
    # values, not by the sum of the weights.
    if w is not None:
        shape = [w.shape[0]] + [1] * (per_sample.dim() - 1)
        per_sample = per_sample * w.reshape(shape)
    return per_sample.sum() / per_sample.numel()


def loss_per_sample(kind, args, y, p):
    fl = args.get("from_logits", False)
    ls = args.get("label_smoothing", 0.0)
    if kind == "mse":
        return ((p - y) ** 2).mean(-1)
    if kind == "mae":
        return (p - y).abs().mean(-1)
    if kind == "huber":
        delta = args.get("delta", 1.0)
        e = p - y
        a = e.abs()
        return torch.where(a <= delta, 0.5 * e * e, delta * a - 0.5 * delta * delta).mean(-1)
    if kind == "hinge":
        if bool(((y == 0) | (y == 1)).all()):
            y = 2 * y - 1  # Keras's _maybe_convert_labels
        return torch.clamp(1 - y * p, min=0).mean(-1)
    if kind == "squared_hinge":
        if bool(((y == 0) | (y == 1)).all()):
            y = 2 * y - 1
        return (torch.clamp(1 - y * p, min=0) ** 2).mean(-1)
    if kind == "categorical_hinge":
        pos = (y * p).sum(-1)
        neg = ((1 - y) * p).max(-1).values
        return torch.clamp(neg - pos + 1, min=0)
    if kind == "mape":
        return 100 * ((y - p).abs() / torch.clamp(y.abs(), min=EPS)).mean(-1)
    if kind == "msle":
        return ((torch.log(torch.clamp(p, min=EPS) + 1) - torch.log(torch.clamp(y, min=EPS) + 1)) ** 2).mean(-1)
    if kind == "log_cosh":
        return torch.log(torch.cosh(p - y)).mean(-1)
    if kind == "poisson":
        return (p - y * torch.log(p + EPS)).mean(-1)
    if kind == "cosine_similarity":
        return -(torch.nn.functional.normalize(y, dim=-1) * torch.nn.functional.normalize(p, dim=-1)).sum(-1)
    if kind == "kld":
        yc = torch.clamp(y, EPS, 1)
        pc = torch.clamp(p, EPS, 1)
        return (yc * torch.log(yc / pc)).sum(-1)
    if kind == "bce":
        y = y * (1 - ls) + 0.5 * ls
        if fl:
            # torch's binary_cross_entropy_with_logits is TensorFlow's sigmoid_cross_entropy
            return torch.nn.functional.binary_cross_entropy_with_logits(p, y, reduction="none").mean(-1)
        # Keras's backend.binary_crossentropy: clip, then log(p + eps) (torch's BCE clamps logs
        # at -100 instead).
        pc = torch.clamp(p, EPS, 1 - EPS)
        return -(y * torch.log(pc + EPS) + (1 - y) * torch.log(1 - pc + EPS)).mean(-1)
    if kind == "cce":
        k = p.shape[-1]
        y = y * (1 - ls) + ls / k
        if fl:
            return -(y * torch.log_softmax(p, -1)).sum(-1)
        # Keras normalises the row to sum 1, then clips (torch's cross_entropy takes logits).
        q = p / p.sum(-1, keepdim=True)
        return -(y * torch.log(torch.clamp(q, EPS, 1 - EPS))).sum(-1)
    if kind == "scce":
        labels = y.reshape(p.shape[:-1]).long()
        logits = p if fl else torch.log(torch.clamp(p, EPS, 1 - EPS))  # Keras: log of clipped p
        return -torch.log_softmax(logits, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    raise ValueError(kind)


def loss_case(name, kind, args, y, p, w=None, y_shape=None):
    y = rounded(y)
    p = rounded(p).clone().requires_grad_(True)
    w = None if w is None else rounded(w)
    value = reduce(loss_per_sample(kind, args, y, p), w)
    value.backward()
    return {
        "name": name, "loss": kind, "args": args,
        "y_true": flat(y), "y_true_shape": list(y_shape or y.shape),
        "y_pred": flat(p.detach()), "y_pred_shape": list(p.shape),
        "sample_weight": None if w is None else flat(w),
        "value": float(value), "gradient": flat(p.grad),
    }


def make_losses():
    n, k = 6, 4
    w = torch.rand(n, dtype=D) * 2
    logits = torch.randn(n, k, dtype=D) * 2
    probs = torch.softmax(logits, -1)
    probs[0, 1] = 0.0  # a clipped probability (zero gradient in Keras)
    probs[0] /= probs[0].sum()
    one_hot = torch.nn.functional.one_hot(torch.randint(0, k, (n,)), k).double()
    binary = (torch.rand(n, 3, dtype=D) > 0.5).double()
    bprobs = torch.rand(n, 3, dtype=D)
    bprobs[1, 2] = 1.0
    blogits = torch.randn(n, 3, dtype=D) * 2
    regress_y = torch.randn(n, 3, dtype=D)
    regress_p = torch.randn(n, 3, dtype=D) * 1.5
    labels = torch.randint(0, k, (n,)).double()
    cases = []
    for sw in (None, w):
        tag = "" if sw is None else " weighted"
        cases += [
            loss_case("mse" + tag, "mse", {}, regress_y, regress_p, sw),
            loss_case("mae" + tag, "mae", {}, regress_y, regress_p, sw),
            loss_case("huber" + tag, "huber", {}, regress_y, regress_p, sw),
            loss_case("huber delta 0.5" + tag, "huber", {"delta": 0.5}, regress_y, regress_p, sw),
            loss_case("hinge 0/1 labels" + tag, "hinge", {}, binary, blogits, sw),
            loss_case("hinge -1/1 labels" + tag, "hinge", {}, 2 * binary - 1, blogits, sw),
            loss_case("kld" + tag, "kld", {}, one_hot * 0.9 + 0.025, probs, sw),
            loss_case("bce" + tag, "bce", {}, binary, bprobs, sw),
            loss_case("bce logits" + tag, "bce", {"from_logits": True}, binary, blogits, sw),
            loss_case("bce smoothing" + tag, "bce", {"label_smoothing": 0.2}, binary, bprobs, sw),
            loss_case("bce logits smoothing" + tag, "bce", {"from_logits": True, "label_smoothing": 0.1},
                      binary, blogits, sw),
            loss_case("cce" + tag, "cce", {}, one_hot, probs * 1.3, sw),
            loss_case("cce logits" + tag, "cce", {"from_logits": True}, one_hot, logits, sw),
            loss_case("cce smoothing" + tag, "cce", {"label_smoothing": 0.1}, one_hot, probs, sw),
            loss_case("cce logits smoothing" + tag, "cce", {"from_logits": True, "label_smoothing": 0.2},
                      one_hot, logits, sw),
            loss_case("scce" + tag, "scce", {}, labels, probs, sw),
            loss_case("scce logits" + tag, "scce", {"from_logits": True}, labels, logits, sw),
            loss_case("scce labels (n, 1)" + tag, "scce", {"from_logits": True}, labels, logits, sw,
                      y_shape=[n, 1]),
        ]
    # Keras's further losses, on data of their own generator (the draws above stay as they were).
    g = torch.Generator().manual_seed(35)
    positive_y = torch.rand(n, 3, generator=g, dtype=D) * 3
    positive_p = torch.rand(n, 3, generator=g, dtype=D) * 3 + 0.05
    positive_p[2, 1] = 0.0  # at the clip of msle's and mape's epsilon
    signed_y = torch.randn(n, 3, generator=g, dtype=D)
    signed_p = torch.randn(n, 3, generator=g, dtype=D) * 1.5
    signed_y[3, 0] = 0.0  # mape's epsilon in the denominator
    binary2 = (torch.rand(n, 3, generator=g, dtype=D) > 0.5).double()
    one_hot2 = torch.nn.functional.one_hot(torch.randint(0, k, (n,), generator=g), k).double()
    scores = torch.randn(n, k, generator=g, dtype=D) * 2
    sw2 = torch.rand(n, generator=g, dtype=D) * 2
    for sw in (None, sw2):
        tag = "" if sw is None else " weighted"
        cases += [
            loss_case("squared_hinge 0/1 labels" + tag, "squared_hinge", {}, binary2, signed_p, sw),
            loss_case("squared_hinge -1/1 labels" + tag, "squared_hinge", {}, 2 * binary2 - 1,
                      signed_p, sw),
            loss_case("categorical_hinge" + tag, "categorical_hinge", {}, one_hot2, scores, sw),
            loss_case("mape" + tag, "mape", {}, signed_y, signed_p, sw),
            loss_case("msle" + tag, "msle", {}, positive_y, positive_p, sw),
            loss_case("log_cosh" + tag, "log_cosh", {}, signed_y, signed_p, sw),
            loss_case("poisson" + tag, "poisson", {}, positive_y, positive_p + 0.1, sw),
            loss_case("cosine_similarity" + tag, "cosine_similarity", {}, signed_y, signed_p, sw),
        ]
    return cases


# ---------------------------------------------------------------- metrics

def weighted_mean(values, w):
    if w is None:
        return values.sum(), float(values.numel())
    shape = [w.shape[0]] + [1] * (values.dim() - 1)
    ww = w.reshape(shape).expand_as(values)
    return (values * ww).sum(), ww.sum()


def metric_values(kind, y, p):
    if kind == "accuracy":
        return (y == p).double()
    if kind == "binary_accuracy":
        return (y == (p > 0.5).double()).double().mean(-1)
    if kind == "categorical_accuracy":
        return (y.argmax(-1) == p.argmax(-1)).double()
    if kind == "sparse_categorical_accuracy":
        return (y.reshape(-1) == p.argmax(-1).double()).double()
    if kind in ("top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy"):
        t = y.argmax(-1) if kind.startswith("top") else y.reshape(-1).long()
        target = p.gather(-1, t.unsqueeze(-1))
        return ((p > target).sum(-1) < 5).double()  # tf.math.in_top_k, k = 5
    if kind == "mse":
        return ((p - y) ** 2).mean(-1)
    if kind == "mae":
        return (p - y).abs().mean(-1)
    raise ValueError(kind)


def confusion(y, p, w, thresholds):
    # Keras's update_confusion_matrix_variables: prediction > threshold, label cast to bool.
    yy = (y.reshape(-1) != 0).double()
    pp = p.reshape(-1)
    if w is None:
        ww = torch.ones_like(pp)
    else:
        ww = w.reshape(-1, 1).expand(p.shape[0], pp.numel() // p.shape[0]).reshape(-1)
    th = torch.tensor(thresholds, dtype=torch.float32)
    above = (pp.float().unsqueeze(0) > th.unsqueeze(1)).double()
    tp = (above * yy * ww).sum(1)
    fp = (above * (1 - yy) * ww).sum(1)
    fn = ((1 - above) * yy * ww).sum(1)
    tn = ((1 - above) * (1 - yy) * ww).sum(1)
    return torch.stack([tp, fp, fn, tn])


def div_no_nan(a, b):
    return torch.where(b == 0, torch.zeros_like(a), a / torch.where(b == 0, torch.ones_like(b), b))


def auc_thresholds(n=200):
    return [0.0 - EPS] + [(i + 1) / (n - 1) for i in range(n - 2)] + [1.0 + EPS]


def metric_case(kind, batches):
    state = None
    results = []
    out_batches = []
    for y, p, w, y_shape in batches:
        y, p = rounded(y), rounded(p)
        w = None if w is None else rounded(w)
        out_batches.append({"y_true": flat(y), "y_true_shape": list(y_shape or y.shape),
                            "y_pred": flat(p), "y_pred_shape": list(p.shape),
                            "sample_weight": None if w is None else flat(w)})
        if kind in ("precision", "recall", "auc"):
            th = [0.5] if kind != "auc" else auc_thresholds()
            c = confusion(y, p, w, th)
            state = c if state is None else state + c
            tp, fp, fn, tn = state
            if kind == "precision":
                results.append(float(div_no_nan(tp, tp + fp)[0]))
            elif kind == "recall":
                results.append(float(div_no_nan(tp, tp + fn)[0]))
            else:
                # Keras's AUC.result, ROC with summation_method='interpolation' (trapezoids).
                recall = div_no_nan(tp, tp + fn)
                fpr = div_no_nan(fp, fp + tn)
                results.append(float(((fpr[:-1] - fpr[1:]) * (recall[:-1] + recall[1:]) / 2).sum()))
        else:
            total, count = weighted_mean(metric_values(kind, y, p), w)
            state = (total, count) if state is None else (state[0] + total, state[1] + count)
            results.append(float(state[0] / state[1]))
    return {"metric": kind, "batches": out_batches, "results": results}


def make_metrics():
    n, k = 8, 7
    cases = []
    w1, w2 = torch.rand(n, dtype=D) * 2, torch.rand(n, dtype=D) * 2

    def two(make):
        return [make() for _ in range(2)]

    def probs():
        return torch.softmax(torch.randn(n, k, dtype=D) * 2, -1)

    def onehot():
        return torch.nn.functional.one_hot(torch.randint(0, k, (n,)), k).double()

    def labels():
        return torch.randint(0, k, (n,)).double()

    for weighted in (False, True):
        ws = [w1, w2] if weighted else [None, None]
        p = two(probs)
        oh = [onehot(), p[1].argmax(-1)]
        oh[1] = torch.nn.functional.one_hot(oh[1], k).double()  # a batch with every row right
        lab = two(labels)
        yb = two(lambda: (torch.rand(n, 3, dtype=D) > 0.5).double())
        pb = two(lambda: torch.rand(n, 3, dtype=D))
        yr = two(lambda: torch.randn(n, 3, dtype=D))
        pr = two(lambda: torch.randn(n, 3, dtype=D))
        ya = two(lambda: torch.randint(0, 3, (n, 2)).double())
        pa = two(lambda: torch.randint(0, 3, (n, 2)).double())
        cases += [
            metric_case("accuracy", [(ya[i], pa[i], ws[i], None) for i in range(2)]),
            metric_case("binary_accuracy", [(yb[i], pb[i], ws[i], None) for i in range(2)]),
            metric_case("categorical_accuracy", [(oh[i], p[i], ws[i], None) for i in range(2)]),
            metric_case("sparse_categorical_accuracy",
                        [(lab[i], p[i], ws[i], [n, 1] if i else None) for i in range(2)]),
            metric_case("top_k_categorical_accuracy", [(oh[i], p[i], ws[i], None) for i in range(2)]),
            metric_case("sparse_top_k_categorical_accuracy",
                        [(lab[i], p[i], ws[i], None) for i in range(2)]),
            metric_case("mse", [(yr[i], pr[i], ws[i], None) for i in range(2)]),
            metric_case("mae", [(yr[i], pr[i], ws[i], None) for i in range(2)]),
            metric_case("precision", [(yb[i], pb[i], ws[i], None) for i in range(2)]),
            metric_case("recall", [(yb[i], pb[i], ws[i], None) for i in range(2)]),
            metric_case("auc", [(yb[i], pb[i], ws[i], None) for i in range(2)]),
        ]
    return cases


# ---------------------------------------------------------------- schedules

def schedule_value(spec, step):
    kind, a = spec["schedule"], spec["args"]
    if kind == "ExponentialDecay":
        e = step / a["decay_steps"]
        if a["staircase"]:
            e = math.floor(e)
        return a["initial_learning_rate"] * a["decay_rate"] ** e
    if kind == "PiecewiseConstantDecay":
        for b, v in zip(a["boundaries"], a["values"]):
            if step <= b:
                return v
        return a["values"][-1]
    if kind == "CosineDecay":
        s = min(step, a["decay_steps"])
        cosine = 0.5 * (1 + math.cos(math.pi * s / a["decay_steps"]))
        return a["initial_learning_rate"] * ((1 - a["alpha"]) * cosine + a["alpha"])
    raise ValueError(kind)


SCHEDULES = [
    {"schedule": "ExponentialDecay",
     "args": {"initial_learning_rate": 0.1, "decay_steps": 3, "decay_rate": 0.5, "staircase": False}},
    {"schedule": "ExponentialDecay",
     "args": {"initial_learning_rate": 0.1, "decay_steps": 3, "decay_rate": 0.5, "staircase": True}},
    {"schedule": "PiecewiseConstantDecay", "args": {"boundaries": [2, 5], "values": [0.1, 0.05, 0.01]}},
    {"schedule": "CosineDecay", "args": {"initial_learning_rate": 0.1, "decay_steps": 6, "alpha": 0.1}},
]


def make_schedules():
    steps = list(range(0, 9))
    return [dict(s, steps=steps, values=[schedule_value(s, t) for t in steps]) for s in SCHEDULES]


# ---------------------------------------------------------------- optimizers

def clip(grads, o):
    # Keras 2.11+ Optimizer._clip_gradients: clipnorm, else global_clipnorm, else clipvalue.
    if o.get("clipnorm"):
        c = o["clipnorm"]
        return [g * c / max(float(g.norm()), c) for g in grads]
    if o.get("global_clipnorm"):
        c = o["global_clipnorm"]
        norm = math.sqrt(sum(float((g * g).sum()) for g in grads))
        return [g * c / max(norm, c) for g in grads]
    if o.get("clipvalue"):
        c = o["clipvalue"]
        return [g.clamp(-c, c) for g in grads]
    return grads


def run_optimizer(kind, o, weights, grads_per_step):
    w = [x.clone() for x in weights]
    slots = None
    for step, grads in enumerate(grads_per_step):
        lr = schedule_value(o["learning_rate"], step) if isinstance(o.get("learning_rate"), dict) \
            else o.get("learning_rate", DEFAULTS[kind])
        grads = clip(grads, o)
        if slots is None:
            init = o.get("initial_accumulator_value", 0.1) if kind == "adagrad" else 0.0
            slots = [[torch.full_like(x, init) for _ in range(3)] for x in w]
        for i, g in enumerate(grads):
            s = slots[i]
            if kind == "sgd":
                # Keras: velocity = momentum * velocity - lr * g. torch.optim.SGD keeps
                # v = momentum * v + g and steps lr * v, which differs once lr changes, and its
                # Nesterov step differs too.
                m = o.get("momentum", 0.0)
                if m == 0:
                    w[i] -= lr * g
                else:
                    s[0] = m * s[0] - lr * g
                    w[i] += (m * s[0] - lr * g) if o.get("nesterov") else s[0]
            elif kind in ("adam", "adamw"):
                # Keras's epsilon-hat form; torch.optim.Adam divides by sqrt(v_hat) + eps with
                # the bias-corrected v, a different epsilon placement.
                b1, b2 = o.get("beta_1", 0.9), o.get("beta_2", 0.999)
                eps = o.get("epsilon", 1e-7)
                if kind == "adamw":
                    w[i] -= w[i] * lr * o.get("weight_decay", 0.004)
                t = step + 1
                alpha = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                s[0] += (g - s[0]) * (1 - b1)
                s[1] += (g * g - s[1]) * (1 - b2)
                v = s[1]
                if o.get("amsgrad"):
                    s[2] = torch.maximum(s[2], s[1])
                    v = s[2]
                w[i] -= s[0] * alpha / (v.sqrt() + eps)
            elif kind == "rmsprop":
                # Keras 2.11+: epsilon inside the square root (torch adds it outside; torch's
                # alpha defaults to 0.99 where Keras's rho is 0.9).
                rho, mom = o.get("rho", 0.9), o.get("momentum", 0.0)
                eps = o.get("epsilon", 1e-7)
                s[0] = rho * s[0] + (1 - rho) * g * g
                if o.get("centered"):
                    s[2] = rho * s[2] + (1 - rho) * g
                    denominator = s[0] - s[2] * s[2] + eps
                else:
                    denominator = s[0] + eps
                increment = lr * g / denominator.sqrt()
                if mom > 0:
                    s[1] = mom * s[1] + increment
                    w[i] -= s[1]
                else:
                    w[i] -= increment
            elif kind == "adagrad":
                # Keras 2.11+: accumulator starts at 0.1 and epsilon sits inside the square root;
                # torch's starts at 0 with epsilon outside.
                eps = o.get("epsilon", 1e-7)
                s[0] += g * g
                w[i] -= lr * g / (s[0] + eps).sqrt()
            elif kind == "adadelta":
                # Keras's formula; torch's Adadelta is the same form but defaults to rho 0.9,
                # eps 1e-6 and lr 1.0.
                rho, eps = o.get("rho", 0.95), o.get("epsilon", 1e-7)
                s[0] = rho * s[0] + (1 - rho) * g * g
                delta = -(s[1] + eps).sqrt() * g / (s[0] + eps).sqrt()
                s[1] = rho * s[1] + (1 - rho) * delta * delta
                w[i] += lr * delta
    return w


DEFAULTS = {"sgd": 0.01, "adam": 0.001, "adamw": 0.001, "rmsprop": 0.001, "adagrad": 0.001,
            "adadelta": 0.001}


def make_optimizers():
    weights = [rounded(torch.randn(3, 2, dtype=D)), rounded(torch.randn(2, dtype=D))]
    steps = 4
    grads = [[rounded(torch.randn_like(x) * 0.5) for x in weights] for _ in range(steps)]
    grads[2] = [g * 10 for g in grads[2]]  # a large step, so clipping acts
    specs = [
        ("sgd", {}), ("sgd", {"learning_rate": 0.1, "momentum": 0.9}),
        ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
        ("adam", {}), ("adam", {"learning_rate": 0.01, "amsgrad": True}),
        ("adam", {"learning_rate": 0.01, "beta_1": 0.8, "beta_2": 0.99, "epsilon": 1e-3}),
        ("adamw", {}), ("adamw", {"learning_rate": 0.01, "weight_decay": 0.1}),
        ("rmsprop", {}), ("rmsprop", {"learning_rate": 0.01, "momentum": 0.5, "centered": True}),
        ("rmsprop", {"learning_rate": 0.01, "centered": True}),
        ("adagrad", {}), ("adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.5}),
        ("adadelta", {}), ("adadelta", {"learning_rate": 1.0, "rho": 0.9}),
        ("sgd", {"learning_rate": 0.1, "clipnorm": 1.0}),
        ("adam", {"learning_rate": 0.01, "global_clipnorm": 1.5}),
        ("sgd", {"learning_rate": 0.1, "momentum": 0.5, "clipvalue": 0.6}),
        ("sgd", {"learning_rate": SCHEDULES[0]}),
        ("adam", {"learning_rate": SCHEDULES[2]}),
        ("rmsprop", {"learning_rate": SCHEDULES[3], "momentum": 0.9}),
    ]
    cases = []
    for kind, o in specs:
        final = run_optimizer(kind, o, weights, grads)
        cases.append({"optimizer": kind, "options": o,
                      "weights": [flat(x) for x in weights], "shapes": [list(x.shape) for x in weights],
                      "gradients": [[flat(g) for g in step] for step in grads],
                      "expected": [flat(x) for x in final]})
    return cases


def main():
    out = {"losses": make_losses(), "metrics": make_metrics(), "schedules": make_schedules(),
           "optimizers": make_optimizers()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference",
                        "losses_metrics_optimizers.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
