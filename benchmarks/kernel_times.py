#!/usr/bin/python3
"""One training step's GPU kernel times, by kernel, from Nsight Compute's CSV.

    benchmarks/kernel_times.py NCU_OUTPUT [--step-end REGEX]

NCU_OUTPUT is what `ncu --csv --metrics gpu__time_duration.sum ... bench_keras_gpu --no-graphs
--benchmark_filter=...` printed (the program's own lines among it are skipped). A step is the
kernels after one match of --step-end (default: the CUDA backend's optimizer kernel, the last of
a training step) up to and including the next. Prints the step's total, then each kernel family
with its time and share, largest first: loadstar's kernels by function name, cuBLAS(Lt)'s as
"gemm", "splitKreduce" or "bias reduction (BGRADA)". Exits with 1 in one line where the output
holds no such step.
"""
import argparse
import collections
import csv
import re
import sys

METRIC = "gpu__time_duration.sum"
# The multipliers to microseconds of the units ncu writes durations in.
UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}


def family(kernel):
    """The name a kernel's time is summed under."""
    ours = re.search(r"loadstar::(?:[\w:<>]*::)?(\w+_kernel)", kernel)
    if ours:
        return ours.group(1)
    if "splitKreduce" in kernel:
        return "splitKreduce"
    if "Bgrad" in kernel:
        return "bias reduction (BGRADA)"
    if "gemm" in kernel or "Kernel2" in kernel or "xmma" in kernel:
        return "gemm"
    return kernel.split("(")[0][:60]


def durations(lines):
    """(kernel name, microseconds) for each kernel profiled, in launch order."""
    rows = csv.DictReader(line for line in lines if line.startswith('"'))
    out = []
    for row in rows:
        if row.get("Metric Name") != METRIC:
            continue
        scale = UNITS.get(row.get("Metric Unit", "nsecond"))
        if scale is None:
            raise ValueError(f"unknown time unit {row.get('Metric Unit')!r}")
        out.append((row["Kernel Name"], float(row["Metric Value"].replace(",", "")) * scale))
    return out


def one_step(kernels, step_end):
    ends = [i for i, (name, _) in enumerate(kernels) if re.search(step_end, name)]
    if len(ends) < 2:
        return None
    return kernels[ends[0] + 1:ends[1] + 1]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ncu_output")
    parser.add_argument("--step-end", default=r"optimizer_step_kernel",
                        help="a regex matching the last kernel of a step")
    args = parser.parse_args()
    try:
        with open(args.ncu_output, errors="replace") as f:
            kernels = durations(f)
    except (OSError, ValueError, KeyError) as error:
        sys.exit(f"kernel_times.py: {args.ncu_output}: {error}")
    step = one_step(kernels, args.step_end)
    if step is None:
        sys.exit(f"kernel_times.py: {args.ncu_output}: no whole step ({len(kernels)} kernel times; "
                 f"a step ends at a kernel matching {args.step_end!r}, and two are needed)")
    total = sum(us for _, us in step)
    by_family = collections.defaultdict(lambda: [0.0, 0])
    for name, us in step:
        by_family[family(name)][0] += us
        by_family[family(name)][1] += 1
    print(f"one step: {len(step)} kernels, {total:.1f} us")
    for name, (us, count) in sorted(by_family.items(), key=lambda item: -item[1][0]):
        print(f"  {us:8.1f} us {100 * us / total:5.1f}%  x{count:<3} {name}")


if __name__ == "__main__":
    main()
