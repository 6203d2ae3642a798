#!/usr/bin/python3
"""Reference values for the focal losses and the further metrics in tests/keras/test_losses.cpp
and test_metrics.cpp.

Losses: Keras 2 (tf.keras) formulas written in PyTorch float64 tensors, the reduced value and its
gradient with respect to y_pred by autograd. Metrics: Keras's documented definitions written out
in NumPy float64 (its threshold grid for the thresholded metrics), each running result after every
batch of several, with and without sample weights.

Run with Debian's interpreter (python3-torch, python3-numpy):
    /usr/bin/python3 tests/keras/generate_losses_metrics_34.py
It writes tests/keras/reference/losses_metrics_34.json.
"""
import json
import math
import os

import numpy as np
import torch

torch.manual_seed(34)
RNG = np.random.default_rng(34)
EPS = 1e-7  # keras.backend.epsilon()
D = torch.float64


def rounded(t):
    # Inputs go through float32 first, so that C++ (which reads float32) sees the same numbers.
    return t.float().double()


def f32(a):
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def flat(t):
    return [float(v) for v in np.asarray(t).reshape(-1).tolist()]


# ---------------------------------------------------------------- losses

def reduce(per_sample, w):
    # Keras's compute_weighted_loss with SUM_OVER_BATCH_SIZE: divide by the number of per-sample
    # values, not by the sum of the weights.
    if w is not None:
        per_sample = per_sample * w.reshape([w.shape[0]] + [1] * (per_sample.dim() - 1))
    return per_sample.sum() / per_sample.numel()


def binary_focal(args, y, p):
    # tf.keras's losses.binary_focal_crossentropy: smooth the labels, then
    # backend.binary_focal_crossentropy and the mean over the last axis.
    ls = args.get("label_smoothing", 0.0)
    gamma = args.get("gamma", 2.0)
    alpha = args.get("alpha", 0.25)
    y = y * (1 - ls) + 0.5 * ls
    if args.get("from_logits", False):
        s = torch.sigmoid(p)
        bce = torch.nn.functional.binary_cross_entropy_with_logits(p, y, reduction="none")
    else:
        s = p
        pc = torch.clamp(p, EPS, 1 - EPS)
        bce = -(y * torch.log(pc + EPS) + (1 - y) * torch.log(1 - pc + EPS))
    p_t = y * s + (1 - y) * (1 - s)
    focal = torch.pow(1 - p_t, gamma) * bce
    if args.get("apply_class_balancing", False):
        focal = (y * alpha + (1 - y) * (1 - alpha)) * focal
    return focal.mean(-1)


def categorical_focal(args, y, p):
    # Keras's categorical_focal_crossentropy: smooth, softmax for logits, normalise the row,
    # clip, then sum of -alpha (1 - q)^gamma y log(q).
    ls = args.get("label_smoothing", 0.0)
    gamma = args.get("gamma", 2.0)
    alpha = args.get("alpha", 0.25)
    k = p.shape[-1]
    y = y * (1 - ls) + ls / k
    if args.get("from_logits", False):
        p = torch.softmax(p, -1)
    q = p / p.sum(-1, keepdim=True)
    q = torch.clamp(q, EPS, 1 - EPS)
    return (-alpha * torch.pow(1 - q, gamma) * y * torch.log(q)).sum(-1)


def loss_case(name, kind, args, y, p, w=None):
    y = rounded(y)
    p = rounded(p).clone().requires_grad_(True)
    w = None if w is None else rounded(w)
    per_sample = (binary_focal if kind == "binary_focal_crossentropy" else categorical_focal)(
        args, y, p)
    value = reduce(per_sample, w)
    value.backward()
    return {
        "name": name, "loss": kind, "args": args,
        "y_true": flat(y), "y_true_shape": list(y.shape),
        "y_pred": flat(p.detach()), "y_pred_shape": list(p.shape),
        "sample_weight": None if w is None else flat(w),
        "value": float(value), "gradient": flat(p.grad),
    }


