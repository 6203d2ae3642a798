#!/usr/bin/python3
"""Writes tests/keras/reference/recurrent.json: PyTorch (float64) outputs, input gradients and
weight gradients of Keras's SimpleRNN, LSTM, GRU (reset_after True and False) and Bidirectional,
for tests/keras/test_recurrent.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_recurrent.py
The cases have the format of generate_layers.py: the layer's Keras class_name and config, inputs,
weights in Keras's layout, the upstream gradient g, and the targets of loss = sum(output * g).

Keras's layout mapped to PyTorch's:
- Keras holds `kernel` (features, k * units), `recurrent_kernel` (units, k * units) and `bias`
  (k * units) and multiplies `x @ kernel`; torch holds `weight_ih_l0` (k * units, features) and
  `weight_hh_l0` (units, ...) transposed and multiplies `x @ weight.T`. So weight_ih = kernel.T,
  weight_hh = recurrent_kernel.T, bias_ih = bias and bias_hh = 0 (Keras has one bias).
- SimpleRNN is nn.RNN's operator (torch.rnn_tanh or torch.rnn_relu).
- LSTM: both use the gate order i, f, c (torch's g), o: no reordering.
- GRU reset_after=True (Keras 2/3): Keras's order is z, r, h and torch's r, z, n, so the blocks
  are reordered (Keras block 1, 0, 2 make torch's r, z, n); bias (2, 3 * units) is bias_ih
  (row 0) and bias_hh (row 1), reordered the same way. torch's n = tanh(W_in x + b_in +
  r * (W_hn h + b_hn)) and h' = (1 - z) * n + z * h are Keras's formulas.
- GRU reset_after=False (Keras 1) has no torch module: its formulas are written here in torch
  (autograd gives the gradients): z = s(x W_z + h U_z + b_z), r = s(x W_r + h U_r + b_r),
  hh = tanh(x W_h + (r * h) U_h + b_h), h' = z * h + (1 - z) * hh.
- go_backwards: the sequence is flipped along time first, and outputs stay in processing order.
- Bidirectional: a forward and a go_backwards copy; with return_sequences the backward outputs
  are flipped back along time; merged by concat (last axis), sum, mul or ave.
"""
import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3333)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


GATES = {"SimpleRNN": 1, "LSTM": 4, "GRU": 3}
CELL = {"SimpleRNN": "simple_rnn_cell", "LSTM": "lstm_cell", "GRU": "gru_cell"}


def keras_weights(class_name, features, units, reset_after, prefix=""):
    k = GATES[class_name]
    cell = prefix + CELL[class_name]
    w = {cell + "/kernel": rnd(features, k * units, scale=0.6),
         cell + "/recurrent_kernel": rnd(units, k * units, scale=0.6)}
    if class_name == "GRU" and reset_after:
        w[cell + "/bias"] = rnd(2, k * units, scale=0.3)
    else:
        w[cell + "/bias"] = rnd(k * units, scale=0.3)
    return w


def gru_order(t, units):
    """Keras's z, r, h blocks (last axis) as torch's r, z, n."""
    z, r, h = t[..., :units], t[..., units:2 * units], t[..., 2 * units:]
    return torch.cat([r, z, h], dim=-1)


