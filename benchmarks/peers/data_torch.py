#!/usr/bin/python3
"""PyTorch DataLoader on the workloads of bench_data_sequence_adapter, for `benchmarks/run data`.

Map-style datasets, batch_size=None (each item is a batch), persistent workers. PyTorch has no
thread workers, so its process measurement is reported for both modes. Prints a JSON list of
{"workload", "workers", "mode", "value", "unit"} on stdout. Run with /usr/bin/python3 (Debian's
python3-torch). Takes --list, --only REGEX and --timeout S (see common.py).
"""
import json
import math
import os
import sys
import time

import common

LENGTH = 1000
WORKLOADS = ("hand-off", "cpu-bound", "large")
# The same worker counts as bench_data_sequence_adapter: LOADSTAR_BENCH_WORKERS, else 1, 2, 3.
WORKERS = tuple(int(w) for w in os.environ.get("LOADSTAR_BENCH_WORKERS", "1,2,3").split(","))
MODES = ("threads", "processes")
NAMES = [f"{w}/{m}/{n}" for n in WORKERS for m in MODES for w in WORKLOADS]

if __name__ == "__main__":
    # Before importing torch (seconds), so that --list is cheap.
    SELECTED, ARGS = common.select(NAMES, __doc__.splitlines()[0])

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class HandOff(Dataset):
    """A prebuilt 32x784 batch handed out as is."""

    def __init__(self):
        self.batch = torch.ones(32, 784)

    def __len__(self):
        return LENGTH

    def __getitem__(self, index):
        return self.batch


class CpuBound(Dataset):
    """About 1 ms of scalar arithmetic per batch (calibrated), returning a small tensor."""

    def __init__(self, rounds):
        self.rounds = rounds

    def __len__(self):
        return LENGTH

    def __getitem__(self, index):
        acc = float(index)
        for i in range(self.rounds):
            acc += math.sin(acc + i)
        return torch.tensor([acc], dtype=torch.float32)


class Large(Dataset):
    """32x3x224x224 float batches, each fresh memory (a copy of a prebuilt source)."""

    def __init__(self):
        self.source = torch.full((32, 3, 224, 224), 0.5)

    def __len__(self):
        return LENGTH

    def __getitem__(self, index):
        return self.source.clone()


def calibrate():
    """The rounds that take about 1 ms: the fastest of several probes (the machine is shared)."""
    probe = CpuBound(20000)
    best = 1e9
    for i in range(7):
        start = time.perf_counter()
        probe[i]
        best = min(best, time.perf_counter() - start)
    return max(1, int(20000 * 1e-3 / best))


def rate(dataset, workers, seconds=1.0):
    """Batches per second in steady state, after a warm-up."""
    # timeout bounds each wait for a worker's batch: a hung worker raises instead of blocking.
    loader = DataLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                        persistent_workers=workers > 0, prefetch_factor=2 if workers else None,
                        timeout=ARGS.timeout if workers else 0)
    count = 0
    while True:  # an infinite stream over epochs, as the adapter's training stream
        for batch in loader:
            count += 1
            if count == 10:
                start = time.perf_counter()
            elif count > 10 and time.perf_counter() - start >= seconds:
                return (count - 10) / (time.perf_counter() - start)


def main():
    torch.set_num_threads(1)
    wanted = lambda name, workers: any(f"{name}/{m}/{workers}" in SELECTED for m in MODES)
    rounds = calibrate() if any(wanted("cpu-bound", n) for n in WORKERS) else 1
    records = []
    large_bytes = Large().source.numel() * 4
    for workers in WORKERS:
        for name, make, unit, scale in (
                ("hand-off", HandOff, "batches/s", 1.0),
                ("cpu-bound", lambda: CpuBound(rounds), "batches/s", 1.0),
                ("large", Large, "GB/s", large_bytes / 1e9)):
            if not wanted(name, workers):
                continue
            try:
                value = rate(make(), workers) * scale
            except Exception as error:  # a worker died or hung: one line, not a traceback
                names = [f"{name}/{m}/{workers}" for m in MODES]
                common.fail(", ".join(n for n in names if n in SELECTED),
                            f"{type(error).__name__}: "
                            + (str(error).strip().splitlines() or [""])[0])
            # One measurement for both modes: PyTorch has no thread workers.
            for mode in MODES:
                if f"{name}/{mode}/{workers}" in SELECTED:
                    records.append({"workload": name, "workers": workers, "mode": mode,
                                    "value": value, "unit": unit})
    json.dump(records, sys.stdout)
    print()


if __name__ == "__main__":
    main()
