#!/usr/bin/python3
"""pandas and Python on the csv and text workloads of bench_data_files, for `benchmarks/run data`.

csv/parse/1: pandas.read_csv (its C parser) of a CSV file of 100000 rows, an int64 label and 8
floats, with the same header and dtypes as CsvDataset is given. text/lines/1: Python's iteration
over the lines of a text file of 200000 lines, each decoded and stripped of its newline, as
TextLineDataset yields them. Both files are written here as bench_data_files writes them. The
rate is rows per second over about 2 seconds of whole passes. Prints a JSON list of
{"workload", "workers", "mode", "value", "unit"} on stdout. Run with /usr/bin/python3. Takes
--list, --only REGEX and --timeout S (see common.py).
"""
import json
import os
import shutil
import sys
import tempfile
import time

import common

CSV_ROWS = 100000
TEXT_LINES = 200000
MEASURE_SECONDS = 2.0
NAMES = ["csv/parse/1", "text/lines/1"]

if __name__ == "__main__":
    SELECTED, ARGS = common.select(NAMES, __doc__.splitlines()[0])


def write_files(directory):
    csv_path = os.path.join(directory, "rows.csv")
    with open(csv_path, "w") as f:
        f.write("label,f0,f1,f2,f3,f4,f5,f6,f7\n")
        for i in range(CSV_ROWS):
            f.write(str(i % 10) + "".join(",%.3f" % (((i * 7 + j) % 1000) / 8) for j in range(8))
                    + "\n")
    text_path = os.path.join(directory, "lines.txt")
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    with open(text_path, "w") as f:
        for i in range(TEXT_LINES):
            f.write(f"line {i}: {letters}\n")
    return csv_path, text_path


def count_lines(path):
    with open(path, encoding="utf-8") as f:
        return sum(1 for line in f if line.rstrip("\n") is not None)


def rows_per_second(one_pass):
    one_pass()  # warm up: the file in the page cache, the parser loaded
    rows = 0
    start = time.perf_counter()
    while True:
        rows += one_pass()
        elapsed = time.perf_counter() - start
        if elapsed >= MEASURE_SECONDS:
            return rows / elapsed


def main():
    import pandas  # noqa: E402 (after --list)
    directory = tempfile.mkdtemp(prefix="bench_data_text_peer_")
    try:
        csv_path, text_path = write_files(directory)
        dtypes = {"label": "int64", **{f"f{j}": "float32" for j in range(8)}}
        measures = {
            "csv/parse/1": lambda: len(pandas.read_csv(csv_path, dtype=dtypes, engine="c")),
            "text/lines/1": lambda: count_lines(text_path),
        }
        results = []
        for name in NAMES:
            if name not in SELECTED:
                continue
            try:
                value = rows_per_second(measures[name])
            except Exception as error:  # one line, not a traceback
                common.fail(name, f"{type(error).__name__}: {error}")
            workload, mode, workers = name.split("/")
            results.append({"workload": workload, "workers": int(workers), "mode": mode,
                            "value": value, "unit": "rows/s"})
        json.dump(results, sys.stdout)
        print()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