def run_direction(class_name, config, x, w, prefix=""):
    """Outputs of one direction (batch, steps, units) in processing order, and the last."""
    units = config["units"]
    cell = prefix + CELL[class_name]
    kernel, recurrent, bias = w[cell + "/kernel"], w[cell + "/recurrent_kernel"], w[cell + "/bias"]
    if config.get("go_backwards", False):
        x = torch.flip(x, dims=[1])
    if class_name == "GRU" and not config.get("reset_after", True):
        h = torch.zeros(x.shape[0], units, dtype=DT)
        outs = []
        for s in range(x.shape[1]):
            xp = x[:, s] @ kernel + bias
            rp = h @ recurrent[:, :2 * units]
            z = torch.sigmoid(xp[:, :units] + rp[:, :units])
            r = torch.sigmoid(xp[:, units:2 * units] + rp[:, units:])
            hh = torch.tanh(xp[:, 2 * units:] + (r * h) @ recurrent[:, 2 * units:])
            h = z * h + (1 - z) * hh
            outs.append(h)
        return torch.stack(outs, dim=1)
    # The ATen operators nn.RNN, nn.LSTM and nn.GRU run (torch.rnn_tanh, torch.lstm, ...), called
    # with the mapped weights so that autograd reaches Keras's tensors.
    h0 = torch.zeros(1, x.shape[0], units, dtype=DT)
    flags = (True, 1, 0.0, True, False, True)  # biases, layers, dropout, train, bidirectional,
    # batch_first
    if class_name == "SimpleRNN":
        op = torch.rnn_relu if config.get("activation", "tanh") == "relu" else torch.rnn_tanh
        out, _ = op(x, h0, [kernel.T, recurrent.T, bias, torch.zeros_like(bias)], *flags)
    elif class_name == "LSTM":
        out, _, _ = torch.lstm(x, (h0, h0), [kernel.T, recurrent.T, bias, torch.zeros_like(bias)],
                               *flags)
    else:
        out, _ = torch.gru(x, h0, [gru_order(kernel, units).T, gru_order(recurrent, units).T,
                                   gru_order(bias[0], units), gru_order(bias[1], units)], *flags)
    return out


def layer_output(class_name, config, x, w, prefix=""):
    out = run_direction(class_name, config, x, w, prefix)
    return out if config.get("return_sequences", False) else out[:, -1]


def record(name, class_name, config, x, w, xs, ws, out, seed=None, step=None):
    """A case: the upstream gradient g is drawn here, and the targets of loss = sum(out * g)."""
    g = rnd(*out.shape)
    (out * g).sum().backward()
    c = {"name": name, "class_name": class_name, "config": config, "training": True}
    if seed is not None:
        c.update(seed=seed, step=step)
    c.update({
        "input_shapes": [list(x.shape)],
        "inputs": [flat(x)],
        "weights": {k: flat(v) for k, v in w.items()},
        "upstream": flat(g),
        "output_shape": list(out.shape),
        "output": flat(out),
        "input_gradients": [flat(xs.grad)],
        "weight_gradients": {k: flat(v.grad) for k, v in ws.items()},
        "updated_weights": {},
    })
    return c


def case(name, class_name, config, shape, bidirectional=None):
    x = rnd(*shape)
    if bidirectional is None:
        w = keras_weights(class_name, shape[-1], config["units"], config.get("reset_after", True))
    else:
        inner = config["layer"]["class_name"]
        inner_config = config["layer"]["config"]
        ra = inner_config.get("reset_after", True)
        snake = {"SimpleRNN": "simple_rnn", "LSTM": "lstm", "GRU": "gru"}[inner]
        w = keras_weights(inner, shape[-1], inner_config["units"], ra, "forward_" + snake + "/")
        w.update(keras_weights(inner, shape[-1], inner_config["units"], ra,
                               "backward_" + snake + "/"))
    xs = x.clone().requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    if bidirectional is None:
        out = layer_output(class_name, config, xs, ws)
    else:
        inner = config["layer"]["class_name"]
        fc = dict(config["layer"]["config"])
        snake = {"SimpleRNN": "simple_rnn", "LSTM": "lstm", "GRU": "gru"}[inner]
        bc = dict(fc, go_backwards=not fc.get("go_backwards", False))
        f = layer_output(inner, fc, xs, ws, "forward_" + snake + "/")
        b = layer_output(inner, bc, xs, ws, "backward_" + snake + "/")
        if fc.get("return_sequences", False):
            b = torch.flip(b, dims=[1])
        mode = config.get("merge_mode", "concat")
        out = {"concat": lambda: torch.cat([f, b], dim=-1), "sum": lambda: f + b,
               "mul": lambda: f * b, "ave": lambda: (f + b) / 2}[mode]()
    return record(name, class_name, config, x, w, xs, ws, out)


