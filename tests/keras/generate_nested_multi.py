#!/usr/bin/python3
"""Writes tests/keras/reference/nested_multi.json: PyTorch (float64) predictions and one SGD
step of models that use a nested model of several inputs or several outputs, for
tests/keras/test_nested_models.cpp.

- multi_io: x -> Dense "pre" (tanh); [a nested functional model "pair" of inputs a, b:
  ha = Dense(tanh)(a), gb = Dense(b), s = Add([ha, gb]), d1 = Dense(s); outputs d1, s and its
  input a] called on [pre, y]; Concatenate of its three outputs -> Dense "head". An output
  that a layer inside reads too (s), and one that is an input (a), get the outer gradient added.
- encoder_states: tokens -> Embedding(mask_zero=True) -> [a nested model "encoder": an LSTM
  with return_sequences and return_state; outputs the sequence and h, not c] ->
  GlobalAveragePooling1D of the sequence (which carries the outer mask) and h -> Concatenate
  -> Dense "head".
- inner_states: as encoder_states with the Embedding inside the encoder: the mask is made
  inside and carried out on the sequence, not on the state.

Keras's semantics written out: Embedding's mask is tokens != 0; an LSTM step (gates i, f, c, o
in Keras's kernel layout) at a masked step keeps the states and outputs the previous output; its
returned state h is the last kept one; GlobalAveragePooling1D with a mask is
sum(x * mask) / sum(mask). The loss is the mean squared error, the step SGD with learning rate
0.5. Weights are keyed "<outer layer>/<variable>" ("pair/d1/kernel" inside the nested model).

    /usr/bin/python3 tests/keras/generate_nested_multi.py
"""
import json
import os

import torch

from masked_lstm_reference import DT, flat, lstm_steps, rnd

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(5023)
LR = 0.5


def lstm(x, mask, kernel, recurrent, bias, units):
    return lstm_steps(x, mask, kernel, recurrent, bias, units)


def run(name, inputs, targets, weights, forward):
    y = forward(weights)
    loss = ((y - targets) ** 2).mean()
    loss.backward()
    return {"name": name,
            "inputs": [{"shape": list(x.shape), "values": flat(x.to(DT))} for x in inputs],
            "targets": {"shape": list(targets.shape), "values": flat(targets)},
            "weights": {k: {"shape": list(w.shape), "values": flat(w)} for k, w in weights.items()},
            "predictions": flat(y), "loss": float(loss),
            "updated": {k: flat(w - LR * w.grad) for k, w in weights.items()}}


X = torch.rand(4, 4, dtype=DT) * 2 - 1
Y = torch.rand(4, 3, dtype=DT) * 2 - 1
T = torch.rand(4, 1, dtype=DT) * 2 - 1


def multi_io(w):
    pre = torch.tanh(X @ w["pre/kernel"] + w["pre/bias"])
    ha = torch.tanh(pre @ w["pair/ha/kernel"] + w["pair/ha/bias"])
    gb = Y @ w["pair/gb/kernel"] + w["pair/gb/bias"]
    s = ha + gb
    d1 = s @ w["pair/d1/kernel"] + w["pair/d1/bias"]
    cat = torch.cat([d1, s, pre], dim=1)
    return cat @ w["head/kernel"] + w["head/bias"]


TOKENS = torch.tensor([[3, 1, 0, 0, 0], [2, 5, 7, 1, 4], [0, 6, 2, 0, 8], [1, 0, 0, 0, 0]])
TOKEN_TARGETS = torch.tensor([[0.5], [-0.25], [1.0], [0.0]], dtype=DT)
VOCAB, EMBED, UNITS = 9, 3, 4


def states_model(embedding, scope):
    def forward(w):
        mask = TOKENS != 0
        seq, h = lstm(w[embedding][TOKENS], mask, w[scope + "kernel"],
                      w[scope + "recurrent_kernel"], w[scope + "bias"], UNITS)
        m = mask.to(DT).unsqueeze(-1)
        pooled = (seq * m).sum(dim=1) / m.sum(dim=1)
        return torch.cat([pooled, h], dim=1) @ w["head/kernel"] + w["head/bias"]
    return forward


def lstm_weights(scope):
    return {scope + "kernel": rnd(EMBED, 4 * UNITS),
            scope + "recurrent_kernel": rnd(UNITS, 4 * UNITS),
            scope + "bias": rnd(4 * UNITS, scale=0.2)}


cases = [
    run("multi_io", [X, Y], T,
        {"pre/kernel": rnd(4, 4), "pre/bias": rnd(4, scale=0.2),
         "pair/ha/kernel": rnd(4, 5), "pair/ha/bias": rnd(5, scale=0.2),
         "pair/gb/kernel": rnd(3, 5), "pair/gb/bias": rnd(5, scale=0.2),
         "pair/d1/kernel": rnd(5, 2), "pair/d1/bias": rnd(2, scale=0.2),
         "head/kernel": rnd(11, 1), "head/bias": rnd(1, scale=0.2)}, multi_io),
    run("encoder_states", [TOKENS], TOKEN_TARGETS,
        {"words/embeddings": rnd(VOCAB, EMBED), **lstm_weights("encoder/enc_lstm/lstm_cell/"),
         "head/kernel": rnd(2 * UNITS, 1), "head/bias": rnd(1, scale=0.2)},
        states_model("words/embeddings", "encoder/enc_lstm/lstm_cell/")),
    run("inner_states", [TOKENS], TOKEN_TARGETS,
        {"encoder/words/embeddings": rnd(VOCAB, EMBED), **lstm_weights("encoder/enc_lstm/lstm_cell/"),
         "head/kernel": rnd(2 * UNITS, 1), "head/bias": rnd(1, scale=0.2)},
        states_model("encoder/words/embeddings", "encoder/enc_lstm/lstm_cell/")),
]
with open(os.path.join(HERE, "reference", "nested_multi.json"), "w") as f:
    json.dump({"generator": "tests/keras/generate_nested_multi.py", "cases": cases}, f,
              indent=None, separators=(",", ":"))
    f.write("\n")
