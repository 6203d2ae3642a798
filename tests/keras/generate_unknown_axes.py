#!/usr/bin/python3
"""Writes tests/keras/reference/unknown_axes.json: PyTorch (float64) training of six text models
whose inputs have a sequence axis of unknown length (Keras's `Input(shape=(None,))`), fed batches
of different lengths one after another, for tests/keras/test_unknown_axes.cpp.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_unknown_axes.py

Each model starts from the weights written here (in Keras's layouts), takes one plain SGD step per
batch, and the file holds the loss of every step (computed before its update, as Keras's
`train_on_batch` returns it), the predictions of a last batch of another length, and the final
weights. PyTorch modules do the computing where they match Keras exactly:
- `Embedding`: `nn.functional.embedding` with Keras's `embeddings` `(input_dim, output_dim)`.
- `LSTM`: the cell's formulas in a loop, first checked against `nn.LSTM`; Keras's gates are i, f, c, o as PyTorch's i, f, g, o, its `kernel`
  `(features, 4 units)` is `weight_ih_l0` transposed, `recurrent_kernel` `weight_hh_l0`
  transposed, and its one `bias` is `bias_ih_l0` with `bias_hh_l0` zero.
- `Bidirectional(LSTM, merge_mode="concat", return_sequences=True)`: the same loop run backwards
  over time, checked against `nn.LSTM(bidirectional=True)` (whose reverse direction's outputs come
  back in time order, as Keras returns them); Keras lists the forward direction's three weights,
  then the backward one's.
- `MultiHeadAttention`: Keras's formulas written out with einsum (query, key, value kernels
  `(dim, heads, key_dim)`, biases `(heads, key_dim)`, output kernel `(heads, value_dim, dim)`).
- `LayerNormalization(epsilon=1e-3)`, `GlobalAveragePooling1D`, `Dense`, `TimeDistributed(Dense)`:
  the plain formulas.
- `Conv1D` (valid padding and strides 2, or same padding), `GlobalMaxPooling1D`,
  `MaxPooling1D`, `AveragePooling1D`: `F.conv1d`, a max over the steps, `F.max_pool1d`,
  `F.avg_pool1d`.
- `GRU` (reset_after): the cell's formulas in a loop, first checked against `nn.GRU` (its gates
  r, z, n are Keras's r, z, h; Keras's kernel columns are z, r, h). `SimpleRNN`: its one formula.
- `ZeroPadding1D`, `Cropping1D`, `UpSampling1D`: `F.pad`, slicing, `repeat_interleave`.
- `BatchNormalization` on a masked input, `Concatenate` of masked and unmasked inputs along the
  steps: Keras 3's masked moments and `Concatenate.compute_mask`, written out (below).
Losses: sparse categorical crossentropy on softmax outputs, binary crossentropy on sigmoid outputs
and mean squared error, each the mean over every sample (and step) of the batch, as Keras's
`sum_over_batch_size`.
"""
import json
import math
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(4242)
DT = torch.float64
VOCAB = 12
LR = 0.5
LENGTHS = [6, 2, 9, 1, 6]  # the training batches' lengths, in order
BATCH = 3
PREDICT_LENGTH = 4


def rnd(*shape, scale=0.5):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


def tokens(length):
    return torch.randint(0, VOCAB, (BATCH, length))