cases = []
for class_name in ["SimpleRNN", "LSTM", "GRU"]:
    for steps in [1, 2, 5]:
        for sequences in [False, True]:
            for backwards in [False, True]:
                config = {"units": 4, "return_sequences": sequences, "go_backwards": backwards}
                tag = f"{class_name.lower()}_t{steps}_{'seq' if sequences else 'last'}" \
                      f"{'_backwards' if backwards else ''}"
                cases.append(case(tag, class_name, config, (3, steps, 5)))
                if class_name == "GRU":
                    config = dict(config, reset_after=False)
                    cases.append(case(tag + "_reset_before", class_name, config, (3, steps, 5)))
cases.append(case("simple_rnn_relu", "SimpleRNN",
                  {"units": 3, "activation": "relu", "return_sequences": True}, (2, 4, 2)))
for inner in ["LSTM", "GRU", "SimpleRNN"]:
    for mode in ["concat", "sum", "mul", "ave"]:
        for sequences in [False, True]:
            config = {"layer": {"class_name": inner,
                                "config": {"units": 3, "return_sequences": sequences}},
                      "merge_mode": mode}
            cases.append(case(f"bidirectional_{inner.lower()}_{mode}_{'seq' if sequences else 'last'}",
                              "Bidirectional", config, (2, 3, 4), bidirectional=True))

# Dropout in training (appended after the cases above, so that their values stay as they were).
# The masks are loadstar's draws, reproduced here: a layer's key is
# mix64(mix64(seed) ^ mix64(step + C) ^ fnv1a64(name)) (keras/layers/detail/recurrent.hpp,
# recurrent_dropout_key; a Bidirectional's directions are named name/forward and name/backward);
# mask m of the inputs uses stream mix64(key ^ mix64(1 + m)), of the state mix64(key ^ mix64(9 +
# m)), and element i of a stream is kept when the top 53 bits of mix64(stream + golden * (i + 1))
# as a fraction are at least the rate (keras/detail/layer_formulas.hpp, dropout_keeps); a kept
# value is scaled by 1 / (1 - rate). What is checked against torch is how the masks enter the
# computation, written out below as Keras 3's cells with implementation 1 (a mask per gate) or 2
# (one input mask for every gate): the input of gate g is x * input_mask[g] and the state fed to
# gate g's recurrent kernel h * state_mask[g]; the carried states are not dropped.
M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    return h


def dropout_key(seed, step, name):
    return mix64(mix64(seed) ^ mix64((step + 0x632BE59BD9B4E019) & M64) ^ fnv1a64(name))


def draw_masks(key, first_stream, count, rows, cols, rate):
    masks = []
    for m in range(count):
        stream = mix64(key ^ mix64(first_stream + m))
        keep = [((mix64((stream + GOLDEN * (i + 1)) & M64) >> 11) * 2.0 ** -53) >= rate
                for i in range(rows * cols)]
        assert any(keep) and not all(keep), "a mask that drops nothing or everything"
        masks.append(torch.tensor([1.0 / (1.0 - rate) if k else 0.0 for k in keep],
                                  dtype=DT).reshape(rows, cols))
    return masks


def dropout_direction(class_name, config, x, w, input_masks, state_masks, prefix=""):
    """Keras's cell loop with the given masks: outputs (batch, steps, units), processing order."""
    units = config["units"]
    cell = prefix + CELL[class_name]
    kernel, recurrent, bias = w[cell + "/kernel"], w[cell + "/recurrent_kernel"], w[cell + "/bias"]
    if config.get("go_backwards", False):
        x = torch.flip(x, dims=[1])

    def block(t, g):
        return t[..., g * units:(g + 1) * units]

    def x_in(xs, g):
        if not input_masks:
            return xs
        return xs * input_masks[g if len(input_masks) > 1 else 0]

    def h_in(h, g):
        return h * state_masks[g] if state_masks else h

    h = torch.zeros(x.shape[0], units, dtype=DT)
    c = torch.zeros(x.shape[0], units, dtype=DT)
    outs = []
    for s in range(x.shape[1]):
        xs = x[:, s]
        if class_name == "SimpleRNN":
            h = torch.tanh(x_in(xs, 0) @ kernel + bias + h_in(h, 0) @ recurrent)
        elif class_name == "LSTM":
            pre = [x_in(xs, g) @ block(kernel, g) + block(bias, g) + h_in(h, g) @ block(recurrent, g)
                   for g in range(4)]
            c = torch.sigmoid(pre[1]) * c + torch.sigmoid(pre[0]) * torch.tanh(pre[2])
            h = torch.sigmoid(pre[3]) * torch.tanh(c)
        elif config.get("reset_after", True):
            xp = [x_in(xs, g) @ block(kernel, g) + block(bias[0], g) for g in range(3)]
            rp = [h_in(h, g) @ block(recurrent, g) + block(bias[1], g) for g in range(3)]
            z = torch.sigmoid(xp[0] + rp[0])
            r = torch.sigmoid(xp[1] + rp[1])
            h = z * h + (1 - z) * torch.tanh(xp[2] + r * rp[2])
        else:
            xp = [x_in(xs, g) @ block(kernel, g) + block(bias, g) for g in range(3)]
            z = torch.sigmoid(xp[0] + h_in(h, 0) @ block(recurrent, 0))
            r = torch.sigmoid(xp[1] + h_in(h, 1) @ block(recurrent, 1))
            h = z * h + (1 - z) * torch.tanh(xp[2] + (r * h_in(h, 2)) @ block(recurrent, 2))
        outs.append(h)
    return torch.stack(outs, dim=1)


