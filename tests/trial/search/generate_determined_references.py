#!/usr/bin/python3
"""Writes the references of tests/trial/search/test_determined_conformance.cpp by running
Determined's own Go code (tag 0.15.6) on random configurations:
- reference/sequencer_streams.json: the workload streams of its master sequencer
  (master/internal/trial_workload_sequencer.go with the unit arithmetic of
  master/pkg/model/length.go);
- reference/asha_searches.json: the searches of its adaptive_asha searcher
  (master/pkg/searcher/{adaptive_asha,asha,tournament}.go);
- reference/asha_stop_once_searches.json: the same with searcher.stop_once, its stopping variant
  (master/pkg/searcher/asha_stopping.go).

Run: /usr/bin/python3 tests/trial/search/generate_determined_references.py /path/to/determined
with a clone of github.com/determined-ai/determined (its tags) and Go (Debian's golang-go).
Determined's files are copied unchanged but for their import paths into a scratch Go module made
of determined/ beside this script: stand-ins for the few types they import (expconf.Length,
workload.Workload, searcher.Create, ...) and drivers. The sequencer's driver requests the
operations, takes Workload() until UpToDate(), completes each workload and reports a graceful stop
as WorkloadFailed(USER_CANCELED), as master/internal/trial.go does; the searcher's simulates an
experiment (determined/searcher/asha_driver.go says how).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

TAG = "0.15.6"
HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "reference")
IMPORTS = {
    "github.com/determined-ai/determined/master/pkg/workload": "seqref/workload",
    "github.com/determined-ai/determined/master/pkg/model": "seqref/model",
    "github.com/determined-ai/determined/master/pkg/schemas/expconf": "seqref/expconf",
    "github.com/determined-ai/determined/master/pkg/searcher": "seqref/searcher",
    "github.com/determined-ai/determined/master/pkg/ptrs": "seqref/ptrs",
    "github.com/pkg/errors": "seqref/errors",
}
# The declarations of length.go the sequencer needs (the rest needs protobuf types).
LENGTH_DECLS = ["type PartialUnits", "type UnitContext", "func NewUnitContext",
                "func UnitsFromBatches", "func (u UnitContext) ToNearestBatch",
                "func (u UnitContext) EqualWithinBatch", "func abs"]


def show(repo, path):
    return subprocess.run(["git", "-C", repo, "show", f"{TAG}:{path}"], check=True,
                          capture_output=True, text=True).stdout


def top_level_chunks(source):
    """Top-level declarations with their doc comments, split at lines that start a declaration."""
    chunks, current = [], []
    for line in source.splitlines():
        if re.match(r"^(func|type|const|var|import|package)\b", line) and current and \
                not all(l.startswith("//") for l in current):
            chunks.append("\n".join(current))
            current = []
        current.append(line)
    chunks.append("\n".join(current))
    return chunks


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("DETERMINED_SRC", "")
    if not repo:
        sys.exit("usage: generate_determined_references.py /path/to/determined")
    with tempfile.TemporaryDirectory() as scratch:
        module = os.path.join(scratch, "seqref")
        shutil.copytree(os.path.join(HERE, "determined"), module)
        for path, into in [("master/internal/trial_workload_sequencer.go", "internal"),
                           ("master/pkg/searcher/adaptive_asha.go", "searcher"),
                           ("master/pkg/searcher/asha.go", "searcher"),
                           ("master/pkg/searcher/asha_stopping.go", "searcher"),
                           ("master/pkg/searcher/tournament.go", "searcher")]:
            source = show(repo, path)
            for old, new in IMPORTS.items():
                source = source.replace(f'"{old}"', f'"{new}"')
            with open(os.path.join(module, into, os.path.basename(path)), "w") as f:
                f.write(source)
        length = show(repo, "master/pkg/model/length.go")
        decls = [chunk for chunk in top_level_chunks(length)
                 if any(re.search(r"^" + re.escape(d) + r"\b", chunk, re.M) for d in LENGTH_DECLS)]
        assert len(decls) == len(LENGTH_DECLS), [d.splitlines()[-1] for d in decls]
        with open(os.path.join(module, "model", "length.go"), "w") as f:
            f.write("package model\n\nimport (\n\t\"fmt\"\n\n\t\"seqref/expconf\"\n)\n\n" +
                    "\n\n".join(decls) + "\n")
        env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off", GO111MODULE="on",
                   GOCACHE=os.path.join(scratch, "cache"), GOPATH=os.path.join(scratch, "gopath"))
        outputs = {}
        for kind in ["sequencer", "asha", "asha_stop_once"]:
            result = subprocess.run(["go", "run", ".", kind], cwd=module, env=env,
                                    capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit("go run failed:\n" + result.stderr)
            outputs[kind] = json.loads(result.stdout)["cases"]
    os.makedirs(REFERENCE, exist_ok=True)
    for kind, name, source in [
            ("sequencer", "sequencer_streams.json", "master/internal/trial_workload_sequencer.go"),
            ("asha", "asha_searches.json", "master/pkg/searcher/adaptive_asha.go"),
            ("asha_stop_once", "asha_stop_once_searches.json",
             "master/pkg/searcher/asha_stopping.go")]:
        cases = outputs[kind]
        path = os.path.join(REFERENCE, name)
        with open(path, "w") as f:
            f.write('{"source": "determined ' + TAG + ' ' + source + '",\n "cases": [\n')
            f.write(",\n".join(json.dumps(c, separators=(",", ":")) for c in cases))
            f.write("\n]}\n")
        print(f"wrote {len(cases)} cases to {path}")


if __name__ == "__main__":
    main()