def lstm_direction(x, kernel, recurrent, bias, reverse=False):
    """One LSTM direction over x (batch, steps, features): Keras's (and PyTorch's) gates i, f, c, o;
    the outputs of every step in time order."""
    units = recurrent.shape[0]
    h = torch.zeros(x.shape[0], units, dtype=DT)
    c = torch.zeros(x.shape[0], units, dtype=DT)
    steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    out = [None] * x.shape[1]
    for t in steps:
        z = x[:, t] @ kernel + h @ recurrent + bias
        i, f, g, o = z.split(units, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out[t] = h
    return torch.stack(out, dim=1)


def lstm(x, kernel, recurrent, bias, bidirectional=False, back=None):
    out = lstm_direction(x, kernel, recurrent, bias)
    if bidirectional:
        out = torch.cat([out, lstm_direction(x, *back, reverse=True)], dim=2)
    return out


def check_lstm_against_torch():
    """The loop above against nn.LSTM (both directions), with Keras's layout mapped."""
    x = rnd(2, 5, 3)
    fw = (rnd(3, 8), rnd(2, 8), rnd(8))
    bw = (rnd(3, 8), rnd(2, 8), rnd(8))
    module = torch.nn.LSTM(3, 2, batch_first=True, bidirectional=True, dtype=DT)
    with torch.no_grad():
        for suffix, (k, r, b) in (("", fw), ("_reverse", bw)):
            getattr(module, "weight_ih_l0" + suffix).copy_(k.t())
            getattr(module, "weight_hh_l0" + suffix).copy_(r.t())
            getattr(module, "bias_ih_l0" + suffix).copy_(b)
            getattr(module, "bias_hh_l0" + suffix).zero_()
        expected, _ = module(x)
    assert torch.allclose(lstm(x, *fw, bidirectional=True, back=bw), expected, atol=1e-12)


check_lstm_against_torch()


def text_lstm(w, x):
    """Embedding(12, 5) -> LSTM(4) -> Dense(3, softmax)."""
    h = F.embedding(x, w["embeddings"])
    h = lstm(h, w["lstm/kernel"], w["lstm/recurrent_kernel"], w["lstm/bias"])[:, -1]
    return torch.softmax(h @ w["dense/kernel"] + w["dense/bias"], dim=-1)


def text_attention(w, x):
    """Embedding(12, 8) -> MultiHeadAttention(2, 3) self-attention -> Add -> LayerNormalization
    -> GlobalAveragePooling1D -> Dense(2)."""
    e = F.embedding(x, w["embeddings"])
    q = torch.einsum("btd,dhk->bthk", e, w["mha/query/kernel"]) + w["mha/query/bias"]
    k = torch.einsum("btd,dhk->bthk", e, w["mha/key/kernel"]) + w["mha/key/bias"]
    v = torch.einsum("btd,dhk->bthk", e, w["mha/value/kernel"]) + w["mha/value/bias"]
    scores = torch.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    p = torch.softmax(scores, dim=-1)
    o = torch.einsum("bhqs,bshk->bqhk", p, v)
    a = torch.einsum("bqhk,hkd->bqd", o, w["mha/attention_output/kernel"]) + \
        w["mha/attention_output/bias"]
    r = e + a
    mean = r.mean(dim=-1, keepdim=True)
    var = ((r - mean) ** 2).mean(dim=-1, keepdim=True)
    n = (r - mean) / torch.sqrt(var + 1e-3) * w["norm/gamma"] + w["norm/beta"]
    pooled = n.mean(dim=1)
    return pooled @ w["dense/kernel"] + w["dense/bias"]


def tagger(w, x):
    """Embedding(12, 5) -> Bidirectional(LSTM(3, return_sequences=True)) ->
    TimeDistributed(Dense(1))."""
    e = F.embedding(x, w["embeddings"])
    h = lstm(e, w["fw/kernel"], w["fw/recurrent_kernel"], w["fw/bias"], bidirectional=True,
             back=(w["bw/kernel"], w["bw/recurrent_kernel"], w["bw/bias"]))
    return h @ w["td/kernel"] + w["td/bias"]


def text_cnn(w, x):
    """Embedding(12, 6) -> Conv1D(4, 3, strides=2, relu) -> GlobalMaxPooling1D ->
    Dense(1, sigmoid), as Keras's "text classification from scratch" example on Input(None).
    PyTorch's conv1d weight (out, in, k) is Keras's kernel (k, in, out) transposed."""
    e = F.embedding(x, w["embeddings"]).transpose(1, 2)
    h = torch.relu(F.conv1d(e, w["conv/kernel"].permute(2, 1, 0), w["conv/bias"], stride=2))
    pooled = h.max(dim=2).values
    return torch.sigmoid(pooled @ w["dense/kernel"] + w["dense/bias"])


def text_cnn_pooled(w, x):
    """Embedding(12, 6) -> Conv1D(4, 3, padding="same", relu) -> MaxPooling1D(2) ->
    AveragePooling1D(2) -> GlobalAveragePooling1D -> Dense(1, sigmoid). TensorFlow's "same"
    padding of a size-3 kernel at stride 1 is one step on each side, as PyTorch's padding=1."""
    e = F.embedding(x, w["embeddings"]).transpose(1, 2)
    h = torch.relu(F.conv1d(e, w["conv/kernel"].permute(2, 1, 0), w["conv/bias"], padding=1))
    h = F.avg_pool1d(F.max_pool1d(h, 2), 2)
    return torch.sigmoid(h.mean(dim=2) @ w["dense/kernel"] + w["dense/bias"])


def bce(p, y):
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def lstm_weights(prefix, features, units):
    return {prefix + "kernel": rnd(features, 4 * units), prefix + "recurrent_kernel":
            rnd(units, 4 * units), prefix + "bias": rnd(4 * units, scale=0.1)}


def run(name, forward, weights, loss, targets, lengths=LENGTHS, make_tokens=None, metric=None,
        predict_length=PREDICT_LENGTH):
    """One SGD step per batch; `forward` may return (output, tokens) for a loss that reads the
    mask, and `metric(output, y, tokens)` is recorded per batch as "accuracies"."""
    make_tokens = make_tokens or tokens
    w = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    batches, losses, accuracies = [], [], []
    for length in lengths:
        x = make_tokens(length)
        y = targets(x)
        out = forward(w, x)
        value = loss(out, y)
        if metric is not None:
            accuracies.append(metric(out[0].detach(), y, x))
        for v in w.values():
            v.grad = None
        value.backward()
        with torch.no_grad():
            for v in w.values():
                if v.grad is not None:  # a non-trainable weight (moving statistics) has none
                    v -= LR * v.grad
        batches.append({"x": x.reshape(-1).tolist(), "length": length, "y": flat(y),
                        "y_shape": list(y.shape)})
        losses.append(float(value))
    x = make_tokens(predict_length)
    with torch.no_grad():
        prediction = forward(w, x)
        if isinstance(prediction, tuple):  # (output, tokens) of a loss that reads the mask
            prediction = prediction[0]
    extra = {"accuracies": accuracies} if metric is not None else {}
    return {"name": name, "batches": batches, "losses": losses, **extra,
            "initial_weights": {k: flat(v) for k, v in weights.items()},
            "weight_order": list(weights.keys()),
            "predict_x": x.reshape(-1).tolist(), "prediction": flat(prediction),
            "prediction_shape": list(prediction.shape),
            "final_weights": {k: flat(v) for k, v in w.items()}}


def sparse_ce(p, y):
    return -torch.log(p.gather(1, y.view(-1, 1))).mean()


def mse(p, y):
    return ((p - y) ** 2).mean()


cases = []
w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("lstm/", 5, 4))
w.update({"dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1)})
cases.append(run("text_lstm", text_lstm, w, sparse_ce, lambda x: (x.sum(dim=1) % 3)))

w = {"embeddings": rnd(VOCAB, 8, scale=1.0)}
for p in ("query", "key", "value"):
    w["mha/%s/kernel" % p] = rnd(8, 2, 3)
    w["mha/%s/bias" % p] = rnd(2, 3, scale=0.1)
w["mha/attention_output/kernel"] = rnd(2, 3, 8)
w["mha/attention_output/bias"] = rnd(8, scale=0.1)
w.update({"norm/gamma": 1 + rnd(8, scale=0.1), "norm/beta": rnd(8, scale=0.1),
          "dense/kernel": rnd(8, 2), "dense/bias": rnd(2, scale=0.1)})
cases.append(run("text_attention", text_attention, w, mse,
                 lambda x: torch.stack([(x < 6).to(DT).mean(dim=1), (x % 2).to(DT).mean(dim=1)],
                                       dim=1)))

w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("fw/", 5, 3))
w.update(lstm_weights("bw/", 5, 3))
w.update({"td/kernel": rnd(6, 1), "td/bias": rnd(1, scale=0.1)})
cases.append(run("tagger", tagger, w, mse, lambda x: (x % 2).to(DT).unsqueeze(-1)))

w = {"embeddings": rnd(VOCAB, 6, scale=1.0), "conv/kernel": rnd(3, 6, 4),
     "conv/bias": rnd(4, scale=0.1), "dense/kernel": rnd(4, 1), "dense/bias": rnd(1, scale=0.1)}
cases.append(run("text_cnn", text_cnn, w, bce, lambda x: (x < 6).to(DT).mean(dim=1, keepdim=True).round(),
                 lengths=[7, 3, 10, 4, 8]))

w = {"embeddings": rnd(VOCAB, 6, scale=1.0), "conv/kernel": rnd(3, 6, 4),
     "conv/bias": rnd(4, scale=0.1), "dense/kernel": rnd(4, 1), "dense/bias": rnd(1, scale=0.1)}
cases.append(run("text_cnn_pooled", text_cnn_pooled, w, bce,
                 lambda x: (x < 6).to(DT).mean(dim=1, keepdim=True).round(),
                 lengths=[7, 4, 10, 5, 8]))

def gru_direction(x, kernel, recurrent, bias):
    """Keras's GRU with reset_after (its default): gates z, r, h; bias (2, 3 units), the input
    bias then the recurrent one; h = z * h_prev + (1 - z) * candidate."""
    units = recurrent.shape[0]
    h = torch.zeros(x.shape[0], units, dtype=DT)
    out = []
    for t in range(x.shape[1]):
        xz, xr, xh = (x[:, t] @ kernel + bias[0]).split(units, dim=1)
        hz, hr, hh = (h @ recurrent + bias[1]).split(units, dim=1)
        z = torch.sigmoid(xz + hz)
        r = torch.sigmoid(xr + hr)
        h = z * h + (1 - z) * torch.tanh(xh + r * hh)
        out.append(h)
    return torch.stack(out, dim=1)


def check_gru_against_torch():
    """The loop above against nn.GRU: PyTorch's gates r, z, n are Keras's r, z, h, so Keras's
    kernel columns (z, r, h) are PyTorch's rows (r, z, n) reordered and transposed."""
    x = rnd(2, 5, 3)
    kernel, recurrent, bias = rnd(3, 6), rnd(2, 6), rnd(2, 6)
    module = torch.nn.GRU(3, 2, batch_first=True, dtype=DT)

    def torch_order(m):  # columns z, r, h -> rows r, z, n
        z, r, h = m.split(2, dim=-1)
        return torch.cat([r, z, h], dim=-1).t() if m.dim() == 2 else torch.cat([r, z, h])

    with torch.no_grad():
        module.weight_ih_l0.copy_(torch_order(kernel))
        module.weight_hh_l0.copy_(torch_order(recurrent))
        module.bias_ih_l0.copy_(torch_order(bias[0]))
        module.bias_hh_l0.copy_(torch_order(bias[1]))
        expected, _ = module(x)
    assert torch.allclose(gru_direction(x, kernel, recurrent, bias), expected, atol=1e-12)


check_gru_against_torch()


def padded_gru(w, x):
    """Embedding(12, 5) -> ZeroPadding1D((1, 2)) -> GRU(4, return_sequences=True) ->
    Cropping1D((1, 1)) -> UpSampling1D(2) -> SimpleRNN(3) -> Dense(2). SimpleRNN is
    h = tanh(x kernel + h recurrent_kernel + bias)."""
    e = F.pad(F.embedding(x, w["embeddings"]), (0, 0, 1, 2))
    h = gru_direction(e, w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"])
    h = h[:, 1:-1].repeat_interleave(2, dim=1)
    s = torch.zeros(x.shape[0], 3, dtype=DT)
    for t in range(h.shape[1]):
        s = torch.tanh(h[:, t] @ w["rnn/kernel"] + s @ w["rnn/recurrent_kernel"] + w["rnn/bias"])
    return s @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0), "gru/kernel": rnd(5, 12),
     "gru/recurrent_kernel": rnd(4, 12), "gru/bias": rnd(2, 12, scale=0.1),
     "rnn/kernel": rnd(4, 3), "rnn/recurrent_kernel": rnd(3, 3), "rnn/bias": rnd(3, scale=0.1),
     "dense/kernel": rnd(3, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("padded_gru", padded_gru, w, mse,
                 lambda x: torch.stack([(x < 6).to(DT).mean(dim=1), (x % 3).to(DT).mean(dim=1)],
                                       dim=1),
                 lengths=[5, 1, 7, 2, 4]))


# Masks (Keras's Masking and Embedding(mask_zero=True)). Keras's backend.rnn with a mask: at a
# masked step every state keeps its value from the step before, and the step's output is the
# previous output (or 0 with zero_output_for_mask, which Bidirectional sets when it returns
# sequences); the last output is the last step's. GlobalAveragePooling1D averages the unmasked
# steps. The mask follows Dense, SimpleRNN/GRU with return_sequences, and stops at Conv1D.


def large_and_odd(x):
    """Two regression targets of a token sequence: the fractions of tokens above 5 and of odd
    ones."""
    return torch.stack([(x > 5).to(DT).mean(dim=1), (x % 2).to(DT).mean(dim=1)], dim=1)


def masked_tokens(length):
    """Tokens 1..11 padded at the end with 0 (each row keeps at least one token), and now and then
    a 0 inside, which a mask skips as well."""
    x = torch.randint(1, VOCAB, (BATCH, length))
    for b in range(BATCH):
        keep = int(torch.randint(1, length + 1, (1,)))
        x[b, keep:] = 0
        if keep > 2 and float(torch.rand(1)) < 0.5:
            x[b, int(torch.randint(1, keep - 1, (1,)))] = 0
    return x


def state_loop(cell, x, m, units, h0=None, c0=None, reverse=False, zero_output=False):
    """A recurrent direction over x (batch, steps, features) with mask m (batch, steps): `cell`
    maps (x_t, h, c) to (h, c), and a masked step keeps both. Starts from the initial states h0
    and c0 (zeros when None); returns the outputs in processing order (reversed for
    go_backwards; 0 at masked steps with zero_output) and the final states (those of the last
    unmasked step, as Keras's `return_state`)."""
    h = h0 if h0 is not None else torch.zeros(x.shape[0], units, dtype=DT)
    c = c0 if c0 is not None else torch.zeros(x.shape[0], units, dtype=DT)
    steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
    out = []
    for t in steps:
        h_new, c_new = cell(x[:, t], h, c)
        keep = m[:, t:t + 1]
        h = torch.where(keep, h_new, h)
        c = torch.where(keep, c_new, c)
        out.append(torch.where(keep, h, torch.zeros_like(h)) if zero_output else h)
    return torch.stack(out, dim=1), h, c


def masked_loop(cell, x, m, units, reverse=False, zero_output=False):
    """`state_loop` from zero states: its outputs alone."""
    return state_loop(cell, x, m, units, reverse=reverse, zero_output=zero_output)[0]


def torch_lstm(kernel, recurrent, bias):
    """nn.LSTM with Keras's weights: weight_ih = kernel.T, weight_hh = recurrent_kernel.T,
    bias_ih = bias and bias_hh = 0 (Keras has one bias)."""
    module = torch.nn.LSTM(kernel.shape[0], recurrent.shape[0], batch_first=True, dtype=DT)
    with torch.no_grad():
        module.weight_ih_l0.copy_(kernel.t())
        module.weight_hh_l0.copy_(recurrent.t())
        module.bias_ih_l0.copy_(bias)
        module.bias_hh_l0.zero_()
    return module


def lstm_cell(kernel, recurrent, bias):
    units = recurrent.shape[0]

    def cell(x, h, c):
        i, f, g, o = (x @ kernel + h @ recurrent + bias).split(units, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    return cell


def gru_cell(kernel, recurrent, bias):
    units = recurrent.shape[0]

    def cell(x, h, c):
        xz, xr, xh = (x @ kernel + bias[0]).split(units, dim=1)
        hz, hr, hh = (h @ recurrent + bias[1]).split(units, dim=1)
        z = torch.sigmoid(xz + hz)
        r = torch.sigmoid(xr + hr)
        return z * h + (1 - z) * torch.tanh(xh + r * hh), c
    return cell


def rnn_cell(kernel, recurrent, bias):
    return lambda x, h, c: (torch.tanh(x @ kernel + h @ recurrent + bias), c)


def check_masked_lstm_against_packed():
    """On sequences padded at the end, the masked loop's last output is nn.LSTM's final hidden
    state over the packed (unpadded) sequences, and its outputs past each end repeat it."""
    x = rnd(3, 6, 4)
    lengths = torch.tensor([6, 2, 4])
    m = torch.arange(6).unsqueeze(0) < lengths.unsqueeze(1)
    kernel, recurrent, bias = rnd(4, 8), rnd(2, 8), rnd(8)
    module = torch_lstm(kernel, recurrent, bias)
    with torch.no_grad():
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True,
                                                         enforce_sorted=False)
        _, (h_n, _) = module(packed)
    out = masked_loop(lstm_cell(kernel, recurrent, bias), x, m, 2)
    assert torch.allclose(out[:, -1], h_n[0], atol=1e-12)
    for b, n in enumerate(lengths.tolist()):
        assert torch.allclose(out[b, n - 1:], h_n[0, b].expand(6 - n + 1, 2), atol=1e-12)


check_masked_lstm_against_packed()


def masked_lstm(w, x):
    """Embedding(12, 5, mask_zero=True) -> LSTM(4, go_backwards=True) -> Dense(3, softmax)."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    h = masked_loop(lstm_cell(w["lstm/kernel"], w["lstm/recurrent_kernel"], w["lstm/bias"]), e, m,
                    4, reverse=True)[:, -1]
    return torch.softmax(h @ w["dense/kernel"] + w["dense/bias"], dim=-1)


def masked_bilstm_conv(w, x):
    """Embedding(12, 5, mask_zero=True) -> Bidirectional(LSTM(3, return_sequences=True)) (masked
    outputs 0 in both directions) -> Conv1D(2, 2, relu) (the mask stops) -> GlobalMaxPooling1D ->
    Dense(1, sigmoid)."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    f = masked_loop(lstm_cell(w["fw/kernel"], w["fw/recurrent_kernel"], w["fw/bias"]), e, m, 3,
                    zero_output=True)
    b = masked_loop(lstm_cell(w["bw/kernel"], w["bw/recurrent_kernel"], w["bw/bias"]), e, m, 3,
                    reverse=True, zero_output=True)
    h = torch.cat([f, torch.flip(b, dims=[1])], dim=2).transpose(1, 2)
    c = torch.relu(F.conv1d(h, w["conv/kernel"].permute(2, 1, 0), w["conv/bias"]))
    return torch.sigmoid(c.max(dim=2).values @ w["dense/kernel"] + w["dense/bias"])