def direction_masks(class_name, config, key, batch, features):
    k = GATES[class_name]
    rate, recurrent_rate = config.get("dropout", 0.0), config.get("recurrent_dropout", 0.0)
    per_gate = config.get("implementation", 2) == 1 or recurrent_rate > 0
    inputs = draw_masks(key, 1, k if per_gate else 1, batch, features, rate) if rate > 0 else []
    states = draw_masks(key, 9, k, batch, config["units"], recurrent_rate) \
        if recurrent_rate > 0 else []
    return inputs, states


def dropout_case(name, class_name, config, shape, seed, step, bidirectional=False):
    x = rnd(*shape)
    inner, inner_config = (config["layer"]["class_name"], config["layer"]["config"]) \
        if bidirectional else (class_name, config)
    ra = inner_config.get("reset_after", True)
    snake = {"SimpleRNN": "simple_rnn", "LSTM": "lstm", "GRU": "gru"}[inner]
    prefixes = ["forward_" + snake + "/", "backward_" + snake + "/"] if bidirectional else [""]
    w = {}
    for prefix in prefixes:
        w.update(keras_weights(inner, shape[-1], inner_config["units"], ra, prefix))
    key_seed = inner_config.get("seed", seed)
    # Without masks the loop is the torch operator's computation.
    plain = dropout_direction(inner, inner_config, x, w, [], [], prefixes[0])
    assert torch.allclose(plain, run_direction(inner, inner_config, x, w, prefixes[0]))
    xs = x.clone().requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    if not bidirectional:
        masks = direction_masks(inner, inner_config, dropout_key(key_seed, step, name), shape[0],
                                shape[-1])
        out = dropout_direction(inner, inner_config, xs, ws, *masks)
        if not inner_config.get("return_sequences", False):
            out = out[:, -1]
    else:
        bc = dict(inner_config, go_backwards=not inner_config.get("go_backwards", False))
        outs = []
        for direction, (cfg, prefix) in enumerate([(inner_config, prefixes[0]), (bc, prefixes[1])]):
            masks = direction_masks(inner, cfg, dropout_key(
                key_seed, step, name + ("/forward" if direction == 0 else "/backward")), shape[0],
                shape[-1])
            o = dropout_direction(inner, cfg, xs, ws, *masks, prefix)
            outs.append(o if inner_config.get("return_sequences", False) else o[:, -1])
        if inner_config.get("return_sequences", False):
            outs[1] = torch.flip(outs[1], dims=[1])
        out = torch.cat(outs, dim=-1)
    return record(name, class_name, config, x, w, xs, ws, out, seed, step)


