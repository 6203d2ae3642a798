#!/usr/bin/python3
"""PyTorch DataLoader on the workloads of bench_data_dataset, for `benchmarks/run data`.

pipeline: rows of a 60000x32 float tensor (small rows: the cost per element, not bandwidth) and
int64 labels, a pass-through map (the dataset's __getitem__), batches of 32 by the default
collate, with workers=0 (main process) or 1 (one worker process with prefetch_factor=2, PyTorch's
prefetch). parallel-map: a CPU-bound function of about
100 us per element (calibrated here, as the C++ side calibrates its own), batches of 32, on 1, 2 or
4 worker processes. PyTorch has no thread workers: its worker processes are its parallel map, so
they are reported under mode "threads". Prints a JSON list of
{"workload", "workers", "mode", "value", "unit"} on stdout. Run with /usr/bin/python3. Takes
--list, --only REGEX and --timeout S (see common.py).
"""
import json
import math
import sys
import time

import common

ROWS = 60000
FEATURES = 32
MEASURE_SECONDS = 2.0
PIPELINE_WORKERS = (0, 1)
PARALLEL_MAP_WORKERS = (1, 2, 4)
NAMES = [f"pipeline/threads/{n}" for n in PIPELINE_WORKERS] + \
    [f"parallel-map/threads/{n}" for n in PARALLEL_MAP_WORKERS]

if __name__ == "__main__":
    # Before importing torch (seconds), so that --list is cheap.
    SELECTED, ARGS = common.select(NAMES, __doc__.splitlines()[0])

import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402


class Rows(Dataset):
    def __init__(self):
        self.x = torch.full((ROWS, FEATURES), 0.5)
        self.y = torch.full((ROWS,), 3, dtype=torch.int64)

    def __len__(self):
        return ROWS

    def __getitem__(self, index):
        return self.x[index], self.y[index]


class CpuBound(Dataset):
    def __init__(self, rounds, length=1 << 30):
        self.rounds = rounds
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        acc = float(index)
        for i in range(self.rounds):
            acc += math.sin(acc + i)
        return torch.tensor(acc, dtype=torch.float64)


def calibrate_rounds(target):
    probe = CpuBound(20000)
    best = 1e9
    for i in range(5):
        start = time.perf_counter()
        probe[i]
        best = min(best, time.perf_counter() - start)
    return max(1, int(20000 * target / best))


def elements_per_second(dataset, workers, batch_size=32):
    kwargs = {"num_workers": workers}
    if workers > 0:
        # timeout bounds each wait for a worker's batch: a hung worker raises instead of blocking.
        kwargs.update(prefetch_factor=2, persistent_workers=True, timeout=ARGS.timeout)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, **kwargs)
    it = iter(loader)
    for _ in range(5):  # warm up: workers started, queues full
        next(it)
    elements = 0
    start = time.perf_counter()
    while True:
        try:
            batch = next(it)
        except StopIteration:  # a new epoch (the same workers with persistent_workers)
            it = iter(loader)
            continue
        elements += batch[0].shape[0] if isinstance(batch, (list, tuple)) else batch.shape[0]
        elapsed = time.perf_counter() - start
        if elapsed >= MEASURE_SECONDS:
            return elements / elapsed


def measure(workload, dataset, workers):
    """A record of elements per second, or one line on stderr and exit status 1."""
    try:
        value = elements_per_second(dataset, workers)
    except Exception as error:  # a worker died or hung: one line, not a traceback
        common.fail(f"{workload}/threads/{workers}", f"{type(error).__name__}: "
                    + (str(error).strip().splitlines() or [""])[0])
    return {"workload": workload, "workers": workers, "mode": "threads", "value": value,
            "unit": "elements/s"}


def main():
    torch.set_num_threads(1)
    results = []
    pipeline = [n for n in PIPELINE_WORKERS if f"pipeline/threads/{n}" in SELECTED]
    if pipeline:
        rows = Rows()
        results += [measure("pipeline", rows, workers) for workers in pipeline]
    parallel = [n for n in PARALLEL_MAP_WORKERS if f"parallel-map/threads/{n}" in SELECTED]
    if parallel:
        cpu = CpuBound(calibrate_rounds(100e-6))
        results += [measure("parallel-map", cpu, workers) for workers in parallel]
    json.dump(results, sys.stdout)
    print()


if __name__ == "__main__":
    sys.exit(main())
