#!/usr/bin/python3
"""Checks the failure paths of benchmarks/run and the peer scripts: each ends in one line that
says what failed, with a non-zero exit status, and in bounded time, never a traceback or a hang.

    benchmarks/check_run.py [-v]

Needs /usr/bin/python3 with PyTorch for the peer cases (skipped without it) and, for the --only
and timeout cases, the benchmark build directory build-bench that `benchmarks/run data` makes
(skipped without it; the dist cases that build also need mpirun). Runs no benchmark: every case
fails before or at its first measurement, except one 2-second smoke measurement of the peer
script's eager step on the CPU.

`benchmarks/run keras --gpu` (Gpu): the option's parsing, its table and JSON (from a stand-in
bench_keras_gpu and a stand-in peer Python, so that no GPU is needed), the missing-GPU line and
the missing-CUDA-build messages; the real bench_keras_gpu, where build-gpu (tools/gpu-check) or
build-bench has one, must stop with the CUDA backend's "no CUDA device is available" line on a
machine without a GPU (skipped where it has one or where none is built), and our side runs end
to end through the driver on the cuda suite's host emulation of the device where
bench_keras_gpu_emulated is built. GpuCheck: the arguments
of tools/gpu-check and, where it has packed a bundle, that the bundle's bench_keras_gpu lists
the GPU rows. KernelTimes: benchmarks/kernel_times.py's summary of a made-up Nsight Compute
output and its one line for an output without a whole step or with an unknown unit, and
peers/profile_torch.py's one line for a bad WORKLOAD/BATCH.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run")
PEERS = os.path.join(HERE, "peers")
BUILD = os.path.join(os.path.dirname(HERE), "build-bench")
TORCH_PYTHON = "/usr/bin/python3"
HAS_MPIRUN = shutil.which("mpirun") is not None
GPU_NAMES = ["mlp/32/gpu", "mlp/256/gpu", "cnn/32/gpu", "cnn/256/gpu"]
# Every row of bench_keras_gpu and keras_torch.py --device cuda, in their order.
ALL_GPU_NAMES = GPU_NAMES + [f"{w}/{b}/gpu" for w in ("mobilenet", "unet") for b in (32, 256)] + \
    [f"resnet/{b}/gpu/{p}" for b in (128, 512)
     for p in ("float32", "mixed_float16", "mixed_bfloat16")]


def has_torch():
    return subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


def has_torch_cuda():
    return subprocess.run([TORCH_PYTHON, "-c", "import torch, sys; "
                           "sys.exit(0 if torch.cuda.is_available() else 1)"],
                          capture_output=True).returncode == 0


def gpu_bench_dir():
    """A build directory that holds a built bench_keras_gpu, or None."""
    for name in ("build-gpu", "build-bench"):
        folder = os.path.join(os.path.dirname(HERE), name)
        if os.access(os.path.join(folder, "benchmarks", "bench_keras_gpu"), os.X_OK):
            return folder
    return None


GPU_BENCH_DIR = gpu_bench_dir()


def run(*command, timeout=120, env=None):
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class OneLine(unittest.TestCase):
    def assert_one_line(self, done, *parts):
        self.assertNotEqual(done.returncode, 0)
        self.assertNotIn("Traceback", done.stderr)
        last = done.stderr.strip().splitlines()[-1]
        for part in parts:
            self.assertIn(part, last)


class Runner(OneLine):
    def test_peers_without_torch_say_what_to_install(self):
        python = "/nonexistent/python3"
        done = run(RUN, "keras", "--peer-python", python)
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assert_one_line(done, "the peers need PyTorch", python, "tools/install-deps --peers",
                             "--no-peers")

    def test_peers_whose_python_lacks_torch_say_what_to_install(self):
        with tempfile.TemporaryDirectory() as folder:
            python = os.path.join(folder, "python3")
            with open(python, "w") as out:  # a Python whose `import torch` fails
                out.write("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\n"
                          "exit 1\n")
            os.chmod(python, 0o755)
            done = run(RUN, "data", "--only", "hand-off", "--peer-python", python)
        self.assertEqual(done.returncode, 2)
        self.assertEqual(len(done.stderr.strip().splitlines()), 1)
        self.assert_one_line(done, "has none (ModuleNotFoundError: No module named 'torch')",
                             "tools/install-deps --peers", "--no-peers")

    def test_peer_python_from_the_environment(self):
        done = run(RUN, "data", env={"PEER_PYTHON": "/nonexistent/python3"})
        self.assert_one_line(done, "'/nonexistent/python3'", "tools/install-deps --peers")

    def test_empty_compile_selection_lists_the_workloads(self):
        done = run(RUN, "compile", "--only", "no-such-workload")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--only 'no-such-workload' selects none",
                             "keras.hpp keras.hpp-separate data.hpp fashion_mnist.cpp "
                             "fashion_mnist.cpp-separate library-src/keras.cpp")

    def test_bad_regex(self):
        done = run(RUN, "compile", "--only", "(")
        self.assert_one_line(done, "--only '(' is not a regular expression")

    def test_empty_dist_selection_lists_the_workloads(self):
        done = run(RUN, "dist", "--only", "no-such-workload")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--only 'no-such-workload' selects none of the dist",
                             "cnn/1 cnn/2")

    def test_dist_batch_that_does_not_divide_among_the_ranks(self):
        done = run(RUN, "dist", "--batch", "63")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--batch 63 does not divide among 2 ranks")

    def test_dist_without_mpirun_says_what_to_install(self):
        done = run(RUN, "dist", env={"PATH": "/nonexistent"})
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "no mpirun on PATH", "tools/install-deps")

    @unittest.skipUnless(os.path.exists(os.path.join(BUILD, "build.ninja")) and HAS_MPIRUN,
                         "no build-bench or no mpirun")
    def test_a_failing_rank_is_its_own_line_not_mpiruns_banner(self):
        with tempfile.TemporaryDirectory() as folder:
            mpirun = os.path.join(folder, "mpirun")
            with open(mpirun, "w") as out:  # what Open MPI prints after a rank's MPI_Abort
                out.write("#!/bin/sh\necho 'rank 1 of 2: injected failure' >&2\n"
                          "printf -- '-----\\nMPI_ABORT was invoked on rank 1\\n-----\\n' >&2\n"
                          "exit 1\n")
            os.chmod(mpirun, 0o755)
            done = run(RUN, "dist", "--no-peers", "--only", "cnn/2", timeout=1800,
                       env={"PATH": folder + os.pathsep + os.environ["PATH"]})
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "bench_dist_train (2 ranks): exited with code 1: rank 1 of 2: "
                             "injected failure")

    @unittest.skipUnless(os.path.exists(os.path.join(BUILD, "build.ninja")) and HAS_MPIRUN,
                         "no build-bench or no mpirun")
    def test_a_dist_run_past_the_timeout_stops_every_rank(self):
        done = run(RUN, "dist", "--no-peers", "--only", "cnn/2", "--timeout", "5", "--min-time",
                   "600", timeout=1800)
        self.assert_one_line(done, "bench_dist_train (2 ranks): still running after 5 s")
        exe = os.path.join(BUILD, "benchmarks", "bench_dist_train")
        ranks = subprocess.run(["pgrep", "-f", exe], capture_output=True, text=True)
        self.assertEqual(ranks.stdout, "")

    @unittest.skipUnless(os.path.exists(os.path.join(BUILD, "build.ninja")), "no build-bench")
    def test_empty_data_selection_lists_the_workloads(self):
        done = run(RUN, "data", "--no-peers", "--only", "no-such-workload", timeout=1800)
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--only 'no-such-workload' selects none of the data",
                             "hand-off/threads/1", "pipeline/threads/0")

    @unittest.skipUnless(os.path.exists(os.path.join(BUILD, "build.ninja")), "no build-bench")
    def test_a_benchmark_past_the_timeout_is_stopped(self):
        done = run(RUN, "data", "--no-peers", "--only", "^hand-off/processes/2$", "--timeout",
                   "2", "--min-time", "60", timeout=1800)
        self.assert_one_line(done, "bench_data_sequence_adapter (hand-off/processes/2)",
                             "still running after 2 s")


def write_script(path, text):
    with open(path, "w") as out:
        out.write(textwrap.dedent(text))
    os.chmod(path, 0o755)


def fake_gpu_bench(folder, rates=None, failure=None, names=GPU_NAMES):
    """A build directory whose benchmarks/bench_keras_gpu lists the GPU rows (`names`) and, when
    run, reports `rates` ({name: samples/s}) as Google Benchmark's JSON, or prints `failure` and
    exits with 1 as bench_keras_gpu does without a GPU."""
    os.makedirs(os.path.join(folder, "benchmarks"))
    write_script(os.path.join(folder, "benchmarks", "bench_keras_gpu"), f"""\
        #!/usr/bin/python3
        import json, re, sys
        names = {names!r}
        if "--benchmark_list_tests=true" in sys.argv:
            print("\\n".join(n + "/real_time" for n in names))
            sys.exit(0)
        if {failure!r}:
            print({failure!r}, file=sys.stderr)
            sys.exit(1)
        pattern = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--benchmark_filter=")][0]
        rates = {rates!r}
        print(json.dumps({{"benchmarks": [
            {{"name": n + "/real_time", "rate": rates[n], "label": "samples/s",
              "peak_rss_mb": 300.0, "device_mb": 40.0}}
            for n in names if re.search(pattern, n + "/real_time")]}}))
        """)
    return folder


def fake_peer_python(folder, eager, graph, names=GPU_NAMES):
    """A stand-in for the peers' Python: `-c` probes succeed, keras_torch.py --device cuda
    --list lists the GPU rows (`names`) and a measurement prints {name: samples/s} of each mode
    (the ResNet's records with their "policy")."""
    path = os.path.join(folder, "python3")
    write_script(path, f"""\
        #!/usr/bin/python3
        import json, re, sys
        if sys.argv[1] == "-c":
            sys.exit(0)
        args = sys.argv[2:]
        if args[args.index("--device") + 1] != "cuda":
            print("peers/keras_torch.py: expected --device cuda", file=sys.stderr)
            sys.exit(1)
        names = {names!r}
        if "--list" in args:
            print("\\n".join(names))
            sys.exit(0)
        pattern = args[args.index("--only") + 1]
        values = {{"eager": {eager!r}, "graph": {graph!r}}}
        records = []
        for n in names:
            if re.search(pattern, n):
                workload, batch, _, *policy = n.split("/")
                for mode in ("eager", "graph"):
                    records.append({{"workload": workload, "batch": int(batch), "threads": "gpu",
                                    "mode": mode, "value": values[mode][n], "unit": "samples/s",
                                    "peak_rss_mb": 900.0, "device": "Stand-in GPU",
                                    "torch": "2.11.0+cu130"}})
                    if policy:
                        records[-1]["policy"] = policy[0]
        print(json.dumps(records))
        """)
    return path


class Gpu(OneLine):
    OURS = {"mlp/32/gpu": 500e3, "mlp/256/gpu": 2.5e6, "cnn/32/gpu": 100e3, "cnn/256/gpu": 400e3}
    EAGER = {"mlp/32/gpu": 30e3, "mlp/256/gpu": 226e3, "cnn/32/gpu": 14e3, "cnn/256/gpu": 123e3}
    GRAPH = {"mlp/32/gpu": 191e3, "mlp/256/gpu": 1.03e6, "cnn/32/gpu": 85e3, "cnn/256/gpu": 340e3}

    def test_the_table_gives_both_ratios_and_the_targets(self):
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), rates=self.OURS)
            python = fake_peer_python(folder, self.EAGER, self.GRAPH)
            out = os.path.join(folder, "gpu.json")
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", build,
                       "--peer-python", python, "--repeats", "2", "--json", out)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(out) as records:
                results = json.load(records)
        lines = done.stdout.splitlines()
        self.assertIn("PyTorch 2.11.0+cu130 on Stand-in GPU", lines[0])
        header = next(line for line in lines if line.startswith("workload"))
        for column in ("ours", "eager", "graph", "ours/eager", "ours/graph", "wanted", "target"):
            self.assertIn(column, header.split())
        rows = {tuple(line.split()[:2]): line for line in lines
                if line.split()[:1] in (["mlp"], ["cnn"])}
        self.assertEqual(list(rows), [("mlp", "32"), ("mlp", "256"), ("cnn", "32"),
                                      ("cnn", "256")])
        # mlp/32: 16.7x eager, 2.62x graph; cnn/32: 7.14x eager (< 10x); cnn/256: 1.18x graph.
        self.assertIn("16.7 [16.7..16.7]", rows[("mlp", "32")])
        self.assertIn("2.62 [2.62..2.62]", rows[("mlp", "32")])
        self.assertTrue(rows[("mlp", "32")].endswith(" met"))
        self.assertTrue(rows[("mlp", "256")].endswith(" met"))
        self.assertTrue(rows[("cnn", "32")].endswith("not met"))
        self.assertIn(">= 1.5x graph", rows[("cnn", "256")])
        self.assertNotIn("eager", rows[("cnn", "256")].split("graph")[-1])
        self.assertTrue(rows[("cnn", "256")].endswith("not met"))
        by_name = {f"{r['workload']}/{r['batch']}/gpu": r for r in results}
        self.assertEqual(sorted(by_name), sorted(GPU_NAMES))
        mlp = by_name["mlp/32/gpu"]
        self.assertEqual(mlp["device"], "gpu")
        self.assertEqual(mlp["ours"]["samples"], [500e3, 500e3])
        self.assertAlmostEqual(mlp["ratio_eager"]["median"], 500 / 30)
        self.assertAlmostEqual(mlp["ratio_graph"]["median"], 500 / 191)
        self.assertEqual(mlp["target"],
                         {"eager": 10.0, "graph": 2.0, "float32": None, "met": True})
        self.assertEqual(by_name["cnn/256/gpu"]["target"],
                         {"eager": None, "graph": 1.5, "float32": None, "met": False})
        self.assertEqual(mlp["policy"], "float32")
        self.assertIsNone(mlp["vs_float32"])
        self.assertEqual(mlp["device_mb"], 40.0)
        self.assertEqual(mlp["gpu"], "Stand-in GPU")

    def test_the_resnet_rows_give_their_policy_and_the_ratio_to_our_float32(self):
        names = [f"resnet/512/gpu/{p}" for p in ("float32", "mixed_float16", "mixed_bfloat16")]
        ours = dict(zip(names, (10e3, 25e3, 18e3)))
        eager = dict(zip(names, (5e3, 8e3, 7e3)))
        graph = dict(zip(names, (9e3, 15e3, 14e3)))
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), rates=ours, names=names)
            python = fake_peer_python(folder, eager, graph, names=names)
            out = os.path.join(folder, "gpu.json")
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", build,
                       "--peer-python", python, "--repeats", "1", "--json", out)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(out) as records:
                results = json.load(records)
        rows = {tuple(line.split()[:3]): line for line in done.stdout.splitlines()
                if line.startswith("resnet")}
        self.assertEqual(list(rows), [("resnet", "512", "float32"),
                                      ("resnet", "512", "mixed_bfloat16"),
                                      ("resnet", "512", "mixed_float16")])
        self.assertTrue(rows[("resnet", "512", "float32")].endswith(" -"))
        # mixed_float16: 1.67x graph, 2.5x our float32; mixed_bfloat16: 1.8x our float32 (< 2x).
        self.assertIn(">= 1.5x graph, >= 2x float32", rows[("resnet", "512", "mixed_float16")])
        self.assertIn("2.5 [2.5..2.5]", rows[("resnet", "512", "mixed_float16")])
        self.assertTrue(rows[("resnet", "512", "mixed_float16")].endswith(" met"))
        self.assertTrue(rows[("resnet", "512", "mixed_bfloat16")].endswith("not met"))
        by_policy = {r["policy"]: r for r in results}
        half = by_policy["mixed_float16"]
        self.assertEqual((half["workload"], half["batch"]), ("resnet", 512))
        self.assertAlmostEqual(half["vs_float32"]["median"], 2.5)
        self.assertAlmostEqual(half["ratio_graph"]["median"], 25 / 15)
        self.assertEqual(half["target"],
                         {"eager": None, "graph": 1.5, "float32": 2.0, "met": True})
        self.assertIsNone(by_policy["float32"]["vs_float32"])
        self.assertEqual(by_policy["float32"]["target"]["met"], None)

    def test_only_selects_gpu_rows_and_no_peers_leaves_the_targets_open(self):
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), rates=self.OURS)
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", build, "--no-peers",
                       "--only", "^cnn/", "--repeats", "1")
        self.assertEqual(done.returncode, 0, done.stderr)
        rows = [line.split() for line in done.stdout.splitlines()
                if line.split()[:1] in (["mlp"], ["cnn"])]
        self.assertEqual([row[:2] for row in rows], [["cnn", "32"], ["cnn", "256"]])
        self.assertTrue(all(row[-1] == "-" for row in rows))

    def test_an_empty_gpu_selection_lists_the_rows(self):
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), rates=self.OURS)
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", build, "--no-peers",
                       "--only", "/1$")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--only '/1$' selects none of the keras --gpu benchmarks",
                             " ".join(sorted(GPU_NAMES)))

    def test_gpu_applies_to_the_keras_group_only(self):
        done = run(RUN, "data", "--gpu")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "benchmarks/run data: --gpu applies to the keras group only")

    def test_without_a_gpu_our_side_is_the_backends_one_line(self):
        line = ("bench_keras_gpu: cuda backend: no CUDA device is available: cudaGetDeviceCount "
                "failed with error 100 (cudaErrorNoDevice): no CUDA-capable device is detected")
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), failure=line)
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", build, "--no-peers")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "bench_keras_gpu (mlp/32/gpu): exited with code 1: " + line)

    @unittest.skipUnless(GPU_BENCH_DIR, "no bench_keras_gpu built (build-gpu or build-bench)")
    def test_the_real_gpu_bench_without_a_gpu_stops_in_one_line(self):
        listed = run(os.path.join(GPU_BENCH_DIR, "benchmarks", "bench_keras_gpu"),
                     "--benchmark_list_tests=true")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual([n.split("/real_time")[0] for n in listed.stdout.split()],
                         ALL_GPU_NAMES)
        done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", GPU_BENCH_DIR,
                   "--no-peers", "--only", "^mlp/32/", timeout=300)
        if done.returncode == 0:
            self.skipTest("this machine has a GPU")
        self.assertEqual(len(done.stderr.strip().splitlines()), 3)  # run 1 of 3, the exe, why
        self.assert_one_line(done, "bench_keras_gpu (mlp/32/gpu): exited with code 1: "
                             "bench_keras_gpu: cuda backend: no CUDA device is available: ")

    @unittest.skipUnless(GPU_BENCH_DIR and os.access(os.path.join(
        GPU_BENCH_DIR, "benchmarks", "bench_keras_gpu_emulated"), os.X_OK),
        "no bench_keras_gpu_emulated (ninja -C build-gpu benchmarks/bench_keras_gpu_emulated)")
    def test_our_side_end_to_end_on_the_emulated_device(self):
        # bench_keras_gpu's own code (fit on the CUDA backend, the synchronized timing, its
        # counters) on the cuda suite's host emulation, through the driver, beside a stand-in
        # peer: the figures are the host's, the path is the GPU run's.
        with tempfile.TemporaryDirectory() as folder:
            os.makedirs(os.path.join(folder, "build", "benchmarks"))
            os.symlink(os.path.join(GPU_BENCH_DIR, "benchmarks", "bench_keras_gpu_emulated"),
                       os.path.join(folder, "build", "benchmarks", "bench_keras_gpu"))
            python = fake_peer_python(folder, self.EAGER, self.GRAPH)
            out = os.path.join(folder, "gpu.json")
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir",
                       os.path.join(folder, "build"), "--peer-python", python, "--only",
                       "^mlp/32/", "--repeats", "1", "--min-time", "0.05", "--json", out,
                       timeout=300)
            self.assertEqual(done.returncode, 0, done.stderr)
            with open(out) as records:
                record, = json.load(records)
        self.assertEqual((record["workload"], record["batch"]), ("mlp", 32))
        self.assertGreater(record["ours"]["median"], 0)
        self.assertGreater(record["device_mb"], 0)
        self.assertIsNotNone(record["target"]["met"])

    def test_no_build_without_the_gpu_bench_says_how_to_get_it(self):
        with tempfile.TemporaryDirectory() as folder:
            done = run(RUN, "keras", "--gpu", "--no-build", "--build-dir", folder, "--no-peers")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, f"--gpu: no bench_keras_gpu in {folder}/benchmarks "
                             "(--no-build)", "tools/gpu-check")

    def test_a_build_without_cuda_says_how_to_configure_it(self):
        with tempfile.TemporaryDirectory() as folder:
            build = os.path.join(folder, "build")
            os.makedirs(build)
            open(os.path.join(build, "build.ninja"), "w").close()
            tools = os.path.join(folder, "bin")
            os.makedirs(tools)
            # A Meson whose build directory has the CPU benchmarks only (configured without CUDA).
            write_script(os.path.join(tools, "meson"), """\
                #!/bin/sh
                echo '[{"name": "bench_keras_train"}, {"name": "bench_data_dataset"}]'
                """)
            done = run(RUN, "keras", "--gpu", "--build-dir", build, "--no-peers",
                       env={"PATH": tools + os.pathsep + os.environ["PATH"]})
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, f"--gpu: no bench_keras_gpu in {build}: it is configured "
                             "without the CUDA backend",
                             f"meson setup --reconfigure {build} -Dcuda=enabled")

    def test_the_cpu_rows_leave_the_gpu_bench_out(self):
        with tempfile.TemporaryDirectory() as folder:
            build = fake_gpu_bench(os.path.join(folder, "build"), rates=self.OURS)
            # Meson's object folders beside the executables are not executables.
            os.makedirs(os.path.join(build, "benchmarks", "bench_keras_train.p"))
            os.makedirs(os.path.join(build, "benchmarks", "bench_keras_gpu.p"))
            os.symlink(os.path.join(build, "benchmarks", "bench_keras_gpu"),
                       os.path.join(build, "benchmarks", "bench_keras_gpu_emulated"))
            done = run(RUN, "keras", "--no-build", "--build-dir", build, "--no-peers")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "no bench_keras_* executable in", "--no-build")

    def test_the_peer_graph_mode_needs_cuda(self):
        done = run(TORCH_PYTHON, os.path.join(PEERS, "keras_torch.py"), "--device", "cpu",
                   "--mode", "graph", "--only", "^mlp/32/1$")
        self.assert_one_line(done, "peers/keras_torch.py: --mode graph:", "needs --device cuda")

    def test_the_peer_lists_the_gpu_rows_without_torch(self):
        listed = run(TORCH_PYTHON, os.path.join(PEERS, "keras_torch.py"), "--list", "--device",
                     "cuda")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual(listed.stdout.split(), ALL_GPU_NAMES)

    @unittest.skipUnless(has_torch() and not has_torch_cuda(),
                         f"{TORCH_PYTHON} has no torch, or one that sees a GPU")
    def test_the_peer_on_cuda_without_a_gpu_is_one_line(self):
        done = run(TORCH_PYTHON, os.path.join(PEERS, "keras_torch.py"), "--device", "cuda",
                   "--only", "^mlp/32/gpu$")
        self.assert_one_line(done, "peers/keras_torch.py: --device cuda: PyTorch",
                             "cannot use a GPU")

    @unittest.skipUnless(has_torch(), f"{TORCH_PYTHON} has no torch")
    def test_the_peer_eager_step_runs_on_the_cpu(self):
        done = run(TORCH_PYTHON, os.path.join(PEERS, "keras_torch.py"), "--device", "cpu",
                   "--mode", "eager", "--only", "^mlp/32/1$", timeout=300)
        self.assertEqual(done.returncode, 0, done.stderr)
        record, = json.loads(done.stdout)
        self.assertEqual((record["workload"], record["batch"], record["threads"]), ("mlp", 32, 1))
        self.assertGreater(record["value"], 0)


