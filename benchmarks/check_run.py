#!/usr/bin/python3
"""Checks the failure paths of benchmarks/run and the peer scripts: each ends in one line that
says what failed, with a non-zero exit status, and in bounded time, never a traceback or a hang.

    benchmarks/check_run.py [-v]

Needs /usr/bin/python3 with PyTorch for the peer cases (skipped without it) and, for the --only
and timeout cases, the benchmark build directory build-bench that `benchmarks/run data` makes
(skipped without it; the dist cases that build also need mpirun). Runs no benchmark: every case
fails before or at its first measurement.
"""
import os
import shutil
import subprocess
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUN = os.path.join(HERE, "run")
PEERS = os.path.join(HERE, "peers")
BUILD = os.path.join(os.path.dirname(HERE), "build-bench")
TORCH_PYTHON = "/usr/bin/python3"
HAS_MPIRUN = shutil.which("mpirun") is not None


def has_torch():
    return subprocess.run([TORCH_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


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