def make_losses():
    cases = []
    yb = (torch.rand(4, 3, dtype=D) > 0.5).double()
    pb = torch.rand(4, 3, dtype=D) * 0.98 + 0.01
    pb[0, 0] = 1.0  # clipped: no gradient through the cross-entropy there
    logits = torch.randn(4, 3, dtype=D) * 2
    w = torch.tensor([1.0, 0.5, 2.0, 0.0], dtype=D)
    bf = "binary_focal_crossentropy"
    cases.append(loss_case("bfce defaults", bf, {}, yb, pb))
    cases.append(loss_case("bfce logits", bf, {"from_logits": True}, yb, logits))
    cases.append(loss_case("bfce balanced weighted", bf,
                           {"apply_class_balancing": True, "alpha": 0.4, "gamma": 3.0}, yb, pb, w))
    cases.append(loss_case("bfce logits smoothing balanced", bf,
                           {"apply_class_balancing": True, "from_logits": True,
                            "label_smoothing": 0.2, "gamma": 1.5}, yb, logits, w))
    cases.append(loss_case("bfce gamma 0", bf, {"gamma": 0.0}, yb, pb))
    yb3 = (torch.rand(2, 3, 2, dtype=D) > 0.5).double()
    pb3 = torch.rand(2, 3, 2, dtype=D) * 0.9 + 0.05
    cases.append(loss_case("bfce rank 3 weighted", bf, {"gamma": 2.5}, yb3, pb3,
                           torch.tensor([0.3, 1.7], dtype=D)))
    oh = torch.nn.functional.one_hot(torch.randint(0, 5, (4,)), 5).double()
    pc = torch.softmax(torch.randn(4, 5, dtype=D), -1)
    pc_unnormalised = torch.rand(4, 5, dtype=D) + 0.05
    lc = torch.randn(4, 5, dtype=D) * 3
    cf = "categorical_focal_crossentropy"
    cases.append(loss_case("cfce defaults", cf, {}, oh, pc))
    cases.append(loss_case("cfce unnormalised weighted", cf, {"alpha": 0.7, "gamma": 1.0},
                           oh, pc_unnormalised, w))
    cases.append(loss_case("cfce logits smoothing", cf,
                           {"from_logits": True, "label_smoothing": 0.1, "gamma": 3.0}, oh, lc))
    cases.append(loss_case("cfce logits gamma 0 weighted", cf,
                           {"from_logits": True, "gamma": 0.0, "alpha": 1.0}, oh, lc, w))
    soft = torch.softmax(torch.randn(4, 5, dtype=D), -1)
    cases.append(loss_case("cfce soft labels", cf, {"gamma": 2.0}, soft, pc))
    return cases


# ---------------------------------------------------------------- metrics

def l2_normalize(x):
    return x / np.sqrt(np.maximum((x * x).sum(-1, keepdims=True), 1e-12))


def maybe_convert(y):
    # Keras's hinge losses: labels that are all 0 or 1 (in the batch) become -1 and 1.
    return 2 * y - 1 if np.all((y == 0) | (y == 1)) else y


def log_softmax(x):
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def row_values(kind, args, y, p):
    """The per-row values of the mean metrics, one per last-axis row (tf.keras formulas)."""
    fl = args.get("from_logits", False)
    ls = args.get("label_smoothing", 0.0)
    if kind == "BinaryCrossentropy":
        y = y * (1 - ls) + 0.5 * ls
        if fl:
            return (np.maximum(p, 0) - p * y + np.log1p(np.exp(-np.abs(p)))).mean(-1)
        pc = np.clip(p, EPS, 1 - EPS)
        return -(y * np.log(pc + EPS) + (1 - y) * np.log(1 - pc + EPS)).mean(-1)
    if kind == "CategoricalCrossentropy":
        y = y * (1 - ls) + ls / p.shape[-1]
        if fl:
            return -(y * log_softmax(p)).sum(-1)
        q = np.clip(p / p.sum(-1, keepdims=True), EPS, 1 - EPS)
        return -(y * np.log(q)).sum(-1)
    if kind == "SparseCategoricalCrossentropy":
        logits = p if fl else np.log(np.clip(p, EPS, 1 - EPS))
        labels = y.reshape(p.shape[:-1]).astype(int)
        return -np.take_along_axis(log_softmax(logits), labels[..., None], -1)[..., 0]
    if kind == "KLDivergence":
        yc, pc = np.clip(y, EPS, 1), np.clip(p, EPS, 1)
        return (yc * np.log(yc / pc)).sum(-1)
    if kind == "Poisson":
        return (p - y * np.log(p + EPS)).mean(-1)
    if kind == "Hinge":
        return np.maximum(1 - maybe_convert(y) * p, 0).mean(-1)
    if kind == "SquaredHinge":
        return (np.maximum(1 - maybe_convert(y) * p, 0) ** 2).mean(-1)
    if kind == "CategoricalHinge":
        pos = (y * p).sum(-1)
        neg = ((1 - y) * p).max(-1)
        return np.maximum(neg - pos + 1, 0)
    if kind == "LogCoshError":
        return np.log(np.cosh(p - y)).mean(-1)
    if kind == "MeanAbsolutePercentageError":
        return 100 * (np.abs(y - p) / np.maximum(np.abs(y), EPS)).mean(-1)
    if kind == "MeanSquaredLogarithmicError":
        return ((np.log(np.maximum(p, EPS) + 1) - np.log(np.maximum(y, EPS) + 1)) ** 2).mean(-1)
    if kind == "CosineSimilarity":
        return (l2_normalize(y) * l2_normalize(p)).sum(-1)
    if kind == "RootMeanSquaredError":
        return ((p - y) ** 2).mean(-1)
    raise ValueError(kind)


