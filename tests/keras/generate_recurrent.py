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
    g = rnd(*out.shape)
    (out * g).sum().backward()
    return {
        "name": name,
        "class_name": class_name,
        "config": config,
        "training": True,
        "input_shapes": [list(shape)],
        "inputs": [flat(x)],
        "weights": {k: flat(v) for k, v in w.items()},
        "upstream": flat(g),
        "output_shape": list(out.shape),
        "output": flat(out),
        "input_gradients": [flat(xs.grad)],
        "weight_gradients": {k: flat(v.grad) for k, v in ws.items()},
        "updated_weights": {},
    }


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

with open(os.path.join(HERE, "reference", "recurrent.json"), "w") as f:
    json.dump({"cases": cases}, f, separators=(",", ":"))
print(len(cases), "cases")
