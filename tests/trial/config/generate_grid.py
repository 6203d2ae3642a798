#!/usr/bin/python3
"""Writes tests/trial/config/reference/grid.json: the grid searcher's points, computed here from
Determined's formulas (master/pkg/searcher/grid.go), for tests/trial/config/test_grid_reference.cpp.

Run: /usr/bin/python3 tests/trial/config/generate_grid.py
"values": one hyperparameter in Determined's config form and its points in order; "products": a
`hyperparameters` mapping and the grid's points (objects, nested for groups) in order.
Determined visits hyperparameters by sorted (dotted) name and varies the first name slowest. Int
points are round(min + i*(max-min)/(count-1)) with Go's math.Round (half away from zero, computed
here exactly with decimal), the count clamped to max-min+1, and count 1 giving the rounded
midpoint; double points are evenly spaced; log points are base to evenly spaced exponents.
"""
import json
import math
import os
from decimal import ROUND_HALF_UP, Decimal


def go_round(x):
    return int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def points(hp):
    if not isinstance(hp, dict):
        return [hp]
    kind = hp["type"]
    if kind == "const":
        return [hp["val"]]
    if kind == "categorical":
        return list(hp["vals"])
    lo, hi, count = hp["minval"], hp["maxval"], hp["count"]
    if kind == "int":
        count = min(count, hi - lo + 1)
        if count == 1:
            return [go_round(float(lo + hi) / 2.0)]
        return [go_round(float(lo) + float(i * (hi - lo)) / float(count - 1)) for i in range(count)]
    if count == 1:
        exponents = [(lo + hi) / 2.0]
    else:
        exponents = [lo + float(i) * (hi - lo) / float(count - 1) for i in range(count)]
    if kind == "double":
        return exponents
    return [hp.get("base", 10.0) ** e for e in exponents]


def flatten(hparams, prefix=()):
    out = []
    for name, hp in hparams.items():
        path = prefix + (name,)
        if isinstance(hp, dict) and "type" not in hp:
            out += flatten(hp, path)
        else:
            out.append((path, hp))
    return sorted(out, key=lambda item: ".".join(item[0]))


def grid(hparams):
    flat = flatten(hparams)
    product = [{}]
    for path, hp in reversed(flat):
        product = [{**rest, path: value} for value in points(hp) for rest in product]
    result = []
    for point in product:
        nested = {}
        for path, value in point.items():
            at = nested
            for part in path[:-1]:
                at = at.setdefault(part, {})
            at[path[-1]] = value
        result.append(nested)
    return result


def value_case(hp):
    return {"hyperparameter": hp, "values": points(hp)}


def product_case(hparams):
    return {"hyperparameters": hparams, "points": grid(hparams)}


values = []
# Int ranges of 2 to 13 integers at three offsets, every count up to 14 (clamping, rounding of
# halves, the midpoint of count 1).
for lo in [-3, 0, 5]:
    for span in range(1, 13):
        for count in range(1, 15):
            values.append(value_case({"type": "int", "minval": lo, "maxval": lo + span,
                                      "count": count}))
for lo, hi in [(0.0, 1.0), (-0.3, 0.7), (1e-3, 0.1), (-5.0, -4.5)]:
    for count in range(1, 8):
        values.append(value_case({"type": "double", "minval": lo, "maxval": hi, "count": count}))
for lo, hi, base in [(-4.0, -1.0, 10.0), (-6.0, -2.5, 10.0), (2.0, 9.0, 2.0), (0.0, 1.0, math.e)]:
    for count in range(1, 7):
        values.append(value_case({"type": "log", "minval": lo, "maxval": hi, "base": base,
                                  "count": count}))
values.append(value_case({"type": "categorical", "vals": ["a", 2, 0.5, True, None]}))
values.append(value_case({"type": "const", "val": {"nested": [1, 2]}}))
products = []
# Products over several hyperparameters, nested groups and file order unlike the sorted one.
products.append(product_case({
    "z_units": {"type": "int", "minval": 16, "maxval": 64, "count": 3},
    "global_batch_size": {"type": "categorical", "vals": [32, 64]},
    "optimizer": {"lr": {"type": "log", "minval": -3, "maxval": -1, "count": 3},
                  "momentum": {"type": "double", "minval": 0.8, "maxval": 0.9, "count": 2},
                  "name": "sgd"},
    "activation": {"type": "categorical", "vals": ["relu", "tanh"]},
    "dropout": {"type": "const", "val": 0.25},
}))
products.append(product_case({"global_batch_size": {"type": "int", "minval": 8, "maxval": 10, "count": 5},
                   "a": {"b": {"c": {"type": "categorical", "vals": [1, 2, 3]}}},
                   "a_b": {"type": "int", "minval": 0, "maxval": 1, "count": 2}}))

path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "grid.json")
with open(path, "w") as out:
    json.dump({"generator": "tests/trial/config/generate_grid.py", "values": values,
               "products": products}, out, separators=(",", ":"))
    out.write("\n")
print(f"{path}: {len(values)} hyperparameters, {len(products)} products")