class MeanOfRows:
    """Keras's MeanMetricWrapper: the weighted mean of per-row values, each row weighted by its
    batch row's sample weight."""

    def __init__(self, kind, config):
        self.kind, self.config = kind, config
        self.total = self.count = 0.0

    def update(self, y, p, w):
        v = row_values(self.kind, self.config, y, p)
        v = v.reshape(v.shape[0], -1)
        ww = np.ones(v.shape[0]) if w is None else w
        self.total += (v * ww[:, None]).sum()
        self.count += ww.sum() * v.shape[1]

    def result(self):
        m = self.total / self.count if self.count else 0.0
        return math.sqrt(m) if self.kind == "RootMeanSquaredError" else m


class R2:
    """keras.metrics.R2Score (Keras 3): per-output sums, the residual, and the number of samples
    with a non-zero weight."""

    def __init__(self, config):
        self.aggregation = config.get("class_aggregation", "uniform_average")
        self.regressors = config.get("num_regressors", 0)
        self.s = self.sq = self.res = self.cnt = 0.0
        self.n = 0.0

    def update(self, y, p, w):
        ww = np.ones((y.shape[0], 1)) if w is None else w[:, None]
        ww = np.broadcast_to(ww, y.shape)
        self.s = self.s + (y * ww).sum(0)
        self.sq = self.sq + (y * y * ww).sum(0)
        self.res = self.res + ((y - p) ** 2 * ww).sum(0)
        self.cnt = self.cnt + ww.sum(0)
        self.n += float((ww != 0).any(-1).sum())

    def scores(self):
        mean = self.s / self.cnt
        total = self.sq - self.s * mean
        raw = 1 - self.res / total
        return np.where(np.isinf(raw), 0.0, raw), total

    def result(self):
        raw, total = self.scores()
        r2 = raw.mean() if self.aggregation == "uniform_average" else (total * raw).sum() / total.sum()
        n, k = self.n, self.regressors
        if k != 0 and k < n - 1:
            r2 = 1 - (1 - r2) * (n - 1) / (n - k - 1)
        return r2


class FBeta:
    """keras.metrics.FBetaScore: per-class (or, for 'micro', global) weighted counts."""

    def __init__(self, config):
        self.average = config.get("average")
        self.beta = config.get("beta", 1.0)
        self.threshold = config.get("threshold")
        self.tp = self.fp = self.fn = self.iw = 0.0

    def update(self, y, p, w):
        if self.threshold is None:
            pred = ((p >= p.max(-1, keepdims=True)) & (np.abs(p) > 1e-9)).astype(float)
        else:
            pred = (p > self.threshold).astype(float)
        ww = np.ones((y.shape[0], 1)) if w is None else w[:, None]
        axis = None if self.average == "micro" else 0
        self.tp = self.tp + (pred * y * ww).sum(axis)
        self.fp = self.fp + (pred * (1 - y) * ww).sum(axis)
        self.fn = self.fn + ((1 - pred) * y * ww).sum(axis)
        self.iw = self.iw + (y * ww).sum(axis)

    def scores(self):
        precision = self.tp / (self.tp + self.fp + EPS)
        recall = self.tp / (self.tp + self.fn + EPS)
        b2 = self.beta ** 2
        return precision * recall / (b2 * precision + recall + EPS) * (1 + b2)

    def result(self):
        f = self.scores()
        if self.average == "weighted":
            return float((f * self.iw / (self.iw.sum() + EPS)).sum())
        return float(np.mean(f))


