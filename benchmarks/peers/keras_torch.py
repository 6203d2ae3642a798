#!/usr/bin/python3
"""PyTorch on the workloads of bench_keras, for `benchmarks/run keras`.

The same models (the Fashion-MNIST MLP, the small CNN and the 1-D text CNN, channels first as
PyTorch wants), Adam(1e-3) and cross-entropy from logits, trained for the same 50 steps per pass
on synthetic 28x28 images (100 token ids for the text CNN), with torch.set_num_threads(threads).
Each (workload, batch, threads) runs in its own
process, so that its peak resident memory is its own. Prints a JSON list of {"workload", "batch",
"threads", "value", "unit", "peak_rss_mb"} on stdout. Run with /usr/bin/python3. Takes --list,
--only REGEX and --timeout S (see common.py); a measuring process that dies or outlives the
timeout is reported in one line with the workload and its exit code.
"""
import json
import multiprocessing
import queue as queues
import resource
import sys
import time

import common

STEPS = 50
MEASURE_SECONDS = 2.0
GRID = [("mlp", 32, 1), ("mlp", 32, 2), ("mlp", 256, 1), ("mlp", 256, 2), ("cnn", 32, 1),
        ("cnn", 32, 2), ("cnn", 256, 1), ("cnn", 256, 2), ("text", 32, 1), ("text", 32, 2)]
TEXT_STEPS = 100


def model_of(workload):
    import torch.nn as nn

    class Transpose(nn.Module):
        def forward(self, x):
            return x.transpose(1, 2)

    if workload == "text":
        # Keras's Conv1D is channels_last; PyTorch's Conv1d wants (batch, channels, steps).
        return nn.Sequential(nn.Embedding(1000, 32), Transpose(), nn.Conv1d(32, 64, 5), nn.ReLU(),
                             nn.MaxPool1d(4), nn.Conv1d(64, 64, 5), nn.ReLU(),
                             nn.AdaptiveMaxPool1d(1), nn.Flatten(), nn.Linear(64, 10))
    if workload == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(32, 64, 3),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(1600, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def measure(workload, batch, threads, queue):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model = model_of(workload)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    if workload == "text":
        xs = [torch.randint(0, 1000, (batch, TEXT_STEPS)) for _ in range(STEPS)]
    else:
        shape = (batch, 28, 28) if workload == "mlp" else (batch, 1, 28, 28)
        xs = [torch.rand(shape) for _ in range(STEPS)]
    ys = [torch.arange(batch) % 10 for _ in range(STEPS)]

    def one_pass():
        for x, y in zip(xs, ys):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()

    one_pass()  # warm-up
    samples, start = 0, time.perf_counter()
    while time.perf_counter() - start < MEASURE_SECONDS:
        one_pass()
        samples += batch * STEPS
    rate = samples / (time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    queue.put({"workload": workload, "batch": batch, "threads": threads, "value": rate,
               "unit": "samples/s", "peak_rss_mb": peak})


def name_of(workload, batch, threads):
    return f"{workload}/{batch}/{threads}"


def run_child(context, workload, batch, threads, timeout):
    """The record the measuring process sends, waiting at most timeout seconds for it."""
    name = name_of(workload, batch, threads)
    queue = context.Queue()
    process = context.Process(target=measure, args=(workload, batch, threads, queue))
    process.start()
    deadline = time.monotonic() + timeout
    while True:
        try:
            record = queue.get(timeout=1.0)
            process.join(timeout=max(1.0, deadline - time.monotonic()))
            return record
        except queues.Empty:
            pass
        if not process.is_alive():
            try:  # it may have sent its record just before exiting
                return queue.get(timeout=1.0)
            except queues.Empty:
                common.fail(name, f"the measuring process exited with code {process.exitcode} "
                            "before sending its result")
        if time.monotonic() > deadline:
            process.kill()
            process.join(timeout=10)
            common.fail(name, f"the measuring process sent no result within {timeout:g} s; "
                        "killed")


def main():
    selected, args = common.select([name_of(*point) for point in GRID],
                                   __doc__.splitlines()[0])
    records = []
    context = multiprocessing.get_context("spawn")
    for workload, batch, threads in GRID:
        if name_of(workload, batch, threads) in selected:
            records.append(run_child(context, workload, batch, threads, args.timeout))
    json.dump(records, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
