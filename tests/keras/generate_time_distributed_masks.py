#!/usr/bin/python3
"""Writes tests/keras/reference/time_distributed_masks.json: PyTorch (float64) training of
models in which `TimeDistributed` wraps layers that read the mask of each step, for
tests/keras/test_masking.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_time_distributed_masks.py

Token ids (batch, sentences, words), 0 for padding, go through Embedding(12, 4, mask_zero=True),
whose mask (batch, sentences, words) Keras 3's TimeDistributed.call hands the wrapped layer one
sentence at a time (`mask[:, i]`, of shape (batch, words)). A masked LSTM step keeps the states
and repeats the previous output (zeros before the first unmasked step); GlobalAveragePooling1D
averages the unmasked words. The LSTM's loop (Keras's gates i, f, c, o; kernel (features,
4 units), recurrent_kernel (units, 4 units), one bias) is checked against nn.LSTM on packed
sequences first. Each model starts from the weights written here, takes one plain SGD step on
one batch (mean squared error over every element), and the file holds the loss, the final
weights and the predictions of another batch after the step.
"""
import json
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(6262)
DT = torch.float64
LR = 0.5
VOCAB = 12
SHAPE = (3, 3, 4)  # batch, sentences, words


def rnd(*shape, scale=0.5):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


def masked_lstm(x, m, kernel, recurrent, bias):
    """x (batch, steps, features), m (batch, steps) bool: the outputs of every step."""
    units = recurrent.shape[0]
    h = torch.zeros(x.shape[0], units, dtype=DT)
    c = torch.zeros(x.shape[0], units, dtype=DT)
    out = []
    for t in range(x.shape[1]):
        i, f, g, o = (x[:, t] @ kernel + h @ recurrent + bias).split(units, dim=1)
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        keep = m[:, t:t + 1]
        h = torch.where(keep, h_new, h)
        c = torch.where(keep, c_new, c)
        out.append(h)
    return torch.stack(out, dim=1)


def check_against_torch():
    x = rnd(3, 5, 4)
    lengths = torch.tensor([5, 2, 3])
    m = torch.arange(5).unsqueeze(0) < lengths.unsqueeze(1)
    kernel, recurrent, bias = rnd(4, 8), rnd(2, 8), rnd(8)
    module = torch.nn.LSTM(4, 2, batch_first=True, dtype=DT)
    with torch.no_grad():
        module.weight_ih_l0.copy_(kernel.t())
        module.weight_hh_l0.copy_(recurrent.t())
        module.bias_ih_l0.copy_(bias)
        module.bias_hh_l0.zero_()
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                         enforce_sorted=False)
        _, (h_n, _) = module(packed)
    assert torch.allclose(masked_lstm(x, m, kernel, recurrent, bias)[:, -1], h_n[0], atol=1e-12)


check_against_torch()


def per_sentence(tokens, w, fn):
    """Runs fn(embedded words, mask) on every sentence, as TimeDistributed's loop does."""
    e = F.embedding(tokens, w["embeddings"])
    m = tokens != 0
    return torch.stack([fn(e[:, s], m[:, s]) for s in range(tokens.shape[1])], dim=1)


def td_lstm(w, tokens):
    """Embedding(12, 4, mask_zero=True) -> TimeDistributed(LSTM(3)) -> Flatten -> Dense(2)."""
    h = per_sentence(tokens, w, lambda e, m: masked_lstm(e, m, w["lstm/kernel"],
                                                         w["lstm/recurrent_kernel"],
                                                         w["lstm/bias"])[:, -1])
    return h.reshape(h.shape[0], -1) @ w["dense/kernel"] + w["dense/bias"]


def td_lstm_pool(w, tokens):
    """Embedding(12, 4, mask_zero=True) -> TimeDistributed(LSTM(3, return_sequences=True)) (the
    mask passes) -> TimeDistributed(GlobalAveragePooling1D()) -> Flatten -> Dense(2)."""
    def sentence(e, m):
        seq = masked_lstm(e, m, w["lstm/kernel"], w["lstm/recurrent_kernel"], w["lstm/bias"])
        f = m.to(DT).unsqueeze(-1)
        return (seq * f).sum(dim=1) / f.sum(dim=1)
    h = per_sentence(tokens, w, sentence)
    return h.reshape(h.shape[0], -1) @ w["dense/kernel"] + w["dense/bias"]


def tokens(every_sentence_has_a_word):
    x = torch.randint(1, VOCAB, SHAPE)
    for b in range(SHAPE[0]):
        for s in range(SHAPE[1]):
            keep = int(torch.randint(1, SHAPE[2] + 1, (1,)))
            x[b, s, keep:] = 0
    if not every_sentence_has_a_word:
        x[1, 2] = 0  # a sentence of padding only: the LSTM's zero states
        x[2, 0] = 0
    return x


def run(name, model, full_sentences):
    w = {"embeddings": rnd(VOCAB, 4, scale=1.0), "lstm/kernel": rnd(4, 12),
         "lstm/recurrent_kernel": rnd(3, 12), "lstm/bias": rnd(12, scale=0.1),
         "dense/kernel": rnd(9, 2), "dense/bias": rnd(2, scale=0.1)}
    params = {k: v.clone().requires_grad_() for k, v in w.items()}
    x = tokens(full_sentences)
    p = model(params, x)
    y = torch.rand(*p.shape, dtype=DT)
    loss = ((p - y) ** 2).mean()
    loss.backward()
    final = {k: (v - LR * v.grad).detach() for k, v in params.items()}
    x2 = tokens(full_sentences)
    with torch.no_grad():
        predicted = model(final, x2)
    return {"name": name, "weight_order": list(w),
            "initial_weights": {k: flat(v) for k, v in w.items()}, "x": flat(x), "y": flat(y),
            "loss": float(loss), "final_weights": {k: flat(v) for k, v in final.items()},
            "predict_x": flat(x2), "prediction": flat(predicted)}


cases = [run("td_lstm", td_lstm, False), run("td_lstm_pool", td_lstm_pool, True)]

with open(os.path.join(HERE, "reference", "time_distributed_masks.json"), "w") as out:
    json.dump({"generator": "tests/keras/generate_time_distributed_masks.py", "lr": LR,
               "shape": list(SHAPE), "cases": cases}, out, separators=(",", ":"))
    out.write("\n")
print("wrote", len(cases), "cases")