class GpuCheck(OneLine):
    """tools/gpu-check's arguments (what it builds and packs is checked by running it)."""
    GPU_CHECK = os.path.join(os.path.dirname(HERE), "tools", "gpu-check")

    def test_an_unknown_argument_is_one_line(self):
        done = run(self.GPU_CHECK, "--bogus")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "tools/gpu-check: unknown argument '--bogus'")

    def test_repeats_must_be_positive(self):
        done = run(self.GPU_CHECK, "--repeats", "0")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--repeats takes a positive number")

    def test_fashion_and_all_exclude_each_other(self):
        done = run(self.GPU_CHECK, "--fashion", "--all")
        self.assertEqual(done.returncode, 2)
        self.assert_one_line(done, "--fashion and --all exclude each other")


    @unittest.skipUnless(GPU_BENCH_DIR and os.path.isdir(os.path.join(GPU_BENCH_DIR, "bundle")),
                         "no bundle from tools/gpu-check")
    def test_the_bundle_lists_the_gpu_rows(self):
        listed = run(os.path.join(GPU_BENCH_DIR, "bundle", "benchmarks", "bench_keras_gpu"),
                     "--benchmark_list_tests=true")
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertEqual([n.split("/real_time")[0] for n in listed.stdout.split()],
                         ALL_GPU_NAMES)