class IoUMetric:
    """keras.metrics.IoU and its variants: a weighted confusion matrix of class indices, where a
    label or prediction outside [0, num_classes) (or a label equal to ignore_class) is left out."""

    def __init__(self, kind, config):
        self.kind = kind
        self.num_classes = config.get("num_classes", 2)
        self.targets = config.get("target_class_ids", list(range(self.num_classes)))
        if kind == "BinaryIoU":
            self.targets = config.get("target_class_ids", [0, 1])
        self.ignore = config.get("ignore_class")
        self.threshold = config.get("threshold", 0.5)
        self.sparse_pred = config.get("sparse_y_pred", kind not in ("OneHotIoU", "OneHotMeanIoU"))
        self.cm = np.zeros((self.num_classes, self.num_classes))

    def update(self, y, p, w):
        if self.kind == "BinaryIoU":
            p = (p >= self.threshold).astype(float)
        if self.kind in ("OneHotIoU", "OneHotMeanIoU"):
            y = y.argmax(-1)
            if not self.sparse_pred:
                p = p.argmax(-1)
        rows = y.shape[0]
        yt = np.trunc(y.reshape(-1))
        yp = np.trunc(p.reshape(-1))
        ww = np.ones(rows) if w is None else w
        ww = np.repeat(ww, yt.size // rows)
        for t, q, v in zip(yt, yp, ww):
            if not (0 <= t < self.num_classes and 0 <= q < self.num_classes):
                continue
            if self.ignore is not None and t == self.ignore:
                continue
            self.cm[int(t), int(q)] += v

    def result(self):
        tp = np.diag(self.cm)
        denominator = self.cm.sum(0) + self.cm.sum(1) - tp
        tp, denominator = tp[self.targets], denominator[self.targets]
        valid = denominator > 1e-9
        iou = np.where(valid, tp / (denominator + EPS), 0.0)
        return iou.sum() / (valid.sum() + EPS)


def as_float32(values):
    return [float(np.float32(v)) for v in values]


class Thresholded:
    """The confusion counts at thresholds of AUC and the sensitivity/specificity metrics: a
    prediction is positive at a threshold when strictly above it (float32 comparisons), a label
    when it is not 0."""

    def __init__(self, kind, config):
        self.kind, self.config = kind, config
        n = config.get("num_thresholds", 200)
        if kind == "AUC" and config.get("thresholds") is not None:
            # AUC's thresholds given: -epsilon, the thresholds sorted, 1 + epsilon.
            self.t = as_float32([-EPS] + sorted(config["thresholds"]) + [1 + EPS])
        elif kind == "AUC":
            # AUC: -epsilon, i / (n - 1), 1 + epsilon.
            self.t = as_float32([-EPS] + [i / (n - 1) for i in range(1, n - 1)] + [1 + EPS])
        else:
            # SensitivitySpecificityBase: 0, (i + 1) / (n - 1), 1.
            self.t = as_float32([0.0] + [(i + 1) / (n - 1) for i in range(n - 2)] + [1.0])
        self.t = np.array(self.t)
        self.class_id = config.get("class_id")
        self.tp = np.zeros(len(self.t))
        self.fp = np.zeros(len(self.t))
        self.tn = np.zeros(len(self.t))
        self.fn = np.zeros(len(self.t))

    def update(self, y, p, w):
        if self.config.get("from_logits"):
            # AUC(from_logits=True): the sigmoid of each prediction, in float32.
            p = (1.0 / (1.0 + np.exp(-p.astype(np.float64)))).astype(np.float32)
        if self.class_id is not None:
            y, p = y[..., self.class_id], p[..., self.class_id]
        rows = y.shape[0]
        ww = np.ones(rows) if w is None else w
        ww = np.repeat(ww, y.size // rows)
        if self.config.get("label_weights") is not None and not self.config.get("multi_label"):
            # Each prediction's count weighted by its label's weight (the last axis).
            ww = ww * np.tile(np.array(self.config["label_weights"]), y.size // y.shape[-1])
        for yy, pp, v in zip(y.reshape(-1), p.reshape(-1), ww):
            above = np.float32(pp) > self.t
            if yy != 0:
                self.tp += above * v
                self.fn += (~above) * v
            else:
                self.fp += above * v
                self.tn += (~above) * v

    def result(self):
        c = self.config
        div = lambda a, b: np.where(b == 0, 0.0, a / np.where(b == 0, 1, b))
        recall = div(self.tp, self.tp + self.fn)
        precision = div(self.tp, self.tp + self.fp)
        specificity = div(self.tn, self.tn + self.fp)
        best = lambda constrained, value, dependent: max(
            [0.0] + [float(d) for cc, d in zip(constrained, dependent) if cc >= value])
        if self.kind == "SensitivityAtSpecificity":
            return best(specificity, c["specificity"], recall)
        if self.kind == "SpecificityAtSensitivity":
            return best(recall, c["sensitivity"], specificity)
        if self.kind == "PrecisionAtRecall":
            return best(recall, c["recall"], precision)
        if self.kind == "RecallAtPrecision":
            return best(precision, c["precision"], recall)
        curve = c.get("curve", "ROC")
        method = c.get("summation_method", "interpolation")
        if curve == "PR" and method == "interpolation":
            # Davis & Goadrich: precision interpolated along true positives between thresholds.
            dtp = self.tp[:-1] - self.tp[1:]
            pos = self.tp + self.fp
            dp = pos[:-1] - pos[1:]
            slope = div(dtp, np.maximum(dp, 0))
            intercept = self.tp[1:] - slope * pos[1:]
            ratio = np.where((pos[:-1] > 0) & (pos[1:] > 0),
                             div(pos[:-1], np.maximum(pos[1:], 0)), 1.0)
            return float(div(slope * (dtp + intercept * np.log(ratio)),
                             np.maximum(self.tp[1:] + self.fn[1:], 0)).sum())
        if curve == "ROC":
            x, y = div(self.fp, self.fp + self.tn), recall
        elif curve == "PR":
            x, y = recall, precision
        else:  # PRGAIN
            scale = div(self.tp + self.fn, self.tn + self.fp)
            rg = 1 - scale * div(self.fn, self.tp)
            pg = 1 - scale * div(self.fp, self.tp)
            rg = np.maximum(np.where(self.tp == 0, 0.0, rg), 0.0)
            pg = np.where(self.tp == 0, 1.0, pg)
            x, y = rg, pg
        if method == "interpolation":
            h = (y[:-1] + y[1:]) / 2
        elif method == "minoring":
            h = np.minimum(y[:-1], y[1:])
        else:
            h = np.maximum(y[:-1], y[1:])
        return float(((x[:-1] - x[1:]) * h).sum())


class MultiLabelAUC:
    """AUC(multi_label=True): one curve per label (column of the rank-2 predictions), each the
    single-label AUC of its column; the result is their mean, or their mean weighted by
    label_weights (divide_no_nan)."""

    def __init__(self, config):
        self.config = config
        single = {k: v for k, v in config.items() if k not in ("multi_label", "label_weights",
                                                               "num_labels")}
        self.make = lambda: Thresholded("AUC", single)
        self.labels = None

    def update(self, y, p, w):
        if self.labels is None:
            self.labels = [self.make() for _ in range(y.shape[1])]
        for j, label in enumerate(self.labels):
            label.update(y[:, j], p[:, j], w)

    def result(self):
        areas = np.array([label.result() for label in self.labels])
        weights = np.array(self.config.get("label_weights") or [1.0] * len(areas))
        total = (areas * weights).sum()
        return 0.0 if weights.sum() == 0 else total / weights.sum()


MEAN_KINDS = {"BinaryCrossentropy", "CategoricalCrossentropy", "SparseCategoricalCrossentropy",
              "KLDivergence", "Poisson", "Hinge", "SquaredHinge", "CategoricalHinge",
              "LogCoshError", "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError",
              "CosineSimilarity", "RootMeanSquaredError"}
THRESHOLDED = {"AUC", "SensitivityAtSpecificity", "SpecificityAtSensitivity", "PrecisionAtRecall",
               "RecallAtPrecision"}


def make_metric(kind, config):
    if kind in MEAN_KINDS:
        return MeanOfRows(kind, config)
    if kind == "R2Score":
        return R2(config)
    if kind in ("FBetaScore", "F1Score"):
        return FBeta(config)
    if kind == "AUC" and config.get("multi_label"):
        return MultiLabelAUC(config)
    if kind in THRESHOLDED:
        return Thresholded(kind, config)
    return IoUMetric(kind, config)


def metric_case(name, kind, config, batches, per_class=False):
    m = make_metric(kind, config)
    out, results = [], []
    for y, p, w in batches:
        y, p = f32(y), f32(p)
        w = None if w is None else f32(w)
        m.update(y, p, w)
        results.append(None if per_class else float(m.result()))
        out.append({"y_true": flat(y), "y_true_shape": list(y.shape),
                    "y_pred": flat(p), "y_pred_shape": list(p.shape),
                    "sample_weight": None if w is None else flat(w)})
    case = {"name": name, "class_name": kind, "config": config, "batches": out}
    if per_class:
        s = m.scores()
        case["scores"] = flat(s[0] if isinstance(s, tuple) else s)
    else:
        case["results"] = results
    return case


def batches(make_y, make_p, weighted, count=3, rows=6):
    out = []
    for i in range(count):
        w = RNG.uniform(0.0, 2.0, rows) if weighted else None
        if w is not None:
            w[i % rows] = 0.0  # a masked row
        out.append((make_y(rows), make_p(rows), w))
    return out


def make_metrics():
    cases = []
    k = 4

    def binary(rows, cols=3):
        return (RNG.uniform(size=(rows, cols)) > 0.5).astype(float)

    def probs(rows, cols=3):
        return RNG.uniform(0.02, 0.98, (rows, cols))

    def logits(rows, cols=k):
        return RNG.normal(0, 2, (rows, cols))

    def onehot(rows, cols=k):
        return np.eye(cols)[RNG.integers(0, cols, rows)]

    def softmax_rows(rows, cols=k):
        e = np.exp(RNG.normal(0, 1.5, (rows, cols)))
        return e / e.sum(-1, keepdims=True)

    def labels(rows, cols=k):
        return RNG.integers(0, cols, rows).astype(float)

    def regression(rows, cols=3):
        return RNG.normal(0, 1, (rows, cols))

    def positive(rows, cols=3):
        return RNG.uniform(0.1, 3.0, (rows, cols))

    for weighted in (False, True):
        tag = " weighted" if weighted else ""
        for kind, config, make_y, make_p in [
            ("BinaryCrossentropy", {}, binary, probs),
            ("BinaryCrossentropy", {"from_logits": True, "label_smoothing": 0.1}, binary,
             lambda r: logits(r, 3)),
            ("CategoricalCrossentropy", {}, onehot, softmax_rows),
            ("CategoricalCrossentropy", {"from_logits": True, "label_smoothing": 0.2}, onehot,
             logits),
            ("SparseCategoricalCrossentropy", {}, labels, softmax_rows),
            ("SparseCategoricalCrossentropy", {"from_logits": True}, labels, logits),
            ("KLDivergence", {}, softmax_rows, softmax_rows),
            ("Poisson", {}, positive, positive),
            ("Hinge", {}, binary, regression),
            ("SquaredHinge", {}, lambda r: 2 * binary(r) - 1, regression),
            ("CategoricalHinge", {}, onehot, logits),
            ("LogCoshError", {}, regression, regression),
            ("MeanAbsolutePercentageError", {}, positive, positive),
            ("MeanSquaredLogarithmicError", {}, positive, regression),
            ("CosineSimilarity", {}, regression, regression),
            ("RootMeanSquaredError", {}, regression, regression),
            ("R2Score", {}, regression, regression),
            ("R2Score", {"class_aggregation": "variance_weighted_average", "num_regressors": 2},
             regression, regression),
            ("F1Score", {"average": "macro"}, binary, probs),
            ("F1Score", {"average": "micro", "threshold": 0.5}, binary, probs),
            ("FBetaScore", {"average": "weighted", "beta": 2.0, "threshold": 0.4}, binary, probs),
            ("FBetaScore", {"average": "macro", "beta": 0.5}, onehot, softmax_rows),
            ("MeanIoU", {"num_classes": k}, labels, labels),
            ("IoU", {"num_classes": k, "target_class_ids": [0, 2]}, labels, labels),
            ("IoU", {"num_classes": 3, "target_class_ids": [1], "ignore_class": 0},
             lambda r: labels(r, 4), lambda r: labels(r, 3)),
            ("BinaryIoU", {}, binary, probs),
            ("BinaryIoU", {"target_class_ids": [1], "threshold": 0.3}, binary, probs),
            ("OneHotIoU", {"num_classes": k, "target_class_ids": [1, 3]}, onehot, softmax_rows),
            ("OneHotMeanIoU", {"num_classes": k}, onehot, softmax_rows),
            ("AUC", {"curve": "PR"}, binary, probs),
            ("AUC", {"curve": "PR", "summation_method": "majoring", "num_thresholds": 50},
             binary, probs),
            ("AUC", {"curve": "PR", "summation_method": "minoring"}, binary, probs),
            ("AUC", {"summation_method": "minoring", "num_thresholds": 13}, binary, probs),
            ("AUC", {"curve": "PRGAIN"}, binary, probs),
            ("PrecisionAtRecall", {"recall": 0.6}, binary, probs),
            ("RecallAtPrecision", {"precision": 0.75, "num_thresholds": 40}, binary, probs),
            ("SensitivityAtSpecificity", {"specificity": 0.5}, binary, probs),
            ("SpecificityAtSensitivity", {"sensitivity": 0.7, "class_id": 1}, binary, probs),
        ]:
            name = kind + " " + json.dumps(config, sort_keys=True) + tag
            cases.append(metric_case(name, kind, config, batches(make_y, make_p, weighted)))
    # Rank 3 predictions (rows of a sequence), weighted per batch row.
    seq = [(RNG.normal(0, 1, (3, 2, 4)), RNG.normal(0, 1, (3, 2, 4)), RNG.uniform(0, 2, 3))
           for _ in range(2)]
    cases.append(metric_case("RootMeanSquaredError rank 3", "RootMeanSquaredError", {}, seq))
    cases.append(metric_case("CosineSimilarity rank 3", "CosineSimilarity", {}, seq))
    # One score per class.
    cases.append(metric_case("F1Score per class", "F1Score", {"threshold": 0.5},
                             batches(binary, probs, True), per_class=True))
    cases.append(metric_case("R2Score per output", "R2Score", {"class_aggregation": None},
                             batches(regression, regression, True), per_class=True))
    # AUC's other arguments: one curve per label (mean, or weighted by label_weights), label
    # weights on the counts of one curve, logits, thresholds given.
    for weighted in (False, True):
        tag = " weighted" if weighted else ""
        for config, make_p in [
            ({"multi_label": True}, probs),
            ({"multi_label": True, "label_weights": [0.5, 2.0, 1.0], "curve": "PR"}, probs),
            ({"multi_label": True, "num_labels": 3, "summation_method": "majoring",
              "num_thresholds": 20}, probs),
            ({"label_weights": [1.0, 0.25, 3.0]}, probs),
            ({"from_logits": True, "curve": "PRGAIN"}, lambda r: logits(r, 3)),
            ({"thresholds": [0.7, 0.2, 0.5, 0.35], "summation_method": "minoring"}, probs),
            ({"thresholds": [0.1, 0.4, 0.6, 0.9], "curve": "PR", "multi_label": True,
              "from_logits": True}, lambda r: logits(r, 3)),
        ]:
            name = "AUC " + json.dumps(config, sort_keys=True) + tag
            cases.append(metric_case(name, "AUC", config, batches(binary, make_p, weighted)))
    return cases


def main():
    out = {"losses": make_losses(), "metrics": make_metrics()}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference",
                        "losses_metrics_34.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