for class_name, extra in [("SimpleRNN", {}), ("LSTM", {}), ("GRU", {}),
                          ("GRU", {"reset_after": False})]:
    tag = class_name.lower() + ("_reset_before" if extra else "")
    variants = [
        ("dropout", {"dropout": 0.3, "return_sequences": True}),
        ("both", {"dropout": 0.25, "recurrent_dropout": 0.4}),
        ("recurrent_backwards", {"recurrent_dropout": 0.35, "go_backwards": True,
                                 "return_sequences": True, "seed": 77}),
    ]
    if class_name != "SimpleRNN":
        variants.append(("per_gate", {"dropout": 0.3, "implementation": 1}))
    for variant, options in variants:
        config = dict({"units": 4}, **extra, **options)
        cases.append(dropout_case(f"{tag}_{variant}_dropout", class_name, config, (3, 4, 5),
                                  seed=1234, step=7))
cases.append(dropout_case(
    "bidirectional_lstm_dropout", "Bidirectional",
    {"layer": {"class_name": "LSTM", "config": {"units": 3, "return_sequences": True,
                                                 "dropout": 0.3, "recurrent_dropout": 0.45}},
     "merge_mode": "concat"}, (3, 3, 4), seed=99, step=2, bidirectional=True))

# RNN(StackedRNNCells([...])): at every step the cells run in order, each on the output of the
# one before, which is the same as running each cell over the whole sequence on the sequence of
# the cell before (processing order: only the first reverses a go_backwards sequence). Weights are
# named stacked_rnn_cells/<cell name>/kernel, ...; each cell's dropout is keyed by name/<cell>.
def stacked_case(name, cells, rnn, shape, seed=0, step=0):
    x = rnd(*shape)
    w, per_cell = {}, []
    features = shape[-1]
    for cell_class, cell_config in cells:
        layer = cell_class[:-len("Cell")]
        cw = keras_weights(layer, features, cell_config["units"],
                           cell_config.get("reset_after", True))
        per_cell.append(cw)
        for k, v in cw.items():
            w["stacked_rnn_cells/" + cell_config["name"] + k[k.index("/"):]] = v
        features = cell_config["units"]
    xs = x.clone().requires_grad_(True)
    ws = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    out = xs
    for i, (cell_class, cell_config) in enumerate(cells):
        layer = cell_class[:-len("Cell")]
        direction = dict(cell_config, go_backwards=i == 0 and rnn.get("go_backwards", False))
        cw = {k: ws["stacked_rnn_cells/" + cell_config["name"] + k[k.index("/"):]]
              for k in per_cell[i]}
        masks = direction_masks(layer, cell_config, dropout_key(
            cell_config.get("seed", seed), step, name + "/" + cell_config["name"]), shape[0],
            out.shape[-1]) if seed or step else ([], [])
        out = dropout_direction(layer, direction, out, cw, *masks)
    if not rnn.get("return_sequences", False):
        out = out[:, -1]
    config = dict(rnn, cell={"class_name": "StackedRNNCells", "config": {"cells": [
        {"class_name": c, "config": cc} for c, cc in cells]}})
    return record(name, "RNN", config, x, w, xs, ws, out, seed, step)


lstm_gru = [("LSTMCell", {"units": 4, "name": "lstm_cell"}),
            ("GRUCell", {"units": 3, "name": "gru_cell"})]
cases.append(stacked_case("stacked_lstm_gru_last", lstm_gru, {}, (3, 4, 5)))
cases.append(stacked_case("stacked_lstm_gru_seq_backwards", lstm_gru,
                          {"return_sequences": True, "go_backwards": True}, (3, 4, 5)))
cases.append(stacked_case("stacked_one_simple_rnn", [("SimpleRNNCell", {"units": 3,
                                                                        "name": "cell_a"})],
                          {"return_sequences": True}, (2, 3, 4)))
cases.append(stacked_case(
    "stacked_two_lstm_dropout",
    [("LSTMCell", {"units": 3, "name": "lstm_cell", "dropout": 0.3, "recurrent_dropout": 0.45}),
     ("GRUCell", {"units": 4, "name": "gru_cell", "dropout": 0.4, "reset_after": False})],
    {"return_sequences": True, "go_backwards": True}, (3, 4, 5), seed=5, step=3))

with open(os.path.join(HERE, "reference", "recurrent.json"), "w") as f:
    json.dump({"cases": cases}, f, separators=(",", ":"))
print(len(cases), "cases")