class KernelTimes(OneLine):
    """benchmarks/kernel_times.py on Nsight Compute's CSV: one step's kernels, by family."""
    SCRIPT = os.path.join(HERE, "kernel_times.py")
    HEADER = ('"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit",'
              '"Metric Value"\n')

    def csv(self, folder, kernels):
        """A file of ncu's output for (name, value, unit) kernels, with a program's lines."""
        path = os.path.join(folder, "ncu.csv")
        with open(path, "w") as out:
            out.write("==PROF== Connected to process 1\nBenchmark  Time  CPU\n" + self.HEADER)
            for i, (name, value, unit) in enumerate(kernels):
                out.write(f'"{i}","{name}","(1, 1, 1)","(256, 1, 1)","gpu__time_duration.sum",'
                          f'"{unit}","{value}"\n')
        return path

    def test_one_step_by_family(self):
        step = [("void loadstar::<unnamed>::im2col_kernel<unsigned int>(const float *)", "2,000",
                 "nsecond"),
                ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x32x8", "3000", "nsecond"),
                ("void cutlass::Kernel2<cutlass_80_simt_sgemm_64x64_8x5_nt_align1>(T1::Params)",
                 "1.5", "usecond"),
                ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(int)", "500", "nsecond"),
                ("void epilogue::globalKernelBgradAB_v1<8, 64, float>(int)", "700", "nsecond"),
                ("loadstar::<unnamed>::optimizer_step_kernel(const loadstar::UpdateTarget *)",
                 "1000", "nsecond")]
        before = [("loadstar::<unnamed>::optimizer_step_kernel(const loadstar::UpdateTarget *)",
                   "9999", "nsecond")]
        with tempfile.TemporaryDirectory() as folder:
            done = run(sys.executable, self.SCRIPT, self.csv(folder, before + step + step[:2]))
        self.assertEqual(done.returncode, 0, done.stderr)
        lines = done.stdout.splitlines()
        self.assertEqual(lines[0], "one step: 6 kernels, 8.7 us")
        families = {line.split()[-1] if "BGRADA" not in line else "BGRADA":
                    float(line.split()[0]) for line in lines[1:]}
        self.assertEqual(families, {"gemm": 4.5, "im2col_kernel": 2.0,
                                    "optimizer_step_kernel": 1.0, "BGRADA": 0.7,
                                    "splitKreduce": 0.5})
        self.assertIn("x2", lines[1])  # the two GEMMs, largest first

    def test_an_unknown_time_unit_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            done = run(sys.executable, self.SCRIPT, self.csv(folder, [
                ("loadstar::<unnamed>::optimizer_step_kernel(const float *)", "1", "fortnight")]))
        self.assertEqual(done.returncode, 1)
        self.assert_one_line(done, "kernel_times.py:", "unknown time unit 'fortnight'")

    def test_profile_torch_names_a_bad_point_in_one_line(self):
        done = run(sys.executable, os.path.join(PEERS, "profile_torch.py"), "cnn/256", "cnn/x")
        self.assertEqual(done.returncode, 1)
        self.assert_one_line(done, "profile_torch.py: 'cnn/x': expected WORKLOAD/BATCH")

    def test_no_whole_step_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            done = run(sys.executable, self.SCRIPT, self.csv(folder, [
                ("loadstar::<unnamed>::optimizer_step_kernel(const float *)", "1000",
                 "nsecond")]))
        self.assertEqual(done.returncode, 1)
        self.assert_one_line(done, "no whole step (1 kernel times")

