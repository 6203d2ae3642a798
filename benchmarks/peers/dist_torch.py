#!/usr/bin/python3
"""PyTorch DistributedDataParallel on the workload of bench_dist_train, for `benchmarks/run dist`.

The small CNN of keras_torch.py, Adam(1e-3) and cross-entropy from logits, trained by N ranks
(processes started with torch.multiprocessing, the gloo backend, a file store in a temporary
folder), each with torch.set_num_threads(1) and global batch / N rows of synthetic 28x28 images
per step. As bench_dist_train: a warm-up, then the number of steps the slowest rank's warm-up
says take --seconds (at least 10), between two barriers; then half as many steps under
DDP.no_sync(), which compute the same but sum no gradients. Names are "cnn/<ranks>". Prints a
JSON list of {"workload", "ranks", "batch", "threads", "value", "unit", "steps", "step_ms",
"compute_ms", "compute_cpu_ms"} on stdout (value: global samples per second; compute_cpu_ms: the
CPU time rank 0 used per step without the sum). Run with /usr/bin/python3. Takes
--list, --only REGEX and --timeout S (see common.py), --batch B (the global batch, default 64)
and --seconds S (default 2); a rank that fails, dies or outlives the timeout ends the script in
one line with the workload, the rank and its exit code.
"""
import json
import os
import queue as queues
import sys
import tempfile
import time

import common
import keras_torch

STEPS = 20
WARMUP_STEPS = 5
MIN_STEPS = 10
GRID = [("cnn", 1), ("cnn", 2)]


def options(parser):
    parser.add_argument("--batch", type=int, default=64, metavar="B",
                        help="the global batch, divided among the ranks (default 64)")
    parser.add_argument("--seconds", type=float, default=2.0, metavar="S",
                        help="about how long the summing steps run (default 2)")


def name_of(workload, ranks):
    return f"{workload}/{ranks}"


def train(model, optimizer, loss_fn, xs, ys, steps, at):
    """steps steps on the batches from index at (cycling); returns the next index."""
    for _ in range(steps):
        optimizer.zero_grad()
        loss = loss_fn(model(xs[at]), ys[at])
        loss.backward()
        optimizer.step()
        at = (at + 1) % len(xs)
    return at


def measure(rank, ranks, batch, seconds, store, timeout, queue):
    """One rank of the job; rank 0 sends the record, a rank that fails sends its error."""
    try:
        import datetime

        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                                world_size=ranks, timeout=datetime.timedelta(seconds=timeout))
        torch.manual_seed(1)
        model = DistributedDataParallel(keras_torch.model_of("cnn"))  # rank 0's weights
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
        loss_fn = torch.nn.CrossEntropyLoss()
        per_rank = batch // ranks
        torch.manual_seed(7 + rank)  # each rank its own rows
        xs = [torch.rand(per_rank, 1, 28, 28) for _ in range(STEPS)]
        ys = [(torch.arange(per_rank) + rank * per_rank) % 10 for _ in range(STEPS)]

        at = train(model, optimizer, loss_fn, xs, ys, 1, 0)
        dist.barrier()
        start = time.perf_counter()
        at = train(model, optimizer, loss_fn, xs, ys, WARMUP_STEPS, at)
        slowest = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        steps = max(MIN_STEPS, int(seconds / (slowest.item() / WARMUP_STEPS)))
        dist.barrier()
        start = time.perf_counter()
        at = train(model, optimizer, loss_fn, xs, ys, steps, at)
        dist.barrier()
        summing = time.perf_counter() - start

        alone_steps = max(MIN_STEPS, steps // 2)
        with model.no_sync():
            at = train(model, optimizer, loss_fn, xs, ys, WARMUP_STEPS, at)
            dist.barrier()
            start, cpu_start = time.perf_counter(), time.process_time()
            train(model, optimizer, loss_fn, xs, ys, alone_steps, at)
            computing_cpu = time.process_time() - cpu_start
            dist.barrier()
            computing = time.perf_counter() - start
        dist.destroy_process_group()
        if rank == 0:
            queue.put(("result", rank, {
                "workload": "cnn", "ranks": ranks, "batch": batch, "threads": 1,
                "value": steps * batch / summing, "unit": "samples/s", "steps": steps,
                "step_ms": summing * 1e3 / steps, "compute_ms": computing * 1e3 / alone_steps,
                "compute_cpu_ms": computing_cpu * 1e3 / alone_steps}))
    except Exception as error:  # one line in the parent's report, not a traceback here
        text = str(error).strip().splitlines()
        queue.put(("error", rank, f"{type(error).__name__}: {text[0] if text else ''}"))
        queue.close()
        queue.join_thread()  # sent before the exit
        os._exit(1)


def stop(processes):
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join(timeout=10)


def failure(processes, errors):
    """One line on what went wrong: the ranks that died or exited with an error, and why."""
    parts = []
    for rank, process in enumerate(processes):
        if rank in errors:
            parts.append(f"rank {rank} failed ({errors[rank]})")
        elif process.exitcode not in (None, 0):
            parts.append(f"rank {rank} exited with code {process.exitcode}")
    return "; ".join(parts) + " before rank 0 sent its result"


def run_job(context, workload, ranks, args):
    """The record of rank 0 of a job of ranks processes, waiting at most args.timeout s."""
    name = name_of(workload, ranks)
    if args.batch < ranks or args.batch % ranks != 0:
        common.fail(name, f"the global batch {args.batch} does not divide among {ranks} ranks")
    queue = context.Queue()
    with tempfile.TemporaryDirectory(prefix="loadstar-dist-torch-") as folder:
        store = os.path.join(folder, "store")
        processes = [context.Process(target=measure, args=(rank, ranks, args.batch, args.seconds,
                                                           store, args.timeout, queue))
                     for rank in range(ranks)]
        for process in processes:
            process.start()
        deadline = time.monotonic() + args.timeout
        errors = {}
        while True:
            try:
                kind, rank, payload = queue.get(timeout=1.0)
                if kind == "result":
                    for process in processes:
                        process.join(timeout=max(1.0, deadline - time.monotonic()))
                    stop(processes)
                    return payload
                errors[rank] = payload
            except queues.Empty:
                pass
            if errors or any(p.exitcode not in (None, 0) for p in processes):
                time.sleep(1.0)  # the other ranks' errors and exits, for the report
                while True:
                    try:
                        kind, rank, payload = queue.get(timeout=0.1)
                    except queues.Empty:
                        break
                    if kind == "error":
                        errors[rank] = payload
                message = failure(processes, errors)  # before the survivors are killed
                stop(processes)
                common.fail(name, message)
            if all(not p.is_alive() for p in processes):
                common.fail(name, "every rank exited without a result")
            if time.monotonic() > deadline:
                stop(processes)
                common.fail(name, f"rank 0 sent no result within {args.timeout:g} s; killed")


def main():
    selected, args = common.select([name_of(*point) for point in GRID],
                                   __doc__.splitlines()[0], options)
    import torch.multiprocessing
    context = torch.multiprocessing.get_context("spawn")
    records = [run_job(context, workload, ranks, args) for workload, ranks in GRID
               if name_of(workload, ranks) in selected]
    json.dump(records, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