def masking_rnn_pool(w, x):
    """Embedding(12, 4) (row 0 zero) -> Masking(0.0) -> SimpleRNN(3, return_sequences=True) ->
    Dense(3, tanh) -> GRU(2, return_sequences=True) -> GlobalAveragePooling1D (of the unmasked
    steps) -> Dense(2). Masking's mask is any(e != 0) over the features, and its output e there."""
    e = F.embedding(x, w["embeddings"])
    m = (e != 0).any(dim=-1)
    e = torch.where(m.unsqueeze(-1), e, torch.zeros_like(e))
    h = masked_loop(rnn_cell(w["rnn/kernel"], w["rnn/recurrent_kernel"], w["rnn/bias"]), e, m, 3)
    h = torch.tanh(h @ w["mid/kernel"] + w["mid/bias"])
    g = masked_loop(gru_cell(w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"]), h, m, 2)
    mf = m.to(DT).unsqueeze(-1)
    pooled = (g * mf).sum(dim=1) / mf.sum(dim=1)
    return pooled @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("lstm/", 5, 4))
w.update({"dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1)})
cases.append(run("masked_lstm", masked_lstm, w, sparse_ce, lambda x: (x.sum(dim=1) % 3),
                 make_tokens=masked_tokens))

w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("fw/", 5, 3))
w.update(lstm_weights("bw/", 5, 3))
w.update({"conv/kernel": rnd(2, 6, 2), "conv/bias": rnd(2, scale=0.1), "dense/kernel": rnd(2, 1),
          "dense/bias": rnd(1, scale=0.1)})
cases.append(run("masked_bilstm_conv", masked_bilstm_conv, w, bce,
                 lambda x: ((x > 0) & (x < 6)).to(DT).mean(dim=1, keepdim=True).round(),
                 lengths=[6, 3, 9, 2, 6], make_tokens=masked_tokens))

embeddings = rnd(VOCAB, 4, scale=1.0)
embeddings[0] = 0.0
w = {"embeddings": embeddings, "rnn/kernel": rnd(4, 3), "rnn/recurrent_kernel": rnd(3, 3),
     "rnn/bias": rnd(3, scale=0.1), "mid/kernel": rnd(3, 3), "mid/bias": rnd(3, scale=0.1),
     "gru/kernel": rnd(3, 6), "gru/recurrent_kernel": rnd(2, 6), "gru/bias": rnd(2, 6, scale=0.1),
     "dense/kernel": rnd(2, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("masking_rnn_pool", masking_rnn_pool, w, mse,
                 large_and_odd,
                 make_tokens=masked_tokens))



def masked_tagger(w, x):
    """Embedding(12, 5, mask_zero=True) -> GRU(4, return_sequences=True) -> Dense(3, softmax):
    one class per step, the output carrying the mask."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    h = masked_loop(gru_cell(w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"]), e, m, 4)
    return torch.softmax(h @ w["dense/kernel"] + w["dense/bias"], dim=-1)


def masked_sparse_ce(p, y, x):
    """Keras 3's loss of an output with a mask (losses.loss.apply_mask): each unmasked step's
    crossentropy weighted total / valid, then the mean over every step: the mean over the
    unmasked steps."""
    m = (x != 0).to(DT)
    ce = -torch.log(p.gather(2, y.unsqueeze(-1)).squeeze(-1))
    return (ce * m * (m.numel() / m.sum())).sum() / m.numel()


def masked_accuracy(p, y, x):
    """Keras 3's MeanMetricWrapper on a masked output: the mean over the unmasked steps."""
    m = x != 0
    return float(((p.argmax(dim=-1) == y) & m).sum()) / float(m.sum())


w = {"embeddings": rnd(VOCAB, 5, scale=1.0), "gru/kernel": rnd(5, 12),
     "gru/recurrent_kernel": rnd(4, 12), "gru/bias": rnd(2, 12, scale=0.1),
     "dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1)}
cases.append(run("masked_tagger", lambda w, x: (masked_tagger(w, x), x), w,
                 lambda px, y: masked_sparse_ce(px[0], y, px[1]), lambda x: x % 3,
                 make_tokens=masked_tokens, metric=masked_accuracy))



def keras_masked_softmax(scores, allowed):
    """Keras's masked softmax: where(allowed, s, s - 1e9) then softmax over the last axis."""
    return torch.softmax(torch.where(allowed, scores, scores - 1e9), dim=-1)


def masked_attentions(w, x):
    """Embedding(12, 6, mask_zero=True) -> Add([Attention()([e, e]), AdditiveAttention()([e, e])])
    -> GlobalAveragePooling1D -> Dense(2). Both attentions ignore masked value steps (Keras
    subtracts 1e9 from their scores) and zero their output at masked query steps; the output
    keeps the query's mask, which the pooling uses."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    allowed = m.unsqueeze(1)  # (batch, 1, Tv)
    dot = keras_masked_softmax(e @ e.transpose(1, 2), allowed) @ e
    additive_scores = (w["additive/scale"] * torch.tanh(e.unsqueeze(2) + e.unsqueeze(1))).sum(-1)
    additive = keras_masked_softmax(additive_scores, allowed) @ e
    q = m.unsqueeze(-1)
    h = torch.where(q, dot, torch.zeros_like(dot)) + torch.where(q, additive,
                                                                 torch.zeros_like(additive))
    mf = m.to(DT).unsqueeze(-1)
    pooled = (h * mf).sum(dim=1) / mf.sum(dim=1)
    return pooled @ w["dense/kernel"] + w["dense/bias"]


def masked_mha(w, x):
    """Embedding(12, 8, mask_zero=True) -> MultiHeadAttention(2, 3) on (e, e), whose attention
    mask is the query's mask AND the value's (Keras's _compute_attention_mask) -> Add ->
    LayerNormalization -> GlobalAveragePooling1D (unmasked steps) -> Dense(2). A masked query's
    row has no step left: Keras's float32 scores then give it equal probabilities, and the
    pooling leaves it out, so that it reaches neither the loss nor the gradients."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    q = torch.einsum("btd,dhk->bthk", e, w["mha/query/kernel"]) + w["mha/query/bias"]
    k = torch.einsum("btd,dhk->bthk", e, w["mha/key/kernel"]) + w["mha/key/bias"]
    v = torch.einsum("btd,dhk->bthk", e, w["mha/value/kernel"]) + w["mha/value/bias"]
    scores = torch.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1])
    allowed = (m.unsqueeze(2) & m.unsqueeze(1)).unsqueeze(1)  # (batch, 1, Tq, Tv)
    p = keras_masked_softmax(scores, allowed)
    o = torch.einsum("bhqs,bshk->bqhk", p, v)
    a = torch.einsum("bqhk,hkd->bqd", o, w["mha/attention_output/kernel"]) + \
        w["mha/attention_output/bias"]
    r = e + a
    mean = r.mean(dim=-1, keepdim=True)
    var = ((r - mean) ** 2).mean(dim=-1, keepdim=True)
    n = (r - mean) / torch.sqrt(var + 1e-3) * w["norm/gamma"] + w["norm/beta"]
    mf = m.to(DT).unsqueeze(-1)
    pooled = (n * mf).sum(dim=1) / mf.sum(dim=1)
    return pooled @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 6, scale=1.0), "additive/scale": rnd(6, scale=1.0),
     "dense/kernel": rnd(6, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("masked_attentions", masked_attentions, w, mse,
                 large_and_odd,
                 make_tokens=masked_tokens))

w = {"embeddings": rnd(VOCAB, 8, scale=1.0)}
for p in ("query", "key", "value"):
    w["mha/%s/kernel" % p] = rnd(8, 2, 3)
    w["mha/%s/bias" % p] = rnd(2, 3, scale=0.1)
w["mha/attention_output/kernel"] = rnd(2, 3, 8)
w["mha/attention_output/bias"] = rnd(8, scale=0.1)
w.update({"norm/gamma": 1 + rnd(8, scale=0.1), "norm/beta": rnd(8, scale=0.1),
          "dense/kernel": rnd(8, 2), "dense/bias": rnd(2, scale=0.1)})
cases.append(run("masked_mha", masked_mha, w, mse,
                 lambda x: torch.stack([(x < 6).to(DT).mean(dim=1), (x % 2).to(DT).mean(dim=1)],
                                       dim=1),
                 make_tokens=masked_tokens))



def masked_td_tagger(w, x):
    """Embedding(12, 5, mask_zero=True) -> Bidirectional(LSTM(3, return_sequences=True)) (masked
    outputs 0) -> TimeDistributed(Dense(1)), whose output keeps the mask for the loss."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    f = masked_loop(lstm_cell(w["fw/kernel"], w["fw/recurrent_kernel"], w["fw/bias"]), e, m, 3,
                    zero_output=True)
    b = masked_loop(lstm_cell(w["bw/kernel"], w["bw/recurrent_kernel"], w["bw/bias"]), e, m, 3,
                    reverse=True, zero_output=True)
    h = torch.cat([f, torch.flip(b, dims=[1])], dim=2)
    return h @ w["td/kernel"] + w["td/bias"]


def masked_mse(p, y, x):
    """Keras 3's mean squared error of an output with a mask: the mean over the unmasked steps."""
    m = (x != 0).to(DT)
    return (((p - y) ** 2).mean(dim=-1) * m).sum() / m.sum()


w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("fw/", 5, 3))
w.update(lstm_weights("bw/", 5, 3))
w.update({"td/kernel": rnd(6, 1), "td/bias": rnd(1, scale=0.1)})
cases.append(run("masked_td_tagger", lambda w, x: (masked_td_tagger(w, x), x), w,
                 lambda px, y: masked_mse(px[0], y, px[1]),
                 lambda x: (x % 2).to(DT).unsqueeze(-1), make_tokens=masked_tokens))



def check_states_against_torch():
    """From given initial states, the loop's outputs and final states are nn.LSTM's and nn.GRU's
    (Keras's GRU gates z, r, h reordered to torch's r, z, n)."""
    x = rnd(3, 5, 4)
    every = torch.ones(3, 5, dtype=torch.bool)
    h0, c0 = rnd(3, 2), rnd(3, 2)
    kernel, recurrent, bias = rnd(4, 8), rnd(2, 8), rnd(8)
    module = torch_lstm(kernel, recurrent, bias)
    with torch.no_grad():
        want, (h_n, c_n) = module(x, (h0.unsqueeze(0), c0.unsqueeze(0)))
    out, h, c = state_loop(lstm_cell(kernel, recurrent, bias), x, every, 2, h0, c0)
    assert torch.allclose(out, want, atol=1e-12)
    assert torch.allclose(h, h_n[0], atol=1e-12) and torch.allclose(c, c_n[0], atol=1e-12)
    kernel, recurrent, bias = rnd(4, 6), rnd(2, 6), rnd(2, 6)
    module = torch.nn.GRU(4, 2, batch_first=True, dtype=DT)

    def order(t):
        return torch.cat([t[..., 2:4], t[..., 0:2], t[..., 4:6]], dim=-1)
    with torch.no_grad():
        module.weight_ih_l0.copy_(order(kernel).t())
        module.weight_hh_l0.copy_(order(recurrent).t())
        module.bias_ih_l0.copy_(order(bias[0]))
        module.bias_hh_l0.copy_(order(bias[1]))
        want, h_n = module(x, h0.unsqueeze(0))
    out, h, _ = state_loop(gru_cell(kernel, recurrent, bias), x, every, 2, h0)
    assert torch.allclose(out, want, atol=1e-12) and torch.allclose(h, h_n[0], atol=1e-12)


check_states_against_torch()


def seq2seq_lstm(w, x):
    """An encoder-decoder: Embedding(12, 5, mask_zero=True) -> LSTM(4, return_state=True), whose
    output nothing reads; its states h, c start a second LSTM(4, return_sequences=True,
    go_backwards=True) over Embedding(12, 5) of the same tokens (no mask) -> GlobalAveragePooling1D
    -> Dense(3, softmax)."""
    m = x != 0
    _, h, c = state_loop(lstm_cell(w["enc/kernel"], w["enc/recurrent_kernel"], w["enc/bias"]),
                         F.embedding(x, w["enc_embeddings"]), m, 4)
    every = torch.ones_like(m)
    out, _, _ = state_loop(lstm_cell(w["dec/kernel"], w["dec/recurrent_kernel"], w["dec/bias"]),
                           F.embedding(x, w["dec_embeddings"]), every, 4, h, c, reverse=True)
    return torch.softmax(out.mean(dim=1) @ w["dense/kernel"] + w["dense/bias"], dim=-1)


w = {"enc_embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("enc/", 5, 4))
w["dec_embeddings"] = rnd(VOCAB, 5, scale=1.0)
w.update(lstm_weights("dec/", 5, 4))
w.update({"dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1)})
# Keras's weight order: both embeddings (one depth from the decoder), then the LSTMs.
order = ["enc_embeddings", "dec_embeddings"] + [k for k in w if "/" in k]
w = {k: w[k] for k in order}
cases.append(run("seq2seq_lstm", seq2seq_lstm, w, sparse_ce, lambda x: (x.sum(dim=1) % 3),
                 make_tokens=masked_tokens))


def gru_states(w, x):
    """Embedding(12, 4, mask_zero=True) -> GRU(3, return_sequences=True, return_state=True) ->
    [sequence, h]; SimpleRNN(3, return_state=True) over the sequence (masked) from h -> [o, h2];
    Dense(2) of Concatenate([o, h2, h])."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    seq, h, _ = state_loop(gru_cell(w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"]),
                           e, m, 3)
    _, h2, _ = state_loop(rnn_cell(w["rnn/kernel"], w["rnn/recurrent_kernel"], w["rnn/bias"]),
                          seq, m, 3, h)
    return torch.cat([h2, h2, h], dim=1) @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 4, scale=1.0),
     "gru/kernel": rnd(4, 9), "gru/recurrent_kernel": rnd(3, 9), "gru/bias": rnd(2, 9, scale=0.1),
     "rnn/kernel": rnd(3, 3), "rnn/recurrent_kernel": rnd(3, 3), "rnn/bias": rnd(3, scale=0.1),
     "dense/kernel": rnd(9, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("gru_states", gru_states, w, mse,
                 large_and_odd,
                 make_tokens=masked_tokens))

def bilstm_states(w, x):
    """Embedding(12, 5, mask_zero=True) -> Bidirectional(LSTM(3, return_state=True)), whose merged
    output nothing reads: its states [fh, fc, bh, bc] (the backward direction's after it has run
    from the end to the start) start Bidirectional(LSTM(3), merge_mode="sum") over Embedding(12, 5)
    of the same tokens (no mask) -> Dense(2)."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    _, fh, fc = state_loop(lstm_cell(w["fw/kernel"], w["fw/recurrent_kernel"], w["fw/bias"]),
                           e, m, 3)
    _, bh, bc = state_loop(lstm_cell(w["bw/kernel"], w["bw/recurrent_kernel"], w["bw/bias"]),
                           e, m, 3, reverse=True)
    e2 = F.embedding(x, w["embeddings2"])
    every = torch.ones_like(m)
    f, _, _ = state_loop(lstm_cell(w["fw2/kernel"], w["fw2/recurrent_kernel"], w["fw2/bias"]),
                         e2, every, 3, fh, fc)
    b, _, _ = state_loop(lstm_cell(w["bw2/kernel"], w["bw2/recurrent_kernel"], w["bw2/bias"]),
                         e2, every, 3, bh, bc, reverse=True)
    return (f[:, -1] + b[:, -1]) @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("fw/", 5, 3))
w.update(lstm_weights("bw/", 5, 3))
w["embeddings2"] = rnd(VOCAB, 5, scale=1.0)
w.update(lstm_weights("fw2/", 5, 3))
w.update(lstm_weights("bw2/", 5, 3))
w.update({"dense/kernel": rnd(3, 2), "dense/bias": rnd(2, scale=0.1)})
# Keras's weight order: both embeddings (one depth from the second Bidirectional), then the rest.
order = ["embeddings", "embeddings2"] + [k for k in w if "/" in k]
w = {k: w[k] for k in order}
cases.append(run("bilstm_states", bilstm_states, w, mse,
                 large_and_odd,
                 make_tokens=masked_tokens))

def bigru_separate(w, x):
    """Embedding(12, 4, mask_zero=True) -> Bidirectional(GRU(3, return_sequences=True),
    merge_mode=None) -> [forward, backward] (the backward outputs back in time order, masked
    steps 0 in both, each with the mask) -> GlobalAveragePooling1D of each (of the unmasked steps)
    -> Dense(2) of their Concatenate."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    f = masked_loop(gru_cell(w["fw/kernel"], w["fw/recurrent_kernel"], w["fw/bias"]), e, m, 3,
                    zero_output=True)
    b = masked_loop(gru_cell(w["bw/kernel"], w["bw/recurrent_kernel"], w["bw/bias"]), e, m, 3,
                    reverse=True, zero_output=True)
    b = torch.flip(b, dims=[1])
    mf = m.to(DT).unsqueeze(-1)
    pooled = torch.cat([(f * mf).sum(dim=1), (b * mf).sum(dim=1)], dim=1) / mf.sum(dim=1)
    return pooled @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 4, scale=1.0),
     "fw/kernel": rnd(4, 9), "fw/recurrent_kernel": rnd(3, 9), "fw/bias": rnd(2, 9, scale=0.1),
     "bw/kernel": rnd(4, 9), "bw/recurrent_kernel": rnd(3, 9), "bw/bias": rnd(2, 9, scale=0.1),
     "dense/kernel": rnd(6, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("bigru_separate", bigru_separate, w, mse,
                 large_and_odd,
                 make_tokens=masked_tokens))

def mha_scores(w, x):
    """Input((5,)) -> Embedding(12, 6) -> MultiHeadAttention(2, 3) self-attention called with
    return_attention_scores=True -> [y, scores (batch, 2, 5, 5)] -> Dense(2) of
    Concatenate([GlobalAveragePooling1D(y), Flatten(scores)]): the loss reaches the scores'
    softmax directly as well as through the output."""
    e = F.embedding(x, w["embeddings"])
    q = torch.einsum("btd,dhk->bthk", e, w["mha/query/kernel"]) + w["mha/query/bias"]
    k = torch.einsum("btd,dhk->bthk", e, w["mha/key/kernel"]) + w["mha/key/bias"]
    v = torch.einsum("btd,dhk->bthk", e, w["mha/value/kernel"]) + w["mha/value/bias"]
    p = torch.softmax(torch.einsum("bqhk,bshk->bhqs", q, k) / math.sqrt(q.shape[-1]), dim=-1)
    o = torch.einsum("bhqs,bshk->bqhk", p, v)
    y = torch.einsum("bqhk,hkd->bqd", o, w["mha/attention_output/kernel"]) + \
        w["mha/attention_output/bias"]
    features = torch.cat([y.mean(dim=1), p.reshape(p.shape[0], -1)], dim=1)
    return features @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 6, scale=1.0)}
for p in ("query", "key", "value"):
    w["mha/%s/kernel" % p] = rnd(6, 2, 3)
    w["mha/%s/bias" % p] = rnd(2, 3, scale=0.1)
w["mha/attention_output/kernel"] = rnd(2, 3, 6)
w["mha/attention_output/bias"] = rnd(6, scale=0.1)
w.update({"dense/kernel": rnd(6 + 50, 2), "dense/bias": rnd(2, scale=0.1)})
cases.append(run("mha_scores", mha_scores, w, mse,
                 large_and_odd,
                 lengths=[5, 5, 5], predict_length=5))

class StatefulLstm:
    """Embedding(12, 5, mask_zero=True) -> LSTM(4, stateful=True) -> Dense(3, softmax): each batch
    (of 3 samples, any length) starts from the final states of the batch before, detached (Keras's
    truncated backpropagation through time), the first from zeros; prediction continues them."""

    def __init__(self):
        self.h = self.c = None

    def __call__(self, w, x):
        m = x != 0
        _, h, c = state_loop(lstm_cell(w["lstm/kernel"], w["lstm/recurrent_kernel"],
                                       w["lstm/bias"]),
                             F.embedding(x, w["embeddings"]), m, 4, self.h, self.c)
        self.h, self.c = h.detach(), c.detach()
        return torch.softmax(h @ w["dense/kernel"] + w["dense/bias"], dim=-1)


w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("lstm/", 5, 4))
w.update({"dense/kernel": rnd(4, 3), "dense/bias": rnd(3, scale=0.1)})
cases.append(run("stateful_lstm", StatefulLstm(), w, sparse_ce, lambda x: (x.sum(dim=1) % 3),
                 make_tokens=masked_tokens))

def stacked_cells(w, x):
    """Embedding(12, 5, mask_zero=True) -> RNN(StackedRNNCells([LSTMCell(4), GRUCell(3)]),
    go_backwards=True) -> Dense(2): the LSTM cell reads the sequence from its end, and the GRU
    cell reads the LSTM cell's outputs in that order, with the mask reversed likewise; a masked
    step keeps both cells' states; the output is the GRU cell's last state."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    first, _, _ = state_loop(lstm_cell(w["lstm/kernel"], w["lstm/recurrent_kernel"],
                                       w["lstm/bias"]), e, m, 4, reverse=True)
    _, h, _ = state_loop(gru_cell(w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"]),
                         first, torch.flip(m, dims=[1]), 3)
    return h @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0)}
