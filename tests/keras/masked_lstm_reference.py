"""Keras's LSTM written out in PyTorch float64 for the generators of nested-model references
(generate_nested_masks.py, generate_nested_multi.py): random weights, flat lists for JSON, and
the LSTM over a masked sequence.

Keras's semantics: gates i, f, c, o in the kernel's column order, sigmoid and tanh; a masked step
keeps the states and outputs the previous output (zeros before the first); the final state h is
the last kept one.
"""
import torch

DT = torch.float64


def rnd(*shape, scale=0.5):
    return ((torch.rand(shape, dtype=DT) * 2 - 1) * scale).requires_grad_()


def flat(t):
    return [round(float(v), 12) for v in t.detach().reshape(-1).tolist()]


def lstm_steps(x, mask, kernel, recurrent, bias, units):
    """The output of every step (batch, steps, units) and the final h (batch, units)."""
    batch, steps, _ = x.shape
    h = torch.zeros(batch, units, dtype=DT)
    c = torch.zeros(batch, units, dtype=DT)
    outputs = []
    for t in range(steps):
        z = x[:, t] @ kernel + h @ recurrent + bias
        i, f, g, o = (z[:, k * units:(k + 1) * units] for k in range(4))
        c_new = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h_new = torch.sigmoid(o) * torch.tanh(c_new)
        keep = mask[:, t:t + 1]
        h = torch.where(keep, h_new, h)
        c = torch.where(keep, c_new, c)
        outputs.append(h)
    return torch.stack(outputs, dim=1), h
