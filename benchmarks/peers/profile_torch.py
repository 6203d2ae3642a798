#!/usr/bin/python3
"""PyTorch's GPU kernel times per training step of keras_torch.py's workloads, to set beside
ours (benchmarks/kernel_times.py on Nsight Compute's output for bench_keras_gpu).

    profile_torch.py WORKLOAD/BATCH...     e.g. cnn/256 cnn/32 mlp/256

For each: the model, Adam(1e-3) and cross-entropy of keras_torch.py in full fp32 on the first GPU,
two warm-up passes over 5 batches, then 5 eager steps under torch.profiler (the graph mode
replays the same kernels). Prints the kernel time per step and the 12 largest kernels. Run with
the GPU machine's python3 (a CUDA build of PyTorch); one line on stderr and exit status 1 where
PyTorch sees no GPU.
"""
import sys

import keras_torch as peer

STEPS = 5


def self_time(event):
    """An event's own device time in microseconds (named for CUDA before PyTorch 2.4)."""
    value = getattr(event, "self_device_time_total", None)
    return value if value is not None else event.self_cuda_time_total


def profile(torch, workload, batch):
    model = peer.model_of(workload).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    xs, ys = peer.data_of(workload, batch, "cuda")
    one_pass = peer.eager_pass(model, optimizer, torch.nn.CrossEntropyLoss(), xs[:STEPS],
                               ys[:STEPS])
    one_pass()
    one_pass()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        one_pass()
        torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if self_time(e) > 0]
    total = sum(self_time(e) for e in kernels) / STEPS
    print(f"=== PyTorch {torch.__version__} {workload}/{batch}: {total:.1f} us of kernels per step")
    for e in sorted(kernels, key=lambda e: -self_time(e))[:12]:
        print(f"  {self_time(e) / STEPS:8.1f} us  {e.key[:100]}")


def main():
    points = []
    for point in sys.argv[1:]:
        workload, _, batch = point.partition("/")
        if workload not in ("mlp", "cnn", "text") or not batch.isdigit() or int(batch) == 0:
            sys.exit(f"profile_torch.py: {point!r}: expected WORKLOAD/BATCH, the workload mlp, cnn "
                     "or text and the batch a positive number (e.g. cnn/256)")
        points.append((workload, int(batch)))
    try:
        import torch
    except ImportError as error:
        sys.exit(f"profile_torch.py: {sys.executable} has no PyTorch ({error})")
    if not torch.cuda.is_available():
        sys.exit("profile_torch.py: PyTorch sees no GPU")
    peer.full_fp32(torch)
    for workload, batch in points:
        profile(torch, workload, batch)


if __name__ == "__main__":
    main()