w.update(lstm_weights("lstm/", 5, 4))
w.update({"gru/kernel": rnd(4, 9), "gru/recurrent_kernel": rnd(3, 9),
          "gru/bias": rnd(2, 9, scale=0.1), "dense/kernel": rnd(3, 2),
          "dense/bias": rnd(2, scale=0.1)})
cases.append(run("stacked_cells", stacked_cells, w, mse, large_and_odd,
                 make_tokens=masked_tokens))

def attention_scores(w, x):
    """Input((5,)) -> Embedding(12, 6) -> Attention(use_scale=True) and AdditiveAttention() self-
    attention, each called with return_attention_scores=True -> [y, scores (batch, 5, 5)] ->
    Dense(2) of Concatenate([GlobalAveragePooling1D(y1), GlobalAveragePooling1D(y2),
    Flatten(scores1), Flatten(scores2)]): the loss reaches each softmax through the scores as
    well as through the output. Attention's scores: scale * q k^T; AdditiveAttention's:
    sum_d scale[d] * tanh(q[d] + k[d])."""
    e = F.embedding(x, w["embeddings"])
    p1 = torch.softmax(w["attention/scale"] * (e @ e.transpose(1, 2)), dim=-1)
    additive = (w["additive_attention/scale"] * torch.tanh(e.unsqueeze(2) + e.unsqueeze(1))).sum(-1)
    p2 = torch.softmax(additive, dim=-1)
    y1, y2 = p1 @ e, p2 @ e
    features = torch.cat([y1.mean(dim=1), y2.mean(dim=1), p1.reshape(p1.shape[0], -1),
                          p2.reshape(p2.shape[0], -1)], dim=1)
    return features @ w["dense/kernel"] + w["dense/bias"]


