#!/usr/bin/python3
"""Writes the half-precision reference files under tests/data/npy/ that tests/data/test_npy.cpp
reads: float32 inputs chosen to exercise rounding (ties to even, subnormals, overflow, NaN and
infinities), NumPy's float16 of them, and PyTorch's bfloat16 of them as raw 16-bit patterns
(NumPy has no bfloat16 dtype).

Run with Debian's python3-numpy and python3-torch: /usr/bin/python3 tests/data/generate_half.py
"""
import os

import numpy as np
import torch

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(TESTS, "data", "npy")


def save(name, array):
    with open(os.path.join(HERE, name), "wb") as f:
        np.lib.format.write_array(f, array, allow_pickle=False)


def main():
    rng = np.random.default_rng(36)
    special = np.array(
        [0.0, -0.0, 1.0, -1.0, 0.1, 1.0 / 3.0, 65504.0, 65519.0, 65520.0, 1e6, -1e6,
         6.1e-5, 5.96e-8, 2.98e-8, 2.99e-8, 1e-9, 1.0009765625, 1.00048828125, 1.00146484375,
         1.00390625, 1.001953125, 1.005859375, 3.3895314e38, 1e-39, np.inf, -np.inf, np.nan],
        dtype=np.float32)
    # Random values over many binades, and values exactly halfway between two float16s.
    spread = (rng.standard_normal(200) * np.exp2(rng.integers(-26, 18, 200))).astype(np.float32)
    halfway = (np.arange(1, 65, dtype=np.float32) * np.float32(2.0 ** -10) + 1.0 +
               np.float32(2.0 ** -11)).astype(np.float32)
    inputs = np.concatenate([special, spread, halfway]).astype("<f4")
    save("half_inputs_f4.npy", inputs)
    save("half_numpy_f2.npy", inputs.astype("<f2"))
    bits = torch.from_numpy(inputs).to(torch.bfloat16).view(torch.int16).numpy()
    save("bfloat16_torch_u2.npy", bits.view(np.uint16).astype("<u2"))
    # A float16 array in both byte orders, read by the pattern test.
    values = ((np.arange(24) % 11) - 3).astype(np.float32) * np.float32(0.25)
    save("pattern_f2_le.npy", values.astype("<f2").reshape(2, 3, 4))
    save("pattern_f2_be.npy", values.astype(">f2").reshape(2, 3, 4))


if __name__ == "__main__":
    main()