@unittest.skipUnless(has_torch(), f"{TORCH_PYTHON} has no torch")
class Peers(OneLine):
    def wrapper(self, folder, script, body):
        """A script that runs peers/<script> with body patched in, as the peer's name."""
        path = os.path.join(folder, "wrapper.py")
        with open(path, "w") as out:
            out.write(textwrap.dedent(f"""\
                import os, sys, time
                sys.path.insert(0, {PEERS!r})
                sys.argv[0] = {script!r}
                """) + textwrap.dedent(body))
        return path

    def test_a_dead_measuring_process_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "keras_torch.py", """\
                import keras_torch
                def dies(workload, batch, threads, queue):
                    os._exit(3)
                if __name__ == "__main__":
                    keras_torch.measure = dies
                    keras_torch.main()
                """)
            done = run(TORCH_PYTHON, path, "--only", "^mlp/32/1$")
        self.assert_one_line(done, "peers/keras_torch.py: mlp/32/1:", "exited with code 3")

    def test_a_hung_measuring_process_is_killed(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "keras_torch.py", """\
                import keras_torch
                def hangs(workload, batch, threads, queue):
                    time.sleep(1000)
                if __name__ == "__main__":
                    keras_torch.measure = hangs
                    keras_torch.main()
                """)
            done = run(TORCH_PYTHON, path, "--only", "^cnn/32/2$", "--timeout", "3", timeout=60)
        self.assert_one_line(done, "peers/keras_torch.py: cnn/32/2:", "within 3 s; killed")

    def test_a_dead_loader_worker_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "data_torch.py", f"""\
                source = open({os.path.join(PEERS, "data_torch.py")!r}).read()
                source = source.replace("return self.batch\\n", "os._exit(5)\\n")
                source = source.replace("import common\\n", "import common\\nimport os\\n")
                exec(compile(source, "data_torch.py", "exec"), {{"__name__": "__main__"}})
                """)
            done = run(TORCH_PYTHON, path, "--only", "^hand-off/threads/2$", "--timeout", "30")
        self.assert_one_line(done, "peers/data_torch.py: hand-off/threads/2:",
                             "exited unexpectedly")

    def test_a_dead_rank_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "dist_torch.py", """\
                import dist_torch
                def dies(rank, ranks, batch, seconds, store, timeout, queue):
                    if rank == 1:
                        os._exit(3)
                    time.sleep(1000)
                if __name__ == "__main__":
                    dist_torch.measure = dies
                    dist_torch.main()
                """)
            done = run(TORCH_PYTHON, path, "--only", "^cnn/2$")
        self.assert_one_line(done, "peers/dist_torch.py: cnn/2: rank 1 exited with code 3")

    def test_a_rank_that_raises_is_one_line(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "dist_torch.py", """\
                import dist_torch
                def broken(workload):
                    raise RuntimeError("no model\\nmore")
                dist_torch.keras_torch.model_of = broken  # in the spawned ranks, too
                if __name__ == "__main__":
                    dist_torch.main()
                """)
            done = run(TORCH_PYTHON, path, "--only", "^cnn/2$")
        self.assert_one_line(done, "peers/dist_torch.py: cnn/2:",
                             "rank 0 failed (RuntimeError: no model)")

    def test_hung_ranks_are_killed(self):
        with tempfile.TemporaryDirectory() as folder:
            path = self.wrapper(folder, "dist_torch.py", """\
                import dist_torch
                def hangs(*args):
                    time.sleep(1000)
                if __name__ == "__main__":
                    dist_torch.measure = hangs
                    dist_torch.main()
                """)
            done = run(TORCH_PYTHON, path, "--only", "^cnn/2$", "--timeout", "3", timeout=60)
        self.assert_one_line(done, "peers/dist_torch.py: cnn/2:", "within 3 s; killed")

    def test_list_and_only(self):
        listed = run(TORCH_PYTHON, os.path.join(PEERS, "keras_torch.py"), "--list")
        self.assertEqual(listed.returncode, 0)
        self.assertIn("mlp/256/2", listed.stdout.split())
        done = run(TORCH_PYTHON, os.path.join(PEERS, "data_dataset.py"), "--only", "(")
        self.assert_one_line(done, "peers/data_dataset.py: --only:", "not a regular expression")


if __name__ == "__main__":
    unittest.main()