w = {"embeddings": rnd(VOCAB, 6, scale=1.0), "attention/scale": 1 + rnd(1, scale=0.2).reshape(()),
     "additive_attention/scale": rnd(6),
     "dense/kernel": rnd(12 + 50, 2), "dense/bias": rnd(2, scale=0.1)}
cases.append(run("attention_scores", attention_scores, w, mse, large_and_odd,
                 lengths=[5, 5, 5], predict_length=5))

# Keras 3's masked batch statistics (BatchNormalization._moments with a mask): the mask, expanded
# over the features, weighs each value; mean = sum(m x) / (sum(m) + 1e-7) and variance =
# sum(m (x - mean)^2) / (sum(m) + 1e-7) (backend.epsilon()), the masked values left out of both.
# Every value is then normalised with them, and the moving statistics take them (momentum 0.9,
# the variance biased, as Keras 3's). Outside training the moving statistics normalise.
KERAS_EPSILON = 1e-7


def masked_batch_norm(w, x):
    """Embedding(12, 5, mask_zero=True) -> Dense(4, tanh) -> BatchNormalization(momentum=0.9) ->
    GlobalAveragePooling1D (unmasked steps) -> Dense(2)."""
    m = (x != 0).to(DT).unsqueeze(-1)
    e = F.embedding(x, w["embeddings"])
    h = torch.tanh(e @ w["dense/kernel"] + w["dense/bias"])
    if torch.is_grad_enabled():  # a training step: the batch's masked statistics
        weights = m.expand_as(h)
        total = weights.sum(dim=(0, 1)) + KERAS_EPSILON
        mean = (h * weights).sum(dim=(0, 1)) / total
        difference = torch.where(weights > 0, h - mean, torch.zeros_like(h))
        variance = (difference ** 2).sum(dim=(0, 1)) / total
        with torch.no_grad():
            w["bn/moving_mean"].copy_(w["bn/moving_mean"] * 0.9 + mean * 0.1)
            w["bn/moving_variance"].copy_(w["bn/moving_variance"] * 0.9 + variance * 0.1)
    else:
        mean, variance = w["bn/moving_mean"], w["bn/moving_variance"]
    n = (h - mean) / torch.sqrt(variance + 1e-3) * w["bn/gamma"] + w["bn/beta"]
    pooled = (n * m).sum(dim=1) / m.sum(dim=1)
    return pooled @ w["dense_1/kernel"] + w["dense_1/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0), "dense/kernel": rnd(5, 4),
     "dense/bias": rnd(4, scale=0.1), "bn/gamma": 1 + rnd(4, scale=0.2),
     "bn/beta": rnd(4, scale=0.1), "bn/moving_mean": rnd(4, scale=0.1),
     "bn/moving_variance": 1 + rnd(4, scale=0.2), "dense_1/kernel": rnd(4, 2),
     "dense_1/bias": rnd(2, scale=0.1)}
