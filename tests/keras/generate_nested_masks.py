#!/usr/bin/python3
"""Writes tests/keras/reference/nested_masks.json: PyTorch (float64) predictions and one SGD
step of two models whose masks run through a nested model, for tests/keras/test_masking.cpp.

- inner_mask: tokens -> [a nested Sequential: Embedding(mask_zero=True) -> LSTM returning
  sequences] -> GlobalAveragePooling1D -> Dense(1). The mask is made inside the nested model,
  read by its LSTM, and carried out of it to the pooling, which averages the unmasked steps.
- given_mask: tokens -> Embedding(mask_zero=True) -> [a nested functional model: Dense(tanh) ->
  LSTM returning its last output] -> Dense(1). The outer mask is the nested model's input mask;
  the Dense inside passes it on and the LSTM skips the masked steps.

Keras's semantics written out: Embedding's mask is tokens != 0; an LSTM step (gates i, f, c, o
in Keras's kernel layout, sigmoid and tanh) at a masked step keeps the states and outputs the
previous output (zeros before the first); GlobalAveragePooling1D with a mask is
sum(x * mask) / sum(mask) over the steps (Keras 3). The loss is the mean squared error and the
step SGD with learning rate 0.5: the reference holds the weights after it, in the model's order.

    /usr/bin/python3 tests/keras/generate_nested_masks.py
"""
import json
import os

import torch

from masked_lstm_reference import DT, flat, lstm_steps, rnd

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(4311)
LR = 0.5


def lstm(x, mask, kernel, recurrent, bias, units, sequences):
    outputs, h = lstm_steps(x, mask, kernel, recurrent, bias, units)
    return outputs if sequences else h


TOKENS = torch.tensor([[3, 1, 0, 0, 0], [2, 5, 7, 1, 4], [0, 6, 2, 0, 8], [1, 0, 0, 0, 0]])
TARGETS = torch.tensor([[0.5], [-0.25], [1.0], [0.0]], dtype=DT)
VOCAB, EMBED, UNITS, HIDDEN = 9, 3, 4, 5


def run(name, weights, forward):
    y = forward(weights)
    loss = ((y - TARGETS) ** 2).mean()
    loss.backward()
    return {"name": name, "tokens": flat(TOKENS.to(DT)), "targets": flat(TARGETS),
            "weights": [flat(w) for w in weights], "shapes": [list(w.shape) for w in weights],
            "predictions": flat(y), "loss": float(loss),
            "updated": [flat(w - LR * w.grad) for w in weights]}


def inner_mask(w):
    embeddings, kernel, recurrent, bias, dense_kernel, dense_bias = w
    mask = TOKENS != 0
    h = lstm(embeddings[TOKENS], mask, kernel, recurrent, bias, UNITS, True)
    m = mask.to(DT).unsqueeze(-1)
    pooled = (h * m).sum(dim=1) / m.sum(dim=1)
    return pooled @ dense_kernel + dense_bias


def given_mask(w):
    embeddings, inner_kernel, inner_bias, kernel, recurrent, bias, dense_kernel, dense_bias = w
    mask = TOKENS != 0
    x = torch.tanh(embeddings[TOKENS] @ inner_kernel + inner_bias)
    h = lstm(x, mask, kernel, recurrent, bias, UNITS, False)
    return h @ dense_kernel + dense_bias


cases = [
    run("inner_mask", [rnd(VOCAB, EMBED), rnd(EMBED, 4 * UNITS), rnd(UNITS, 4 * UNITS),
                       rnd(4 * UNITS, scale=0.2), rnd(UNITS, 1), rnd(1, scale=0.2)], inner_mask),
    run("given_mask", [rnd(VOCAB, EMBED), rnd(EMBED, HIDDEN), rnd(HIDDEN, scale=0.2),
                       rnd(HIDDEN, 4 * UNITS), rnd(UNITS, 4 * UNITS), rnd(4 * UNITS, scale=0.2),
                       rnd(UNITS, 1), rnd(1, scale=0.2)], given_mask),
]
with open(os.path.join(HERE, "reference", "nested_masks.json"), "w") as f:
    json.dump({"generator": "tests/keras/generate_nested_masks.py", "cases": cases}, f,
              indent=None, separators=(",", ":"))
    f.write("\n")
