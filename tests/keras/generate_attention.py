#!/usr/bin/python3
"""Writes tests/keras/reference/attention.json and attention_transformer.json: PyTorch (float64)
outputs, input gradients and weight gradients of Keras's MultiHeadAttention, Attention and
AdditiveAttention, and the losses of a Transformer encoder trained a few SGD steps, for
tests/keras/test_attention.cpp and the emulated CUDA test.

Run with Debian's python3-torch: /usr/bin/python3 tests/keras/generate_attention.py
The layer cases have the format of generate_layers.py (class_name, config, inputs, weights in
Keras's layout, upstream gradient g, targets of loss = sum(output * g)), plus `call_kwargs`: the
keyword arguments of the Keras call (use_causal_mask; Softmax's mask and MultiHeadAttention's
attention_mask, tensors that are the layer's last input).

Keras's layout mapped to PyTorch's:
- MultiHeadAttention's projections are EinsumDense kernels `query/kernel` (dim, heads, key_dim)
  and biases (heads, key_dim) (`key/*`, `value/*` alike, `value_dim` for the value), applied as
  `einsum("abc,cde->abde")`: torch's `F.linear(x, kernel.reshape(dim, heads * key_dim).T,
  bias.reshape(-1))` viewed as (batch, steps, heads, key_dim). The output kernel
  `attention_output/kernel` (heads, value_dim, out) is `einsum("abcd,cde->abe")`: `F.linear` of
  the heads' results (batch, steps, heads * value_dim) with `kernel.reshape(heads * value_dim,
  out).T`. Scores are `q k^T / sqrt(key_dim)` per head, softmax over the value steps; the causal
  mask keeps value step j for query step i when j <= i. Where heads * key_dim equals the query's
  features and the value and output sizes match, torch.nn.functional.multi_head_attention_forward
  (with q_proj_weight = query kernel reshaped and transposed, in_proj_bias the three biases
  concatenated, out_proj_weight = output kernel reshaped and transposed) checks these formulas.
- Attention: scores `scale * q k^T` ("dot") or `concat_score_weight * sum(tanh(scale * (q + k)))`
  ("concat"), `scale` and `concat_score_weight` scalars; AdditiveAttention:
  `sum(scale * tanh(q + k))`, `scale` (dim,); then softmax over the value steps times the value
  (Keras's attention.py / additive_attention.py formulas, written in torch).
- The Transformer is Keras's "Text classification with Transformer" example: token and position
  Embedding (tables (vocab, embed) and (steps, embed), the positions given as a second input)
  added, MultiHeadAttention(x, x), Add, LayerNormalization(epsilon=1e-6) (gamma, beta), Dense
  relu and Dense on rank 3 (kernel (in, out) is `x @ kernel + bias`), Add, LayerNormalization,
  GlobalAveragePooling1D, Dense relu, Dense softmax; sparse categorical cross-entropy averaged
  over the batch, plain SGD. Dropout rates are 0 here (their masks cannot match).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(3303)
DT = torch.float64


def rnd(*shape, scale=1.0):
    return (torch.rand(*shape, dtype=DT) * 2 - 1) * scale


def flat(t):
    return [round(float(v), 10) for v in t.detach().reshape(-1).tolist()]


def softmax_rows(scores, causal):
    if causal:
        tq, tv = scores.shape[-2], scores.shape[-1]
        keep = torch.ones(tq, tv, dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1)


def mha(w, q_in, v_in, k_in, heads, key_dim, value_dim, use_bias, causal):
    def project(x, name, dim):
        kernel = w[name + "/kernel"]
        bias = w[name + "/bias"].reshape(-1) if use_bias else None
        y = F.linear(x, kernel.reshape(kernel.shape[0], -1).T, bias)
        return y.reshape(*x.shape[:-1], heads, dim)

    batch = q_in.shape[0]
    q_steps = q_in.shape[1:-1]
    # (batch, steps..., heads, dim) with the steps flattened: attention over all of them.
    q = project(q_in, "query", key_dim).reshape(batch, -1, heads, key_dim).transpose(1, 2)
    k = project(k_in, "key", key_dim).reshape(batch, -1, heads, key_dim).transpose(1, 2)
    v = project(v_in, "value", value_dim).reshape(batch, -1, heads, value_dim).transpose(1, 2)
    p = softmax_rows(q @ k.transpose(-1, -2) / math.sqrt(key_dim), causal)
    o = (p @ v).transpose(1, 2).reshape(batch, *q_steps, heads * value_dim)
    kernel = w["attention_output/kernel"]
    out = kernel.shape[-1]
    return F.linear(o, kernel.reshape(heads * value_dim, out).T,
                    w["attention_output/bias"] if use_bias else None)


def mha_weights(q_dim, k_dim, v_dim, heads, key_dim, value_dim, out, use_bias):
    w = {"query/kernel": rnd(q_dim, heads, key_dim, scale=0.5),
         "key/kernel": rnd(k_dim, heads, key_dim, scale=0.5),
         "value/kernel": rnd(v_dim, heads, value_dim, scale=0.5),
         "attention_output/kernel": rnd(heads, value_dim, out, scale=0.5)}
    if use_bias:
        w["query/bias"] = rnd(heads, key_dim, scale=0.2)
        w["key/bias"] = rnd(heads, key_dim, scale=0.2)
        w["value/bias"] = rnd(heads, value_dim, scale=0.2)
        w["attention_output/bias"] = rnd(out, scale=0.2)
    return w


def finish(name, class_name, config, inputs, input_grads, w, out, call_kwargs):
    g = rnd(*out.shape)
    loss = (out * g).sum()
    loss.backward()
    return {"name": name, "class_name": class_name, "config": config,
            "call_kwargs": call_kwargs,
            "input_shapes": [list(x.shape) for x in inputs],
            "inputs": [flat(x) for x in inputs],
            "weights": {k: flat(v) for k, v in w.items()},
            "training": True,
            "output_shape": list(out.shape), "output": flat(out), "upstream": flat(g),
            "input_gradients": [flat(x.grad) if grad else None
                                for x, grad in zip(inputs, input_grads)],
            "weight_gradients": {k: flat(v.grad) for k, v in w.items()},
            "updated_weights": {}}


def mha_case(name, heads, key_dim, q_shape, v_shape, k_shape=None, value_dim=None,
             output_shape=None, use_bias=True, causal=False, self_attention=False):
    value_dim = value_dim or key_dim
    q_in = rnd(*q_shape, scale=1.5).requires_grad_()
    if self_attention:
        inputs = [q_in, q_in]
        v_in = k_in = q_in
    else:
        v_in = rnd(*v_shape, scale=1.5).requires_grad_()
        k_in = rnd(*k_shape, scale=1.5).requires_grad_() if k_shape else v_in
        inputs = [q_in, v_in] + ([k_in] if k_shape else [])
    out = output_shape or q_shape[-1]
    w = mha_weights(q_shape[-1], k_in.shape[-1], v_in.shape[-1], heads, key_dim, value_dim, out,
                    use_bias)
    for t in w.values():
        t.requires_grad_()
    y = mha(w, q_in, v_in, k_in, heads, key_dim, value_dim, use_bias, causal)
    config = {"num_heads": heads, "key_dim": key_dim, "value_dim": value_dim, "dropout": 0.0,
              "use_bias": use_bias, "output_shape": [output_shape] if output_shape else None,
              "attention_axes": None}
    kwargs = {"use_causal_mask": True} if causal else {}
    if self_attention:
        # One tensor for both inputs: the layer gets it twice; the reference gradient of the
        # tensor is the sum of both paths, checked on the first input, the second unchecked.
        c = finish(name, "MultiHeadAttention", config, [q_in], [True], w, y, kwargs)
        c["input_shapes"] = c["input_shapes"] * 2
        c["inputs"] = c["inputs"] * 2
        c["input_gradients"] = [c["input_gradients"][0], None]
        c["self_attention"] = True
        return c
    return finish(name, "MultiHeadAttention", config, inputs, [True] * len(inputs), w, y, kwargs)


def check_against_torch_mha():
    """Keras's MultiHeadAttention formulas above against torch's own multi-head attention."""
    heads, key_dim, dim = 2, 3, 6
    w = mha_weights(dim, dim, dim, heads, key_dim, key_dim, dim, True)
    q, k, v = rnd(2, 4, dim), rnd(2, 5, dim), rnd(2, 5, dim)
    ours = mha(w, q, v, k, heads, key_dim, key_dim, True, False)
    proj = {n: w[n + "/kernel"].reshape(dim, -1).T for n in ("query", "key", "value")}
    theirs, _ = F.multi_head_attention_forward(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), dim, heads, None,
        torch.cat([w["query/bias"].reshape(-1), w["key/bias"].reshape(-1),
                   w["value/bias"].reshape(-1)]),
        None, None, False, 0.0, w["attention_output/kernel"].reshape(dim, dim).T,
        w["attention_output/bias"], training=False, need_weights=False,
        use_separate_proj_weight=True, q_proj_weight=proj["query"], k_proj_weight=proj["key"],
        v_proj_weight=proj["value"])
    assert torch.allclose(ours, theirs.transpose(0, 1), atol=1e-12), "MHA formulas disagree"


def dense_attention_case(name, class_name, config, q_shape, v_shape, k_shape=None, causal=False,
                         scale=None, concat_weight=None):
    q_in = rnd(*q_shape).requires_grad_()
    v_in = rnd(*v_shape).requires_grad_()
    k_in = rnd(*k_shape).requires_grad_() if k_shape else v_in
    inputs = [q_in, v_in] + ([k_in] if k_shape else [])
    w = {}
    if scale is not None:
        w["scale"] = scale.clone().requires_grad_()
    if concat_weight is not None:
        w["concat_score_weight"] = concat_weight.clone().requires_grad_()
    if class_name == "AdditiveAttention":
        terms = torch.tanh(q_in.unsqueeze(-2) + k_in.unsqueeze(-3))
        scores = (terms * w["scale"]).sum(-1) if "scale" in w else terms.sum(-1)
    elif config.get("score_mode", "dot") == "dot":
        scores = q_in @ k_in.transpose(-1, -2)
        if "scale" in w:
            scores = scores * w["scale"]
    else:
        s = w.get("scale", torch.tensor(1.0, dtype=DT))
        scores = w["concat_score_weight"] * torch.tanh(
            s * (q_in.unsqueeze(-2) + k_in.unsqueeze(-3))).sum(-1)
    y = softmax_rows(scores, causal) @ v_in
    kwargs = {"use_causal_mask": True} if causal else {}
    return finish(name, class_name, config, inputs, [True] * len(inputs), w, y, kwargs)


cases = []
check_against_torch_mha()
cases.append(mha_case("mha_self", 2, 3, (2, 5, 6), None, value_dim=4, self_attention=True))
cases.append(mha_case("mha_cross", 3, 2, (2, 4, 6), (2, 5, 7), k_shape=(2, 5, 8), value_dim=3,
                      output_shape=5))
cases.append(mha_case("mha_query_value", 2, 4, (3, 3, 5), (3, 6, 4)))
cases.append(mha_case("mha_causal", 2, 3, (2, 5, 6), (2, 5, 6), causal=True))
cases.append(mha_case("mha_causal_longer_value", 1, 3, (2, 3, 4), (2, 5, 4), causal=True,
                      use_bias=False))
cases.append(mha_case("mha_two_axes", 2, 2, (2, 2, 3, 4), (2, 3, 2, 5), value_dim=3))
cases.append(dense_attention_case("attention_dot", "Attention",
                                  {"use_scale": False, "score_mode": "dot", "dropout": 0.0},
                                  (2, 3, 4), (2, 5, 6), k_shape=(2, 5, 4)))
cases.append(dense_attention_case("attention_dot_scale_causal", "Attention",
                                  {"use_scale": True, "score_mode": "dot", "dropout": 0.0},
                                  (2, 4, 3), (2, 4, 3), causal=True,
                                  scale=torch.tensor(0.7, dtype=DT)))
cases.append(dense_attention_case("attention_concat", "Attention",
                                  {"use_scale": False, "score_mode": "concat", "dropout": 0.0},
                                  (2, 3, 4), (2, 5, 4),
                                  concat_weight=torch.tensor(1.3, dtype=DT)))
cases.append(dense_attention_case("attention_concat_scale", "Attention",
                                  {"use_scale": True, "score_mode": "concat", "dropout": 0.0},
                                  (2, 3, 4), (2, 5, 2), k_shape=(2, 5, 4),
                                  scale=torch.tensor(0.8, dtype=DT),
                                  concat_weight=torch.tensor(1.3, dtype=DT)))
cases.append(dense_attention_case("additive_attention", "AdditiveAttention",
                                  {"use_scale": True, "dropout": 0.0},
                                  (2, 3, 4), (2, 5, 6), k_shape=(2, 5, 4),
                                  scale=rnd(4)))
cases.append(dense_attention_case("additive_attention_causal_no_scale", "AdditiveAttention",
                                  {"use_scale": False, "dropout": 0.0},
                                  (2, 4, 3), (2, 4, 3), causal=True))

with open(os.path.join(HERE, "reference", "attention.json"), "w") as f:
    json.dump({"cases": cases}, f, separators=(",", ":"))


# --- The Transformer encoder trained a few steps ------------------------------------------------

VOCAB, STEPS, EMBED, HEADS, FF, BATCH, CLASSES, RATE, TRAIN_STEPS = 12, 6, 8, 2, 16, 4, 2, 0.1, 4


def layer_norm(x, gamma, beta):
    return F.layer_norm(x, (x.shape[-1],), gamma, beta, eps=1e-6)


def transformer_weights():
    w = {
        "token_embedding": {"embeddings": rnd(VOCAB, EMBED, scale=0.5)},
        "position_embedding": {"embeddings": rnd(STEPS, EMBED, scale=0.5)},
        "mha": mha_weights(EMBED, EMBED, EMBED, HEADS, EMBED, EMBED, EMBED, True),
        "norm1": {"gamma": 1 + rnd(EMBED, scale=0.1), "beta": rnd(EMBED, scale=0.1)},
        "ffn1": {"kernel": rnd(EMBED, FF, scale=0.4), "bias": rnd(FF, scale=0.1)},
        "ffn2": {"kernel": rnd(FF, EMBED, scale=0.4), "bias": rnd(EMBED, scale=0.1)},
        "norm2": {"gamma": 1 + rnd(EMBED, scale=0.1), "beta": rnd(EMBED, scale=0.1)},
        "hidden": {"kernel": rnd(EMBED, 10, scale=0.4), "bias": rnd(10, scale=0.1)},
        "logits": {"kernel": rnd(10, CLASSES, scale=0.4), "bias": rnd(CLASSES, scale=0.1)},
    }
    for layer in w.values():
        for t in layer.values():
            t.requires_grad_()
    return w


def transformer(w, tokens, positions):
    x = F.embedding(tokens, w["token_embedding"]["embeddings"]) + F.embedding(
        positions, w["position_embedding"]["embeddings"])
    attn = mha(w["mha"], x, x, x, HEADS, EMBED, EMBED, True, False)
    out1 = layer_norm(x + attn, w["norm1"]["gamma"], w["norm1"]["beta"])
    ffn = F.relu(out1 @ w["ffn1"]["kernel"] + w["ffn1"]["bias"])
    ffn = ffn @ w["ffn2"]["kernel"] + w["ffn2"]["bias"]
    out2 = layer_norm(out1 + ffn, w["norm2"]["gamma"], w["norm2"]["beta"])
    pooled = out2.mean(dim=1)
    hidden = F.relu(pooled @ w["hidden"]["kernel"] + w["hidden"]["bias"])
    return torch.softmax(hidden @ w["logits"]["kernel"] + w["logits"]["bias"], dim=-1)


w = transformer_weights()
initial = {name: {k: flat(v) for k, v in layer.items()} for name, layer in w.items()}
tokens = torch.randint(0, VOCAB, (TRAIN_STEPS, BATCH, STEPS))
labels = torch.randint(0, CLASSES, (TRAIN_STEPS, BATCH))
positions = torch.arange(STEPS).repeat(BATCH, 1)
losses = []
for step in range(TRAIN_STEPS):
    probabilities = transformer(w, tokens[step], positions)
    loss = F.nll_loss(torch.log(probabilities), labels[step])
    losses.append(float(loss))
    for layer in w.values():
        for t in layer.values():
            t.grad = None
    loss.backward()
    with torch.no_grad():
        for layer in w.values():
            for t in layer.values():
                t -= RATE * t.grad
with torch.no_grad():
    final = transformer(w, tokens[0], positions)

with open(os.path.join(HERE, "reference", "attention_transformer.json"), "w") as f:
    json.dump({"vocab": VOCAB, "steps": STEPS, "embed": EMBED, "heads": HEADS, "ff": FF,
               "batch": BATCH, "classes": CLASSES, "learning_rate": RATE,
               "weights": initial,
               "tokens": [[flat(b) for b in step] for step in tokens],
               "labels": [flat(step) for step in labels],
               "losses": losses, "final_predictions": flat(final),
               "final_weights": {name: {k: flat(v) for k, v in layer.items()}
                                 for name, layer in w.items()}},
              f, separators=(",", ":"))


# --- Cases added later (after the Transformer, so that its values stay as they were) ------------

def mha_mask_case(name, heads, key_dim, q_shape, v_shape, k_shape=None):
    """MultiHeadAttention with Keras's `attention_mask` (batch, Tq, Tv) as the call's last input:
    Keras adds -1e9 to the masked scores (`_masked_softmax`); every row keeps one step, and the
    mask gets no gradient."""
    q_in = rnd(*q_shape, scale=1.5).requires_grad_()
    v_in = rnd(*v_shape, scale=1.5).requires_grad_()
    k_in = rnd(*k_shape, scale=1.5).requires_grad_() if k_shape else v_in
    mask = (torch.rand(q_shape[0], q_shape[1], v_shape[1]) < 0.6).to(DT)
    mask[:, :, 0] = 1.0
    w = mha_weights(q_shape[-1], k_in.shape[-1], v_in.shape[-1], heads, key_dim, key_dim,
                    q_shape[-1], True)
    for t in w.values():
        t.requires_grad_()

    def project(x, name):
        kernel = w[name + "/kernel"]
        y = F.linear(x, kernel.reshape(kernel.shape[0], -1).T, w[name + "/bias"].reshape(-1))
        return y.reshape(x.shape[0], x.shape[1], heads, key_dim).transpose(1, 2)

    q, k, v = project(q_in, "query"), project(k_in, "key"), project(v_in, "value")
    scores = q @ k.transpose(-1, -2) / math.sqrt(key_dim) + (1.0 - mask.unsqueeze(1)) * -1e9
    o = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(q_shape[0], q_shape[1], -1)
    kernel = w["attention_output/kernel"]
    y = F.linear(o, kernel.reshape(heads * key_dim, -1).T, w["attention_output/bias"])
    config = {"num_heads": heads, "key_dim": key_dim, "value_dim": key_dim, "dropout": 0.0,
              "use_bias": True, "output_shape": None, "attention_axes": None}
    inputs = [q_in, v_in] + ([k_in] if k_shape else []) + [mask]
    grads = [True, True] + ([True] if k_shape else []) + [False]
    return finish(name, "MultiHeadAttention", config, inputs, grads, w, y,
                  {"attention_mask": ["mask", 0, 0]})


cases.append(mha_mask_case("mha_attention_mask", 2, 3, (2, 4, 5), (2, 6, 5)))
cases.append(mha_mask_case("mha_attention_mask_key", 1, 2, (2, 3, 4), (2, 5, 3), k_shape=(2, 5, 6)))


def softmax_mask_case(name, x_shape, mask_shape, axis):
    """Softmax with Keras's call argument `mask` (the layer's second input, broadcast over its
    axes of length 1): Keras 3 replaces the masked inputs with -1e9, takes the softmax and zeroes
    the masked outputs; a row masked along the whole axis is all zeros. The mask gets no
    gradient."""
    x = rnd(*x_shape, scale=2.0).requires_grad_()
    mask = (torch.rand(*mask_shape) < 0.6).to(DT)
    mask.view(-1)[0] = 1.0
    # One position masked along the whole axis: zeros out.
    index = [0] * len(x_shape)
    index[axis] = slice(None)
    full = torch.ones(*mask_shape, dtype=DT)
    full[tuple(0 if mask_shape[i] == 1 else index[i] for i in range(len(x_shape)))] = 0.0
    mask = mask * full
    keep = mask.expand(*x_shape) > 0.5
    y = torch.where(keep, x, torch.full_like(x, -1e9)).softmax(dim=axis)
    y = torch.where(keep, y, torch.zeros_like(y))
    return finish(name, "Softmax", {"axis": axis}, [x, mask], [True, False], {}, y,
                  {"mask": ["mask", 0, 0]})


cases.append(softmax_mask_case("softmax_mask", (2, 3, 5), (2, 3, 5), -1))
cases.append(softmax_mask_case("softmax_mask_broadcast_rows", (2, 4, 3), (2, 1, 3), -1))
cases.append(softmax_mask_case("softmax_mask_axis_1", (2, 4, 3), (2, 4, 1), 1))


# --- MultiHeadAttention over other attention_axes (appended: earlier values stay as they were) --

STEP_LETTERS, KEY_LETTERS = "ijklm", "pqrst"


def mha_axes(w, q_in, v_in, k_in, heads, key_dim, value_dim, axes, use_bias, causal=False,
             mask=None):
    """Keras's MultiHeadAttention with `attention_axes`, written as einsums over named axes:
    the projections are (batch, steps..., heads, dim); the scores are (batch, axes not attended
    (in order), heads, the query's attended axes, the key's attended axes (both in the order of
    `attention_axes`)); the softmax runs jointly over the key's attended axes; `mask` has the
    scores' shape without the heads (0: -1e9 added to the score); the causal mask (one attended
    axis) keeps key step j for query step i when j <= i. Returns the output and the scores."""
    rank = q_in.dim()
    attended = [a if a >= 0 else rank + a for a in axes]
    steps = range(1, rank - 1)
    others = [i for i in steps if i not in attended]

    def project(x, name, dim):
        kernel = w[name + "/kernel"]
        bias = w[name + "/bias"].reshape(-1) if use_bias else None
        y = F.linear(x, kernel.reshape(kernel.shape[0], -1).T, bias)
        return y.reshape(*x.shape[:-1], heads, dim)

    q, k, v = project(q_in, "query", key_dim), project(k_in, "key", key_dim), project(
        v_in, "value", value_dim)
    q_str = "b" + "".join(STEP_LETTERS[i - 1] for i in steps) + "nh"
    k_str = "b" + "".join(KEY_LETTERS[i - 1] if i in attended else STEP_LETTERS[i - 1]
                          for i in steps) + "nh"
    s_str = ("b" + "".join(STEP_LETTERS[i - 1] for i in others) + "n" +
             "".join(STEP_LETTERS[i - 1] for i in attended) +
             "".join(KEY_LETTERS[i - 1] for i in attended))
    scores = torch.einsum(f"{q_str},{k_str}->{s_str}", q, k) / math.sqrt(key_dim)
    if mask is not None:
        scores = scores + (1.0 - mask.unsqueeze(1 + len(others))) * -1e9
    n = len(attended)
    shape = scores.shape
    flat = scores.reshape(*shape[:-2 * n], math.prod(shape[-2 * n:-n]), math.prod(shape[-n:]))
    if causal:
        assert n == 1
        keep = torch.ones(flat.shape[-2], flat.shape[-1], dtype=torch.bool).tril()
        flat = flat.masked_fill(~keep, float("-inf"))
    p = torch.softmax(flat, dim=-1).reshape(shape)
    o = torch.einsum(f"{s_str},{k_str}->{q_str}", p, v).reshape(*q_in.shape[:-1],
                                                                heads * value_dim)
    kernel = w["attention_output/kernel"]
    y = F.linear(o, kernel.reshape(heads * value_dim, -1).T,
                 w["attention_output/bias"] if use_bias else None)
    return y, p


def check_mha_axes():
    """The einsum formulas against the flattened attention above, run on each slice along the
    axes not attended (attention_axes (2,) and (1,), the causal mask with (1,)), and against it
    directly for the default axes."""
    heads, key_dim = 2, 3
    w = mha_weights(4, 4, 4, heads, key_dim, key_dim, 4, True)
    q, v = rnd(2, 3, 5, 4), rnd(2, 3, 6, 4)
    y, _ = mha_axes(w, q, v, v, heads, key_dim, key_dim, (2,), True)
    for t in range(3):
        ref = mha(w, q[:, t], v[:, t], v[:, t], heads, key_dim, key_dim, True, False)
        assert torch.allclose(y[:, t], ref, atol=1e-12), "attention_axes (2,) disagrees"
    q, v = rnd(2, 5, 3, 4), rnd(2, 5, 3, 4)
    for causal in (False, True):
        y, _ = mha_axes(w, q, v, v, heads, key_dim, key_dim, (-3,), True, causal)
        for s in range(3):
            ref = mha(w, q[:, :, s], v[:, :, s], v[:, :, s], heads, key_dim, key_dim, True, causal)
            assert torch.allclose(y[:, :, s], ref, atol=1e-12), "attention_axes (1,) disagrees"
    q, v = rnd(2, 2, 3, 4), rnd(2, 3, 2, 4)
    y, _ = mha_axes(w, q, v, v, heads, key_dim, key_dim, (1, 2), True)
    ref = mha(w, q, v, v, heads, key_dim, key_dim, True, False)
    assert torch.allclose(y, ref, atol=1e-12), "the default attention_axes disagree"


def mha_axes_case(name, heads, key_dim, axes, q_shape, v_shape, k_shape=None, value_dim=None,
                  output_shape=None, use_bias=True, causal=False, mask=False, scores=False):
    """A MultiHeadAttention case over `axes`; with `mask`, Keras's attention_mask (the scores'
    shape without the heads, every row keeping one key position) is the call's last input; with
    `scores`, the call returns the attention scores too, and the loss adds sum(scores * gs)
    (`scores`, `scores_shape`, `scores_upstream`)."""
    value_dim = value_dim or key_dim
    q_in = rnd(*q_shape, scale=1.5).requires_grad_()
    v_in = rnd(*v_shape, scale=1.5).requires_grad_()
    k_in = rnd(*k_shape, scale=1.5).requires_grad_() if k_shape else v_in
    inputs = [q_in, v_in] + ([k_in] if k_shape else [])
    out = output_shape or q_shape[-1]
    w = mha_weights(q_shape[-1], k_in.shape[-1], v_in.shape[-1], heads, key_dim, value_dim, out,
                    use_bias)
    for t in w.values():
        t.requires_grad_()
    attention_mask = None
    if mask:
        rank = len(q_shape)
        attended = [a if a >= 0 else rank + a for a in axes]
        others = [i for i in range(1, rank - 1) if i not in attended]
        mask_shape = ([q_shape[0]] + [q_shape[i] for i in others] +
                      [q_shape[i] for i in attended] + [v_shape[i] for i in attended])
        attention_mask = (torch.rand(*mask_shape) < 0.6).to(DT)
        n = len(attended)
        rows = attention_mask.view(*mask_shape[:-2 * n], -1, math.prod(mask_shape[-n:]))
        rows[..., 0] = 1.0
    y, p = mha_axes(w, q_in, v_in, k_in, heads, key_dim, value_dim, axes, use_bias, causal,
                    attention_mask)
    config = {"num_heads": heads, "key_dim": key_dim, "value_dim": value_dim, "dropout": 0.0,
              "use_bias": use_bias, "output_shape": [output_shape] if output_shape else None,
              "attention_axes": list(axes)}
    kwargs = {"use_causal_mask": True} if causal else {}
    grads = [True] * len(inputs)
    if mask:
        inputs.append(attention_mask)
        grads.append(False)
        kwargs["attention_mask"] = ["mask", 0, 0]
    if not scores:
        return finish(name, "MultiHeadAttention", config, inputs, grads, w, y, kwargs)
    gs = rnd(*p.shape)
    c = finish(name, "MultiHeadAttention", config, inputs, grads, w,
               MhaWithScores.apply(y, p, gs), kwargs)
    c["call_kwargs"]["return_attention_scores"] = True
    c["output_shape"] = list(y.shape)
    c["output"] = flat(y)
    c["scores_shape"] = list(p.shape)
    c["scores"] = flat(p)
    c["scores_upstream"] = flat(gs)
    return c


class MhaWithScores(torch.autograd.Function):
    """Passes the output through while the backward also sends `gs` into the scores: the loss
    sum(y * g) + sum(scores * gs) with one upstream `g` for `finish`."""

    @staticmethod
    def forward(ctx, y, p, gs):
        ctx.save_for_backward(gs)
        return y.detach().clone()

    @staticmethod
    def backward(ctx, g):
        (gs,) = ctx.saved_tensors
        return g, gs, None


check_mha_axes()
# A list of their own, so that "cases" keeps the 17 cases the CUDA test counts.
axes_cases = [
    mha_axes_case("mha_axes_2", 2, 3, (2,), (2, 3, 4, 5), (2, 3, 6, 4), k_shape=(2, 3, 6, 7),
                  value_dim=2, output_shape=3),
    mha_axes_case("mha_axes_1_negative", 2, 2, (-3,), (2, 4, 3, 5), (2, 5, 3, 6)),
    mha_axes_case("mha_axes_1_causal", 2, 3, (1,), (2, 4, 3, 5), (2, 4, 3, 5), use_bias=False,
                  causal=True),
    mha_axes_case("mha_axes_23_rank5", 2, 2, (2, 3), (2, 2, 3, 2, 4), (2, 2, 2, 3, 5),
                  value_dim=3),
    mha_axes_case("mha_axes_31_rank5", 1, 3, (3, 1), (2, 3, 2, 2, 4), (2, 2, 2, 3, 4)),
    mha_axes_case("mha_axes_2_mask", 2, 3, (2,), (2, 3, 4, 5), (2, 3, 5, 5), mask=True),
    mha_axes_case("mha_axes_1_mask_causal", 2, 2, (1,), (2, 4, 2, 3), (2, 4, 2, 3), mask=True,
                  causal=True),
]

# The cases that return the attention scores, which run_case does not read.
scores_cases = [
    mha_axes_case("mha_scores_axes_2", 2, 3, (2,), (2, 3, 4, 5), (2, 3, 6, 4), scores=True),
    mha_axes_case("mha_scores_axes_31_rank5", 2, 2, (3, 1), (2, 3, 2, 2, 4), (2, 2, 2, 3, 4),
                  k_shape=(2, 2, 2, 3, 3), scores=True),
    mha_axes_case("mha_scores_default_rank4", 2, 2, (1, 2), (2, 2, 3, 4), (2, 3, 2, 4),
                  value_dim=3, scores=True),
    mha_axes_case("mha_scores_axes_1_mask", 1, 3, (1,), (2, 4, 3, 4), (2, 5, 3, 4), mask=True,
                  scores=True),
]

with open(os.path.join(HERE, "reference", "attention.json"), "w") as f:
    json.dump({"cases": cases, "axes_cases": axes_cases, "scores_cases": scores_cases}, f,
              separators=(",", ":"))