cases.append(run("masked_batch_norm", masked_batch_norm, w, mse, large_and_odd,
                 make_tokens=masked_tokens))


def masked_concat_time(w, x):
    """Embedding(12, 5, mask_zero=True) as e -> Concatenate(axis=1) of [Dense(5, tanh)(e) (masked
    as e), Conv1D(5, 3, padding="same")(e) (no mask: Conv1D stops it), e] along the steps, on
    Input(None): Keras 3's Concatenate.compute_mask joins the masks along the axis, an unmasked
    input's steps all counting -> GRU(3) over the 3 * length steps, skipping the masked ones ->
    Dense(2)."""
    m = x != 0
    e = F.embedding(x, w["embeddings"])
    a = torch.tanh(e @ w["dense/kernel"] + w["dense/bias"])
    b = F.conv1d(e.transpose(1, 2), w["conv/kernel"].permute(2, 1, 0), w["conv/bias"],
                 padding=1).transpose(1, 2)
    joined = torch.cat([a, b, e], dim=1)
    mask = torch.cat([m, torch.ones_like(m), m], dim=1)
    h = masked_loop(gru_cell(w["gru/kernel"], w["gru/recurrent_kernel"], w["gru/bias"]), joined,
                    mask, 3)[:, -1]
    return h @ w["dense_1/kernel"] + w["dense_1/bias"]


w = {"embeddings": rnd(VOCAB, 5, scale=1.0), "dense/kernel": rnd(5, 5),
     "dense/bias": rnd(5, scale=0.1), "conv/kernel": rnd(3, 5, 5), "conv/bias": rnd(5, scale=0.1),
     "gru/kernel": rnd(5, 9), "gru/recurrent_kernel": rnd(3, 9), "gru/bias": rnd(2, 9, scale=0.1),
     "dense_1/kernel": rnd(3, 2), "dense_1/bias": rnd(2, scale=0.1)}
cases.append(run("masked_concat_time", masked_concat_time, w, mse, large_and_odd,
                 make_tokens=masked_tokens))

with open(os.path.join(HERE, "reference", "unknown_axes.json"), "w") as out:
    json.dump({"generator": "tests/keras/generate_unknown_axes.py", "lr": LR, "batch": BATCH,
               "cases": cases}, out, indent=None, separators=(",", ":"))
    out.write("\n")
print("wrote", len(cases), "cases")
